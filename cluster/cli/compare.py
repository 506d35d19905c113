"""`rayeval compare RUN_A RUN_B`: paired differences between two finished runs, per task and metric."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cluster.cli.judge_choice import add_judge_choice, add_prompt_choice, add_version_choice, compare_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="B against A over the questions both runs scored: paired differences, which are beyond noise",
        description="Compare two finished runs of the same questions (two checkpoints, two models). For every "
        "task and metric both scored: the means, B - A, its paired question-clustered standard error and CI95, "
        "and whether it is beyond noise after a Holm-Bonferroni correction over everything compared.",
    )
    p.set_defaults(handler=cmd_compare)
    p.add_argument("run_a", metavar="RUN_A", help="run folder A (the baseline): a path or a URI (s3://...)")
    p.add_argument("run_b", metavar="RUN_B", help="run folder B: a path or a URI (s3://...)")
    p.add_argument("--level", type=float, default=0.05, help="family-wise error level (default 0.05)")
    p.add_argument("--output", type=Path, metavar="FILE", help="also write the comparison as JSON here")
    add_judge_choice(p, "A and B")
    add_prompt_choice(p)
    add_version_choice(p, "A and B")


def cmd_compare(args: argparse.Namespace) -> int:
    from cluster.cli.output_paths import output_file, written
    from cluster.storage import readable_folder
    from evaluators.compare import compare_runs, comparison_json, load_run, render_comparison

    options = compare_options(args)
    output = output_file(args.output, "--output") if args.output else None
    folder_a, folder_b = readable_folder(args.run_a), readable_folder(args.run_b)
    a, b = load_run(folder_a, args.judge), load_run(folder_b, args.judge)
    rows = compare_runs(a, b, options)
    print(render_comparison(a, b, rows, args.level), end="")
    if output:
        with written(output, "--output"):
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(comparison_json(a, b, rows, args.level), indent=1))
    return 0
