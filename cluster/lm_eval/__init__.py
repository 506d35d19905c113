"""The lm-eval bridge: `RayEvalLM`, an lm-eval model backend whose requests run on rayeval's replicas and
store, and the runs of lm-eval tasks (seeds, per-task overrides, few-shot) that a rayeval run includes.
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "RayEvalLM": "backend",
    "DocOutcome": "backend",
    "LmEvalRunOutput": "runs",
    "run_lm_eval_tasks": "runs",
    "lm_eval_seeds": "runs",
    "LM_EVAL_DEFAULT_SEEDS": "runs",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
