"""Evaluation during training, from inside the trainer: weights (or LoRA adapters) pushed in memory to warm
replicas that evaluate each step while the training loop goes on (`Evaluator`); the saved-checkpoint way is
`rayeval watch` (cluster.sweep)."""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "evaluator": ("Evaluator", "PushHandle", "EvaluationHandle", "StepResult"),
    "weights": ("ModelTensors",),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
