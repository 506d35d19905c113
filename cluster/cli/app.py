"""`rayeval`: evaluate models on benchmark tasks over vLLM engine replicas on a Ray cluster."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from cluster.cli import run, tasks, validate
from evaluators.errors import EvalInputError


class Parser(argparse.ArgumentParser):
    """argparse with usage errors in rayeval's one-paragraph style: what is wrong, then where the fix is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"rayeval: error: {message}. `{self.prog} --help` lists every flag and its values.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rayeval", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (run, tasks, validate):
        command.add_parser(sub)
    return parser


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr, force=True)
    for name in ("cluster", "sharding", "evaluators"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(getattr(args, "verbose", False))
    try:
        return int(args.handler(args))
    except EvalInputError as exc:
        print(f"rayeval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "rayeval: interrupted. Rerun the same command (same --output-dir and --run-id) to resume.",
            file=sys.stderr,
        )
        return 130
    except Exception as exc:  # noqa: BLE001 - runtime failures get one readable paragraph, not a traceback
        from cluster.errors import ClusterError

        if isinstance(exc, ClusterError):
            print(f"rayeval: error: {exc}", file=sys.stderr)
            return 1
        raise
