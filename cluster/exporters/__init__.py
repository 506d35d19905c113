"""Exporters: a finished run's numbers and files logged to an experiment tracker (`--log-to mlflow[:URI]`,
`--log-to wandb[:PROJECT]`), each an optional extra imported only when asked. A run logs as one tracker run
named by its run id; a sweep (or watch) logs as one run named by its folder, each step's metrics at the
checkpoint's step."""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "base": ("Exporter", "RunRecord", "EXPORTERS"),
    "export": ("exporter_for", "log_run", "check_log_to", "tracker_problem"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
