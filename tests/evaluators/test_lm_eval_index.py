"""lm-eval's task index kept on disk: stored by the first process, read back by the next, built again when a
task file it indexed changes, and never an error when the cache cannot be used. Real lm-eval TaskManagers:
one over lm-eval's own tasks and a task folder of the test's (a build reads lm-eval's ~14,000 YAMLs), the
others over the test's folders alone."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

from evaluators import lm_eval_index
from evaluators.lm_eval_index import task_manager

TASK = "task: {name}\ndataset_path: json\noutput_type: generate_until\ntest_split: test\ndoc_to_text: q\ndoc_to_target: a\n"


def _timed(include: str, cache: Path | None) -> tuple[object, float]:
    began = time.perf_counter()
    manager = task_manager([include], cache)
    return manager, time.perf_counter() - began


def test_the_index_of_lm_evals_tasks_and_a_folder_is_stored_and_read_back_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    include, cache = tmp_path / "tasks", tmp_path / "cache"
    include.mkdir()
    (include / "mine.yaml").write_text(TASK.format(name="my_task"))
    (include / "gone.yaml").symlink_to(tmp_path / "deleted.yaml")  # a dangling link, skipped as lm-eval does

    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(tmp_path)  # stored from a relative --include-path, read from another folder
    built, build_s = _timed("tasks", cache)
    assert "my_task" in built.all_tasks and "gsm8k" in built.all_tasks
    monkeypatch.chdir(cache)
    made = []  # read back, not parsed again: no TaskManager is made (not timed: a loaded machine lies)
    monkeypatch.setattr(TaskManager, "__init__", lambda self, *a, **k: made.append(a) or None)
    read, read_s = _timed(str(include), cache)
    assert made == [] and read is not built
    assert read.all_tasks == built.all_tasks and read.task_index["my_task"].yaml_path == include / "mine.yaml"
    print(f"index built in {build_s:.2f} s, read back in {read_s:.2f} s")


def test_the_index_is_rebuilt_when_a_task_file_or_the_cache_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The cache's rules on indexes of the test's folders alone (lm-eval's `include_defaults=False`): each
    build here parses two YAML files, not lm-eval's ~14,000, and the rules are the same."""
    include, cache = tmp_path / "tasks", tmp_path / "cache"
    include.mkdir()
    (include / "mine.yaml").write_text(TASK.format(name="my_task"))

    def index(folder: Path, cache_dir: Path) -> set[str]:
        return set(task_manager([str(folder)], cache_dir, include_defaults=False).all_tasks)

    assert index(include, cache) == {"my_task"}
    (stored,) = cache.glob("task-index-*.pkl")
    stored.write_bytes(stored.read_bytes()[:100])  # a truncated file: built again and stored whole
    assert index(include, cache) == {"my_task"}
    assert pickle.loads(stored.read_bytes()).all_tasks == ["my_task"]

    (include / "mine.yaml").write_text(TASK.format(name="my_renamed_task"))
    assert index(include, cache) == {"my_renamed_task"}
    (now,) = cache.glob("task-index-*.pkl")  # the same folders' older index is dropped
    assert now != stored

    monkeypatch.setattr(lm_eval_index, "KEEP", 1)  # another set of folders: the least recently used goes
    other = tmp_path / "other-tasks"
    other.mkdir()
    (other / "theirs.yaml").write_text(TASK.format(name="their_task"))
    assert index(other, cache) == {"their_task"}
    (kept,) = cache.glob("task-index-*.pkl")
    assert kept != now and "their_task" in pickle.loads(kept.read_bytes()).all_tasks

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert index(include, blocked) == {"my_renamed_task"}  # cannot store: built, no error
