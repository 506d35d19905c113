"""The contract of a judged task: outputs in, judge prompts out, judge answers parsed into scores.

A judged task asks the judge one or more questions about each output (both orders of a pairwise
comparison, one rubric item each); the cluster sends them to whichever judge the run uses and hands the
answers back by their key. Parsing never guesses: an answer without a readable verdict raises
`JudgeParseError`, and the sample is counted as failed with that reason.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

from evaluators.tasks.base import ChatMessage, MetricValue, Sample, Task


class JudgeParseError(ValueError):
    """A judge answer holds no verdict the task can read; the message says what was expected, and `key`
    names the judgment whose answer it is ("" where unknown)."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class JudgePrompt:
    """One question to the judge about one output; `key` names it among the sample's judgments."""

    key: str
    messages: tuple[ChatMessage, ...]

    @classmethod
    def from_texts(cls, key: str, system: str, user: str) -> JudgePrompt:
        """The judge's instructions as the system message, the inputs as the user message."""
        return cls(key, (ChatMessage("system", system), ChatMessage("user", user)))


@dataclass
class JudgedSample:
    """The scores of one judged output, the parsed verdict of each judgment, and the numbers the task-level
    statistics need (output lengths for length control, per-game weights)."""

    scores: dict[str, MetricValue]
    verdicts: dict[str, str] = field(default_factory=dict)
    features: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class JudgedItem:
    """A judged output as the statistics see it: which question, which of the N runs."""

    question: int
    run: int
    judged: JudgedSample


@dataclass(frozen=True)
class TaskStatistic:
    """A task-level number beyond the per-sample mean (a length-controlled win rate, a bootstrap CI)."""

    key: str  # lm-eval style "name,filter"
    value: float
    std: float  # bootstrap standard error of `value`
    ci95_low: float
    ci95_high: float
    method: str  # how std and the interval were obtained: rounds, resampling unit, quantiles
    higher_is_better: bool = True


class JudgeTask(Task):
    """A task scored by a judge model instead of a rule."""

    judge_max_tokens: int = 512

    @abstractmethod
    def judge_prompts(self, sample: Sample, output: str) -> list[JudgePrompt]:
        """The judge questions about one output; keys are unique within the sample."""

    @abstractmethod
    def judge_score(self, sample: Sample, output: str, answers: Mapping[str, str]) -> JudgedSample:
        """Scores from the judge's answers (by judgment key); raises JudgeParseError on an unreadable one."""

    def statistics(self, items: list[JudgedItem], seed: int = 0) -> list[TaskStatistic]:
        """Task-level statistics over every judged output; none beyond the means by default."""
        return []

    def score(self, sample: Sample, output: str) -> dict[str, MetricValue]:
        raise TypeError(f"Task '{self.name}' is scored by a judge: use judge_prompts / judge_score")
