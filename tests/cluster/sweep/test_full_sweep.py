"""`rayeval sweep` over full checkpoints: saved copies of the embedded default model, one with perturbed
layers, one storing perturbed tied embeddings as lm_head.weight. Two replicas score every step; each
replica's engine moves from one checkpoint to the next in the same actor process (an in-place weight reload,
checked after it, or a new engine where the tensors changed in a way a reload cannot give). Run again with
two new steps, the sweep evaluates only those: one holds the rebuilt step's weights and is the first engine
the second sweep starts (a rebuilt engine answers as a started one), the other holds the reloaded step's
weights and is reached by a rebuild (a reloaded engine answers as a new one). Which move each kind of change
needs (.bin files, embeddings under either name) is decided on the files alone and tested there
(tests/cluster/models/test_checkpoints.py); a rebuild is the same move whatever asked for it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cluster.models import ensure_default_model
from tests.runs import ENGINE_FLAGS, rayeval, records

WEIGHTS = "model.safetensors"
EMBEDDINGS = "model.embed_tokens.weight"


def save_copy(
    folder: Path,
    perturb: str | None = None,
    *,
    seed: int = 0,
    as_bin: bool = False,
    tied_as: str | None = None,
) -> Path:
    """The default model's files in `folder` (linked, not copied), its weights perturbed where `perturb`
    says which: "layers" (every 2-D weight but the embeddings) or "embeddings" (the tied embeddings only),
    with noise drawn from `seed`. `as_bin` writes the weights as pytorch_model.bin; `tied_as` stores the tied
    embeddings under another name (`lm_head.weight`: vLLM and transformers load either side of a tie)."""
    import torch
    from safetensors.torch import load_file, save_file

    source = ensure_default_model()
    folder.mkdir(parents=True)
    rewrite = perturb is not None or as_bin or tied_as is not None
    for item in source.iterdir():
        if item.name != WEIGHTS or not rewrite:
            os.link(item, folder / item.name)
    if not rewrite:
        return folder
    weights = load_file(source / WEIGHTS)
    noise = torch.Generator().manual_seed(seed)
    for name, tensor in weights.items():
        if perturb is not None and tensor.ndim == 2 and ("embed" in name) == (perturb == "embeddings"):
            weights[name] = tensor + 0.02 * torch.randn(tensor.shape, generator=noise).to(tensor.dtype)
    if tied_as is not None:
        weights[tied_as] = weights.pop(EMBEDDINGS)
    if as_bin:
        torch.save(weights, folder / "pytorch_model.bin")
    else:
        save_file(weights, folder / WEIGHTS, metadata={"format": "pt"})
    return folder


def outputs(run_dir: Path) -> list[str]:
    return [output for output, _ in scored(run_dir)]


def scored(run_dir: Path) -> list[tuple[str, dict]]:
    (samples,) = run_dir.glob("samples/*/ifeval.jsonl")
    return [(r["output"], r["scores"]) for r in records(samples)]


@pytest.fixture(scope="module")
def training_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("full-run")
    save_copy(run / "step_100")
    save_copy(run / "step_200", perturb="layers")
    save_copy(run / "step_300")
    # perturbed tied embeddings stored under the other name: a reload cannot refresh the output side
    save_copy(run / "step_470", perturb="embeddings", seed=3, tied_as="lm_head.weight")
    return run


STEPS = (100, 200, 300, 470)


def test_a_full_checkpoint_sweep_moves_warm_engines_and_resumes_with_new_steps(training_run, tmp_path):
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
    assert "nanobind" not in done.stderr and "leaked" not in done.stderr  # no library noise after the result
    steps = {s["step"]: s for s in json.loads((tmp_path / "sweep" / "sweep.json").read_text())["steps"]}
    assert [steps[s]["status"] for s in STEPS] == ["done"] * len(STEPS)
    pids = sorted(steps[100]["engine_pids"])
    assert len(pids) == 2 and all(sorted(steps[s]["engine_pids"]) == pids for s in STEPS)
    loaded_by = [steps[s]["loaded_by"] for s in STEPS]
    assert loaded_by == [["start"] * 2, ["reload"] * 2, ["reload"] * 2, ["rebuild"] * 2]
    assert steps[200]["load_notes"] == ["same architecture and tokenizer; the reload check passed"] * 2
    assert all(
        n.startswith("the checkpoints name their tensors differently") for n in steps[470]["load_notes"]
    )

    first, perturbed, third = (outputs(tmp_path / "sweep" / f"step_{s}") for s in (100, 200, 300))
    assert third == first and perturbed != first  # the reload back restored the first weights exactly
    assert outputs(tmp_path / "sweep" / "step_470") not in (first, perturbed)

    # New steps: 500 holds step 470's weights and 600 step 200's. The second sweep starts its engines on 500
    # (the first of the two steps with work) and moves them to 600 with a new engine (the tensors are named
    # differently): the rebuilt step 470 answers as the started 500, the reloaded 200 as the rebuilt 600.
    save_copy(training_run / "step_500", perturb="embeddings", seed=3, tied_as="lm_head.weight")
    save_copy(training_run / "step_600", perturb="layers")
    again = rayeval(*sweep)
    assert again.returncode == 0, again.stderr[-3000:]
    steps = {s["step"]: s for s in json.loads((tmp_path / "sweep" / "sweep.json").read_text())["steps"]}
    assert [steps[s]["requests_generated"] for s in (*STEPS, 500, 600)] == [0] * len(STEPS) + [4, 4]
    assert [steps[s]["loaded_by"] for s in (500, 600)] == [["start"] * 2, ["rebuild"] * 2]
    assert scored(tmp_path / "sweep" / "step_500") == scored(tmp_path / "sweep" / "step_470")
    assert scored(tmp_path / "sweep" / "step_600") == scored(tmp_path / "sweep" / "step_200")
    csv_steps = {
        line.split(",")[1] for line in (tmp_path / "sweep" / "sweep_summary.csv").read_text().splitlines()[1:]
    }
    assert csv_steps == {str(s) for s in (*STEPS, 500, 600)}

    # A trainer restarted from an earlier step saves step 600 again, with step 100's weights: its requests are
    # named by the folder, so its old answers would be taken; the step is evaluated afresh, the old folder kept
    for name in ("model.safetensors", "config.json"):  # new files (the tokenizer's are links to step 100's)
        (training_run / "step_600" / name).unlink()
        shutil.copyfile(training_run / "step_100" / name, training_run / "step_600" / name)
    resaved = rayeval(*sweep, "--steps", "600")
    assert resaved.returncode == 0, resaved.stderr[-3000:]
    steps = {s["step"]: s for s in json.loads((tmp_path / "sweep" / "sweep.json").read_text())["steps"]}
    assert steps[600]["requests_generated"] == 4
    assert scored(tmp_path / "sweep" / "step_600") == scored(tmp_path / "sweep" / "step_100")
    [kept] = (tmp_path / "sweep").glob("step_600.replaced-*")
    assert scored(kept) == scored(tmp_path / "sweep" / "step_200")
