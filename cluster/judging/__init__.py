"""Judges: which tasks a judge scores and what a run's judge needs (`rules`), local judge models and
OpenAI-compatible judge APIs behind one backend interface, the runner that sends judge requests through the
dispatcher (with a second pass for transient failures), and the judged samples that turn answers into scores.
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "rules": (
        "judged_task_names",
        "check_judge",
        "check_judge_settings",
        "local_judge_replicas",
        "core_slots",
    ),
    "backends": (
        "JudgeBackend",
        "LocalJudgeBackend",
        "ApiJudgeBackend",
        "JudgeIdentity",
        "build_judge_backend",
        "judge_engine_settings",
    ),
    "runner": ("JudgeRunner", "JudgeStats", "SECOND_PASS_PAUSE_S"),
    "samples": ("JudgedSamples", "task_statistics"),
    "pipeline": ("JudgePipeline", "JudgePaths", "start_judging", "wait_for_judging"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
