"""One evaluation run and its files: the coordinator (`run_evaluation`), the request runner over the replicas
and the result store, request building, scoring into live records, the run folder's layout (`RunPaths`) and
the final files. `SharedReplicas`: a sweep's engines, kept warm from one run to the next. Scores are
computed in `records.SampleWriter` (native tasks) and written by `outputs`."""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "coordinator": ("run_evaluation",),
    "result": ("RunResult", "load_records"),
    "remote": ("RemoteRun", "RunCoordinator", "start_remote", "attach_remote"),
    "runner": ("RequestRunner", "RunnerStats", "NOT_GENERATED"),
    "paths": ("RunPaths",),
    "shared": ("SharedReplicas",),
    "requests": ("PlannedSample", "build_requests"),
    "records": ("SampleWriter",),
    "outputs": ("FinishedRun", "write_outputs", "output_written", "judging_timeline", "FAILURE_HINTS"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
