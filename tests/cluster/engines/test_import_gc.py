"""The collector paused around an engine process's vLLM import (cluster.engines.import_gc): no collection runs
inside, what was made inside is frozen after, and the collector's own state comes back as it was."""

from __future__ import annotations

import gc
import sys

import pytest

from cluster.engines.import_gc import collector_paused, import_with_collector_paused


@pytest.fixture
def collections_run():
    """The number of collections started, as gc.callbacks sees them."""
    started = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    try:
        yield started
    finally:
        gc.callbacks.remove(count)
        gc.unfreeze()  # what the test froze goes back to the collector


def test_nothing_is_collected_inside_and_what_was_made_is_frozen_after(collections_run):
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    with collector_paused():
        assert not gc.isenabled()
        made = [[i] for i in range(50 * gc.get_threshold()[0])]  # many times what starts a collection
        assert collections_run == []
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen_before + len(made)
    collections_run.clear()
    gc.collect()  # the collector runs again after
    assert collections_run


def test_a_collector_turned_off_by_the_caller_stays_off_and_an_error_still_restores_the_state(
    collections_run,
):
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ImportError), collector_paused():
        raise ImportError("a failed import")
    assert gc.isenabled()


def test_modules_imported_already_freeze_nothing_and_a_new_one_is_imported_paused(
    collections_run, tmp_path, monkeypatch
):
    """An engine actor that rebuilds its engine has vLLM imported already: nothing more is frozen (what its
    old engine left to collect stays collectable). A module not imported yet is, with the collector paused."""
    frozen_before = gc.get_freeze_count()
    import_with_collector_paused("json", "gc")
    assert gc.get_freeze_count() == frozen_before
    (tmp_path / "rayeval_gc_probe.py").write_text(
        "import gc\nENABLED_WHILE_IMPORTED = gc.isenabled()\nMADE = [[i] for i in range(100000)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rayeval_gc_probe", raising=False)
    collections_run.clear()
    import_with_collector_paused("json", "rayeval_gc_probe")
    probe = sys.modules["rayeval_gc_probe"]
    assert probe.ENABLED_WHILE_IMPORTED is False and collections_run == []
    assert gc.get_freeze_count() >= frozen_before + len(probe.MADE) and gc.isenabled()
