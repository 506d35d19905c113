"""`cluster.Evaluator` inside a real training loop (tests/cluster/training/trainer.py: plain torch on the
embedded SmolLM2-135M, float32, CPU) on the test run's `ray start` cluster:

- weights pushed after optimizer steps 1 and 3 are served in memory: each step's greedy answers equal those of
  a fresh engine started from a checkpoint the trainer saved at that step, and differ from the base model's,
  whose answers step 0 gives; before step 3 the trainer moves the tied embeddings far, so an output
  projection the push left stale would answer differently; bad pushes are refused naming the first mismatch, before anything is sent;
- a LoRA adapter pushed live gives the answers of `rayeval run --lora` on the adapter the trainer saved;
- a trainer killed right after asking for step 1: the coordinator finishes step 1, then stops its engines.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runs import BASE_IFEVAL_ARGS, BASE_IFEVAL_LIMIT, BASE_IFEVAL_SAMPLES, rayeval, records
from tests.warm_cluster import warm_cluster


def train(mode: str, out: Path, timeout: int = 900, extra: tuple[str, ...] = ()) -> dict:
    shared = warm_cluster()
    report = out / f"{mode}.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.cluster.training.trainer", "--mode", mode, "--address",
         shared.head.gcs_address, "--output-dir", str(out), "--report", str(report), *extra],
        capture_output=True, text=True, timeout=timeout, env=shared.env(), check=False,
    )  # fmt: skip
    if mode != "die":
        assert done.returncode == 0, done.stderr[-4000:]
    assert report.is_file(), done.stderr[-4000:]
    return json.loads(report.read_text())


def answers(run_dir: Path) -> list[str]:
    rows = sorted(records(next(run_dir.glob("samples/*/ifeval.jsonl"))), key=lambda r: r["doc_id"])
    assert [r["doc_id"] for r in rows] == list(range(BASE_IFEVAL_LIMIT))
    return [r["output"] for r in rows]


def fresh_answers(checkpoint: Path, out: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """A `rayeval run` of the same settings on the saved folder: a full checkpoint on an engine of its own
    started from it; an adapter loaded from it by the tests' LoRA-capable pool (tests/warm_cluster.py)."""
    run_id = f"fresh-{checkpoint.name}"
    done = rayeval("run", *BASE_IFEVAL_ARGS, "--limit", str(BASE_IFEVAL_LIMIT), "--num-samples",
                   str(BASE_IFEVAL_SAMPLES), *extra, "--output-dir", str(out), "--run-id", run_id)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return answers(out / run_id)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("training")
    return out, train("full", out)


def test_pushed_weights_answer_as_a_fresh_engine_on_the_saved_checkpoint(trained, base_ifeval_records):
    out, report = trained
    steps = report["steps"]
    base = [r["output"] for r in sorted(base_ifeval_records, key=lambda r: r["doc_id"])]
    assert answers(Path(steps["0"]["run_dir"])) == base  # nothing pushed yet: the base model
    for step in ("1", "3"):
        pushed = answers(Path(steps[step]["run_dir"]))
        checkpoint = out / f"checkpoint-{step}"
        assert pushed == fresh_answers(checkpoint, out, ("--model", str(checkpoint)))
        assert pushed != base, f"step {step}'s training changed no greedy answer"
    assert answers(Path(steps["1"]["run_dir"])) != answers(Path(steps["3"]["run_dir"]))
    # the step folders say what they evaluated, and the replicas report the push
    weights = json.loads((Path(steps["3"]["run_dir"]) / "weights.json").read_text())
    assert weights["weights"] == "weights pushed by the trainer in memory" and weights["megabytes"] > 500
    assert [e["loaded_by"] for e in report["engines"]] == ["push"]


def test_a_push_returns_once_copied_and_the_replicas_serve_it_later(trained):
    _, report = trained
    for step in ("1", "3"):
        s = report["steps"][step]
        assert s["called_at"] <= s["returned_at"] <= s["serving_at"]
        # the handle's times lie within the trainer's own around the call (no tolerance: a loaded machine
        # can pause either side), and it got control back long before serving
        assert s["trainer_before"] <= s["called_at"] and s["returned_at"] <= s["trainer_after"]
        assert s["returned_at"] - s["called_at"] < s["serving_at"] - s["called_at"]
    # step 1's push was made while step 0 was still starting its engines and evaluating: the trainer got
    # control back, and the load began only after that
    assert report["steps"]["1"]["returned_at"] < report["steps"]["1"]["began_at"]
    # step 3's push waited for step 1's evaluation, queued behind it: steps in order
    first = Path(report["steps"]["1"]["run_dir"]) / "summary.json"
    assert report["steps"]["3"]["began_at"] >= first.stat().st_mtime - 1


