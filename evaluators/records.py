"""The per-sample record: one output of one sample of one question, with its scores."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any


def prompt_digest(text: str) -> str:
    """The hash a record keeps of the prompt its question was asked with (`SampleRecord.prompt_hash`)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


@dataclass
class SampleRecord:
    task: str
    doc_id: int
    sample_index: int
    request_id: str
    prompt: str
    output: str
    target: str
    scores: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    replica: str = ""
    latency_s: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    # judged tasks: who judged, each judgment's parsed verdict and raw answer, numbers for task statistics
    judge: str = ""
    verdicts: dict[str, str] = field(default_factory=dict)
    judge_outputs: dict[str, str] = field(default_factory=dict)
    features: dict[str, float] = field(default_factory=dict)
    # the question's prompt as the task posed it, before any model's chat template (`Prompt.digest`), so two
    # runs of different models still show the same question; empty in records written before it was kept
    prompt_hash: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.doc_id, self.sample_index)
