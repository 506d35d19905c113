"""Serving: the model under test (or a judge) behind an OpenAI-compatible API on Ray Serve, with Ray
Serve's own LLM support (`app`): deploy, status and shutdown of the application; local LoRA adapters served
under their own names through Ray's OpenAI ingress, extended (`lora`)."""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "app": (
        "ServedModel",
        "deploy",
        "serve_here",
        "status",
        "shutdown",
        "serve_model",
        "llm_config",
        "serve_status",
        "shutdown_app",
    ),
    "lora": ("LoraIngress",),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
