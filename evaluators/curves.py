"""Training curves: each checkpoint's scores by step, as a table (CSV and Markdown) and one plot per task with
every metric's curve and its error bars. Read from run folders (one per step) through their summary.json, so
any finished runs can be drawn, several training runs on one axis. A judged task's numbers come from one
judge's summary (`evaluators.verdicts`), named in the table and the plot; points of one task judged by
different judges, or scored by different versions of the task, are refused unless allowed
(`check_one_judge`, `check_one_version`)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from evaluators.errors import EvalInputError
from evaluators.verdicts import choose_judge


class ErrorBar(StrEnum):
    CI95 = "ci95"  # the metric's CI95 as the run reports it (possibly asymmetric, cut to the metric's range)
    SEM = "sem"  # one question-clustered standard error
    STD = "std"  # the standard deviation of the N per-run means: run-to-run noise
    NONE = "none"


@dataclass(frozen=True)
class CurvePoint:
    series: str  # the training run
    step: int
    task: str
    metric: str
    mean: float
    sem: float
    ci95_low: float
    ci95_high: float
    std_across_runs: float
    n: int
    questions: int
    judge: str = ""  # a judged task's judge, whose verdicts the numbers are
    version: str = ""  # the task's version that scored the run
    judge_spec: str = ""  # what that judge was (kind, model, endpoint), where its folder records it

    def error(self, bar: ErrorBar) -> tuple[float, float]:
        """(below, above) the mean, NaN-free: 0 where the run has no such spread (one question, N = 1)."""
        if bar is ErrorBar.CI95:
            below, above = self.mean - self.ci95_low, self.ci95_high - self.mean
        elif bar is ErrorBar.SEM:
            below = above = self.sem
        elif bar is ErrorBar.STD:
            below = above = self.std_across_runs
        else:
            below = above = 0.0
        # never negative: an interval's end a rounding error inside its mean would stop the plot
        return (0.0 if math.isnan(below) else max(0.0, below), 0.0 if math.isnan(above) else max(0.0, above))


def partial_because(run_dir: Path) -> str | None:
    """Why a finished run's numbers stand on part of what it was to score, where they do: a task it could
    not run (`task_errors`), or samples that failed outside the model (`failures.OUTSIDE_THE_MODEL`: dead
    replicas, an API that kept failing), which a later run of the folder asks again. None for a run whose
    every sample was answered and scored (or failed on the model's own account, as an over-long prompt)."""
    from evaluators.failures import OUTSIDE_THE_MODEL

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return "no readable summary.json"
    errors = (summary.get("run") or {}).get("task_errors") or {}
    if errors:
        return f"task(s) {', '.join(sorted(errors))} could not run"
    failed: dict[str, int] = {}
    for body in (summary.get("tasks") or {}).values():
        for kind, count in (body.get("failure_reasons") or {}).items():
            if kind in OUTSIDE_THE_MODEL:
                failed[kind] = failed.get(kind, 0) + int(count)
    if failed:
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(failed.items()))
        return f"{sum(failed.values())} sample(s) failed outside the model ({kinds})"
    return None


def points_from_run(
    run_dir: Path, series: str, step: int, judge: str | None = None, latest_judge: bool = False
) -> list[CurvePoint]:
    """Every metric of every task in one finished run folder, as points of `series` at `step`. A judged
    task's come from `judge`'s verdicts, else from the run's only judge; `latest_judge` picks, where none is
    named, the judge of the run's latest invocation (a sweep's own step)."""
    summary_file = run_dir / "summary.json"
    try:
        tasks = json.loads(summary_file.read_text())["tasks"]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise EvalInputError(
            f"'{run_dir}' has no readable summary.json ({exc}); is it a finished run?"
        ) from None
    points = []
    for task, body in tasks.items():
        if latest_judge and not any(body.get(k) for k in ("metrics", "aggregate_only", "statistics")):
            continue  # not scored by the latest invocation (--inference-only): nothing of its own to draw
        chosen = choose_judge(run_dir, task, judge or (body.get("judge") if latest_judge else None))
        if chosen is not None:
            body = chosen.task_summary(task)
        # what scored every point of the task: the judge, the task's version, what that judge was
        scored_by = (
            chosen.name if chosen else "",
            str(body.get("version") or ""),
            chosen.spec if chosen else "",
        )
        for metric, m in (body.get("metrics") or {}).items():
            low, high = (v if v is not None else math.nan for v in m.get("ci95", [None, None]))
            points.append(
                CurvePoint(series, step, task, metric, _num(m.get("mean")), _num(m.get("sem")), low, high,
                           _num(m.get("std_across_runs")), int(m.get("n", 1)), int(m.get("questions", 0)),
                           *scored_by)
            )  # fmt: skip
        points += _other_points(series, step, task, body, scored_by)
    return points


