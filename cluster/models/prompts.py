"""Rendering task prompts into the exact text an engine receives, with the model's own chat template; or, for
a model behind an OpenAI-compatible endpoint, into the chat messages the endpoint templates itself."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Protocol

from cluster.models.cache import cache_root
from cluster.models.rendered import RenderedPrompts
from cluster.models.resolve import ResolvedModel
from evaluators.errors import EvalInputError
from evaluators.tasks.base import Prompt
from sharding.requests import RequestKind


class Renderer(Protocol):
    """What `build_requests` needs: a prompt's request text and the kind of request that carries it."""

    request_kind: RequestKind

    def render(self, prompt: Prompt) -> str: ...


class PromptRenderer:
    """Turns a task prompt into the exact text sent to the engine: chat template or plain text.

    The tokenizer loads on the first prompt the rendered-prompt cache (`models.rendered`) lacks: a run that
    renders what an earlier one did, on the same tokenizer files, never imports transformers."""

    request_kind: RequestKind = "generate"

    def __init__(
        self,
        model: ResolvedModel,
        chat_template: bool | None,
        revision: str | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.path, self.revision = model.path, revision
        self._tokenizer: Any = None
        self._loading = threading.Lock()
        self.cache = RenderedPrompts.of_folder(
            Path(model.path), revision, cache_dir or cache_root() / "rendered"
        )
        has_template = self.cache.has_template() if self.cache is not None else None
        if has_template is None:
            has_template = bool(getattr(self.tokenizer, "chat_template", None))
            if self.cache is not None:
                self.cache.set_has_template(has_template)
        if chat_template and not has_template:
            raise EvalInputError(
                f"--chat-template was asked for, but the tokenizer of '{model.path}' has no chat template. "
                "Drop the flag (plain prompts are used) or use a chat model."
            )
        self.use_chat_template = has_template if chat_template is None else chat_template

    @property
    def tokenizer(self) -> Any:
        with self._loading:
            if self._tokenizer is None:
                try:
                    self._tokenizer = chat_tokenizer(self.path, self.revision)
                except Exception as exc:  # noqa: BLE001
                    raise EvalInputError(
                        f"Could not load the tokenizer of '{self.path}' ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}). If it is a hub id, this machine may "
                        "be offline: download the model folder and pass its path with --model."
                    ) from exc
            return self._tokenizer

    def render(self, prompt: Prompt) -> str:
        if not self.use_chat_template:
            return prompt.text
        key = prompt.digest()
        cached = self.cache.get(key) if self.cache is not None else None
        if cached is not None:
            return cached
        messages = [{"role": m.role, "content": m.content} for m in prompt.messages]
        text = str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        if self.cache is not None:
            self.cache.put(key, text)
        return text


# transformers resolves its top-level names on first use; two threads asking at once can get "cannot import
# name 'PreTrainedTokenizerFast'" (a sweep's or an RD-Agent round's runs render in threads of one process).
_TRANSFORMERS_IMPORT = threading.Lock()


def chat_tokenizer(path: str, revision: str | None = None) -> Any:
    """The tokenizer that renders chat templates. A model folder with a `tokenizer.json` loads it as the plain
    fast tokenizer: rendering needs only its template and special tokens, and that class loads without
    torch (1.3 s against AutoTokenizer's 5 to 6 s on two cores, while the engines start beside it). Anything
    else (a hub id, a slow-only tokenizer) goes through AutoTokenizer."""
    with _TRANSFORMERS_IMPORT:  # its lazy module fails names asked for by two threads at once
        if (Path(path) / "tokenizer.json").is_file():
            from transformers import PreTrainedTokenizerFast as tokenizer_class
        else:
            from transformers import AutoTokenizer as tokenizer_class
    return tokenizer_class.from_pretrained(path, revision=revision)


class EndpointRenderer:
    """A model behind an endpoint applies its own chat template: a prompt travels as its chat messages in
    JSON (a `chat` request, sent to /chat/completions), or as its plain text (a `generate` request, sent
    to /completions) where `chat_template` is False."""

    def __init__(self, chat_template: bool | None) -> None:
        self.use_chat_template = chat_template is not False
        self.request_kind: RequestKind = "chat" if self.use_chat_template else "generate"

    def render(self, prompt: Prompt) -> str:
        if not self.use_chat_template:
            return prompt.text
        return json.dumps(
            [{"role": m.role, "content": m.content} for m in prompt.messages], ensure_ascii=False
        )


def prompt_renderer(
    model: ResolvedModel, chat_template: bool | None, revision: str | None = None
) -> Renderer:
    """The renderer of the model under test: its tokenizer's template here, or its endpoint's there."""
    if model.endpoint:
        return EndpointRenderer(chat_template)
    return PromptRenderer(model, chat_template, revision)
