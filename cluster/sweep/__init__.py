"""Training-run sweeps: every checkpoint (full model or LoRA adapter) of a run folder evaluated on one set of
warm replicas, each step its own resumable run folder, then the curves (`rayeval sweep`); and a training run
still going, its checkpoints evaluated as they complete on engines kept warm (`rayeval watch`)."""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "plan": ("SweepPlan", "SweepStep", "SkippedCheckpoint", "build_sweep_plan", "MAX_LORAS"),
    "runner": (
        "SweepResult",
        "StepOutcome",
        "StepStatus",
        "SweepEngines",
        "run_sweep",
        "finished_steps",
        "complete_steps",
        "draw_curves",
    ),
    "arrivals": ("ArrivalWatcher",),
    "watch": ("WatchOptions", "WatchResult", "watch_checkpoints", "check_watch", "describe_watch"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
