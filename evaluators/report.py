"""Run outputs: per-sample JSONL and Parquet, lm-eval compatible results.json, summary.json, a table."""

from __future__ import annotations

import functools
import io
import json
import math
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evaluators.adaptive import AdaptiveReport
from evaluators.failures import failure_kind
from evaluators.judging.base import TaskStatistic
from evaluators.passk import METHOD as PASS_AT_K_METHOD
from evaluators.passk import PassAtKTable, pass_at_k_table
from evaluators.records import SampleRecord
from evaluators.stats import MetricSummary, ScoredItem, summarize
from evaluators.tasks.base import Task
from evaluators.tokens import TokenCounts

# Where a task reports both: which interval is the one to quote, and why.
HEADLINE_INTERVAL = (
    "metrics.*.ci95: the t-interval on the question-clustered SEM over every sample, as for every task. The "
    "statistics' bootstrap intervals resample questions the way the benchmark's own leaderboard does, and are "
    "there to set beside its published numbers."
)


@dataclass
class TaskSummary:
    task: str
    version: str
    num_fewshot: int
    num_questions: int
    num_available: int
    num_samples: int
    num_runs: int
    failed: int
    failure_reasons: dict[str, int]
    metrics: dict[str, MetricSummary] = field(default_factory=dict)
    pass_at_k: dict[str, PassAtKTable] = field(default_factory=dict)  # 0/1 metrics with N > 1
    source: str = "rayeval"  # "rayeval" | "lm-eval": whose task definition and metrics
    # lm-eval metrics aggregated other than by a mean (perplexity, corpus BLEU): value and lm-eval's stderr
    aggregate_only: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    higher_is_better: dict[str, bool] = field(default_factory=dict)
    lm_eval_results: dict[str, Any] | None = None  # lm-eval's own results entry (runs with N = 1)
    # lm-eval's aggregates not reported, each with why (they counted failed samples as answers)
    withheld: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # the task could not run at all (e.g. its dataset is unreachable)
    judge: str | None = None  # judged tasks: the judge, or why they were not judged (--inference-only)
    statistics: list[TaskStatistic] = field(default_factory=list)  # judged tasks: LC win rate, bootstrap CIs
    adaptive: AdaptiveReport | None = None  # adaptive N: samples per question, rounds, why it stopped
    one_draw: str | None = None  # greedy decoding with N > 1 asked: why the samples are one draw (N = 1)
    tokens: TokenCounts | None = None  # its records' prompt and output tokens (evaluators.tokens)


def summarize_task(
    task: Task,
    records: list[SampleRecord],
    num_runs: int,
    num_fewshot: int,
    num_available: int,
    common_runs: int | None = None,
) -> TaskSummary:
    summary = summarize_records(
        task.name,
        task.version,
        [m.key for m in task.metrics if not m.optional or any(m.key in r.scores for r in records)],
        records,
        num_runs,
        num_fewshot,
        num_available,
        bounds={m.key: m.bounds for m in task.metrics if m.bounds is not None},
        common_runs=common_runs,
    )
    summary.higher_is_better = {m.key: m.higher_is_better for m in task.metrics if m.key in summary.metrics}
    return summary


def summarize_records(
    name: str,
    version: str,
    metric_keys: list[str],
    records: list[SampleRecord],
    num_runs: int,
    num_fewshot: int,
    num_available: int,
    bounds: dict[str, tuple[float, float]] | None = None,
    common_runs: int | None = None,
) -> TaskSummary:
    """mean@N of each per-sample metric, with failed samples counted by reason and never scored; `bounds`
    gives metrics' known ranges (their CI95 stays inside); `common_runs` is for adaptive N (`summarize`)."""
    failed = [r for r in records if r.error is not None]
    reasons = Counter(failure_kind(r.error or "") for r in failed)
    summary = TaskSummary(
        task=name,
        version=version,
        num_fewshot=num_fewshot,
        num_questions=len({r.doc_id for r in records}),
        num_available=num_available,
        num_samples=len(records),
        num_runs=num_runs,
        failed=len(failed),
        failure_reasons=dict(reasons),
    )
    for key in metric_keys:
        items = scored_items(records, key)
        summary.metrics[key] = summarize(items, num_runs, (bounds or {}).get(key), common_runs)
        if table := pass_at_k_table(items):
            summary.pass_at_k[key] = table
    return summary


def scored_items(records: list[SampleRecord], metric: str) -> list[ScoredItem]:
    """The scored samples of one metric, failed samples left out: what mean@N and comparisons reduce."""
    return [
        ScoredItem(r.doc_id, r.sample_index, r.scores[metric] * r.weights[metric], r.weights[metric])
        for r in records
        if r.error is None and metric in r.scores
    ]


