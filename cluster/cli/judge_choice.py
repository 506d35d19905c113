"""The flags that say what pairs where finished runs are read back (compare, view, plot): whose verdicts
stand for a judged task (`--judge NAME`, `--allow-different-judges`) and whether questions asked with other
prompts pair (`--allow-different-prompts`), and whether runs that scored a task with different versions of it
are read together (`--allow-different-versions`), defined once for the three commands."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evaluators.compare import CompareOptions

JUDGE_HELP = (
    "judged tasks: use this judge's verdicts in every run (its name, e.g. openai:gpt-4.1, or its folder under "
    "judges/); default: each run's only judge, and a run judged by several must name one"
)


def add_judge_choice(p: argparse.ArgumentParser, what: str, judge_help: str = JUDGE_HELP) -> None:
    """`what`: the runs the judges must agree over, as the help says it ("A and B", "the runs drawn")."""
    p.add_argument("--judge", metavar="NAME", help=judge_help)
    p.add_argument(
        "--allow-different-judges",
        action="store_true",
        help=f"read a judged task even where {what} were judged by different judges (refused by default: the "
        "numbers would mix judges' verdicts with the models' differences)",
    )


def add_prompt_choice(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-different-prompts",
        action="store_true",
        help="pair questions by doc_id even where the two runs asked them with different prompts",
    )


def add_version_choice(p: argparse.ArgumentParser, what: str) -> None:
    """`what`: the runs that must have scored a task with one version of it."""
    p.add_argument(
        "--allow-different-versions",
        action="store_true",
        help=f"read a task even where {what} scored it with different versions of it (refused by default: a "
        "version changes how an answer scores)",
    )


def compare_options(args: argparse.Namespace) -> CompareOptions:
    """The pairing rules `--level` and the allow flags above set."""
    from evaluators.compare import CompareOptions

    return CompareOptions(
        args.level, args.allow_different_judges, args.allow_different_prompts, args.allow_different_versions
    )
