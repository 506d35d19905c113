"""The OpenCompass layout's numbers from a run's summary.json entry and records: accuracy and pass@k over the
scored samples alike (a failed sample in neither), checked against pass@k recomputed here."""

from __future__ import annotations

from math import comb

import pytest

from evaluators.opencompass_layout import dataset_result
from evaluators.records import SampleRecord
from evaluators.report import summarize_records, summary_json

KEY = "exact_match,flexible-extract"


def _record(doc: int, sample: int, score: float | None, error: str | None = None) -> SampleRecord:
    record = SampleRecord("gsm8k", doc, sample, f"r{doc}-{sample}", "prompt", "output", "4", error=error)
    if score is not None:
        record.scores[KEY], record.weights[KEY] = score, 1.0
    return record


def _layout(records: list[SampleRecord], pass_k: list[int]) -> dict[str, float]:
    summary = summarize_records("gsm8k", "3", [KEY], records, 3, 0, 3)
    entry = summary_json([summary], {})["tasks"]["gsm8k"]
    return dataset_result("gsm8k", entry, [r.to_dict() for r in records], pass_k).metrics


def test_a_failed_sample_is_in_neither_accuracy_nor_pass_at_k():
    # question 0: 1, 0, 1; question 1: 1, 1 and a failed sample; question 2: 0, 0, 0
    records = [_record(0, 0, 1.0), _record(0, 1, 0.0), _record(0, 2, 1.0), _record(1, 0, 1.0),
               _record(1, 1, 1.0), _record(1, 2, None, "VLLMValidationError: too long"),
               _record(2, 0, 0.0), _record(2, 1, 0.0), _record(2, 2, 0.0)]  # fmt: skip
    metrics = _layout(records, [1, 2, 3])
    assert metrics["accuracy"] == pytest.approx(100 * (2 / 3 + 1 + 0) / 3)

    def unbiased(n: int, c: int, k: int) -> float:
        return 1.0 - comb(n - c, k) / comb(n, k)

    # pass@1 equals the accuracy; pass@2 over each question's scored samples (question 1 has two)
    assert metrics["pass@1"] == pytest.approx(metrics["accuracy"])
    assert metrics["pass@2"] == pytest.approx(100 * (unbiased(3, 2, 2) + unbiased(2, 2, 2) + 0) / 3)
    assert "pass@3" not in metrics  # question 1 has two scored samples: as summary.json, no pass@3


def test_no_pass_at_k_for_a_metric_that_is_not_zero_or_one():
    records = [_record(doc, sample, 0.5) for doc in range(2) for sample in range(2)]
    assert set(_layout(records, [1, 2])) == {"accuracy"}