def greedy_note(samples_asked: int) -> str:
    """summary.json's `one_draw` for a greedy task run with N > 1: what was generated and what is reported."""
    return (
        f"greedy decoding (temperature 0): the {samples_asked} samples asked per question are one draw, "
        "generated and scored once; N = 1, so there is no std across runs and no pass@k"
    )


def unavailable_task(name: str, source: str, error: str) -> TaskSummary:
    return TaskSummary(name, "", 0, 0, 0, 0, 0, 0, {}, source=source, error=error)


@functools.cache
def preload_report_libraries() -> threading.Thread:
    """Start, once per process and in a background thread, the imports a run's end would otherwise wait for
    after its last result: pandas, which pyarrow imports the first time it converts Python rows into a table
    (`write_samples`: 0.3 to 0.45 s on two cores), and scipy.special, the t-quantile of every summary. A run
    whose engines leave this machine's cores free starts it once its first result is scored, so the imports
    overlap generation (the run's scoring thread starts it). pandas is imported before
    pyarrow's first conversion, so a conversion on another thread meanwhile waits on Python's import lock for
    the same module rather than finding it half-imported."""

    def load() -> None:
        import pandas  # noqa: F401 - imported for its side effect: loaded once, here
        import pyarrow as pa
        from scipy import special  # noqa: F401

        pa.Table.from_pylist([{"preload": 0}])  # pyarrow's pandas adapter, set up once per process

    thread = threading.Thread(target=load, name="report-libraries-import", daemon=True)
    thread.start()
    return thread


def write_samples(directory: Path, task: str, records: list[SampleRecord]) -> tuple[Path, Path]:
    """Final per-sample files, in (question, sample) order so a resumed run writes the same bytes of data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    ordered = sorted(records, key=lambda r: r.sort_key)
    jsonl = directory / f"{task}.jsonl"
    tmp = jsonl.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for record in ordered:
            handle.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
    tmp.replace(jsonl)
    parquet = directory / f"{task}.parquet"
    rows = [record.to_dict() for record in ordered]
    for row in rows:  # mappings as JSON text: score keys hold commas, and Parquet cannot store empty structs
        for key in ("scores", "weights", "verdicts", "judge_outputs", "features"):
            row[key] = json.dumps(row[key], ensure_ascii=False)
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    return jsonl, parquet


def _finite(value: float) -> float | None:
    return None if not math.isfinite(value) else value


def json_safe(value: Any) -> Any:
    """`value` with every NaN or infinite float as None: JSON has no such numbers (Python would write
    `NaN` or `Infinity`, which strict parsers reject). lm-eval's own entries may hold them."""
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def results_json(
    summaries: list[TaskSummary], config: dict[str, Any], model_name: str, date: float
) -> dict[str, Any]:
    """lm-eval's results.json layout: `results[task]["metric,filter"]` and `"metric_stderr,filter"`.

    lm-eval tasks run once (N = 1) without failed samples carry lm-eval's own entry unchanged, so the numbers
    equal lm-eval's. Otherwise mean metrics are our mean@N with the question-clustered SEM as their stderr, and
    the numbers lm-eval computed over failed samples are null (`TaskSummary.withheld`).
    """
    results: dict[str, dict[str, Any]] = {}
    ran = [s for s in summaries if s.error is None]
    for s in ran:
        if s.lm_eval_results is not None:
            results[s.task] = dict(s.lm_eval_results)
            continue
        entry: dict[str, Any] = {"alias": s.task}
        for key, m in s.metrics.items():
            name, _, filt = key.partition(",")
            entry[key] = _finite(m.mean)
            entry[f"{name}_stderr,{filt}"] = _finite(m.sem)
        for key, (value, stderr) in s.aggregate_only.items():
            name, _, filt = key.partition(",")
            entry[key] = _finite(value)
            entry[f"{name}_stderr,{filt}"] = "N/A" if stderr is None else _finite(stderr)
        for key in s.withheld:
            name, _, filt = key.partition(",")
            entry[key], entry[f"{name}_stderr,{filt}"] = None, "N/A"
        for stat in s.statistics:
            if (
                stat.key not in s.metrics
            ):  # a bootstrap of a mean metric keeps the clustered SEM as its stderr
                name, _, filt = stat.key.partition(",")
                entry[stat.key] = _finite(stat.value)
                entry[f"{name}_stderr,{filt}"] = _finite(stat.std)
        if s.judge is not None:
            entry["judge"] = s.judge
        results[s.task] = entry
    return json_safe(
        {
            "results": results,
            "versions": {s.task: s.version for s in ran},
            "n-shot": {s.task: s.num_fewshot for s in ran},
            "higher_is_better": {
                s.task: {
                    **{
                        k.split(",")[0]: s.higher_is_better.get(k, True)
                        for k in [*s.metrics, *s.aggregate_only]
                    },
                    **{t.key.split(",")[0]: t.higher_is_better for t in s.statistics},
                }
                for s in ran
            },
            "n-samples": {s.task: {"original": s.num_available, "effective": s.num_questions} for s in ran},
            "errors": {s.task: s.error for s in summaries if s.error is not None},
            "config": config,
            "model_name": model_name,
            "date": date,
        }
    )


