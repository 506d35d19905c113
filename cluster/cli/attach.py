"""`rayeval attach`: follow a run coordinated inside the cluster (started through a Ray client) to its end."""

from __future__ import annotations

import argparse

from cluster.cli.run import report


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attach",
        help="follow a run that runs inside the cluster (started with --address ray://...) and print its result",
        description="Follow a run coordinated inside the cluster, from any Ray client session: its progress "
        "until it ends, then its table. A run started with --address ray://... goes on when its client goes "
        "away; this picks it up again.",
    )
    p.set_defaults(handler=cmd_attach)
    p.add_argument("run_id", metavar="RUN_ID", help="the run's --run-id (printed when it started)")
    p.add_argument(
        "--address",
        metavar="ray://HEAD:10001",
        help="the cluster's Ray client address (default: $RAY_ADDRESS)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_attach(args: argparse.Namespace) -> int:
    from cluster.api import attach

    return report(attach(args.run_id, args.address, progress=not args.no_progress))
