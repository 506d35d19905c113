"""What a report page shows, read from the folders rayeval writes: a run's (summary.json, its sample records,
judged tasks' verdicts, config.yaml), a sweep's (one run folder per step) and two runs' paired comparison.
Everything becomes plain JSON-able dicts the page's script renders."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from evaluators.compare import CompareOptions, compare_runs, comparison_json, first_record, load_run
from evaluators.curves import points_from_run
from evaluators.errors import EvalInputError

# What each metric (by name before the filter) means, shown on hover; a metric not listed shows its method.
METRIC_DEFINITIONS = {
    "exact_match": "share of answers whose extracted final answer equals the target",
    "prompt_level_strict_acc": "share of prompts whose every instruction is followed (strict check)",
    "inst_level_strict_acc": "share of all instructions followed (strict check)",
    "prompt_level_loose_acc": "share of prompts whose every instruction is followed (loose: after removing "
    "first/last lines and markdown)",
    "inst_level_loose_acc": "share of all instructions followed (loose check)",
    "win_rate": "share of pairwise judgments the model wins against the reference (ties count half), both orders",
    "score": "the task's score per sample, averaged",
    "acc": "share of questions whose likeliest choice is the right one",
    "acc_norm": "as acc, with each choice's log-likelihood normalised by its length",
}
COLUMNS = ("mean", "sem", "ci95", "n", "questions", "failed", "pass_at_k")


def run_page_data(run_dir: Path, judge: str | None = None) -> dict[str, Any]:
    """A finished run folder as the run page's data. A judged task shows `judge`'s verdicts and numbers, else
    those of the run's latest judge (the one summary.json's numbers come from); each task names its judge."""
    summary = _summary(run_dir)
    samples = load_run(run_dir, judge, latest_judge=True)  # says so where the folder holds no samples
    tasks = []
    for name, body in summary.get("tasks", {}).items():
        if judge is not None:  # the asked judge's numbers (else summary.json's: the latest judge's)
            body = samples.judge_summaries.get(name, body)
        tasks.append({
            "name": name, "version": body.get("version"), "failed": body.get("failed", 0),
            "failure_reasons": body.get("failure_reasons", {}), "num_runs": body.get("num_runs"),
            "judge": samples.judges.get(name),
            "metrics": [*(_metric_row(k, m) for k, m in body.get("metrics", {}).items()), *_other_rows(body)],
        })  # fmt: skip
    records = {
        task: [_record_json(r) for r in sorted(rows, key=lambda r: r.sort_key)]
        for task, rows in samples.records.items()
    }
    config = run_dir / "config.yaml"
    run = summary.get("run", {})
    return {
        "kind": "run",
        "title": f"{run.get('run_id', run_dir.name)}: {run.get('model', '')}",
        "tasks": tasks,
        "samples": records,
        "config": config.read_text(encoding="utf-8") if config.is_file() else "",
        "timeline": run.get("timeline", {}),
        "engines": [
            {
                k: e.get(k)
                for k in ("name", "node_id", "pid", "start_s", "dtype", "vllm_version", "max_num_seqs")
            }
            for e in run.get("engines", [])
        ],
        "facts": {
            k: run.get(k)
            for k in (
                "model",
                "model_path",
                "device",
                "replicas",
                "num_samples",
                "requests",
                "requests_generated",
                "samples_failed",
                "wall_s",
                "generation_s",
            )
        },  # fmt: skip
    }


def sweep_page_data(sweep_dir: Path, step_pages: dict[int, str]) -> dict[str, Any]:
    """A sweep folder's steps as curves (mean and CI95 by step, per task and metric) and a table; each
    point links to its step's run page (`step_pages`: step -> relative URL)."""
    steps = sorted(
        (int(p.parent.name.removeprefix("step_")), p.parent)
        for p in sweep_dir.glob("step_*/summary.json")
        if p.parent.name.removeprefix("step_").isdigit()
    )
    if not steps:
        raise EvalInputError(
            f"{sweep_dir} holds no finished step (step_<N>/summary.json): is it a sweep folder?"
        )
    points = [
        p for step, folder in steps for p in points_from_run(folder, sweep_dir.name, step, latest_judge=True)
    ]
    curves: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(points, key=lambda p: (p.task, p.metric, p.step)):
        curves.setdefault(f"{p.task} / {p.metric}", []).append({
            "step": p.step, "mean": _finite(p.mean), "low": _finite(p.ci95_low), "high": _finite(p.ci95_high),
            "sem": _finite(p.sem), "n": p.n, "questions": p.questions, "judge": p.judge, "page": step_pages.get(p.step),
        })  # fmt: skip
    return {
        "kind": "sweep",
        "title": f"sweep {sweep_dir.name}",
        "curves": curves,
        "steps": [s for s, _ in steps],
    }