def _other_points(
    series: str, step: int, task: str, body: dict, scored_by: tuple[str, str, str]
) -> list[CurvePoint]:
    """A task's numbers beside its mean metrics: lm-eval's aggregates other than a mean (perplexity, a
    group's accuracy) and a judged task's statistics (bootstraps, the LC win rate)."""
    questions, runs, nan = int(body.get("num_questions") or 0), int(body.get("num_runs") or 1), math.nan
    points = [
        CurvePoint(
            series, step, task, key, _num(value), _num(stderr), nan, nan, nan, 1, questions, *scored_by
        )
        for key, (value, stderr) in (body.get("aggregate_only") or {}).items()
    ]
    for key, stat in (body.get("statistics") or {}).items():
        low, high = (_num(v) for v in stat.get("ci95") or [None, None])
        points.append(CurvePoint(series, step, task, f"{key} (bootstrap)", _num(stat.get("value")),
                                 _num(stat.get("std")), low, high, nan, runs, questions, *scored_by))  # fmt: skip
    return points


def check_one_judge(points: list[CurvePoint]) -> None:
    """Refuse a task whose points come from different judges, named apart or one name for two judges (their
    recorded specs differ): its curve would move with the judge."""
    for task, seen in _mixed(points, lambda p: p.judge):
        raise EvalInputError(
            f"{task}: the runs were judged by different judges ({seen}), so the curve would mix judges. "
            "Pass --judge NAME to draw one judge's verdicts (judge the other runs with it first: rayeval run "
            "--judge-only --run-id RUN --judge NAME), or --allow-different-judges."
        )
    for task, seen in _mixed(points, lambda p: p.judge_spec):
        raise EvalInputError(
            f"{task}: the runs' judges share a name but were different judges ({seen}), so the curve would mix "
            "judges. Judge every run with one judge (rayeval run --judge-only --run-id RUN --judge NAME), or "
            "pass --allow-different-judges (where it is one judge served elsewhere)."
        )


def mixed_versions(points: list[CurvePoint]) -> list[tuple[str, str]]:
    """(task, where each version scored it) for each task whose points different versions of it scored: its
    curve would move with the scoring change."""
    return _mixed(points, lambda p: p.version)


def check_one_version(points: list[CurvePoint]) -> None:
    """Refuse a task whose points different versions of it scored."""
    for task, seen in mixed_versions(points):
        raise EvalInputError(
            f"{task}: the runs scored it with different versions of the task ({seen}), so the curve would mix "
            "scoring rules. Run the older runs' commands again with this rayeval (their completions are read "
            "back and scored anew), or pass --allow-different-versions."
        )


def _mixed(points: list[CurvePoint], value_of: Callable[[CurvePoint], str]) -> list[tuple[str, str]]:
    """(task, each value with the first places it is found) for each task whose points have more than one
    value (`value_of`: a judge, a version; points without one are left out)."""
    found: dict[str, dict[str, list[str]]] = {}
    for p in points:
        if value_of(p):
            found.setdefault(p.task, {}).setdefault(value_of(p), []).append(f"{p.series} step {p.step}")
    return [
        (
            task,
            "; ".join(
                f"{value} at {', '.join(sorted(set(at))[:3])}" for value, at in sorted(by_value.items())
            ),
        )
        for task, by_value in sorted(found.items())
        if len(by_value) > 1
    ]


