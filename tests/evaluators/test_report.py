from __future__ import annotations

import json
import subprocess
import sys

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
    # N = 2 of a 0/1 metric: pass@1 (the mean) and pass@2 (question 0 passes twice, question 1 never)
    passes = body["metrics"]["exact_match,strict-match"]["pass_at_k"]
    assert passes["1"]["mean"] == 0.5 and passes["2"]["mean"] == 0.5 and passes["2"]["questions"] == 2
    assert "Chen et al. 2021" in body["metrics"]["exact_match,strict-match"]["pass_at_k_method"]
    assert "pass_at_k" not in body  # only beside its metric
    json.dumps(body)  # NaN-free and serialisable

    jsonl, parquet = write_samples(tmp_path, "gsm8k", records)
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(r["doc_id"], r["sample_index"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    assert pq.read_table(parquet).num_rows == 5

    table = render_table([summary])
    assert "exact_match,strict-match" in table and "0.5000" in table


def test_a_task_with_bootstrap_statistics_names_its_headline_interval():
    from evaluators.judging.base import TaskStatistic

    summary = summarize_task(GSM8K(), [record(0, 0, 1.0), record(1, 0, 0.0)], 1, 0, 2)
    body = summary_json([summary], {})["tasks"]["gsm8k"]
    assert "headline_interval" not in body  # one kind of interval only
    summary.statistics.append(
        TaskStatistic("win_rate,bootstrap", 0.5, 0.1, 0.3, 0.7, "bootstrap over questions")
    )
    body = summary_json([summary], {})["tasks"]["gsm8k"]
    assert body["headline_interval"].startswith(
        "metrics.*.ci95: the t-interval on the question-clustered SEM"
    )


def test_the_report_libraries_load_once_in_the_background_and_the_sample_files_then_write(tmp_path):
    """A fresh process: the preload's thread imports what writing the Parquet file and the summary would
    import after a run's last result (pandas, through pyarrow's row conversion; scipy.special), once."""
    script = f"""
import sys
from evaluators.report import preload_report_libraries, write_samples
assert "pandas" not in sys.modules
thread = preload_report_libraries()
assert preload_report_libraries() is thread
thread.join()
print(sorted(name for name in ("pandas", "scipy.special") if name in sys.modules))
from evaluators.records import SampleRecord
record = SampleRecord("t", 0, 0, "r0", "p", "o", "o", scores={{"acc": 1.0}})
write_samples(__import__("pathlib").Path({str(tmp_path)!r}), "t", [record])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['pandas', 'scipy.special']"
    assert pq.read_table(tmp_path / "t.parquet").num_rows == 1
