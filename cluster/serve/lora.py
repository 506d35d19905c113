"""Local LoRA adapters on `rayeval serve`'s API, each under its own name.

Ray Serve LLM loads adapters from cloud storage only, and names them `<base model>:<suffix>`. Here every
replica's engine loads the adapters from its own disk when it starts instead (vLLM's static `lora_modules`),
and this ingress, Ray's OpenAI ingress extended through its documented `ingress_cls` option, sends a request
for an adapter's name to the base model's replicas as it is (every replica holds every adapter; vLLM maps the
request's `model` to its adapter) and lists the adapters in /v1/models.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIHTTPException,
)
from ray.serve.llm.ingress import OpenAiIngress

NO_PROMPT_LOGPROBS = (
    "prompt_logprobs cannot be computed here: this server's engines run with LoRA adapters enabled, and vLLM's "
    "LoRA logits layer fails on prompt positions, which would kill the engine. Ask without prompt_logprobs, or "
    "serve the model without --lora for log-likelihoods."
)


def refuse_prompt_logprobs(body: Any) -> None:
    if getattr(body, "prompt_logprobs", None):
        raise OpenAIHTTPException(status_code=400, message=NO_PROMPT_LOGPROBS, type="BadRequestError")


class LoraIngress(OpenAiIngress):
    """Ray's OpenAI ingress with `adapters` served by name; without adapters it is Ray's ingress as it is."""

    def __init__(self, *args: Any, adapters: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._adapters = dict(adapters or {})  # adapter name -> the id of the base model it runs on

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        if self._adapters:
            refuse_prompt_logprobs(body)
        return await super().completions(body, request)

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        if self._adapters:
            refuse_prompt_logprobs(body)
        return await super().chat(body, request)

    async def _get_model_id(self, model: str | None) -> str:
        if model in self._adapters:
            return model
        return await super()._get_model_id(model)

    def _get_configured_serve_handle(self, model_id: str) -> Any:
        base = self._adapters.get(model_id)
        if base is None:
            return super()._get_configured_serve_handle(model_id)
        if model_id not in self._configured_serve_handles:  # no multiplexing: any replica serves it
            self._configured_serve_handles[model_id] = self._default_serve_handles[base].options(stream=True)
        return self._configured_serve_handles[model_id]

    async def model(self, model_id: str) -> Any:
        base = self._adapters.get(model_id)
        if base is None:
            return await super().model(model_id)
        card = self._model_cards[base]
        return card.model_copy(update={"id": model_id, "metadata": {**card.metadata, "base_model": base}})

    async def models(self) -> Any:
        listed = await super().models()
        listed.data.extend([await self.model(name) for name in self._adapters])
        return listed
