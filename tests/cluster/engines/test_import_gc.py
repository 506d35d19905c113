"""The collector paused around an engine process's vLLM import (cluster.engines.import_gc): no collection runs
inside, what was made inside is frozen after, and the collector's own state comes back as it was."""

from __future__ import annotations

import gc

import pytest

from cluster.engines.import_gc import collector_paused


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
