"""Report pages (`rayeval view`): a run's results and samples, a sweep's curves, two runs' comparison, each one
self-contained HTML file written beside the folders it reads."""

from __future__ import annotations

from pathlib import Path

from evaluators.compare import CompareOptions
from evaluators.view.data import comparison_page_data, run_page_data, sweep_page_data
from evaluators.view.page import render_page, write_page

REPORT_FOLDER = "report"

__all__ = [
    "REPORT_FOLDER",
    "render_page",
    "write_comparison_report",
    "write_run_report",
    "write_sweep_report",
    "is_sweep_folder",
]


def is_sweep_folder(folder: Path) -> bool:
    """A sweep's folder holds step_<N> run folders and no summary.json of its own."""
    return not (folder / "summary.json").is_file() and any(folder.glob("step_*/summary.json"))


def write_run_report(run_dir: Path, judge: str | None = None) -> Path:
    """`run_dir`/report/index.html for a finished run folder (judged tasks: `judge`'s verdicts, else the
    latest judge's)."""
    return write_page(run_dir / REPORT_FOLDER, run_page_data(run_dir, judge))


def write_sweep_report(sweep_dir: Path) -> Path:
    """Every finished step's run page, then the sweep's page (its curves' points link to them)."""
    pages = {}
    for summary in sorted(sweep_dir.glob("step_*/summary.json")):
        step = summary.parent.name.removeprefix("step_")
        if step.isdigit():
            write_run_report(summary.parent)
            pages[int(step)] = f"../{summary.parent.name}/{REPORT_FOLDER}/index.html"
    return write_page(sweep_dir / REPORT_FOLDER, sweep_page_data(sweep_dir, pages))


def write_comparison_report(
    run_a: Path,
    run_b: Path,
    out: Path | None = None,
    options: CompareOptions | None = None,
    judge: str | None = None,
) -> Path:
    """The comparison page, by default `run_a`/report/compare-<run_b's folder>/index.html."""
    folder = out or run_a / REPORT_FOLDER / f"compare-{run_b.name}"
    return write_page(folder, comparison_page_data(run_a, run_b, options or CompareOptions(), judge))
