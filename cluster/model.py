"""Resolving `--model` to something vLLM loads, and rendering task prompts with its tokenizer."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.default_model import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model
from evaluators.errors import EvalInputError
from evaluators.tasks.base import Prompt

HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # short name for folders and tables
    path: str  # what vLLM and the tokenizer load
    is_default: bool


def resolve_model(path: str | None, materialise: bool = True) -> ResolvedModel:
    if not path:
        folder = ensure_default_model() if materialise else default_model_dir()
        return ResolvedModel(DEFAULT_MODEL_NAME, str(folder), True)
    local = Path(path).expanduser()
    if local.exists():
        if not local.is_dir() or not (local / "config.json").is_file():
            raise EvalInputError(
                f"--model {path} is not a model folder: it has no config.json. Point --model at a Hugging Face "
                "model folder (config.json plus weights), or give a hub id such as org/name."
            )
        return ResolvedModel(local.resolve().name, str(local.resolve()), False)
    if HF_ID.match(path) and not path.startswith((".", "/", "~")):
        return ResolvedModel(path.split("/")[-1], path, False)
    raise EvalInputError(
        f"--model {path} does not exist. Give an existing local model folder, or a Hugging Face hub id "
        "of the form org/name (the hub must be reachable, or the model in the HF cache)."
    )


class PromptRenderer:
    """Turns a task prompt into the exact text sent to the engine: chat template or plain text."""

    def __init__(self, model: ResolvedModel, chat_template: bool | None, revision: str | None = None) -> None:
        from transformers import AutoTokenizer

        try:
            self.tokenizer: Any = AutoTokenizer.from_pretrained(model.path, revision=revision)
        except Exception as exc:  # noqa: BLE001
            raise EvalInputError(
                f"Could not load the tokenizer of '{model.path}' ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}). If it is a hub id, this machine may be offline: "
                "download the model folder and pass its path with --model."
            ) from exc
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if chat_template and not has_template:
            raise EvalInputError(
                f"--chat-template was asked for, but the tokenizer of '{model.path}' has no chat template. "
                "Drop the flag (plain prompts are used) or use a chat model."
            )
        self.use_chat_template = has_template if chat_template is None else chat_template

    def render(self, prompt: Prompt) -> str:
        if not self.use_chat_template:
            return prompt.text
        messages = [{"role": m.role, "content": m.content} for m in prompt.messages]
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
