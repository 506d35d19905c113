"""The typed contract every task fulfils: samples in, prompts out, completions scored."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from evaluators.records import prompt_digest


@dataclass(frozen=True)
class Sample:
    """One benchmark item: its position in the dataset and the raw row."""

    doc_id: int
    doc: dict[str, Any]


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class Prompt:
    """A prompt in both forms: chat messages for chat-templated models, plain text for base models."""

    messages: tuple[ChatMessage, ...]
    text: str

    @classmethod
    def user_turn(cls, text: str) -> Prompt:
        """The whole prompt as one user message."""
        return cls(messages=(ChatMessage("user", text),), text=text)

    def digest(self) -> str:
        """A hash of the prompt as the task poses it, in both forms and before any model's chat template:
        runs of two models that asked a question alike have the same digest, a changed dataset, few-shot
        set or wording gives another."""
        form = {"messages": [[m.role, m.content] for m in self.messages], "text": self.text}
        return prompt_digest(json.dumps(form, ensure_ascii=False, sort_keys=True))


@dataclass(frozen=True)
class MetricValue:
    """A score and its weight: a rate over k items of one sample has value = hits and weight = k."""

    value: float
    weight: float = 1.0


@dataclass(frozen=True)
class MetricSpec:
    """A reported metric: lm-eval's `name,filter` key, which way is better, and the range its values can take
    where that is known (a win rate in [0, 1], a 1-10 rating): the CI95 never reaches outside it."""

    name: str
    filter: str = "none"
    higher_is_better: bool = True
    bounds: tuple[float, float] | None = None
    # reported only where some sample has it (a category's score, for data that may hold no such category)
    optional: bool = False

    @property
    def key(self) -> str:
        return f"{self.name},{self.filter}"


@dataclass(frozen=True)
class TaskDefaults:
    max_tokens: int
    num_fewshot: int = 0
    stop: tuple[str, ...] = ()
    limit: int | None = None


@dataclass(frozen=True)
class DataSourceInfo:
    """Where a task's data comes from, in the order tried, for `rayeval tasks` and error messages."""

    description: str
    required_fields: tuple[str, ...] = field(default_factory=tuple)


class Task(ABC):
    name: str
    version: str
    description: str
    metrics: tuple[MetricSpec, ...]
    defaults: TaskDefaults
    source: DataSourceInfo

    @abstractmethod
    def load_samples(self, data_path: str | None) -> list[Sample]:
        """Every sample of the evaluation split, in dataset order."""

    def check_ready(self) -> None:
        """Raise EvalInputError if scoring cannot work in this environment (a scorer dependency that is not
        installed, say): called while planning, so the run stops before any engine starts or output is lost.
        Quick: `--dry-run` calls it too; importing a heavy scorer is `preload_scorer`'s job."""
        return None  # most tasks score with the standard library and need no check

    def preload_scorer(self) -> None:
        """Start importing what scoring needs, in the background (a run calls it while a local Ray starts, or
        once its first requests are out); a second call does nothing."""
        return None

    def wait_for_scorer(self) -> None:
        """Block until `preload_scorer`'s import is done; raise EvalInputError if it failed. A run calls it
        before it scores the task's first output (its requests go out meanwhile)."""
        return None

    def raise_if_scorer_failed(self) -> None:
        """Raise `wait_for_scorer`'s error where `preload_scorer`'s import has already failed; never blocks and
        never starts it. A run asks before it starts engines, so a checker that cannot import costs no engine
        start where its import began with a local Ray's start."""
        return None

    def load_fewshot(self, data_path: str | None) -> list[Sample]:
        """Samples few-shot examples are drawn from; tasks without few-shot support keep the default."""
        return []

    @abstractmethod
    def build_prompt(self, sample: Sample, fewshot: list[Sample]) -> Prompt:
        """The prompt for one sample, with the given few-shot examples in front."""

    @abstractmethod
    def score(self, sample: Sample, output: str) -> dict[str, MetricValue]:
        """Score one completion; keys are the metric keys of `metrics`."""

    def target(self, sample: Sample) -> str:
        """The reference answer recorded beside each output (empty where the task has none)."""
        return ""
