"""rayeval's cache on one machine (no Ray): what `rayeval cache list` finds, what `prune` removes and keeps.
Over a cluster's hosts: tests/cluster/test_runs_on_separate_hosts.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.models.cache import CacheKind, list_entries, mark_used, prune

DAY = 24 * 3600.0


def write(path: Path, size: int, age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def age(path: Path, age_s: float) -> None:
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache with an entry of each kind: old ones (10 days) and one merged checkpoint used an hour ago."""
    root = tmp_path / "cache"
    monkeypatch.setenv("RAYEVAL_CACHE", str(root))
    monkeypatch.delenv("RAYEVAL_STAGING_DIR", raising=False)
    for name in ("old", "recent"):
        folder = root / "merged" / f"M+{name}-abc"
        write(folder / "model.safetensors", 1000, 10 * DAY)
        write(folder / "config.json", 10, 10 * DAY)
        age(folder, 10 * DAY)
    mark_used(root / "merged" / "M+recent-abc")  # loaded today, built ten days ago
    write(root / "adapters" / "a-123" / "adapter_model.safetensors", 100, 10 * DAY)
    age(root / "adapters" / "a-123", 10 * DAY)
    write(root / "models" / "SmolLM2" / "model.safetensors", 500, 10 * DAY)
    age(root / "models" / "SmolLM2", 10 * DAY)
    write(root / "rendered" / "t.sqlite", 40, 10 * DAY)
    write(root / "rendered" / "t.sqlite-wal", 8, 10 * DAY)  # one entry with its database
    write(root / "lm_eval" / "task-index-1.pkl", 20, 10 * DAY)
    write(root / "merged" / ".staging-xyz" / "model.safetensors", 1000, 10 * DAY)  # a build stopped half way
    age(root / "merged" / ".staging-xyz", 10 * DAY)
    write(root / "merged" / ".M+old-abc.lock", 0)
    write(root / "storage" / "s3" / "bucket" / "evals" / "g1" / "summary.json", 30, 10 * DAY)
    return root


def test_every_entry_is_listed_with_its_kind_size_and_last_use(cache: Path):
    entries = {(e.kind, Path(e.path).relative_to(cache).as_posix()): e for e in list_entries()}
    assert {key: entry.size_bytes for key, entry in entries.items()} == {
        (CacheKind.MERGED, "merged/M+old-abc"): 1010,
        (CacheKind.MERGED, "merged/M+recent-abc"): 1010,
        (CacheKind.MERGED, "merged/.staging-xyz"): 1000,  # its lock file is no entry
        (CacheKind.ADAPTERS, "adapters/a-123"): 100,
        (CacheKind.MODELS, "models/SmolLM2"): 500,
        (CacheKind.RENDERED, "rendered/t.sqlite"): 48,
        (CacheKind.LM_EVAL, "lm_eval/task-index-1.pkl"): 20,
        (CacheKind.STORAGE, "storage/s3/bucket/evals/g1"): 30,  # the first folder down that holds a file
    }
    assert time.time() - entries[(CacheKind.MERGED, "merged/M+recent-abc")].last_used < 60
    assert time.time() - entries[(CacheKind.MERGED, "merged/M+old-abc")].last_used > 9 * DAY


def test_prune_removes_what_was_not_used_for_the_time_given_and_keeps_the_rest(cache: Path):
    kinds = (CacheKind.MERGED, CacheKind.ADAPTERS, CacheKind.RENDERED, CacheKind.LM_EVAL)
    would = prune(kinds, 7 * DAY, dry_run=True)
    assert sorted(Path(e.path).name for e in would) == [
        ".staging-xyz", "M+old-abc", "a-123", "t.sqlite", "task-index-1.pkl"
    ]  # fmt: skip
    assert (cache / "merged" / "M+old-abc").is_dir()  # a dry run removes nothing
    removed = prune(kinds, 7 * DAY)
    assert sorted(Path(e.path).name for e in removed) == sorted(Path(e.path).name for e in would)
    left = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file())
    assert left == [
        "merged/.M+old-abc.lock",
        "merged/M+recent-abc/config.json",
        "merged/M+recent-abc/model.safetensors",
        "models/SmolLM2/model.safetensors",
        "storage/s3/bucket/evals/g1/summary.json",
    ]  # the sqlite's write-ahead log went with it; the default model is pruned only when named
    with pytest.raises(ValueError, match="--kind storage: staged run folders are never pruned"):
        prune((CacheKind.STORAGE,), 0)


def test_the_command_lists_and_prunes_this_machine_and_totals_what_it_did(cache: Path, capsys):
    assert main(["cache", "list", "--kind", "merged"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split("\t") == ["NODE", "KIND", "SIZE", "LAST USED", "PATH"]
    assert [line.split("\t")[4] for line in out[1:-1]] == [
        str(cache / "merged" / "M+old-abc"),
        str(cache / "merged" / "M+recent-abc"),
        str(cache / "merged" / ".staging-xyz"),
    ]
    assert out[1].split("\t")[2] == "1010 B" and out[-1] == "3 entries, 2.9 KiB, on 1 node"
    assert main(["cache", "prune", "--unused-for", "0", "--kind", "models"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "removed 1 entry, 500 B, on 1 node"
    assert not (cache / "models" / "SmolLM2").exists()
