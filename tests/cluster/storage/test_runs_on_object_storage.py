"""Runs whose folder is on a real S3-compatible server (SeaweedFS on loopback): every file there and the same
as a local run of the same command; killed mid-run and resumed from another working folder and another
staging folder (another node's disk): every sample once, only the missing ones generated; the store stopped
mid-run: nothing lost, the rerun uploads it; compare reads the store. The runs generate on the test run's
warm pool of float32 engines (tests/warm_cluster.py), so they start no engine of their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cluster.cli.front_paths import WARM_CLI_ENV
from cluster.storage import RemoteFolder
from tests.object_store import ObjectStore
from tests.runs import (
    BASE_IFEVAL_ARGS,
    BASE_IFEVAL_LIMIT,
    BASE_IFEVAL_SAMPLES,
    MODEL_DIR,
    rayeval,
    records,
    start_in_background,
)
from tests.warm_cluster import enabled, warm_cluster

SAMPLES = f"samples/{MODEL_DIR}/ifeval.jsonl"
JOURNAL = "cache/completions.jsonl"
# fields that say when and how fast, not what: they differ between two runs of the same outputs
TIMING = {"latency_s", "ttft_s", "finished_at", "replica", "queue_s"}


def lines(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def what(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def node_env(store: ObjectStore, node: Path) -> dict[str, str]:
    """A node: the store's credentials in its environment, its own staging disk."""
    return {**store.env(), "RAYEVAL_STAGING_DIR": str(node / "staging")}


