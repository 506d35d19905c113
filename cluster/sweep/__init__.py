"""Training-run sweeps: every checkpoint (full model or LoRA adapter) of a run folder evaluated on one set of
warm replicas, each step its own resumable run folder, then the curves (`rayeval sweep`)."""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "plan": ("SweepPlan", "SweepStep", "SkippedCheckpoint", "build_sweep_plan", "MAX_LORAS"),
    "runner": ("SweepResult", "StepOutcome", "StepStatus", "run_sweep"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
