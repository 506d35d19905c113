"""Models: where a model comes from (a local folder, a hub id, the embedded default), the checks made on it
before any engine starts, and how a task's prompt is rendered with the model's chat template.
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "ResolvedModel": "resolve",
    "resolve_model": "resolve",
    "check_context_length": "resolve",
    "check_model_folder": "resolve",
    "check_hub_model": "resolve",
    "PromptRenderer": "prompts",
    "DEFAULT_MODEL_NAME": "default",
    "ensure_default_model": "default",
    "default_model_dir": "default",
    "cache_root": "default",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
