"""`rayeval jobs list|status|logs|stop`: the Ray Jobs of a cluster, as `rayeval submit` made them."""

from __future__ import annotations

import argparse
import sys

from cluster.cli.submit import add_address_flag


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "jobs",
        help="list, inspect, read and stop the Ray Jobs of a cluster",
        description="The Ray Jobs of a cluster (those submitted through its job server, e.g. by `rayeval submit`).",
    )
    actions = p.add_subparsers(dest="action", required=True)
    for name, handler, text in (
        ("list", cmd_list, "every submitted job: id, status, start and end, command"),
        ("status", cmd_status, "one job's status and message"),
        ("logs", cmd_logs, "one job's log so far"),
        ("stop", cmd_stop, "stop a running job"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.set_defaults(handler=handler)
        add_address_flag(action)
        if name != "list":
            action.add_argument("job_id", metavar="ID", help="the job's id, as `rayeval submit` printed it")
        if name == "logs":
            action.add_argument("--follow", action="store_true", help="keep printing until the job ends")


def cmd_list(args: argparse.Namespace) -> int:
    from cluster.jobs import JobsClient

    rows = JobsClient(args.address).rows()
    for row in rows:
        print(f"{row.job_id}\t{row.status}\t{row.started}\t{row.ended}\t{row.entrypoint}")
    print(f"({len(rows)} jobs)", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from cluster.jobs import JobsClient

    row = JobsClient(args.address).row(args.job_id)
    print(f"{row.job_id}: {row.status} (started {row.started}, ended {row.ended})")
    print(f"command: {row.entrypoint}")
    if row.message:
        print(f"message: {row.message}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from cluster.jobs import JobsClient, exit_code

    jobs = JobsClient(args.address)
    if args.follow:
        return exit_code(jobs.follow(args.job_id))
    print(jobs.logs(args.job_id), end="")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from cluster.jobs import JobsClient

    jobs = JobsClient(args.address)
    if jobs.stop(args.job_id):
        details = jobs.wait(args.job_id)
        print(f"job {args.job_id} {details.status}")
    else:
        print(f"job {args.job_id} had already ended ({jobs.row(args.job_id).status}); nothing to stop")
    return 0
