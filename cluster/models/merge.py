"""A LoRA adapter merged into its base model's weights, as peft's `merge_and_unload` merges it, written as a
full checkpoint beside the base model's other files (linked, not copied).

`rayeval sweep --lora-merge` runs adapters this way, moving the engines from one merged checkpoint to the next
by weight reload, instead of serving them through vLLM's LoRA layers: on CPU those run an adapter at a third
of the base model's speed (docs/BENCHMARKS.md). What is merged, per module the adapter trains:

- a linear layer's W += scale x B @ A (transposed for `fan_in_fan_out`), and its bias += scale x B's bias
  where the adapter trains one (`lora_bias`);
- an embedding's W += scale x (B @ A)^T;
- scale = alpha / r (alpha / sqrt(r) with `use_rslora`), r and alpha the module's own where `rank_pattern` or
  `alpha_pattern` names it (the first key matching the end of the module's name, as peft matches them);
- whole tensors the adapter carries replace the base model's before the LoRA deltas are added (as peft loads
  them before it merges): biases trained with `bias: all|lora_only`, an embedding saved beside its LoRA
  (`<module>.base_layer.weight`), and every parameter of a module trained whole (`modules_to_save`: peft
  saves `<module>.<param>` for each module whose name ends with an entry; vLLM cannot serve those as
  an adapter, so merging is how they run).

Anything else is refused before anything is written, naming what the merge does not do: DoRA, trainable tokens, LoRA on parameters, aLoRA, an initialisation that changed the
base weights (PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA) saved without conversion, and a change to tied embeddings
(merged, the output projection would change with the input embeddings, which the adapter served does not).
The merge is done in float32 and cast back to the weights' dtype, so outputs match the adapter served by LoRA
layers up to that rounding.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.models.cache import mark_used
from cluster.models.checkpoints import (
    ADAPTER_WEIGHTS,
    MergedFrom,
    merged_from_of,
    tied_embeddings,
    write_merged_from,
)
from cluster.models.default import is_default_model
from cluster.models.once import built_once
from evaluators.errors import EvalInputError
from sharding.requests import Adapter

PEFT_PREFIX = "base_model.model."
# adapter_config.json settings this merge does not do: the setting, and what it is
UNSUPPORTED_SETTINGS = {
    "use_dora": "DoRA (use_dora)",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)",
    "target_parameters": "LoRA on parameters (target_parameters)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "layer_replication": "layer replication (layer_replication)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "arrow_config": "Arrow routing (arrow_config)",
}
# initialisations that change the base weights: an adapter saved without peft's conversion needs those
BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")


@dataclass
class MergePlan:
    """What merging one adapter changes in the base model: base tensor name -> float32 delta to add, or the
    tensor that replaces it."""

    deltas: dict[str, Any] = field(default_factory=dict)
    replaced: dict[str, Any] = field(default_factory=dict)


def merged_cache() -> Path:
    """Where this machine keeps the checkpoints it merged: under its rayeval cache."""
    from cluster.models.cache import cache_root

    return cache_root() / "merged"


def merged_checkpoint(
    adapter: Path, base: Path, digest: str, cache: Path | None = None, name: str | None = None
) -> Path:
    """The merged model folder for this adapter (made once, then reused from `cache`, by default
    `merged_cache()`), named `name` where given (a node's copy of a folder made elsewhere keeps its name)."""
    target = (cache or merged_cache()) / (name or f"{base.name}+{adapter.name}-{digest}")
    made_from = MergedFrom(
        Adapter(adapter.name, str(adapter.resolve()), digest), str(base), is_default_model(base)
    )
    if (target / "config.json").is_file():
        mark_used(target)
        if merged_from_of(target) is None:  # merged before the record was kept: it is the same merge
            with contextlib.suppress(OSError):
                write_merged_from(target, made_from)
        return target
    config = json.loads((adapter / "adapter_config.json").read_text())
    problem = merge_problem(config)
    if problem is not None:
        raise EvalInputError(f"--lora-merge: {adapter}: {problem}")
    plan = merge_plan(config, _adapter_tensors(adapter), adapter)

    def build(staging: Path) -> None:  # several replicas of one node may merge it at once: one does
        _write(base, staging, plan, adapter)
        write_merged_from(staging, made_from)  # a node without this folder merges its own from it

    return built_once(target, build, f"merging {adapter} into {base}")


def merged_folder_here(path: str) -> str | None:
    """The merged checkpoint `path` (made where the run is coordinated) on this node: that folder, or this
    node's own copy of it (`merged_copy_here`) made before; None where neither is here."""
    for folder in (Path(path), merged_cache() / Path(path).name):
        if (folder / "config.json").is_file():
            mark_used(folder)
            return str(folder)
    return None


def merged_copy_here(path: str, merged: MergedFrom, adapter_folder: str) -> str:
    """This node's own copy of the merged checkpoint `path`, under its rayeval cache by the same name, merged
    here from the adapter's files (`adapter_folder`, this node's) and this node's base model."""
    from cluster.models.default import default_model_here

    base = default_model_here(merged.base) if merged.base_is_default else merged.base
    return str(
        merged_checkpoint(Path(adapter_folder), Path(base), merged.adapter.digest, name=Path(path).name)
    )


def merge_problem(config: dict[str, Any]) -> str | None:
    """What in an adapter's config this merge does not do, with the way out; None when it does it all."""
    for setting, what in UNSUPPORTED_SETTINGS.items():
        if config.get(setting):
            return (
                f"it uses {what}, which this merge does not do; sweep it without --lora-merge (vLLM serves "
                "what it supports as a LoRA adapter)"
            )
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(BASE_CHANGING_INITS):
        return (
            f"it was initialised with {init}, which changes the base weights, and saved without peft's "
            "conversion to a plain LoRA adapter (save_pretrained's path_initial_model_for_weight_conversion); "
            "merged into the original base it would be wrong"
        )
    return None


def module_rank_and_scale(config: dict[str, Any], module: str) -> tuple[int, float]:
    """The rank and scale peft gives `module` (its name in the base model): rank_pattern and alpha_pattern
    keys match the end of the name, the first that matches wins; otherwise r and lora_alpha."""
    rank = int(_pattern_value(config.get("rank_pattern") or {}, module, config["r"]))
    alpha = float(_pattern_value(config.get("alpha_pattern") or {}, module, config.get("lora_alpha", 8)))
    return rank, alpha / rank**0.5 if config.get("use_rslora") else alpha / rank


def _pattern_value(pattern: dict[str, Any], module: str, default: Any) -> Any:
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def merge_plan(config: dict[str, Any], tensors: dict[str, Any], adapter: Path) -> MergePlan:
    """Every change the adapter's tensors make to the base model (see the module docstring)."""
    plan = MergePlan()
    names = {name.removeprefix(PEFT_PREFIX): tensor for name, tensor in tensors.items()}
    saved_whole = tuple(config.get("modules_to_save") or ())
    for name, tensor in names.items():
        if name.endswith((".lora_A.weight", ".lora_embedding_A")):
            _add_lora(plan, config, names, name, adapter)
        elif _in_module_saved_whole(name, saved_whole):
            plan.replaced[name] = tensor  # a module trained whole: its tensor as trained
        elif name.endswith((".base_layer.weight", ".bias")) and ".lora_" not in name:
            plan.replaced[name.replace(".base_layer.", ".")] = tensor  # the base tensor, saved as trained
        elif not name.endswith((".lora_B.weight", ".lora_B.bias", ".lora_embedding_B")):
            raise EvalInputError(
                f"--lora-merge: {adapter} holds {PEFT_PREFIX}{name}, which is not a LoRA A/B matrix, a LoRA bias or "
                "a saved base tensor: this merge does not know what it is. Sweep it without --lora-merge."
            )
    return plan


def _in_module_saved_whole(name: str, modules: tuple[str, ...]) -> bool:
    """Whether tensor `name` (one the adapter holds) is a parameter of a module peft saved whole: one whose name
    ends with an entry of `modules_to_save`. peft's own rule changed between releases (a plain suffix, where
    `norm` took `input_layernorm` too; later at a dot); the file holds only what it wrapped, so either reads."""
    module = name.rpartition(".")[0]
    return ".lora_" not in name and any(module.endswith(m) for m in modules)


def _add_lora(
    plan: MergePlan, config: dict[str, Any], names: dict[str, Any], name: str, adapter: Path
) -> None:
    import torch

    embedding = name.endswith(".lora_embedding_A")
    module = name.removesuffix(".lora_embedding_A" if embedding else ".lora_A.weight")
    a = names[name].to(torch.float32)
    b = names[f"{module}.lora_embedding_B" if embedding else f"{module}.lora_B.weight"].to(torch.float32)
    rank, scale = module_rank_and_scale(config, module)
    if a.shape[0] != rank:
        raise EvalInputError(
            f"--lora-merge: {adapter}: {module}'s LoRA matrices have rank {a.shape[0]}, but adapter_config.json "
            f"gives it rank {rank} (r, rank_pattern): the config is not the one these weights were saved with."
        )
    delta = scale * (b @ a)
    plan.deltas[f"{module}.weight"] = delta.T if embedding or config.get("fan_in_fan_out") else delta
    bias = names.get(f"{module}.lora_B.bias")
    if bias is not None:  # lora_bias: B's bias, scaled like the product
        plan.deltas[f"{module}.bias"] = scale * bias.to(torch.float32)


def _adapter_tensors(adapter: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    safetensors, binary = (adapter / name for name in ADAPTER_WEIGHTS)
    if safetensors.is_file():
        return load_file(safetensors)
    return torch.load(binary, map_location="cpu", weights_only=True)


def _write(base: Path, folder: Path, plan: MergePlan, adapter: Path) -> None:
    """The base folder's files into `folder`: weight files merged (as safetensors: .bin ones are converted,
    with an index where there are several), everything else linked."""
    from safetensors.torch import save_file

    safetensors = sorted(base.glob("*.safetensors"))
    weight_files = safetensors or sorted(base.glob("pytorch_model*.bin"))
    left = set(plan.deltas) | set(plan.replaced)
    tied = tied_embeddings(base)
    index: dict[str, str] = {}
    for item in sorted(base.iterdir()):
        if item in weight_files:
            weights = _load_weights(item)
            _apply(weights, plan, left, tied, adapter)
            name = item.name if safetensors else f"{item.stem.replace('pytorch_model', 'model')}.safetensors"
            save_file(weights, folder / name, metadata={"format": "pt"})
            index |= dict.fromkeys(weights, name)
        elif safetensors or not item.name.startswith("pytorch_model"):
            _link(item, folder / item.name)
    if not safetensors and len(weight_files) > 1:
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": index})
        )
    if left:
        tie = " (a model with tied embeddings stores no output projection of its own)" if tied else ""
        raise EvalInputError(
            f"--lora-merge: {adapter} changes weights the base model {base} lacks ({', '.join(sorted(left)[:3])})"
            f"{tie}; is it an adapter of another model?"
        )


def _apply(weights: dict[str, Any], plan: MergePlan, left: set[str], tied: set[str], adapter: Path) -> None:
    """Merge the plan's changes to the tensors of one weight file, each in float32 and kept so."""
    import torch

    for name in sorted(left & weights.keys()):
        original = weights[name].to(torch.float32)
        new = plan.replaced.get(name, original).to(torch.float32)  # a saved tensor first, as peft loads it
        if name in plan.deltas:
            new = new + plan.deltas[name]
        if name in tied and not torch.equal(new, original):
            raise EvalInputError(
                f"--lora-merge: {adapter} changes {name}, one side of the base model's tied embeddings: merged, "
                "the output projection would change with the input embeddings, which the adapter served by "
                "LoRA layers does not do. Sweep it without --lora-merge."
            )
        weights[name] = new
        left.discard(name)


def _load_weights(path: Path) -> dict[str, Any]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    import torch

    return dict(torch.load(path, map_location="cpu", weights_only=True))


def _link(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target)
        return
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copy2(source, target)
