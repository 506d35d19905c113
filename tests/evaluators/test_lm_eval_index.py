"""lm-eval's task index kept on disk: stored by the first process, read back by the next, built again when a
task file it indexed changes, and never an error when the cache cannot be used. Real lm-eval TaskManagers
over lm-eval's own tasks and a task folder of the test's (each build reads lm-eval's ~14,000 YAMLs)."""

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


def test_the_index_is_stored_read_back_and_rebuilt_when_a_task_file_or_the_cache_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    include, cache = tmp_path / "tasks", tmp_path / "cache"
    include.mkdir()
    (include / "mine.yaml").write_text(TASK.format(name="my_task"))
    (include / "gone.yaml").symlink_to(tmp_path / "deleted.yaml")  # a dangling link, skipped as lm-eval does

    monkeypatch.chdir(tmp_path)  # stored from a relative --include-path, read from another folder
    built, build_s = _timed("tasks", cache)
    (stored,) = cache.glob("task-index-*.pkl")
    assert "my_task" in built.all_tasks and "gsm8k" in built.all_tasks

    monkeypatch.chdir(cache)
    read, read_s = _timed(str(include), cache)
    assert read.all_tasks == built.all_tasks and read.task_index["my_task"].yaml_path == include / "mine.yaml"
    assert read_s < build_s / 3, (read_s, build_s)  # read back, not parsed again
    print(f"index built in {build_s:.2f} s, read back in {read_s:.2f} s")

    stored.write_bytes(stored.read_bytes()[:100])  # a truncated file: built again and stored whole
    assert task_manager([str(include)], cache).all_tasks == built.all_tasks
    assert pickle.loads(stored.read_bytes()).all_tasks == built.all_tasks

    (include / "mine.yaml").write_text(TASK.format(name="my_renamed_task"))
    rebuilt = task_manager([str(include)], cache)
    assert "my_renamed_task" in rebuilt.all_tasks and "my_task" not in rebuilt.all_tasks
    (now,) = cache.glob("task-index-*.pkl")  # the same folders' older index is dropped
    assert now != stored

    monkeypatch.setattr(lm_eval_index, "KEEP", 1)  # another set of folders: the least recently used goes
    other = tmp_path / "other-tasks"
    other.mkdir()
    (other / "theirs.yaml").write_text(TASK.format(name="their_task"))
    assert "their_task" in task_manager([str(other)], cache).all_tasks
    (kept,) = cache.glob("task-index-*.pkl")
    assert kept != now and "their_task" in pickle.loads(kept.read_bytes()).all_tasks

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert (
        "my_renamed_task" in task_manager([str(include)], blocked).all_tasks
    )  # cannot store: built, no error
