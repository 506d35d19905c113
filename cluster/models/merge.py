"""A LoRA adapter merged into its base model's weights: W + scale x B @ A for every module it targets, written
as a full checkpoint beside the base model's other files (linked, not copied).

`rayeval sweep --lora-merge` runs adapters this way, moving the engines from one merged checkpoint to the next
by weight reload, instead of serving them through vLLM's LoRA layers: on CPU those run an adapter at a third
of the base model's speed (docs/BENCHMARKS.md). The merge is done in float32 and cast back to the weights'
dtype, so outputs match the adapter served by LoRA layers up to that rounding.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from cluster.models.checkpoints import ADAPTER_WEIGHTS
from evaluators.errors import EvalInputError

PEFT_PREFIX = "base_model.model."


def merged_checkpoint(adapter: Path, base: Path, digest: str, cache: Path) -> Path:
    """The merged model folder for this adapter (made once, then reused from `cache`)."""
    target = cache / f"{base.name}+{adapter.name}-{digest}"
    if (target / "config.json").is_file():
        return target
    config = json.loads((adapter / "adapter_config.json").read_text())
    if config.get("use_dora") or config.get("modules_to_save"):
        raise EvalInputError(
            f"--lora-merge: {adapter} uses {'DoRA' if config.get('use_dora') else 'modules_to_save'}, which this "
            "merge does not do; sweep it without --lora-merge (vLLM serves it as a LoRA adapter)."
        )
    deltas = _deltas(adapter, config)
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".merging-", dir=cache))
    try:
        _write(base, staging, deltas, adapter)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _deltas(adapter: Path, config: dict) -> dict[str, object]:
    """Each targeted weight's name in the base model -> scale x B @ A (float32)."""
    import torch

    rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    scale = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
    tensors = _adapter_tensors(adapter)
    deltas = {}
    for name, a in tensors.items():
        if not name.endswith(".lora_A.weight"):
            continue
        module = name.removeprefix(PEFT_PREFIX).removesuffix(".lora_A.weight")
        b = tensors[f"{name.removesuffix('.lora_A.weight')}.lora_B.weight"]
        delta = scale * (b.to(torch.float32) @ a.to(torch.float32))
        deltas[f"{module}.weight"] = delta.T if config.get("fan_in_fan_out") else delta
    return deltas


def _adapter_tensors(adapter: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    safetensors, binary = (adapter / name for name in ADAPTER_WEIGHTS)
    if safetensors.is_file():
        return load_file(safetensors)
    return torch.load(binary, map_location="cpu", weights_only=True)


def _write(base: Path, folder: Path, deltas: dict, adapter: Path) -> None:
    """The base folder's files into `folder`: weight files merged, everything else linked."""
    import torch
    from safetensors.torch import load_file, save_file

    left = dict(deltas)
    for item in sorted(base.iterdir()):
        if item.suffix != ".safetensors":
            _link(item, folder / item.name)
            continue
        weights = load_file(item)
        for name in [n for n in weights if n in left]:
            original = weights[name]
            weights[name] = (original.to(torch.float32) + left.pop(name)).to(original.dtype)
        save_file(weights, folder / item.name, metadata={"format": "pt"})
    if left:
        raise EvalInputError(
            f"--lora-merge: {adapter} targets weights the base model {base} lacks ({', '.join(sorted(left)[:3])}); "
            "is it an adapter of another model?"
        )


def _link(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target)
        return
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copy2(source, target)
