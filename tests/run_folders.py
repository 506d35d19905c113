"""Run folders written by rayeval's own writers (per-sample JSONL and summary.json), for the commands that read
finished runs (compare, plot) without running a model."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from evaluators.judging.alpaca_eval import AlpacaEval
from evaluators.records import SampleRecord
from evaluators.report import summarize_task, summary_json, write_samples
from evaluators.tasks.base import Prompt
from evaluators.tasks.gsm8k import GSM8K

STRICT, FLEX = "exact_match,strict-match", "exact_match,flexible-extract"
WIN_RATE = "win_rate,none"


def question_prompt(question: int, prompts: dict[int, str] | None = None) -> tuple[str, str]:
    """The prompt text a record shows for a question and the digest its task's prompt has."""
    text = (prompts or {}).get(question, f"Question {question}")
    return text, Prompt.user_turn(text).digest()


def write_gsm8k_run(
    root: Path,
    run_id: str,
    strict: dict[int, list[int]],
    flexible: dict[int, list[int]],
    prompts: dict[int, str] | None = None,
) -> Path:
    """A finished GSM8K run: question -> each sample's 0/1 score, per metric; `prompts` changes a question's."""
    records = []
    for q, samples in strict.items():
        text, digest = question_prompt(q, prompts)
        records += [
            SampleRecord("gsm8k", q, i, f"{run_id}-{q}-{i}", text, "o", "t",
                         {STRICT: float(s), FLEX: float(flexible[q][i])}, {STRICT: 1.0, FLEX: 1.0},
                         prompt_hash=digest)
            for i, s in enumerate(samples)
        ]  # fmt: skip
    run = root / run_id
    write_samples(run / "samples" / "model", "gsm8k", records)
    num_runs = max(len(samples) for samples in strict.values())
    summary = summarize_task(GSM8K(), records, num_runs=num_runs, num_fewshot=0, num_available=1319)
    (run / "summary.json").write_text(json.dumps(summary_json([summary], {"run_id": run_id})))
    return run


def judge_slug(name: str) -> str:
    """The folder a judge's verdicts go to, as rayeval names it (cluster.judging.backends)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")


def write_judged_run(root: Path, run_id: str, wins_by_judge: dict[str, dict[int, list[int]]]) -> Path:
    """A finished alpaca_eval run judged by each judge named: judge -> question -> each sample's games won of
    two. The unjudged outputs go under samples/, each judge's scored samples and summary under
    judges/<judge>/, and the run's summary.json is the last judge's, as after its --judge-only run."""
    task, run = AlpacaEval(), root / run_id
    first = next(iter(wins_by_judge.values()))
    outputs = [
        SampleRecord("alpaca_eval", q, i, f"{run_id}-{q}-{i}", text, f"answer {q}.{i}", "reference",
                     prompt_hash=digest)
        for q, samples in first.items() for text, digest in [question_prompt(q)] for i in range(len(samples))
    ]  # fmt: skip
    write_samples(run / "samples" / "model", task.name, outputs)
    for judge, wins in wins_by_judge.items():
        judged = [
            replace(
                r, judge=judge, scores={WIN_RATE: wins[r.doc_id][r.sample_index] / 2}, weights={WIN_RATE: 2.0}
            )
            for r in outputs
        ]
        folder = run / "judges" / judge_slug(judge)
        write_samples(folder / "samples", task.name, judged)
        num_runs = max(len(samples) for samples in wins.values())
        summary = summarize_task(task, judged, num_runs=num_runs, num_fewshot=0, num_available=805)
        summary.judge = judge
        body = json.dumps(summary_json([summary], {"run_id": run_id}))
        (folder / "summary.json").write_text(body)
        (run / "summary.json").write_text(body)
    return run
