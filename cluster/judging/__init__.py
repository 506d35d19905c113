"""Judges: local judge models and OpenAI-compatible judge APIs behind one backend interface, the runner that
sends judge requests through the dispatcher (with a second pass for transient failures), and the judged
samples that turn answers into scores.
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "JudgeBackend": "backends",
    "LocalJudgeBackend": "backends",
    "ApiJudgeBackend": "backends",
    "JudgeIdentity": "backends",
    "build_judge_backend": "backends",
    "JudgeRunner": "runner",
    "JudgeStats": "runner",
    "SECOND_PASS_PAUSE_S": "runner",
    "JudgedSamples": "samples",
    "task_statistics": "samples",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
