"""How a failed sample says why. A record's `error` is "KIND: detail". KIND is a `FailureKind` where rayeval
names the failure itself, or the exception's type name where an engine or a request raised one (e.g.
`VLLMValidationError` for a prompt longer than the context); summaries count failures by KIND."""

from __future__ import annotations

from enum import StrEnum


class FailureKind(StrEnum):
    SCORING = "ScoringError"  # the task's scorer raised on the output
    EMPTY_OUTPUT = "EmptyOutput"  # the engine finished the request with no output
    NOT_GENERATED = "NotGenerated"  # --judge-only found no stored output for the request
    REPLICAS_DEAD = "ReplicasDead"  # every replica has died: nothing could run it
    REPLICA_LOST = "ReplicaLost"  # the replicas running it kept dying: given up after the last attempt
    NOT_DISPATCHED = "NotDispatched"  # the run stopped handing out work (its results could not be kept)
    JUDGE_PARSE = "JudgeParseError"  # the judge's answer held no verdict in the asked-for format
    JUDGE_TRUNCATED = "JudgeTruncated"  # the judge's answer reached its token limit before a verdict
    JUDGE_API = "JudgeAPIError"  # the judge API kept failing after every retry
    ENDPOINT_API = "EndpointAPIError"  # the model's OpenAI-compatible endpoint kept failing after every retry
    JUDGE_UNAVAILABLE = "JudgeUnavailable"  # the judge could not start
    JUDGE_UNANSWERED = "JudgeUnanswered"  # judging stopped before the sample's verdicts came back

    def error(self, detail: str) -> str:
        """The `error` text of a failure of this kind."""
        return f"{self.value}: {detail}"


# Failures of the machinery (replicas, the endpoint, the judge), not of the model's answers: a later run of the
# same folder asks them again, so until it has, the run's numbers stand on part of its samples.
OUTSIDE_THE_MODEL = frozenset(
    {
        FailureKind.REPLICAS_DEAD,
        FailureKind.REPLICA_LOST,
        FailureKind.NOT_DISPATCHED,
        FailureKind.ENDPOINT_API,
        FailureKind.JUDGE_API,
        FailureKind.JUDGE_UNAVAILABLE,
        FailureKind.JUDGE_UNANSWERED,
    }
)


def failure_kind(error: str) -> str:
    """The KIND of an `error` text: a `FailureKind` value or an exception's type name."""
    return error.split(":", 1)[0] if ":" in error else error


def is_judge_failure(error: str) -> bool:
    """Whether a failure is already told as the judge's (or as a missing output), so a judged sample's
    error keeps its kind instead of being prefixed with `Judge`."""
    kind = failure_kind(error)
    return kind.startswith("Judge") or kind == FailureKind.NOT_GENERATED
