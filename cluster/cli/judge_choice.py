"""The flags that say whose verdicts stand for a judged task where finished runs are read back (compare,
plot): `--judge NAME` and `--allow-different-judges`, defined once for both commands."""

from __future__ import annotations

import argparse


def add_judge_choice(p: argparse.ArgumentParser, what: str) -> None:
    """`what`: the runs the judges must agree over, as the help says it ("A and B", "the runs drawn")."""
    p.add_argument(
        "--judge",
        metavar="NAME",
        help="judged tasks: use this judge's verdicts in every run (its name, e.g. openai:gpt-4.1, or its folder "
        "under judges/); default: each run's only judge, and a run judged by several must name one",
    )
    p.add_argument(
        "--allow-different-judges",
        action="store_true",
        help=f"read a judged task even where {what} were judged by different judges (refused by default: the "
        "numbers would mix judges' verdicts with the models' differences)",
    )
