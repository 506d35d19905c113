from __future__ import annotations

import json

import pyarrow.parquet as pq

from evaluators.records import SampleRecord
from evaluators.report import render_table, results_json, summarize_task, summary_json, write_samples
from evaluators.tasks.gsm8k import GSM8K


def record(doc_id: int, sample: int, strict: float, error: str | None = None) -> SampleRecord:
    scores = {} if error else {"exact_match,strict-match": strict, "exact_match,flexible-extract": strict}
    weights = {} if error else {k: 1.0 for k in scores}
    return SampleRecord(
        "gsm8k", doc_id, sample, f"id{doc_id}{sample}", "p", "o", "t", scores, weights, error=error
    )


def test_summary_counts_failures_and_reports_mean_at_n(tmp_path):
    records = [
        record(1, 1, 0.0),
        record(0, 0, 1.0),
        record(0, 1, 1.0),
        record(1, 0, 0.0),
        record(2, 0, 0, "VLLMValidationError: too long"),
    ]
    summary = summarize_task(GSM8K(), records, num_runs=2, num_fewshot=0, num_available=1319)
    assert summary.failed == 1 and summary.failure_reasons == {"VLLMValidationError": 1}
    strict = summary.metrics["exact_match,strict-match"]
    assert strict.mean == 0.5 and strict.num_questions == 2 and strict.num_scored == 4

    results = results_json([summary], {"limit": 3}, "m", 0.0)
    assert results["results"]["gsm8k"]["exact_match,strict-match"] == 0.5
    assert results["results"]["gsm8k"]["exact_match_stderr,strict-match"] == strict.sem
    assert results["n-samples"]["gsm8k"] == {"original": 1319, "effective": 3}
    body = summary_json([summary], {"run_id": "r"})["tasks"]["gsm8k"]
    assert body["failed"] == 1 and body["metrics"]["exact_match,strict-match"]["n"] == 2
    json.dumps(body)  # NaN-free and serialisable

    jsonl, parquet = write_samples(tmp_path, "gsm8k", records)
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(r["doc_id"], r["sample_index"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    assert pq.read_table(parquet).num_rows == 5

    table = render_table([summary])
    assert "exact_match,strict-match" in table and "0.5000" in table
