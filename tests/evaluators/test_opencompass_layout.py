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


def test_a_question_none_of_whose_samples_scored_is_left_out_of_pass_at_k_as_in_summary_json():
    records = [_record(0, 0, 1.0), _record(0, 1, 0.0), _record(1, 0, 1.0), _record(1, 1, 1.0),
               _record(2, 0, None, "VLLMValidationError: too long"), _record(2, 1, None, "VLLMValidationError: too long")]  # fmt: skip
    metrics = _layout(records, [1, 2])
    assert metrics["pass@1"] == pytest.approx(75.0) and metrics["pass@2"] == pytest.approx(100.0)


def test_a_groups_and_a_perplexitys_own_numbers_are_datasets_of_the_layout(tmp_path):
    import json

    from evaluators.opencompass_layout import layout_of_run, read_accuracy_summary

    (tmp_path / "samples" / "m").mkdir(parents=True)
    row = {
        "doc_id": 0,
        "sample_index": 0,
        "prompt": "p",
        "output": "o",
        "target": "t",
        "scores": {"acc,none": 1.0},
    }
    (tmp_path / "samples" / "m" / "mmlu_a.jsonl").write_text(json.dumps(row) + "\n")
    tasks = {
        "mmlu_a": {"version": "1", "metrics": {"acc,none": {"mean": 1.0}}},
        "mmlu": {
            "metrics": {},
            "aggregate_only": {"acc,none": [0.61, 0.01]},
        },  # a group: percent, as its subtasks
        "wiki": {"metrics": {}, "aggregate_only": {"word_perplexity,none": [21.3, None]}},  # as it is
        "withheld_group": {"metrics": {}, "withheld": {"acc,none": "lm-eval counted 1 failed sample"}},
    }
    (tmp_path / "summary.json").write_text(json.dumps({"tasks": tasks}))
    written = read_accuracy_summary(layout_of_run(tmp_path, tmp_path / "oc", "m"))
    assert written == {"mmlu_a": {"acc": 100.0}, "mmlu": {"acc": 61.0}, "wiki": {"word_perplexity": 21.3}}


def test_wrong_answers_beyond_the_limit_are_a_seeded_sample_over_every_dataset(tmp_path):
    """RD-Agent samples its error examples at random; the first N in file order would all come from the first
    datasets (MMLU's first subjects). A seeded sample: spread out, the same on every call."""
    import json

    from evaluators.opencompass_layout import wrong_answers

    for subject in ("a_first", "b_second", "c_third"):
        details = [{"correct": [False], "pred": [f"{subject}-{i}"], "answer": "x"} for i in range(10)]
        (tmp_path / "results" / "m").mkdir(parents=True, exist_ok=True)
        (tmp_path / "results" / "m" / f"{subject}.json").write_text(json.dumps({"details": details}))
    every = wrong_answers(tmp_path, 100)
    assert [e["model_output"] for e in every] == [f"{s}-{i}" for s in ("a_first", "b_second", "c_third")
                                                   for i in range(10)]  # fmt: skip
    some = wrong_answers(tmp_path, 6)
    assert some == wrong_answers(tmp_path, 6) and len(some) == 6
    assert len({e["model_output"].rsplit("-", 1)[0] for e in some}) > 1  # not the first subject alone
    assert some == [e for e in every if e in some]  # in dataset order
