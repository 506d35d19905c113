"""`rayeval submit`: run a rayeval command on a Ray cluster as a Ray Job, and follow it."""

from __future__ import annotations

import argparse
import sys

from evaluators.errors import EvalInputError

COMMANDS = ("run", "tasks", "validate")

EPILOG = """examples:
  rayeval submit --address http://HEAD:8265 -- run --model Qwen/Qwen2.5-7B-Instruct --tasks ifeval,gsm8k \\
                 --replicas 4 --output-dir /shared/runs --run-id qwen7b
  rayeval submit --no-wait --env HF_HOME=/shared/hf -- run --tasks gsm8k --limit 200
  rayeval submit --working-dir my_tasks/ -- run --tasks my_task --include-path .
The job's `rayeval run` joins the job's own cluster (Ray sets RAY_ADDRESS for it) and writes its run folder on
the node that runs the job's driver (the head): give --output-dir on storage you can read back, and rerun the
same submit with the same --run-id to resume. Ray's token authentication is handled: the token is read where
Ray keeps it (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)."""


def add_address_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        metavar="URL",
        help="the head node's dashboard / job server, e.g. http://HEAD:8265 (default: $RAY_API_SERVER_ADDRESS, "
        "an http $RAY_ADDRESS, else http://127.0.0.1:8265)",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "submit",
        help="run a rayeval command on a Ray cluster as a Ray Job",
        description="Submit `rayeval COMMAND ...` to a Ray cluster through Ray's Job Submission API, print the "
        "job id and follow its log until it ends (its exit status is the job's).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(handler=cmd_submit)
    add_address_flag(p)
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for the job (runtime_env env_vars); repeat for more",
    )
    p.add_argument("--working-dir", metavar="DIR", help="a local folder Ray uploads and runs the job in")
    p.add_argument("--job-id", metavar="ID", help="the job's submission id (default: Ray makes one)")
    p.add_argument("--no-wait", action="store_true", help="print the job id and return without following it")
    p.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- then the rayeval command, e.g. -- run --tasks gsm8k"
    )


def cmd_submit(args: argparse.Namespace) -> int:
    from cluster.jobs import JobsClient, JobSpec, exit_code

    spec = JobSpec(
        command=job_command(args.command),
        env=_env_vars(args.env),
        working_dir=args.working_dir,
        job_id=args.job_id,
    )
    jobs = JobsClient(args.address)
    job_id = jobs.submit(spec)
    print(f"submitted job {job_id} to {jobs.address}: {spec.entrypoint}", file=sys.stderr)
    if args.no_wait:
        print(job_id)
        return 0
    try:
        details = jobs.follow(job_id)
    except KeyboardInterrupt:
        print(
            f"rayeval: stopped following; job {job_id} goes on. `rayeval jobs logs {job_id} --follow` follows it "
            f"again, `rayeval jobs stop {job_id}` stops it.",
            file=sys.stderr,
        )
        return 130
    print(f"job {job_id} {details.status}", file=sys.stderr)
    return exit_code(details)


def job_command(given: list[str]) -> list[str]:
    """The rayeval command after `--`, checked here with rayeval's own parser so a wrong flag fails before
    anything is submitted."""
    command = given[1:] if given[:1] == ["--"] else list(given)
    if command[:1] == ["rayeval"]:
        command = command[1:]
    if not command or command[0] not in COMMANDS:
        raise EvalInputError(
            f"rayeval submit needs the command to run after `--`, one of {', '.join(COMMANDS)} "
            f"(got {' '.join(given) or 'nothing'}), e.g. `rayeval submit -- run --tasks gsm8k --limit 50`."
        )
    _command_parser().parse_args(command)  # a usage error exits 2 naming the flag, as on the cluster
    return command


def _command_parser() -> argparse.ArgumentParser:
    from cluster.cli import run, tasks, validate
    from cluster.cli.parser import Parser

    parser = Parser(prog="rayeval")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (run, tasks, validate):
        command.add_parser(sub)
    return parser


def _env_vars(entries: list[str]) -> dict[str, str]:
    env = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise EvalInputError(f"--env {entry}: write it as KEY=VALUE, e.g. --env HF_HOME=/shared/hf.")
        env[key.strip()] = value
    return env
