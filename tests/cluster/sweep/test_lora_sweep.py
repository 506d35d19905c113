"""`rayeval sweep` over LoRA adapters made here with peft for the embedded default model: every good adapter
is scored on the same base-model engines (one engine per replica for the whole sweep), a broken one is
skipped with its reason, a zero-initialised one reproduces the base model's greedy outputs exactly, and
the same command again generates nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cluster.run.test_lora import make_adapter
from tests.runs import BASE_IFEVAL_ARGS, MODEL_DIR, rayeval, records


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    """A training run's folder: step_100 zero-initialised, step_200 random, step_300 broken (rank 64)."""
    run = tmp_path_factory.mktemp("lora-run")
    make_adapter(run / "step_100", random_init=False)
    make_adapter(run / "checkpoint-200", random_init=True)
    broken = run / "step_300"
    shutil.copytree(run / "step_100", broken)
    config = json.loads((broken / "adapter_config.json").read_text()) | {"r": 64}
    (broken / "adapter_config.json").write_text(json.dumps(config))
    return run


# the base model's settings (float32, whose CPU kernels are batch-invariant, so the zero adapter's outputs
# cannot depend on sharing its batches with the other adapter's requests)
COMMON = [*BASE_IFEVAL_ARGS, "--limit", "3"]


@pytest.fixture(scope="module")
def base_outputs(base_ifeval_records) -> list[str]:
    return [r["output"] for r in base_ifeval_records[:3]]


def test_a_lora_sweep_scores_every_good_adapter_on_one_engine_per_replica(lora_run, base_outputs, tmp_path):
    common = [*COMMON, "--output-dir", str(tmp_path)]
    done = rayeval("sweep", str(lora_run), *common, "--run-id", "sweep", "--replicas", "2")
    assert done.returncode == 0, done.stderr[-3000:]

    sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    by_step = {s["step"]: s for s in sweep["steps"]}
    assert [by_step[s]["status"] for s in (100, 200, 300)] == ["done", "done", "skipped"]
    assert "rank 64 is above the engine's max_lora_rank 16" in by_step[300]["reason"]
    assert "step 300" in done.stdout and "skipped" in done.stdout
    # one pool of two engines served both adapters: the same two engine processes in both steps
    assert sweep["engine_starts"] == 1
    assert sorted(by_step[100]["engine_pids"]) == sorted(by_step[200]["engine_pids"])
    assert len(set(by_step[100]["engine_pids"])) == 2

    zero = records(tmp_path / "sweep" / "step_100" / "samples" / f"{MODEL_DIR}+step_100" / "ifeval.jsonl")
    tuned = records(
        tmp_path / "sweep" / "step_200" / "samples" / f"{MODEL_DIR}+checkpoint-200" / "ifeval.jsonl"
    )
    assert [r["output"] for r in zero] == base_outputs and len(zero) == 3
    assert [r["output"] for r in tuned] != base_outputs

    summary = (tmp_path / "sweep" / "sweep_summary.csv").read_text().splitlines()
    assert summary[0].startswith("series,step,task,metric")
    assert {line.split(",")[1] for line in summary[1:]} == {"100", "200"}
    assert (tmp_path / "sweep" / "ifeval.png").stat().st_size > 0

    again = rayeval("sweep", str(lora_run), *common, "--run-id", "sweep", "--replicas", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["engine_starts"] == 0
    assert "0 of 3 requests generated" in again.stdout


def test_merged_adapters_run_as_checkpoints_on_the_same_engines(lora_run, base_outputs, tmp_path):
    done = rayeval("sweep", str(lora_run), *COMMON, "--output-dir", str(tmp_path), "--lora-merge")
    assert done.returncode == 0, done.stderr[-3000:]
    root = tmp_path / f"sweep-{lora_run.name}"
    by_step = {s["step"]: s for s in json.loads((root / "sweep.json").read_text())["steps"]}
    assert [by_step[s]["status"] for s in (100, 200, 300)] == ["done", "done", "skipped"]
    assert by_step[100]["loaded_by"] == ["start"] and by_step[200]["loaded_by"] == ["reload"]
    assert by_step[100]["engine_pids"] == by_step[200]["engine_pids"]
    zero = records(root / "step_100" / "samples" / f"{MODEL_DIR}+step_100" / "ifeval.jsonl")
    assert [r["output"] for r in zero] == base_outputs  # B = 0: the merged weights are the base weights
