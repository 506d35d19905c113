"""`rayeval submit`: run a rayeval command on a Ray cluster as a Ray Job, and follow it."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from evaluators.errors import EvalInputError

log = logging.getLogger(__name__)

COMMANDS = ("run", "sweep", "watch", "tasks", "validate")

EPILOG = """examples:
  rayeval submit --address http://HEAD:8265 -- run --model Qwen/Qwen2.5-7B-Instruct --tasks ifeval,gsm8k \\
                 --replicas 4 --output-dir /shared/runs --run-id qwen7b
  rayeval submit --no-wait --env HF_HOME=/shared/hf -- run --tasks gsm8k --limit 200 --output-dir /shared/runs
  rayeval submit --env WANDB_API_KEY -- run --tasks healthbench --judge openai:gpt-4.1 --output-dir /shared/runs
The job's `rayeval run` joins the job's own cluster (Ray sets RAY_ADDRESS for it) and writes its run folder on
the node that runs the job's driver (the head): give an absolute --output-dir on storage you can read back, and
rerun the same submit with the same --run-id to resume. Ray's token authentication is handled: the token is
read where Ray keeps it (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN).
Keys: the judge's and the endpoint's key variables, HF_TOKEN and each --env NAME are taken from this machine
and sealed with the cluster's token (the dashboard shows the job's runtime_env: it holds the sealed blob, never
a value); where this machine lacks one, the job uses the cluster's own. --env NAME=VALUE is a plain variable
that the dashboard shows, so it is refused for names that look like credentials."""


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
        metavar="NAME[=VALUE]",
        help="NAME: this machine's variable, forwarded sealed with the cluster's token; NAME=VALUE: a plain "
        "variable for the job (runtime_env env_vars, shown by Ray's dashboard); repeat for more",
    )
    p.add_argument("--working-dir", metavar="DIR", help="a local folder Ray uploads and runs the job in")
    p.add_argument("--job-id", metavar="ID", help="the job's submission id (default: Ray makes one)")
    p.add_argument("--no-wait", action="store_true", help="print the job id and return without following it")
    p.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- then the rayeval command, e.g. -- run --tasks gsm8k"
    )


def cmd_submit(args: argparse.Namespace) -> int:
    from cluster.jobs import JobsClient, JobSpec, exit_code

    command, parsed = job_command(args.command)
    plain, named = _env_entries(args.env)
    env = plain | sealed_variables(named, *needed_variables(command[0], parsed))  # checked before connecting
    jobs = JobsClient(args.address)
    spec = JobSpec(command=command, env=env, working_dir=args.working_dir, job_id=args.job_id)
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


def needed_variables(command: str, parsed: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The variables a `run` needs from here (its config's key variables, HF_TOKEN), and which of them are
    API keys (the job's engines never get those); the output folder checked on the way: the job writes it
    on the node that runs its driver."""
    from cluster.forwarded_env import HF_TOKEN_NAMES, api_key_names, names_for

    if command not in ("run", "sweep", "watch"):
        return list(HF_TOKEN_NAMES), []
    from cluster.cli.flags import flag_names, overrides
    from cluster.cli.run import run_config
    from cluster.config import COMMAND_LINE, build_config

    try:
        config = run_config(parsed)
    except EvalInputError:  # a file only the cluster has (--judge-only reads the run's config.yaml there):
        # the flags alone must still hold, else the job would fail there with what is refused here
        config = build_config({}, overrides(parsed), COMMAND_LINE, flag_names())
    if "://" not in config.output_dir and not Path(config.output_dir).is_absolute():
        raise EvalInputError(
            f"--output-dir {config.output_dir} is a relative path, but the job writes its run folder on the node "
            "that runs the job's driver (the head), in a working folder of Ray's: give an absolute path there, "
            f"on storage you can read back, e.g. --output-dir /shared/{config.output_dir}, or object storage, e.g. "
            f"--output-dir s3://BUCKET/{config.output_dir}."
        )
    return names_for(config), api_key_names(config)


