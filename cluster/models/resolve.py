"""Resolving `--model` to something vLLM loads, with the checks made on it before any engine starts."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cluster.config import ENDPOINT_PREFIX
from cluster.models.default import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model
from evaluators.data import offline_if_hub_unreachable
from evaluators.errors import EvalInputError

HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "*.model",  # sentencepiece: tokenizer.model, spiece.model
    "vocab.json",
    "tekken.json",
    "*.tiktoken",
)
# config.json keys vLLM reads a model's context length from; it takes the smallest present
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # short name for folders and tables
    path: str  # what vLLM and the tokenizer load; `openai:NAME` for a model behind an endpoint
    is_default: bool
    endpoint: bool = False  # behind an OpenAI-compatible endpoint: no engine, tokenizer or weights here


def resolve_model(path: str | None, materialise: bool = True, label: str | None = None) -> ResolvedModel:
    """The model a path or hub id names, checked as far as possible without loading it.

    `label` is how the user gave it, for messages (default `--model PATH`; a judge passes its own flag).
    """
    if not path:
        folder = ensure_default_model() if materialise else default_model_dir()
        return ResolvedModel(DEFAULT_MODEL_NAME, str(folder), True)
    label = label or f"--model {path}"
    if path.startswith(ENDPOINT_PREFIX):
        served = path.removeprefix(ENDPOINT_PREFIX).strip()
        return ResolvedModel(served.rstrip("/").split("/")[-1] or served, path, False, endpoint=True)
    local = Path(path).expanduser()
    if local.exists():
        check_model_folder(local, label)
        return ResolvedModel(local.resolve().name, str(local.resolve()), False)
    if HF_ID.match(path) and not path.startswith((".", "/", "~")):
        check_hub_model(path, label)
        return ResolvedModel(path.split("/")[-1], path, False)
    raise EvalInputError(
        f"{label} does not exist. Give an existing local model folder, or a Hugging Face hub id "
        "of the form org/name (the hub must be reachable, or the model in the HF cache)."
    )


def check_model_folder(folder: Path, label: str) -> None:
    """A folder vLLM can load: a config.json that is a JSON object, weights, and a tokenizer."""
    fix = "Point it at a Hugging Face model folder (config.json, weights, tokenizer files), or give a hub id."
    config = folder / "config.json"
    if not folder.is_dir() or not config.is_file():
        raise EvalInputError(f"{label} is not a model folder: it has no config.json. {fix}")
    try:
        settings = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f" (line {exc.lineno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        raise EvalInputError(
            f"{label}: {config} is not valid JSON{where}. Restore it from the model's source (a partial "
            "download or an edit broke it)."
        ) from None
    if not isinstance(settings, dict):
        raise EvalInputError(
            f"{label}: {config} holds a JSON {type(settings).__name__}, not an object. {fix}"
        )
    for kind, patterns in (
        ("weights (*.safetensors, *.bin)", WEIGHT_PATTERNS),
        ("tokenizer", TOKENIZER_PATTERNS),
    ):
        if not any(next(folder.glob(pattern), None) for pattern in patterns):
            raise EvalInputError(
                f"{label} has a config.json but no {kind} files. Download the complete model folder (e.g. "
                "`hf download ORG/NAME --local-dir DIR`) and pass that folder."
            )


def check_hub_model(repo: str, label: str) -> None:
    """A hub id loads when the hub is reachable or the model is in the local HF cache; say so now if neither."""
    from huggingface_hub.constants import HF_HUB_CACHE

    snapshots = Path(HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}" / "snapshots"
    if next(snapshots.glob("*/config.json"), None) is not None or not offline_if_hub_unreachable():
        return
    raise EvalInputError(
        f"{label} is not in the Hugging Face cache ({HF_HUB_CACHE}), and this machine cannot reach the hub "
        f"to download it. Download it where the hub is reachable (`hf download {repo} "
        "--local-dir DIR`), copy the folder here and pass --model DIR (or fill HF_HOME's cache)."
    )


def declared_context_length(folder: Path) -> tuple[str, int] | None:
    """The context a local model folder's config.json declares, as (its key, tokens); None where there is
    none to go by. Models with rope scaling (a rope type other than "default") are left to vLLM, which derives
    their longer context itself; so is everything when VLLM_ALLOW_LONG_MAX_MODEL_LEN is set (vLLM's own way to
    allow more)."""
    config = folder / "config.json"
    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") or not config.is_file():
        return None
    settings = json.loads(config.read_text(encoding="utf-8"))
    settings = (
        settings.get("text_config", settings) if isinstance(settings.get("text_config"), dict) else settings
    )
    rope = settings.get("rope_scaling") or settings.get("rope_parameters") or {}
    if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type") or "default") != "default":
        return None
    lengths = {key: settings[key] for key in CONTEXT_KEYS if isinstance(settings.get(key), int)}
    return min(lengths.items(), key=lambda item: item[1]) if lengths else None


def check_context_length(model: ResolvedModel, max_model_len: int) -> None:
    """--max-model-len within the context a local model declares (vLLM refuses more when its engine starts)."""
    declared = declared_context_length(Path(model.path))
    if declared is None:
        return
    key, limit = declared
    if max_model_len > limit:
        raise EvalInputError(
            f"--max-model-len {max_model_len} is longer than {model.name} can read: its config.json gives "
            f"{key} = {limit}. Give --max-model-len {limit} or less (model.max_model_len in a config file)."
        )
