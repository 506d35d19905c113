"""`rayeval compare`: two finished runs of the same questions, per task and metric, B against A.

Reads each run folder's summary.json (its tasks, metrics and which way is better) and per-sample JSONL (for a
judged task, one named judge's scored samples: `evaluators.verdicts`), checks that both runs asked their
shared questions with the same prompts and had them judged by the same judge, pairs the questions both runs
scored (evaluators.paired), adjusts the p-values over every task x metric compared (Holm), and says which
differences are beyond noise at the chosen level.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
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
from evaluators.verdicts import choose_judge


@dataclass(frozen=True)
class RunSamples:
    """What a comparison needs of one run folder."""

    path: Path
    run_id: str
    records: dict[str, list[SampleRecord]]  # by task
    metrics: dict[str, list[str]]  # by task: its per-sample metrics, in the run's order
    higher_is_better: dict[str, dict[str, bool]]
    judges: dict[str, str] = field(default_factory=dict)  # judged tasks: whose verdicts the records hold
    # judged tasks: that judge's summary entry for the task (its numbers), else the run's summary.json entry
    judge_summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    # by task: the range each metric's values take, where summary.json gives it
    bounds: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    # judged tasks: what their judge was (kind, model, endpoint), where its folder records it
    judge_specs: dict[str, str] = field(default_factory=dict)
    # by task: the task's version that scored the records (a new version can score one answer otherwise)
    versions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ComparedMetric:
    task: str
    metric: str
    result: PairedDifference
    p_adjusted: float
    beyond_noise: bool
    better: str | None  # "A" or "B" where beyond noise and the metric has a direction
    judges: tuple[str, str] | None = None  # judged tasks: A's judge and B's


@dataclass(frozen=True)
class CompareOptions:
    """How `compare_runs` treats two runs that do not match: another judge, other prompts, a task scored by
    another version of it."""

    level: float = 0.05
    allow_different_judges: bool = False
    allow_different_prompts: bool = False
    allow_different_versions: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.level < 1:
            raise EvalInputError(f"--level must be between 0 and 1 (got {self.level:g}); 0.05 is usual.")


def load_run(run_dir: Path, judge: str | None = None, latest_judge: bool = False) -> RunSamples:
    """A finished run's per-sample records and metrics; a judged task's come from one judge's verdicts
    (`evaluators.verdicts.choose_judge`: `judge` where given, else the run's only one; with `latest_judge`,
    where none is named, the judge of the run's latest invocation, whose numbers summary.json holds)."""
    summary = _read_summary(run_dir)
    if not any(run_dir.glob("samples/*/*.jsonl")):
        raise EvalInputError(
            f"{run_dir} holds no sample records (samples/<model>/<task>.jsonl): a run writes them as it goes; is "
            "it a run folder copied without its samples?"
        )
    records, metrics, directions, judges, judge_summaries, bounds, specs, versions = (
        {},
        {},
        {},
        {},
        {},
        {},
        {},
        {},
    )
    for task, body in summary.get("tasks", {}).items():
        found = sorted(run_dir.glob(f"samples/*/{task}.jsonl"))[:1]
        chosen = choose_judge(run_dir, task, judge or (body.get("judge") if latest_judge else None))
        if chosen is not None:
            found, body = [chosen.samples(task)], chosen.task_summary(task) or body
            judges[task], judge_summaries[task], specs[task] = chosen.name, body, chosen.spec
        if not found or not body.get("metrics"):
            continue
        with found[0].open(encoding="utf-8") as lines:
            records[task] = [SampleRecord(**json.loads(line)) for line in lines if line.strip()]
        metrics[task] = list(body["metrics"])
        if body.get("version") is not None:
            versions[task] = str(body["version"])
        directions[task] = body.get("higher_is_better", {})
        bounds[task] = {
            key: (float(entry["bounds"][0]), float(entry["bounds"][1]))
            for key, entry in body["metrics"].items()
            if isinstance(entry, dict) and entry.get("bounds")
        }
    run_id = summary.get("run", {}).get("run_id", run_dir.name)
    return RunSamples(
        run_dir, run_id, records, metrics, directions, judges, judge_summaries, bounds, specs, versions
    )


def _read_summary(run_dir: Path) -> dict[str, Any]:
    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        inside = sorted(p.parent.name for p in run_dir.glob("*/summary.json"))
        hint = f" It holds these runs: {', '.join(inside)}." if inside else ""
        raise EvalInputError(
            f"'{run_dir}' is not a finished rayeval run folder (no summary.json in it).{hint} Give the folder a "
            "run printed as 'results in ...'."
        )
    try:
        return json.loads(summary_file.read_text())
    except json.JSONDecodeError as exc:
        raise EvalInputError(
            f"'{summary_file}' is not valid JSON ({exc}); rerun the run to rewrite it."
        ) from None


def compare_runs(a: RunSamples, b: RunSamples, options: CompareOptions | None = None) -> list[ComparedMetric]:
    """Every metric of every task both runs scored, B minus A, Holm-adjusted over all of them. Runs whose
    judged tasks were judged by different judges, whose questions were asked with different prompts, or whose
    task was scored by different versions of it, are refused unless `options` allows it."""
    options = options or CompareOptions()
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
    tasks = list(dict.fromkeys(task for task, _ in pairs))
    if not options.allow_different_judges:
        check_same_judges(a, b, tasks)
    if not options.allow_different_prompts:
        check_same_prompts(a, b, tasks)
    if not options.allow_different_versions:
        check_same_versions(a, b, tasks)
    results = [
        paired_difference(
            scored_items(a.records[t], m),
            scored_items(b.records[t], m),
            a.bounds.get(t, {}).get(m) or b.bounds.get(t, {}).get(m),
        )
        for t, m in pairs
    ]
    adjusted = holm_adjusted([r.p_value for r in results])
    compared = []
    for (task, metric), result, p in zip(pairs, results, adjusted, strict=True):
        beyond = not math.isnan(p) and p < options.level and result.difference != 0
        direction = a.higher_is_better.get(task, {}).get(metric)
        better = None
        if beyond and direction is not None:
            better = "B" if (result.difference > 0) == direction else "A"
        judges = (a.judges[task], b.judges[task]) if task in a.judges and task in b.judges else None
        compared.append(ComparedMetric(task, metric, result, p, beyond, better, judges))
    return compared


def check_same_judges(a: RunSamples, b: RunSamples, tasks: list[str]) -> None:
    """Refuse to pair one judge's verdicts in A with another's in B."""
    for task in tasks:
        judge_a, judge_b = a.judges.get(task), b.judges.get(task)
        spec_a, spec_b = a.judge_specs.get(task), b.judge_specs.get(task)
        moved = ""
        if judge_a == judge_b and spec_a and spec_b and spec_a != spec_b:  # one name, two judges
            judge_a, judge_b = f"{judge_a} ({spec_a})", f"{judge_b} ({spec_b})"
            moved = " (where it is one judge served elsewhere, --allow-different-judges says so)"
        if judge_a != judge_b:
            raise EvalInputError(
                f"{task} was judged by {judge_a or 'no judge'} in A ({a.run_id}) and by {judge_b or 'no judge'} "
                f"in B ({b.run_id}): a difference would mix two judges' verdicts with the models' difference. "
                "Judge both runs with one judge (rayeval run --judge-only --run-id RUN --judge NAME) and pass "
                f"--judge NAME, or pass --allow-different-judges to compare them anyway{moved}."
            )


def check_same_prompts(a: RunSamples, b: RunSamples, tasks: list[str]) -> None:
    """Refuse two runs that asked a question they share with different prompts (a changed dataset, few-shot
    set or prompt wording): pairing them by doc_id would pair different questions. Records that keep their
    prompt's hash are compared by it (the prompt as the task posed it, so two models' chat templates do not
    count); older records by the text they sent."""
    for task in tasks:
        first_a, first_b = first_record(a.records[task]), first_record(b.records[task])
        for doc_id in sorted(first_a.keys() & first_b.keys()):
            ra, rb = first_a[doc_id], first_b[doc_id]
            same = (
                ra.prompt_hash == rb.prompt_hash
                if ra.prompt_hash and rb.prompt_hash
                else ra.prompt == rb.prompt
            )
            if not same:
                raise EvalInputError(
                    f"{task}: question {doc_id} was asked with different prompts in A ({a.run_id}: "
                    f"{_start(ra.prompt)}) and B ({b.run_id}: {_start(rb.prompt)}), so the runs do not pair by "
                    "question. Compare runs of the same data and prompt settings, or pass "
                    "--allow-different-prompts to pair them by doc_id anyway."
                )


def check_same_versions(a: RunSamples, b: RunSamples, tasks: list[str]) -> None:
    """Refuse a task scored by one version in A and another in B: a version changes how an answer scores (a
    checker, a parser, a metric's rule), so their difference would mix that change with the models'."""
    for task in tasks:
        version_a, version_b = a.versions.get(task), b.versions.get(task)
        if version_a and version_b and version_a != version_b:
            raise EvalInputError(
                f"{task} was scored by version {version_a} of the task in A ({a.run_id}) and {version_b} in B "
                f"({b.run_id}): a difference would mix the scoring change with the models'. Run the older one's "
                "command again with this rayeval (same --output-dir and --run-id: its completions are read back "
                "from its store and scored again; a judged task with --judge-only), or pass "
                "--allow-different-versions to compare them anyway."
            )


def first_record(records: list[SampleRecord]) -> dict[int, SampleRecord]:
    """Each question's first sample (lowest sample index), by doc id."""
    first: dict[int, SampleRecord] = {}
    for record in sorted(records, key=lambda r: r.sort_key):
        first.setdefault(record.doc_id, record)
    return first


def _start(prompt: str, size: int = 60) -> str:
    flat = " ".join(prompt.split())
    return repr(flat if len(flat) <= size else flat[:size] + "...")


def comparison_json(a: RunSamples, b: RunSamples, rows: list[ComparedMetric], level: float) -> dict[str, Any]:
    def finite(value: float) -> float | None:
        return None if math.isnan(value) else value

    return {
        "a": {"run_id": a.run_id, "path": str(a.path)},
        "b": {"run_id": b.run_id, "path": str(b.path)},
        "difference": "B - A",
        "se_method": SE_METHOD,
        "multiple_comparisons": f"{MULTIPLE_COMPARISONS} ({tested(rows)} comparisons), level {level:g}",
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
                **({"judge_a": row.judges[0], "judge_b": row.judges[1]} if row.judges else {}),
            }
            for row in rows
        ],
    }