def test_the_curve_and_the_folder_hold_every_step_and_match_the_step_tables(trained):
    out, report = trained
    curve = report["curve"]
    assert report["waited_steps"] == [0, 1, 3]  # wait() returned every step's result, in the order asked
    assert sorted({row["step"] for row in curve}) == [0, 1, 3]
    assert report["curve_after_close"] == curve  # the folder read back once the replicas are gone
    assert (
        report["after_close"].startswith("EvalInputError: evaluate(4): this Evaluator is closed")
        and "resume=True" in report["after_close"]
    )
    for step in ("0", "1", "3"):
        table = {(r["task"], r["metric"]): r["mean"] for r in report["steps"][step]["table"]}
        summary = json.loads((Path(report["steps"][step]["run_dir"]) / "summary.json").read_text())
        recomputed = {
            ("ifeval", m): body["mean"] for m, body in summary["tasks"]["ifeval"]["metrics"].items()
        }
        assert table == pytest.approx(recomputed)
        assert {
            (r["task"], r["metric"]): r["mean"] for r in curve if r["step"] == int(step)
        } == pytest.approx(table)
    folder = out / "train"
    assert (folder / "sweep_summary.csv").is_file() and list(folder.glob("*.png"))
    plotted = rayeval("plot", str(folder), "--output", str(out / "plot"))
    assert plotted.returncode == 0, plotted.stderr[-2000:]


def test_bad_pushes_are_refused_naming_the_first_mismatch(trained):
    _, report = trained
    wrapped, shape, missing = report["refused"]
    assert (
        "tensor 'module.model.embed_tokens.weight' is not a weight" in wrapped
        and "prefix 'module.'" in wrapped
    )
    assert "tensor 'model.norm.weight' has shape [7]" in shape and "[576]" in shape
    assert "first 'model.layers.3.mlp.up_proj.weight'" in missing and "partial=True" in missing
    assert all(m.startswith("EvalInputError") and "keep their weights" in m for m in report["refused"])


def test_a_pushed_adapter_answers_as_rayeval_run_with_the_saved_adapter(tmp_path, base_ifeval_records):
    """... and the evaluator's `log_to` puts the step into one MLflow run named after the training's folder,
    at its step (it once went to a run per step, at step 0)."""
    import mlflow

    from tests.mlflow_server import mlflow_server

    with mlflow_server(tmp_path / "mlflow") as uri:  # stopped after the training (its ~0.5 GB back)
        report = train("lora", tmp_path, extra=("--log-to", f"mlflow:{uri}"))
        client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("rayeval")
        runs = client.search_runs([experiment.experiment_id])
        assert [run.data.tags["rayeval.name"] for run in runs] == ["train-lora"]
        history = client.get_metric_history(runs[0].info.run_id, "ifeval/prompt_level_strict_acc")
    summary = json.loads((Path(report["steps"]["2"]["run_dir"]) / "summary.json").read_text())
    mean = summary["tasks"]["ifeval"]["metrics"]["prompt_level_strict_acc,none"]["mean"]
    assert [(m.step, m.value) for m in history] == [(2, pytest.approx(mean, abs=1e-9))]
    step_dir = Path(report["steps"]["2"]["run_dir"])
    failed = [
        json.loads(line)["error"]
        for line in (step_dir / "cache" / "completions.jsonl").read_text().splitlines()
    ]
    assert failed == [None] * len(failed), failed[:1]  # every request answered (LoRA layers on)
    pushed = answers(step_dir)
    assert pushed != [r["output"] for r in sorted(base_ifeval_records, key=lambda r: r["doc_id"])]
    saved = tmp_path / "adapter-step2"
    assert pushed == fresh_answers(saved, tmp_path, ("--lora", str(saved)))
    assert report["curve_steps"] == [2]


def test_a_trainer_that_dies_leaves_the_steps_it_asked_for_finished(tmp_path):
    report = train("die", tmp_path)
    assert report["asked"] == [1]
    summary = tmp_path / "train-died" / "step_1" / "summary.json"
    deadline = time.monotonic() + 300
    while not summary.is_file() and time.monotonic() < deadline:
        time.sleep(2)
    assert summary.is_file(), "the coordinator did not finish step 1 after the trainer died"
    assert json.loads(summary.read_text())["tasks"]["ifeval"]["metrics"]
    weights = json.loads((summary.parent / "weights.json").read_text())
    assert weights["weights"] == "weights pushed by the trainer in memory"  # the push was not lost
    shared = warm_cluster()
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, shared.head.gcs_address], capture_output=True, text=True,
        env={**shared.env(), "RAY_AUTH_MODE": "token"}, timeout=120, check=False,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert json.loads(probe.stdout.strip().splitlines()[-1]) == {"coordinator_alive": False}


PROBE = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
deadline = time.monotonic() + 60
while True:
    try:
        ray.get_actor("rayeval-training-train-died", namespace="rayeval")
        alive = True
    except ValueError:
        alive = False
    if not alive or time.monotonic() > deadline:
        break
    time.sleep(1)
print(json.dumps({"coordinator_alive": alive}))
"""