def test_a_run_on_the_store_writes_every_file_as_the_local_run_does(
    s3: ObjectStore, base_ifeval_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    done = rayeval("run", *BASE_IFEVAL_ARGS, "--limit", str(BASE_IFEVAL_LIMIT), "--num-samples",
                   str(BASE_IFEVAL_SAMPLES), "--output-dir", s3.uri("same"), "--run-id", "base",
                   env=node_env(s3, tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"results in {s3.uri('same')}/base (" in done.stdout
    stored = s3.read("same/base")
    local = {str(p.relative_to(base_ifeval_run)) for p in base_ifeval_run.rglob("*") if p.is_file()}
    assert set(stored) == {name for name in local if not Path(name).name.startswith(".")}
    assert not any(".parts/" in name for name in stored)
    assert what(lines(stored[SAMPLES])) == what(records(base_ifeval_run / SAMPLES))
    here, there = (
        json.loads(stored["summary.json"]),
        json.loads((base_ifeval_run / "summary.json").read_text()),
    )
    assert here["tasks"] == there["tasks"]
    assert len(lines(stored[JOURNAL])) == BASE_IFEVAL_LIMIT  # greedy N = 4 asked: one request per question

    # compare reads both folders from the store and from disk: the same outputs, every difference 0
    compared = rayeval("compare", str(base_ifeval_run), s3.uri("same/base"), "--output",
                       str(tmp_path / "compare.json"), env=node_env(s3, tmp_path / "reader"))  # fmt: skip
    assert compared.returncode == 0, compared.stderr[-3000:]
    rows = json.loads((tmp_path / "compare.json").read_text())["metrics"]
    assert rows and all(row["difference"] == 0 and row["questions"] == BASE_IFEVAL_LIMIT for row in rows)

    # the Python API reads it too: the Parquet records, as a DataFrame per task
    for name, value in node_env(s3, tmp_path / "notebook").items():
        monkeypatch.setenv(name, value)
    import cluster

    frame = cluster.load_records(s3.uri("same/base"))["ifeval"]
    assert list(frame["output"]) == [row["output"] for row in records(base_ifeval_run / SAMPLES)]


def _journal_on_store(store: ObjectStore, prefix: str) -> list[dict]:
    """The journal as a pull assembles it: the whole object, then the parts in byte order."""
    stored = store.read(prefix)
    parts = sorted(name for name in stored if name.startswith(f"{JOURNAL}.parts/"))
    return lines(stored.get(JOURNAL, b"") + b"".join(stored[name] for name in parts))


def _wait_for_journal_lines(store: ObjectStore, prefix: str, proc: subprocess.Popen[str], count: int) -> None:
    """Until the journal on the store holds `count` lines (the run still going)."""
    deadline = time.time() + 600
    while time.time() < deadline and len(_journal_on_store(store, prefix)) < count:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)


def _start(argv: list[str], env: dict[str, str], cwd: Path):
    cluster = warm_cluster()
    cwd.mkdir(parents=True, exist_ok=True)
    return start_in_background([*argv, *cluster.run_args()], env={**cluster.env(), **env}, cwd=cwd)


@pytest.mark.skipif(not enabled(), reason="runs on the test run's shared cluster (RAYEVAL_TESTS_LOCAL=1)")
def test_a_killed_run_resumes_from_the_store_on_another_node_generating_only_the_missing(
    s3: ObjectStore, tmp_path: Path
):
    total = 30
    # four requests in flight (so the journal grows a few lines at a time, and the kill lands mid-run on any
    # CPU); the resumed run below leaves the last six arguments out
    argv = ["run", *BASE_IFEVAL_ARGS, "--limit", str(total), "--output-dir", s3.uri("killed"), "--run-id", "r",
            "--sync-every", "2", "--sync-interval", "1s", "--max-in-flight", "4"]  # fmt: skip
    # a driver that dies: in its own process, not forked by the warm CLI server (which would interrupt it)
    proc = _start(argv, {**node_env(s3, tmp_path / "node-a"), WARM_CLI_ENV: "0"}, tmp_path / "node-a")
    _wait_for_journal_lines(s3, "killed/r", proc, 2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = _journal_on_store(s3, "killed/r")
    assert 2 <= len(kept) < total

    # another node: another working folder, nothing staged; what the store holds is all it has
    (tmp_path / "node-b").mkdir()
    resumed = rayeval(*argv[:-6], env=node_env(s3, tmp_path / "node-b"), cwd=tmp_path / "node-b")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{total} requests, {len(kept)} reused" in resumed.stderr
    journal = lines(s3.read("killed/r")[JOURNAL])
    ids = [row["request_id"] for row in journal]
    assert len(ids) == len(set(ids)) == total
    assert {row["request_id"] for row in kept} <= set(ids)
    samples = lines(s3.read("killed/r")[SAMPLES])
    assert sorted(row["doc_id"] for row in samples) == list(range(total))


@pytest.mark.skipif(not enabled(), reason="runs on the test run's shared cluster (RAYEVAL_TESTS_LOCAL=1)")
def test_a_store_that_stops_mid_run_loses_nothing_and_the_rerun_uploads_the_folder(
    s3: ObjectStore, tmp_path: Path
):
    total = 24
    # four requests in flight: the run outlasts the store's shutdown on any CPU; the rerun below leaves the
    # last six arguments out
    argv = ["run", *BASE_IFEVAL_ARGS, "--limit", str(total), "--output-dir", s3.uri("outage"), "--run-id", "r",
            "--sync-every", "2", "--sync-interval", "1s", "--max-in-flight", "4"]  # fmt: skip
    env = node_env(s3, tmp_path / "node")
    proc = _start(argv, env, tmp_path / "node")
    _wait_for_journal_lines(s3, "outage/r", proc, 2)
    s3.stop()
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        s3.restart()
    assert proc.returncode == 1, err[-3000:]
    # the run went on without the store (a push that failed mid-run says so: `the run goes on`, unless the
    # server answered one last push while it shut down), and its end names the folder that holds everything
    assert "the store cannot be reached" in err and "while uploading the finished run folder" in err, err[
        -4000:
    ]
    with (
        pytest.MonkeyPatch.context() as node
    ):  # the node's staging folder, by the store its environment names
        for name, value in env.items():
            node.setenv(name, value)
        staged = RemoteFolder.parse(s3.uri("outage/r")).staging
    assert f"Nothing is lost: the whole folder is in {staged}" in err
    assert len(records(staged / JOURNAL)) == total

    again = rayeval(*argv[:-6], env=env)  # the same node once the store is back
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{total} requests, {total} reused" in again.stderr
    stored = s3.read("outage/r")
    assert len(lines(stored[JOURNAL])) == total and "summary.json" in stored
    assert not any(".parts/" in name for name in stored)