def _num(value: float | None) -> float:
    return math.nan if value is None else float(value)


COLUMNS = ("series", "step", "task", "metric", "mean", "sem", "ci95_low", "ci95_high", "std_across_runs", "n",
           "questions", "judge", "version")  # fmt: skip


def write_tables(points: list[CurvePoint], folder: Path, name: str = "sweep_summary") -> tuple[Path, Path]:
    """`name`.csv and `name`.md: one row per series x step x task x metric, in that order."""
    folder.mkdir(parents=True, exist_ok=True)
    ordered = sorted(points, key=lambda p: (p.series, p.task, p.metric, p.step))
    csv_path, md_path = folder / f"{name}.csv", folder / f"{name}.md"
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")  # a judge's spec stays out
        writer.writeheader()
        writer.writerows(asdict(p) for p in ordered)
    lines = ["| training run | step | task | metric | mean | SEM | CI95 | N | questions | judge |",
             "| --- | ---: | --- | --- | ---: | ---: | --- | ---: | ---: | --- |"]  # fmt: skip
    for p in ordered:
        lines.append(
            f"| {p.series} | {p.step} | {p.task} | {p.metric} | {_fmt(p.mean)} | {_fmt(p.sem)} | "
            f"[{_fmt(p.ci95_low, 3)}, {_fmt(p.ci95_high, 3)}] | {p.n} | {p.questions} | {p.judge or '-'} |"
        )
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return csv_path, md_path


def _fmt(value: float, digits: int = 4) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


@dataclass(frozen=True)
class Curve:
    """What one line of a plot shows: the steps, the means and the error bars below and above."""

    series: str
    metric: str
    judge: str
    steps: tuple[int, ...]
    means: tuple[float, ...]
    below: tuple[float, ...]
    above: tuple[float, ...]


def curves_by_task(points: list[CurvePoint], bar: ErrorBar) -> dict[str, list[Curve]]:
    by_line: dict[tuple[str, str, str, str], list[CurvePoint]] = {}
    for p in points:
        by_line.setdefault((p.task, p.series, p.metric, p.judge), []).append(p)
    tasks: dict[str, list[Curve]] = {}
    for (task, series, metric, judge), line in sorted(by_line.items()):
        line.sort(key=lambda p: p.step)
        errors = [p.error(bar) for p in line]
        tasks.setdefault(task, []).append(
            Curve(series, metric, judge, tuple(p.step for p in line), tuple(p.mean for p in line),
                  tuple(e[0] for e in errors), tuple(e[1] for e in errors))
        )  # fmt: skip
    return tasks


def plot_curves(points: list[CurvePoint], folder: Path, bar: ErrorBar) -> list[Path]:
    """One PNG per task: every metric of every training run against the step, with its error bars."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for task, curves in curves_by_task(points, bar).items():
        figure, axis = plt.subplots(figsize=(8, 5))
        several = len({c.series for c in curves}) > 1
        judges = sorted({c.judge for c in curves if c.judge})
        for curve in curves:
            label = f"{curve.series}: {curve.metric}" if several else curve.metric
            label += f" ({curve.judge})" if len(judges) > 1 else ""
            yerr = None if bar is ErrorBar.NONE else [curve.below, curve.above]
            axis.errorbar(curve.steps, curve.means, yerr=yerr, marker="o", capsize=3, label=label)
        shown = {ErrorBar.CI95: "CI95", ErrorBar.SEM: "± SEM", ErrorBar.STD: "± std across runs",
                 ErrorBar.NONE: "no error bars"}[bar]  # fmt: skip
        judged = f", judge {judges[0]}" if len(judges) == 1 else ""
        axis.set(title=f"{task} ({shown}{judged})", xlabel="step", ylabel="mean@N")
        axis.set_xticks(sorted({step for curve in curves for step in curve.steps}))
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
        path = folder / f"{task}.png"
        figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written
