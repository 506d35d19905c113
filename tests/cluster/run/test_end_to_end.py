"""End to end on a real local Ray cluster with real vLLM CPU engines of the embedded SmolLM2-135M-Instruct.

Nothing is mocked: `rayeval` runs as a user runs it (the console script in a subprocess), starts its own
Ray cluster or joins one started with `ray start`, and its engines generate for real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from tests.runs import (
    ENGINE_FLAGS,
    MODEL_DIR,
    engine_actor_pids,
    rayeval,
    records,
    start_in_background,
    wait_for_records,
    without_max_num_seqs,
)
from tests.warm_cluster import auto_pool, warm_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gsm8k_with_a_bad_prompt(tmp_path_factory, shared_gsm8k) -> Path:
    rows = shared_gsm8k.read_text().splitlines()[:3]
    too_long = json.dumps({"question": "How many apples? " * 600, "answer": "#### 1"})
    path = tmp_path_factory.mktemp("data") / "test.jsonl"
    path.write_text("\n".join([*rows, too_long]) + "\n")
    return path


@pytest.fixture(scope="module")
def two_replica_run(tmp_path_factory, gsm8k_with_a_bad_prompt):
    out = tmp_path_factory.mktemp("runs")
    argv = [
        "run", "--tasks", "ifeval,gsm8k", "--data-path", f"gsm8k={gsm8k_with_a_bad_prompt}", "--limit", "4",
        "--num-samples", "2", "--temperature", "0.7", "--replicas", "2", "--output-dir", str(out),
        "--run-id", "e2e", *ENGINE_FLAGS,
    ]  # fmt: skip
    first = rayeval(*argv)
    assert first.returncode == 0, first.stderr[-3000:]
    return argv, out / "e2e", first


def test_every_sample_scored_exactly_once_and_files_complete(two_replica_run):
    _, run_dir, result = two_replica_run
    samples = run_dir / "samples" / MODEL_DIR
    for task in ("ifeval", "gsm8k"):
        rows = records(samples / f"{task}.jsonl")
        assert len(rows) == 4 * 2
        assert sorted((r["doc_id"], r["sample_index"]) for r in rows) == [
            (d, s) for d in range(4) for s in range(2)
        ]
        assert pq.read_table(samples / f"{task}.parquet").num_rows == 8
        for row in rows:
            assert row["prompt"].startswith("<|im_start|>")  # the chat template was applied
            if row["error"] is None:
                assert row["scores"] and row["output_tokens"] > 0 and row["replica"].startswith("replica-")
    assert (run_dir / "config.yaml").is_file()
    assert "prompt_level_strict_acc,none" in result.stdout


def test_both_replicas_did_work(two_replica_run):
    _, run_dir, _ = two_replica_run
    summary = json.loads((run_dir / "summary.json").read_text())
    per_replica = summary["run"]["dispatch"]["per_replica"]
    assert set(per_replica) == {"replica-0", "replica-1"}
    assert all(stats["sequences"] > 0 for stats in per_replica.values())
    assert sum(stats["sequences"] for stats in per_replica.values()) == 16


def test_auto_dtype_became_what_the_cpu_computes_fast(two_replica_run):
    from cluster.engines import cpu_has_native_bf16

    _, run_dir, _ = two_replica_run
    engines = json.loads((run_dir / "summary.json").read_text())["run"]["engines"]
    expected = "bfloat16" if cpu_has_native_bf16() else "float32"
    assert [e["dtype"] for e in engines] == [expected, expected]


def test_failing_prompt_is_counted_not_fatal(two_replica_run):
    _, run_dir, _ = two_replica_run
    summary = json.loads((run_dir / "summary.json").read_text())
    gsm8k = summary["tasks"]["gsm8k"]
    assert gsm8k["failed"] == 2  # the too-long question, both of its samples
    assert list(gsm8k["failure_reasons"]) == ["VLLMValidationError"]
    assert summary["run"]["samples_failed"] == 2
    strict = gsm8k["metrics"]["exact_match,strict-match"]
    assert strict["n"] == 2 and strict["questions"] == 3 and strict["scored_samples"] == 6
    rows = records(run_dir / "samples" / MODEL_DIR / "gsm8k.jsonl")
    assert [r["doc_id"] for r in rows if r["error"]] == [3, 3]
    assert "maximum context length" in rows[-1]["error"]


def test_results_json_is_lm_eval_shaped(two_replica_run):
    _, run_dir, _ = two_replica_run
    results = json.loads((run_dir / "results.json").read_text())
    ifeval = results["results"]["ifeval"]
    for key in (
        "prompt_level_strict_acc,none",
        "inst_level_loose_acc,none",
        "prompt_level_strict_acc_stderr,none",
    ):
        assert 0.0 <= ifeval[key] <= 1.0
    assert set(results["results"]["gsm8k"]) >= {"exact_match,strict-match", "exact_match,flexible-extract"}
    assert results["versions"] == {"ifeval": "4.0", "gsm8k": "3.0"}


def test_rerun_reuses_everything_and_writes_the_same_results(two_replica_run):
    argv, run_dir, _ = two_replica_run
    before = {p.name: p.read_bytes() for p in (run_dir / "samples" / MODEL_DIR).glob("*.jsonl")}
    results_before = json.loads((run_dir / "results.json").read_text())["results"]
    second = rayeval(*argv)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "16 requests, 16 reused" in second.stderr and "0 to generate" in second.stderr
    assert "starting" not in second.stderr  # no engine was started
    after = {p.name: p.read_bytes() for p in (run_dir / "samples" / MODEL_DIR).glob("*.jsonl")}
    assert after == before
    assert json.loads((run_dir / "results.json").read_text())["results"] == results_before


def test_interrupted_run_resumes_on_an_existing_cluster(tmp_path):
    """Ctrl-C half way, then the same command against a cluster from `ray start` (the tests' shared one, whose
    warm pool generates the rest): only the rest is generated."""
    argv = [
        "run",
        "--tasks",
        "ifeval",
        "--limit",
        "10",
        "--output-dir",
        str(tmp_path),
        "--run-id",
        "cut",
        "--max-num-seqs",
        "2",
        *ENGINE_FLAGS,
    ]  # fmt: skip  (two sequences in flight, so completions arrive a pair at a time and the cut lands mid-run)
    store = tmp_path / "cut" / "cache" / "completions.jsonl"
    shared = warm_cluster()
    # Without --address rayeval starts its own cluster, even with a `ray start` cluster on the machine.
    proc = start_in_background(argv)
    wait_for_records(proc, store, 3)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    done_before = len(store.read_text().splitlines())
    assert proc.returncode != 0 and 3 <= done_before < 10, err[-2000:]
    assert "started a local Ray cluster" in err
    resumed = rayeval(*without_max_num_seqs(argv), *shared.run_args(), env=shared.env())  # as a job's run
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"engines: warm (pool {auto_pool()}" in resumed.stdout
    assert "connected to Ray cluster" in resumed.stderr
    assert f"10 requests, {done_before} reused" in resumed.stderr
    assert f"{10 - done_before} to generate" in resumed.stderr
    rows = records(tmp_path / "cut" / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert sorted(r["doc_id"] for r in rows) == list(range(10))
    assert len(store.read_text().splitlines()) == 10
    # the resumed run's tokens: all ten records in the totals; as generated (and in its tokens per second)
    # only what it appended to the store after the first run's completions
    tokens = json.loads((tmp_path / "cut" / "summary.json").read_text())["run"]["tokens"]
    appended = records(store)[done_before:]
    assert tokens["output_tokens"] == sum(r["output_tokens"] for r in rows)
    assert tokens["generated"]["output_tokens"] == sum(c["output_tokens"] for c in appended) > 0
    assert tokens["generated"]["output_tokens"] < tokens["output_tokens"]
    assert "(the rest read back from the run's store)" in resumed.stdout


@pytest.fixture(scope="module")
def tensor_parallel_verbose_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One replica of three tensor-parallel workers (SmolLM2 has 9 attention heads and 3 KV heads, so TP=3
    divides it; the workers share 2 cores), run with --verbose and vLLM's stats every half second."""
    out = tmp_path_factory.mktemp("tp3")
    env = {**os.environ, "VLLM_LOG_STATS_INTERVAL": "0.5"}  # the engines inherit it from the Ray cluster
    argv = ["run", "--tensor-parallel-size", "3", "--limit", "2", "--verbose", "--output-dir", str(out),
            "--run-id", "tp3", *ENGINE_FLAGS]  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "cluster.cli", *argv], capture_output=True, text=True,
                            timeout=900, env=env, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "tp3", result