def sealed_variables(named: list[str], needed: list[str], keys: list[str]) -> dict[str, str]:
    """The job's runtime_env entry with this machine's values of the named (--env NAME) and needed
    variables, sealed with the cluster's token; nothing when there are none. A variable named with --env
    must be here, and sealing needs the token; a needed one that is missing is the cluster's to give."""
    from cluster.forwarded_env import SEALED_ENV, collect, seal
    from cluster.jobs.auth import TOKEN_HELP, read_token

    missing = [name for name in named if not os.environ.get(name, "").strip()]
    if missing:
        raise EvalInputError(
            f"--env {missing[0]}: this machine has no {missing[0]} to forward; set it, or write --env NAME=VALUE "
            "for a plain variable."
        )
    env = collect(dict.fromkeys([*named, *needed]), [key for key in keys if key not in named])
    if not env.values:
        return {}
    token = read_token()
    if token is None:
        if named:
            raise EvalInputError(
                f"--env {named[0]}: variables are forwarded sealed with the cluster's auth token, and this machine "
                f"has none. {TOKEN_HELP} Or keep {named[0]} in the cluster nodes' own environment."
            )
        log.warning(
            "not forwarded (no cluster token to seal them with): %s; the job uses the cluster's own", env
        )
        return {}
    log.info("forwarding %s to the job, sealed with the cluster's token", env)
    return {SEALED_ENV: seal(env, token)}


def job_command(given: list[str]) -> tuple[list[str], argparse.Namespace]:
    """The rayeval command after `--`, checked here with rayeval's own parser so a wrong flag fails before
    anything is submitted, and what the parser read of it."""
    command = given[1:] if given[:1] == ["--"] else list(given)
    if command[:1] == ["rayeval"]:
        command = command[1:]
    if not command or command[0] not in COMMANDS:
        raise EvalInputError(
            f"rayeval submit needs the command to run after `--`, one of {', '.join(COMMANDS)} "
            f"(got {' '.join(given) or 'nothing'}), e.g. `rayeval submit -- run --tasks gsm8k --limit 50`."
        )
    parsed = _command_parser().parse_args(command)  # a usage error exits 2 naming the flag, as on the cluster
    _refuse_credentials(command)
    address = getattr(parsed, "cluster.address", None)
    if isinstance(address, str) and address.startswith(("http://", "https://")):
        raise EvalInputError(
            f"--address {address} after `--` is the job server's: give it to submit, before `--` (`rayeval submit "
            f"--address {address} -- {command[0]} ...`), and leave it out of the command, which runs on the "
            "cluster and finds it there."
        )
    return command, parsed


def _refuse_credentials(command: list[str]) -> None:
    """Refuse a URI that carries a credential anywhere in the command: Ray keeps the command in the job's
    record and shows it on the dashboard (the flag is named, never the value)."""
    from cluster.storage.location import credentials_anywhere

    for before, token in zip(["", *command], command, strict=False):
        flag, _, value = token.partition("=") if token.startswith("--") else (before, "", token)
        carried = credentials_anywhere(value)  # also a URI within a value (--log-to mlflow:https://...)
        if carried is not None:
            raise EvalInputError(
                f"rayeval submit: {flag or 'an argument'} carries a credential in its URI ({carried}); Ray keeps "
                "the job's command in its record and shows it on the dashboard. Give the credential through the "
                "environment (--env NAME forwards it sealed) and the URI without it."
            )


def _command_parser() -> argparse.ArgumentParser:
    from cluster.cli import run, sweep, tasks, validate, watch
    from cluster.cli.parser import Parser

    parser = Parser(prog="rayeval")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (run, sweep, watch, tasks, validate):
        command.add_parser(sub)
    return parser


def _env_entries(entries: list[str]) -> tuple[dict[str, str], list[str]]:
    """--env entries: NAME=VALUE as plain variables (refused for credentials, which the dashboard would
    show), and the NAMEs to forward sealed."""
    from cluster.config.values import check_env_name
    from cluster.forwarded_env import looks_secret
    from cluster.storage.location import credentials_anywhere

    plain, named = {}, []
    for entry in entries:
        key, sep, value = entry.partition("=")
        key = key.strip()
        try:
            check_env_name(key, "HF_HOME")
        except ValueError as exc:  # the name is never quoted: it may be a key pasted in its place
            raise EvalInputError(
                f"--env: {exc}. Write NAME (forwarded from this machine) or NAME=VALUE, e.g. --env HF_HOME=/shared/hf."
            ) from None
        if not sep:
            named.append(key)
        elif looks_secret(key) or credentials_anywhere(value) is not None:
            raise EvalInputError(
                f"--env {key}=...: a job's runtime_env is shown by Ray's dashboard and kept in its job records, so a "
                f"credential is not passed that way. Write --env {key} to forward this machine's value sealed with "
                f"the cluster's token, or keep {key} in the cluster nodes' own environment."
            )
        else:
            plain[key] = value
    return plain, named
