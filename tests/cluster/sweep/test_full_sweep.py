"""`rayeval sweep` over full checkpoints: saved copies of the embedded default model, one with perturbed
weights. Two replicas score every step; each replica's engine moves from one checkpoint to the next in the
same actor process (an in-place weight reload, or a new engine where the tied embeddings changed), and its
outputs are those of a fresh engine on that checkpoint. Run again with a new step, the sweep evaluates only
that step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cluster.models import ensure_default_model
from tests.runs import ENGINE_FLAGS, rayeval, records

WEIGHTS = "model.safetensors"


def save_copy(folder: Path, perturb: str | None = None) -> Path:
    """The default model's files in `folder` (linked, not copied), its weights perturbed where `perturb`
    says which: "layers" (every 2-D weight but the embeddings) or "embeddings" (the tied embeddings only)."""
    import torch
    from safetensors.torch import load_file, save_file

    source = ensure_default_model()
    folder.mkdir(parents=True)
    for item in source.iterdir():
        if item.name != WEIGHTS or perturb is None:
            os.link(item, folder / item.name)
    if perturb is not None:
        weights = load_file(source / WEIGHTS)
        noise = torch.Generator().manual_seed(0)
        for name, tensor in weights.items():
            if tensor.ndim == 2 and ("embed" in name) == (perturb == "embeddings"):
                weights[name] = tensor + 0.02 * torch.randn(tensor.shape, generator=noise).to(tensor.dtype)
        save_file(weights, folder / WEIGHTS, metadata={"format": "pt"})
    return folder


def outputs(run_dir: Path) -> list[str]:
    (samples,) = run_dir.glob("samples/*/ifeval.jsonl")
    return [r["output"] for r in records(samples)]


@pytest.fixture(scope="module")
def training_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("full-run")
    save_copy(run / "step_100")
    save_copy(run / "step_200", perturb="layers")
    save_copy(run / "step_300")
    save_copy(run / "step_400", perturb="embeddings")
    return run


def test_a_full_checkpoint_sweep_moves_warm_engines_and_resumes_a_new_step(training_run, tmp_path):
    # float32: batch-invariant on CPU, so outputs depend on the weights alone
    common = [
        "--tasks",
        "ifeval",
        "--limit",
        "4",
        "--dtype",
        "float32",
        "--output-dir",
        str(tmp_path),
        *ENGINE_FLAGS,
    ]
    sweep = ["sweep", str(training_run), *common, "--run-id", "sweep", "--replicas", "2"]
    done = rayeval(*sweep)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = {s["step"]: s for s in json.loads((tmp_path / "sweep" / "sweep.json").read_text())["steps"]}
    assert [steps[s]["status"] for s in (100, 200, 300, 400)] == ["done"] * 4
    pids = sorted(steps[100]["engine_pids"])
    assert len(pids) == 2 and all(sorted(steps[s]["engine_pids"]) == pids for s in (200, 300, 400))
    loaded_by = [steps[s]["loaded_by"] for s in (100, 200, 300, 400)]
    assert loaded_by == [["start"] * 2, ["reload"] * 2, ["reload"] * 2, ["rebuild"] * 2]

    first, perturbed, third = (outputs(tmp_path / "sweep" / f"step_{s}") for s in (100, 200, 300))
    assert third == first and perturbed != first  # the reload back restored the first weights exactly
    fresh = rayeval("run", "--model", str(training_run / "step_200"), *common, "--run-id", "fresh")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert outputs(tmp_path / "fresh") == perturbed  # a reloaded engine answers as a new one would

    assert outputs(tmp_path / "sweep" / "step_400") not in (first, perturbed)

    save_copy(training_run / "step_500")
    again = rayeval(*sweep)
    assert again.returncode == 0, again.stderr[-3000:]
    steps = {s["step"]: s for s in json.loads((tmp_path / "sweep" / "sweep.json").read_text())["steps"]}
    assert [steps[s]["requests_generated"] for s in (100, 200, 300, 400, 500)] == [0, 0, 0, 0, 4]
    assert steps[500]["loaded_by"] == ["start"] * 2  # the only step with work started the engines on it
    assert outputs(tmp_path / "sweep" / "step_500") == first
    csv_steps = {
        line.split(",")[1] for line in (tmp_path / "sweep" / "sweep_summary.csv").read_text().splitlines()[1:]
    }
    assert csv_steps == {"100", "200", "300", "400", "500"}