def summary_json(summaries: list[TaskSummary], run_info: dict[str, Any]) -> dict[str, Any]:
    tasks: dict[str, Any] = {}
    for s in summaries:
        body = asdict(s)
        body["metrics"] = {
            key: {
                "mean": _finite(m.mean),
                "std_across_runs": _finite(m.std_across_runs),
                "sem": _finite(m.sem),
                "sem_method": "question-clustered standard error (Miller 2024)",
                "ci95": [_finite(m.ci95_low), _finite(m.ci95_high)],
                "ci95_method": m.ci_method,
                **({"bounds": list(m.bounds)} if m.bounds is not None else {}),
                "run_means": list(m.run_means),
                "n": m.num_runs,
                "questions": m.num_questions,
                "scored_samples": m.num_scored,
                **_pass_at_k_json(s.pass_at_k.get(key)),
            }
            for key, m in s.metrics.items()
        }
        body.pop("pass_at_k")
        if s.adaptive is not None:
            adaptive = body["adaptive"]
            adaptive["sem_by_round"] = [_finite(x) for x in s.adaptive.sem_by_round]
            adaptive["floor_sem"] = _finite(s.adaptive.floor_sem)
        body["statistics"] = {
            t.key: {
                "value": _finite(t.value),
                "std": _finite(t.std),
                "ci95": [_finite(t.ci95_low), _finite(t.ci95_high)],
                "method": t.method,
            }
            for t in s.statistics
        }
        if s.statistics and s.metrics:
            body["headline_interval"] = HEADLINE_INTERVAL
        tasks[s.task] = body
    return json_safe({"run": run_info, "tasks": tasks})


def _pass_at_k_json(table: PassAtKTable | None) -> dict[str, Any]:
    if not table:
        return {}
    body: dict[str, Any] = {
        "pass_at_k": {
            str(row.k): {
                "mean": _finite(row.mean),
                "sem": _finite(row.sem),
                "ci95": [_finite(row.ci95_low), _finite(row.ci95_high)],
                "questions": row.questions,
            }
            for row in table.rows
        },
        "pass_at_k_method": PASS_AT_K_METHOD,
    }
    if table.left_out:  # k that only some questions reach: no benchmark number, only the coverage
        body["pass_at_k_left_out"] = {
            str(k): {"questions_with_k_samples": reached, "questions": table.questions}
            for k, reached in table.left_out.items()
        }
    return body


def _fmt(value: float, digits: int) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def render_table(summaries: list[TaskSummary], footer: str | None = None) -> str:
    """The results table, and `footer` (the run's tokens) as its last line."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rayeval results (mean@N)")
    for column in ("task", "metric", "N", "questions", "mean", "± SEM", "CI95", "std across runs", "failed"):
        table.add_column(column, justify="left" if column in ("task", "metric") else "right")
    for s in summaries:
        if s.error is not None:
            table.add_row(s.task, "not run (see summary.json)", *["-"] * 6, "-")
            continue
        for key, m in s.metrics.items():
            table.add_row(
                s.task,
                key,
                str(m.num_runs),
                str(m.num_questions),
                _fmt(m.mean, 4),
                _fmt(m.sem, 4),
                f"[{_fmt(m.ci95_low, 3)}, {_fmt(m.ci95_high, 3)}]",
                _fmt(m.std_across_runs, 4),
                str(s.failed),
            )
        for key, (value, stderr) in s.aggregate_only.items():
            stderr_text = "-" if stderr is None else _fmt(stderr, 4)
            table.add_row(
                s.task, key, "1", str(s.num_questions), _fmt(value, 4), stderr_text, "-", "-", str(s.failed)
            )
        for key in s.withheld:
            table.add_row(s.task, key, "1", str(s.num_questions), "withheld", "-", "-", "-", str(s.failed))
        for stat in s.statistics:
            table.add_row(
                s.task,
                f"{stat.key} (bootstrap)",
                str(s.num_runs),
                str(s.num_questions),
                _fmt(stat.value, 4),
                _fmt(stat.std, 4),
                f"[{_fmt(stat.ci95_low, 3)}, {_fmt(stat.ci95_high, 3)}]",
                "-",
                str(s.failed),
            )
        if not s.metrics and s.judge is not None:
            table.add_row(
                s.task, f"not judged: {s.judge}", "-", str(s.num_questions), *["-"] * 4, str(s.failed)
            )
    console = Console(width=140, record=True, file=io.StringIO())
    console.print(table)
    text = console.export_text()
    return text if footer is None else f"{text}{footer}\n"