def comparison_page_data(
    run_a: Path, run_b: Path, options: CompareOptions, judge: str | None = None
) -> dict[str, Any]:
    """Two runs' paired comparison (compare's numbers, Holm-adjusted) and the questions where they differ; a
    judged task pairs `judge`'s verdicts (as `rayeval compare --judge`)."""
    a, b = load_run(run_a, judge), load_run(run_b, judge)
    rows = compare_runs(a, b, options)
    level = options.level
    differing: list[dict[str, Any]] = []
    for task in sorted(set(a.records) & set(b.records)):
        first_a, first_b = first_record(a.records[task]), first_record(b.records[task])
        for doc_id in sorted(set(first_a) & set(first_b)):
            ra, rb = first_a[doc_id], first_b[doc_id]
            if ra.scores != rb.scores or ra.output != rb.output:
                differing.append(
                    {"task": task, "doc_id": doc_id, "a": _record_json(ra), "b": _record_json(rb)}
                )
    return {"kind": "compare", "title": f"{a.run_id} vs {b.run_id}", "comparison": comparison_json(a, b, rows, level),
            "differing": differing}  # fmt: skip


def _summary(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise EvalInputError(
            f"{run_dir} has no readable summary.json ({exc}); is it a finished run folder?"
        ) from None


def _metric_row(key: str, metric: dict[str, Any]) -> dict[str, Any]:
    name = key.partition(",")[0]
    definition = METRIC_DEFINITIONS.get(name, "")
    method = f"SEM: {metric.get('sem_method', '')}. CI95: {metric.get('ci95_method', '')}."
    return {
        "key": key, "mean": _finite(metric.get("mean")), "sem": _finite(metric.get("sem")),
        "ci95": [_finite(v) for v in metric.get("ci95") or [None, None]], "n": metric.get("n"),
        "questions": metric.get("questions"), "pass_at_k": metric.get("pass_at_k", {}),
        "definition": f"{definition}. {method}" if definition else method,
    }  # fmt: skip


def _other_rows(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's numbers beside its mean metrics, as the results table shows them: lm-eval's aggregates
    other than a mean (perplexity, a group's), the judged tasks' statistics (bootstraps, the LC win rate),
    and lm-eval's numbers withheld for counting failed samples."""
    n, questions = body.get("num_runs"), body.get("num_questions")
    rows = []
    for key, (value, stderr) in (body.get("aggregate_only") or {}).items():
        rows.append({"key": key, "mean": _finite(value), "sem": _finite(stderr), "ci95": [None, None], "n": 1,
                     "questions": questions, "pass_at_k": {}, "definition": "as lm-eval aggregates it"})  # fmt: skip
    for key, stat in (body.get("statistics") or {}).items():
        rows.append({"key": f"{key} (bootstrap)", "mean": _finite(stat.get("value")), "sem": _finite(stat.get("std")),
                     "ci95": [_finite(v) for v in stat.get("ci95") or [None, None]], "n": n,
                     "questions": questions, "pass_at_k": {}, "definition": stat.get("method", "")})  # fmt: skip
    for key, why in (body.get("withheld") or {}).items():
        rows.append({"key": f"{key} (withheld)", "mean": None, "sem": None, "ci95": [None, None], "n": 1,
                     "questions": questions, "pass_at_k": {}, "definition": why})  # fmt: skip
    return rows


def _record_json(record: Any) -> dict[str, Any]:
    body = record.to_dict()
    return {k: body[k] for k in ("doc_id", "sample_index", "prompt", "output", "target", "scores", "error",
                                 "judge", "verdicts", "judge_outputs", "finish_reason", "output_tokens")}  # fmt: skip


def _finite(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value
