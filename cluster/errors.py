"""Errors of the cluster layer that carry a message for the person running the evaluation."""


class ClusterError(RuntimeError):
    """The cluster cannot host or reach what the run asks for; the message says what to change."""
