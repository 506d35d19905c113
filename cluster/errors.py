"""Errors of the cluster layer that carry a message for the person running the evaluation."""


class ClusterError(RuntimeError):
    """The cluster cannot host or reach what the run asks for; the message says what to change."""


class OutputWriteError(ClusterError):
    """The run's files could not be written (a full disk, a folder made read-only); what was written before
    is kept, and the same command resumes once the cause is fixed."""