def render_comparison(a: RunSamples, b: RunSamples, rows: list[ComparedMetric], level: float) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"B ({b.run_id}) - A ({a.run_id}), paired over the questions both scored")
    judged = any(row.judges for row in rows)
    columns = ("task", "metric", *(("judge",) if judged else ()), "questions", "A", "B", "B - A", "± SE", "CI95",
               "p (Holm)", "verdict")  # fmt: skip
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("task", "metric", "judge", "verdict") else "right"
        )
    for row in rows:
        r = row.result
        verdict = "within noise"
        if row.beyond_noise:
            verdict = f"{row.better} better" if row.better else "differs"
        judge = (_judge_cell(row.judges),) if judged else ()
        table.add_row(
            row.task, row.metric, *judge, str(r.questions), _fmt(r.mean_a), _fmt(r.mean_b), _fmt(r.difference),
            _fmt(r.sem), f"[{_fmt(r.ci95_low, 3)}, {_fmt(r.ci95_high, 3)}]", _fmt(row.p_adjusted), verdict,
        )  # fmt: skip
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(table)
    console.print(f"SE: {SE_METHOD}.")
    console.print(
        f"Beyond noise: {MULTIPLE_COMPARISONS} ({tested(rows)} comparisons), adjusted p below {level:g}."
    )
    left_out = {(row.task, row.result.only_in_one) for row in rows if row.result.only_in_one}
    for task, count in sorted(left_out):
        console.print(f"{task}: {count} question(s) scored in one run only, left out of the pairing.")
    return console.export_text()


def tested(rows: list[ComparedMetric]) -> int:
    """The comparisons Holm's adjustment counts: those with a p-value (a metric with under two shared
    questions has none)."""
    return sum(not math.isnan(row.result.p_value) for row in rows)


def _judge_cell(judges: tuple[str, str] | None) -> str:
    if judges is None:
        return "-"
    return judges[0] if judges[0] == judges[1] else f"A: {judges[0]}, B: {judges[1]}"


def _fmt(value: float, digits: int = 4) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"
