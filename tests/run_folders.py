"""Run folders written by rayeval's own writers (per-sample JSONL and summary.json), for the commands that read
finished runs (compare, plot) without running a model."""

from __future__ import annotations

import json
from pathlib import Path

from evaluators.records import SampleRecord
from evaluators.report import summarize_task, summary_json, write_samples
from evaluators.tasks.gsm8k import GSM8K

STRICT, FLEX = "exact_match,strict-match", "exact_match,flexible-extract"


def write_gsm8k_run(
    root: Path, run_id: str, strict: dict[int, list[int]], flexible: dict[int, list[int]]
) -> Path:
    """A finished GSM8K run: question -> each sample's 0/1 score, per metric."""
    records = [
        SampleRecord("gsm8k", q, i, f"{run_id}-{q}-{i}", "p", "o", "t",
                     {STRICT: float(s), FLEX: float(flexible[q][i])}, {STRICT: 1.0, FLEX: 1.0})
        for q, samples in strict.items() for i, s in enumerate(samples)
    ]  # fmt: skip
    run = root / run_id
    write_samples(run / "samples" / "model", "gsm8k", records)
    num_runs = max(len(samples) for samples in strict.values())
    summary = summarize_task(GSM8K(), records, num_runs=num_runs, num_fewshot=0, num_available=1319)
    (run / "summary.json").write_text(json.dumps(summary_json([summary], {"run_id": run_id})))
    return run
