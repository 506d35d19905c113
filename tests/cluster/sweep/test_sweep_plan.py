"""A sweep's plan, made without Ray or engines: each checkpoint a step with its own run folder, a bad
adapter skipped with its reason, and the settings a sweep cannot honour refused before anything starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cluster.cli.app import main
from cluster.config import build_config
from cluster.models import CheckpointKind
from cluster.sweep import build_sweep_plan
from evaluators.errors import EvalInputError
from tests.cluster.models.test_checkpoints import adapter, base_model  # noqa: F401 - fixtures


@pytest.fixture
def lora_run(tmp_path, adapter) -> Path:  # noqa: F811 - the fixture above
    run = tmp_path / "run"
    shutil.copytree(adapter, run / "step_100")
    shutil.copytree(adapter, run / "checkpoint-200")
    shutil.copytree(adapter, run / "step_300")
    config = json.loads((run / "step_300" / "adapter_config.json").read_text()) | {"r": 32}
    (run / "step_300" / "adapter_config.json").write_text(json.dumps(config))
    return run


def config(tmp_path: Path, **fields):  # noqa: ANN201 - a RunConfig
    return build_config({"tasks": ["ifeval"], "output_dir": str(tmp_path / "out"), **fields}, {}, "the test")


def test_each_adapter_is_a_step_with_its_own_run_folder_and_a_bad_one_is_skipped(tmp_path, lora_run):
    plan = build_sweep_plan(config(tmp_path), lora_run, materialise_model=False)
    assert [(s.step, s.kind) for s in plan.steps] == [(100, CheckpointKind.LORA), (200, CheckpointKind.LORA)]
    assert plan.root == tmp_path / "out" / "sweep-run" and plan.max_loras == 2
    step = plan.steps[1].plan
    assert (step.config.output_dir, step.config.run_id) == (str(plan.root), "step_200")
    assert step.adapter is not None and step.adapter.name == "checkpoint-200"
    assert step.model_label == "SmolLM2-135M-Instruct+checkpoint-200"
    (skipped,) = plan.skipped
    assert skipped.step == 300 and "rank 32 is above the engine's max_lora_rank 16" in skipped.reason
    only = build_sweep_plan(config(tmp_path, run_id="mine"), lora_run, steps=[200], materialise_model=False)
    assert [s.step for s in only.steps] == [200] and only.root == tmp_path / "out" / "mine"


def test_what_a_sweep_cannot_do_is_refused_with_the_fix(tmp_path, lora_run):
    with pytest.raises(EvalInputError, match="drop --lora"):
        build_sweep_plan(config(tmp_path, model={"lora": str(lora_run / "step_100")}), lora_run)
    judged = config(tmp_path, tasks=["alpaca_eval"], judge={"model": "local:some/judge"})
    with pytest.raises(EvalInputError, match="does not run a local judge"):
        build_sweep_plan(judged, lora_run, materialise_model=False)


def test_the_dry_run_lists_steps_and_skips(tmp_path, lora_run, capsys):
    assert (
        main(["sweep", str(lora_run), "--tasks", "ifeval", "--output-dir", str(tmp_path), "--dry-run"]) == 0
    )
    shown = capsys.readouterr().out
    assert "step      100      LoRA adapter on SmolLM2-135M-Instruct" in shown
    assert "skipped   300" in shown and "task      ifeval" in shown
    with pytest.raises(SystemExit):
        main(["sweep", str(lora_run), "--steps", "1,x"])
    assert "is not a comma-separated list of steps" in capsys.readouterr().err


def test_merged_adapters_have_no_rank_limit_and_what_the_merge_cannot_do_is_skipped(tmp_path, lora_run):
    """The engines' max_lora_rank limits only adapters served through vLLM's LoRA layers; merged, a rank-32
    adapter runs, and an adapter the merge does not do (DoRA) is skipped saying so, as vLLM's LoRA layers,
    which do not serve it either, skip it when served."""
    shutil.copytree(lora_run / "step_100", lora_run / "step_400")
    config_file = lora_run / "step_400" / "adapter_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"use_dora": True}))
    merged = build_sweep_plan(config(tmp_path), lora_run, materialise_model=False, lora_merge=True)
    assert [s.step for s in merged.steps] == [100, 200, 300]
    (skipped,) = merged.skipped
    assert skipped.step == 400 and "it uses DoRA (use_dora), which this merge does not do" in skipped.reason
    plan = build_sweep_plan(config(tmp_path), lora_run, materialise_model=False)
    reasons = {s.step: s.reason for s in plan.skipped}
    assert "rank 32 is above" in reasons[300] and "vLLM does not serve DoRA (use_dora)" in reasons[400]
