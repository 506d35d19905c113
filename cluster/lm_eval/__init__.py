"""The lm-eval bridge: `RayEvalLM`, an lm-eval model backend whose requests run on rayeval's replicas and
store, and the runs of lm-eval tasks (seeds, per-task overrides, few-shot) that a rayeval run includes.
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "backend": ("RayEvalLM", "DocOutcome"),
    "runs": ("LmEvalRunOutput", "run_lm_eval_tasks", "lm_eval_seeds", "LM_EVAL_DEFAULT_SEEDS"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
