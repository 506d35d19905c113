"""Serving: the model under test (or a judge) behind an OpenAI-compatible API on Ray Serve, with Ray
Serve's own LLM support (`app`): deploy, status and shutdown of the application; where the API listens and
the URL users reach (`address`); Ray's OpenAI ingress, extended (`ingress`) with local LoRA adapters served
under their own names (`lora`) and an optional API key, of which the cluster only gets the digest (`auth`);
the replica's server, binding a CPU engine to its own node's cores (`replica`)."""

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
