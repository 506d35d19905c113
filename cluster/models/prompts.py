"""Rendering task prompts into the exact text an engine receives, with the model's own chat template."""

from __future__ import annotations

from typing import Any

from cluster.models.resolve import ResolvedModel
from evaluators.errors import EvalInputError
from evaluators.tasks.base import Prompt


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
