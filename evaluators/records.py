"""The per-sample record: one output of one sample of one question, with its scores."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.doc_id, self.sample_index)
