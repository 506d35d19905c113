"""`rayeval compare`: two finished runs of the same questions, per task and metric, B against A.

Reads each run folder's summary.json (its tasks, metrics and which way is better) and per-sample JSONL, pairs
the questions both runs scored (evaluators.paired), adjusts the p-values over every task x metric compared
(Holm), and says which differences are beyond noise at the chosen level.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluators.errors import EvalInputError
from evaluators.paired import (
    MULTIPLE_COMPARISONS,
    SE_METHOD,
    PairedDifference,
    holm_adjusted,
    paired_difference,
)
from evaluators.records import SampleRecord
from evaluators.report import scored_items


@dataclass(frozen=True)
class RunSamples:
    """What a comparison needs of one run folder."""

    path: Path
    run_id: str
    records: dict[str, list[SampleRecord]]  # by task
    metrics: dict[str, list[str]]  # by task: its per-sample metrics, in the run's order
    higher_is_better: dict[str, dict[str, bool]]


@dataclass(frozen=True)
class ComparedMetric:
    task: str
    metric: str
    result: PairedDifference
    p_adjusted: float
    beyond_noise: bool
    better: str | None  # "A" or "B" where beyond noise and the metric has a direction


def load_run(run_dir: Path) -> RunSamples:
    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        inside = sorted(p.parent.name for p in run_dir.glob("*/summary.json"))
        hint = f" It holds these runs: {', '.join(inside)}." if inside else ""
        raise EvalInputError(
            f"'{run_dir}' is not a finished rayeval run folder (no summary.json in it).{hint} Give the folder a "
            "run printed as 'results in ...'."
        )
    try:
        summary = json.loads(summary_file.read_text())
    except json.JSONDecodeError as exc:
        raise EvalInputError(
            f"'{summary_file}' is not valid JSON ({exc}); rerun the run to rewrite it."
        ) from None
    records, metrics, directions = {}, {}, {}
    for task, body in summary.get("tasks", {}).items():
        found = sorted(run_dir.glob(f"samples/*/{task}.jsonl"))
        if not found or not body.get("metrics"):
            continue
        with found[0].open(encoding="utf-8") as lines:
            records[task] = [SampleRecord(**json.loads(line)) for line in lines if line.strip()]
        metrics[task] = list(body["metrics"])
        directions[task] = body.get("higher_is_better", {})
    return RunSamples(
        run_dir, summary.get("run", {}).get("run_id", run_dir.name), records, metrics, directions
    )


def compare_runs(a: RunSamples, b: RunSamples, level: float = 0.05) -> list[ComparedMetric]:
    """Every metric of every task both runs scored, B minus A, Holm-adjusted over all of them."""
    pairs = [
        (task, metric)
        for task in a.metrics
        if task in b.metrics
        for metric in a.metrics[task]
        if metric in b.metrics[task]
    ]
    if not pairs:
        raise EvalInputError(
            f"Runs '{a.run_id}' and '{b.run_id}' share no scored task and metric (A has "
            f"{', '.join(a.metrics) or 'none'}, B has {', '.join(b.metrics) or 'none'}). Compare runs of the "
            "same tasks."
        )
    results = [
        paired_difference(scored_items(a.records[t], m), scored_items(b.records[t], m)) for t, m in pairs
    ]
    adjusted = holm_adjusted([r.p_value for r in results])
    compared = []
    for (task, metric), result, p in zip(pairs, results, adjusted, strict=True):
        beyond = not math.isnan(p) and p < level and result.difference != 0
        direction = a.higher_is_better.get(task, {}).get(metric)
        better = None
        if beyond and direction is not None:
            better = "B" if (result.difference > 0) == direction else "A"
        compared.append(ComparedMetric(task, metric, result, p, beyond, better))
    return compared


def comparison_json(a: RunSamples, b: RunSamples, rows: list[ComparedMetric], level: float) -> dict[str, Any]:
    def finite(value: float) -> float | None:
        return None if math.isnan(value) else value

    return {
        "a": {"run_id": a.run_id, "path": str(a.path)},
        "b": {"run_id": b.run_id, "path": str(b.path)},
        "difference": "B - A",
        "se_method": SE_METHOD,
        "multiple_comparisons": f"{MULTIPLE_COMPARISONS} ({len(rows)} comparisons), level {level:g}",
        "metrics": [
            {
                "task": row.task,
                "metric": row.metric,
                "mean_a": finite(row.result.mean_a),
                "mean_b": finite(row.result.mean_b),
                "difference": finite(row.result.difference),
                "sem": finite(row.result.sem),
                "ci95": [finite(row.result.ci95_low), finite(row.result.ci95_high)],
                "p_value": finite(row.result.p_value),
                "p_adjusted": finite(row.p_adjusted),
                "beyond_noise": row.beyond_noise,
                "better": row.better,
                "questions": row.result.questions,
                "questions_in_one_run_only": row.result.only_in_one,
            }
            for row in rows
        ],
    }


def render_comparison(a: RunSamples, b: RunSamples, rows: list[ComparedMetric], level: float) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"B ({b.run_id}) - A ({a.run_id}), paired over the questions both scored")
    columns = ("task", "metric", "questions", "A", "B", "B - A", "± SE", "CI95", "p (Holm)", "verdict")
    for column in columns:
        table.add_column(column, justify="left" if column in ("task", "metric", "verdict") else "right")
    for row in rows:
        r = row.result
        verdict = "within noise"
        if row.beyond_noise:
            verdict = f"{row.better} better" if row.better else "differs"
        table.add_row(
            row.task, row.metric, str(r.questions), _fmt(r.mean_a), _fmt(r.mean_b), _fmt(r.difference),
            _fmt(r.sem), f"[{_fmt(r.ci95_low, 3)}, {_fmt(r.ci95_high, 3)}]", _fmt(row.p_adjusted), verdict,
        )  # fmt: skip
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(table)
    console.print(f"SE: {SE_METHOD}.")
    console.print(
        f"Beyond noise: {MULTIPLE_COMPARISONS} ({len(rows)} comparisons), adjusted p below {level:g}."
    )
    left_out = {(row.task, row.result.only_in_one) for row in rows if row.result.only_in_one}
    for task, count in sorted(left_out):
        console.print(f"{task}: {count} question(s) scored in one run only, left out of the pairing.")
    return console.export_text()


def _fmt(value: float, digits: int = 4) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"
