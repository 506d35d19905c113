"""`rayeval plot RUN...`: training curves from finished run folders, several training runs on one axis."""

from __future__ import annotations

import argparse
from pathlib import Path

from cluster.cli.judge_choice import add_judge_choice, add_version_choice
from evaluators.errors import EvalInputError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="training curves (score by step, with error bars) from finished run folders",
        description="Draw each task's metrics against the training step, one PNG per task, and write the "
        "same numbers as sweep_summary.csv and .md. Each argument is a run folder whose name carries its step "
        "(step_120, checkpoint-120, ...), or a folder of such runs (one training run); several are drawn on "
        "one axis, named after their folders. A judged task is drawn from one judge's verdicts, named in the "
        "table and the plot.",
    )
    p.set_defaults(handler=cmd_plot)
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="a run folder, or a folder of run folders: a path or a URI (s3://...)",
    )
    p.add_argument("--errorbar", choices=["ci95", "sem", "std", "none"], default="ci95",
                   help="what the error bars show: the CI95 (default), one SEM, the std across the N runs, none")  # fmt: skip
    p.add_argument(
        "--output", type=Path, default=Path("plots"), metavar="DIR", help="where to write (default plots/)"
    )
    add_judge_choice(p, "the runs drawn")
    add_version_choice(p, "the runs drawn")


def cmd_plot(args: argparse.Namespace) -> int:
    from cluster.cli.output_paths import output_folder, written
    from cluster.storage import readable_folder
    from evaluators.curves import (
        ErrorBar,
        check_one_judge,
        check_one_version,
        plot_curves,
        points_from_run,
        write_tables,
    )

    output = output_folder(args.output, "--output")  # before any run is read
    folders = [readable_folder(run) for run in args.runs]
    points = [
        point
        for series, step, run in (entry for folder in folders for entry in runs_in(folder))
        for point in points_from_run(run, series, step, args.judge)
    ]
    if not points:
        raise EvalInputError("The runs given hold no scored metric to draw.")
    if not args.allow_different_judges:
        check_one_judge(points)
    if not args.allow_different_versions:
        check_one_version(points)
    with written(output, "--output"):
        csv_path, md_path = write_tables(points, output)
        pngs = plot_curves(points, output, ErrorBar(args.errorbar))
    for path in [*pngs, csv_path, md_path]:
        print(path)
    return 0


def runs_in(folder: Path) -> list[tuple[str, int, Path]]:
    """(training run, step, run folder) for a run folder, or for each run inside a folder of runs."""
    from cluster.models import step_in_name

    if not folder.is_dir():
        raise EvalInputError(f"'{folder}' is not a folder: give a run folder or a folder of run folders.")
    runs = (
        [folder]
        if (folder / "summary.json").is_file()
        else sorted(p.parent for p in folder.glob("*/summary.json"))
    )
    if not runs:
        raise EvalInputError(
            f"'{folder}' holds no finished run (no summary.json in it or in its subfolders)."
        )
    series = folder.parent.name if runs == [folder] else folder.name
    found = []
    for run in runs:
        step = step_in_name(run.name)
        if step is None:
            raise EvalInputError(
                f"Run folder '{run}' names no step: name it like step_120 or checkpoint-120 (the --run-id), so "
                "it has a place on the curve."
            )
        found.append((series, step, run))
    return found