def test_tensor_parallel_replica_from_one_placement_group(tensor_parallel_verbose_run):
    run_dir, result = tensor_parallel_verbose_run
    assert "{3 CPU} for 3 engine worker(s)" in result.stderr
    run = json.loads((run_dir / "summary.json").read_text())["run"]
    assert run["tensor_parallel_size"] == 3 and run["replica_resources"] == {"CPU": 3.0}
    rows = records(run_dir / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert len(rows) == 2 and all(r["error"] is None and r["output_tokens"] > 0 for r in rows)


def test_verbose_shows_each_engines_vllm_stats_and_the_dispatch_timeline(tensor_parallel_verbose_run):
    run_dir, result = tensor_parallel_verbose_run
    logged = result.stdout + result.stderr
    assert "Running: " in logged and "Waiting: " in logged  # vLLM's periodic engine stats
    assert "after the last request was handed out (the tail)" in logged
    run = json.loads((run_dir / "summary.json").read_text())["run"]
    dispatch = run["dispatch"]
    assert dispatch["first_handout_at"] <= dispatch["last_handout_at"] <= dispatch["last_finish_at"]
    assert dispatch["per_replica"]["replica-0"]["last_finish_at"] == dispatch["last_finish_at"]
    assert run["engines"][0]["max_num_batched_tokens"] > 0


def ended(process: psutil.Process) -> bool:
    """Gone, or a zombie (ended, not yet reaped)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_losing_every_replica_fails_clearly_and_loses_nothing(tmp_path):
    """The only replica is killed mid-run and no replacement is allowed: exit 1 naming the cause; a rerun
    generates only what was missing."""
    argv = ["run", "--tasks", "ifeval", "--limit", "8", "--output-dir", str(tmp_path), "--run-id", "lost",
            "--max-num-seqs", "2", "--replica-restarts", "0", *ENGINE_FLAGS]  # fmt: skip
    store = tmp_path / "lost" / "cache" / "completions.jsonl"
    proc = start_in_background(argv)
    wait_for_records(proc, store, 2)
    (actor,) = engine_actor_pids()
    # its engine core: forked from the actor's forkserver (the actor's child), so the actor's grandchild
    cores = [p for p in psutil.Process(actor).children(recursive=True) if p.name().startswith("VLLM::Engine")]
    assert len(cores) == 1, cores
    os.kill(actor, signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]
    assert "Every engine replica died (replica-0:" in err and "Traceback" not in err
    assert all(map(ended, cores)), cores  # it ended with the actor
    kept = records(store)
    assert kept and all(r["error"] is None for r in kept)  # deaths are not cached as results
    resumed = rayeval(*without_max_num_seqs(argv))  # on the tests' warm pool, where the cluster is shared
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"8 requests, {len(kept)} reused" in resumed.stderr
    rows = records(tmp_path / "lost" / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert sorted(r["doc_id"] for r in rows) == list(range(8)) and all(r["error"] is None for r in rows)


def test_an_asked_for_chat_template_the_tokenizer_lacks_fails_before_any_engine_starts(tmp_path):
    # The embedded model's files, its chat template taken out (the weights are linked, not copied).
    from cluster.models import resolve_model

    source = Path(resolve_model(None).path)
    model = tmp_path / "no-template"
    model.mkdir()
    for item in source.iterdir():
        if item.name == "tokenizer_config.json":
            settings = json.loads(item.read_text())
            settings.pop("chat_template", None)
            (model / item.name).write_text(json.dumps(settings))
        elif item.name != "chat_template.jinja":
            (model / item.name).symlink_to(item)
    done = rayeval("run", "--model", str(model), "--chat-template", "--tasks", "ifeval", "--limit", "2",
                   "--output-dir", str(tmp_path / "runs"), *ENGINE_FLAGS)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--chat-template was asked for, but the tokenizer of" in done.stderr
    assert "starting 1 engine replica" not in done.stderr and "Traceback" not in done.stderr
