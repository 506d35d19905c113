"""The output disk fills up, or the output folder becomes unwritable, in the middle of a real run.

The full disk is a small tmpfs mounted for the test (root is needed to mount); the unwritable folder is made
immutable with `chattr +i`, which stops even root from making files in it. Generation is real: the test run's
shared Ray cluster (tests/warm_cluster.py) and its warm pool's vLLM CPU engine, the run keeping two sequences
in flight (`--max-in-flight 2`, a setting of the run, so the pool serves it) so that the fault lands mid-run.
The test asserts one clear error with no traceback, a store whose every line is a whole record, that the
pool stays healthy (the resume generates on it), and that the same command resumes and generates only what
is missing, two sequences at a time.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runs import (
    ENGINE_FLAGS,
    MODEL_DIR,
    rayeval,
    records,
    start_in_background,
    wait_for_records,
)
from tests.warm_cluster import warm_cluster

pytestmark = pytest.mark.slow

LIMIT = 10  # five rounds of two in flight: the fault lands with most of the run still to go


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def run_argv(output_dir: Path) -> list[str]:
    return ["run", "--tasks", "ifeval", "--limit", str(LIMIT), "--output-dir", str(output_dir), "--run-id",
            "r", "--max-in-flight", "2", *ENGINE_FLAGS]  # fmt: skip


def fill(disk: Path) -> Path:
    """Write zeros until the filesystem says it is full."""
    filler = disk / "filler"
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * (1 << 20))
                handle.flush()
        except OSError:
            pass
    return filler


def whole_records(store: Path) -> list[dict]:
    """Every line of the store parses as a record: nothing half written is left."""
    text = store.read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def stopped_with(argv: list[str], store: Path, fault) -> str:
    shared = warm_cluster()
    proc = start_in_background([*argv, *shared.run_args()], env=shared.env())
    wait_for_records(proc, store, 3)
    fault()
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err
    return err


def test_a_full_disk_mid_run_stops_cleanly_and_the_same_command_resumes(small_disk):
    argv = run_argv(small_disk / "runs")
    store = small_disk / "runs" / "r" / "cache" / "completions.jsonl"
    filled: list[Path] = []
    err = stopped_with(argv, store, lambda: filled.append(fill(small_disk)))
    assert "Writing the run's files in" in err and "No space left on device" in err
    assert "rerun the same command: it resumes" in err
    kept = whole_records(store)
    assert 3 <= len(kept) < LIMIT and all(r["error"] is None for r in kept)
    filled[0].unlink()
    resumed = rayeval(*argv)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{LIMIT} requests, {len(kept)} reused" in resumed.stderr
    run = json.loads((small_disk / "runs" / "r" / "summary.json").read_text())["run"]
    assert run["engines_source"]["kind"] == "warm"  # the pool served the faulted run's resume: still healthy
    (replica,) = run["dispatch"]["per_replica"].values()
    assert replica["sequences"] == LIMIT - len(kept) and replica["peak_in_flight"] == min(
        2, LIMIT - len(kept)
    )
    rows = records(small_disk / "runs" / "r" / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert sorted(r["doc_id"] for r in rows) == list(range(LIMIT)) and all(r["error"] is None for r in rows)


@pytest.fixture
def immutable() -> Iterator[list[Path]]:
    """Folders made immutable (`chattr +i`: no file can be made in them, even by root) and freed again."""
    folders: list[Path] = []
    yield folders
    for folder in folders:
        subprocess.run(["chattr", "-i", str(folder)], check=False)


def test_an_output_folder_made_unwritable_mid_run_stops_cleanly_and_the_same_command_resumes(
    tmp_path, immutable
):
    argv = run_argv(tmp_path / "runs")
    run_dir = tmp_path / "runs" / "r"
    store = run_dir / "cache" / "completions.jsonl"
    probe = tmp_path / "probe"
    probe.mkdir()
    if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
        pytest.skip(
            "this filesystem cannot make a folder immutable (chattr +i): no way to make it unwritable"
        )
    immutable.append(probe)
    samples = run_dir / "samples" / MODEL_DIR

    def freeze() -> None:  # the run folder and its samples folder: the final files cannot be made
        for folder in (run_dir, samples):
            subprocess.run(["chattr", "+i", str(folder)], check=True)
            immutable.append(folder)

    err = stopped_with(argv, store, freeze)
    assert "Writing the run's files in" in err and "Operation not permitted" in err
    assert "make the folder writable again" in err
    kept = whole_records(store)
    assert len(kept) == LIMIT  # generation went on into the open files: every result is kept
    assert len(records(samples / "ifeval.jsonl")) == LIMIT  # the live records, readable
    for folder in immutable:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    resumed = rayeval(*argv)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{LIMIT} requests, {LIMIT} reused" in resumed.stderr
    assert (run_dir / "summary.json").is_file() and (samples / "ifeval.parquet").is_file()
