"""`rayeval`: evaluate models on benchmark tasks over vLLM engine replicas on a Ray cluster."""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import signal
import sys

from cluster import timeline
from cluster.cli import (
    attach,
    cache,
    compare,
    jobs,
    plot,
    pools,
    rdagent,
    run,
    serve,
    submit,
    sweep,
    tasks,
    validate,
    view,
    watch,
)
from cluster.cli.parser import Parser
from evaluators.errors import EvalInputError


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rayeval", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    commands = (
        run,
        sweep,
        watch,
        serve,
        pools,
        cache,
        submit,
        jobs,
        attach,
        compare,
        plot,
        view,
        tasks,
        validate,
        rdagent,
    )
    for command in commands:
        command.add_parser(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"rayeval {version('rayeval')}"
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "rayeval (not installed: run from its source folder)"


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr, force=True)
    for name in ("cluster", "sharding", "evaluators"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)


def main(argv: list[str] | None = None) -> int:
    timeline.mark("cli imported")
    args = build_parser().parse_args(argv)
    configure_logging(getattr(args, "verbose", False))
    try:
        _open_sealed_environment()
        return int(args.handler(args))
    except EvalInputError as exc:
        print(f"rayeval: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `rayeval ... | head`: the reader left; say nothing more and exit as a pipe writer does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
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


def _open_sealed_environment() -> None:
    """A Ray Job's `rayeval` (on the cluster) opens the variables `rayeval submit` sealed for it."""
    from cluster.forwarded_env import SEALED_ENV, open_sealed_environment

    if SEALED_ENV not in os.environ:
        return
    try:
        names = open_sealed_environment()
    except ValueError as exc:
        raise EvalInputError(
            f"The variables `rayeval submit` forwarded could not be opened: {exc}. Submit again with this "
            "cluster's token, or keep the variables in the cluster nodes' own environment."
        ) from None
    logging.getLogger(__name__).info("variables forwarded by rayeval submit: %s", ", ".join(names))


def entry() -> int:
    """The `rayeval` command and `python -m cluster.cli`: `main`, leaving the process's objects to its exit.

    A run's driver holds a large heap (lm-eval's task modules, the run's records) that the interpreter's final
    garbage collection walks for about a second after the last line is printed and every file is closed.
    `gc.freeze()` takes that heap out of the collection (the process's exit frees its memory); `main` does
    not freeze, for callers that stay in the same process (tests, notebooks).

    Once the command's own exit handlers are done, everything it says is said: the standard error the
    interpreter's shutdown writes to goes to /dev/null. Libraries print there while they are torn down (triton's
    nanobind bindings list ~80 "leaked" objects when a sweep's driver imported torch), below the command's
    result."""
    _hangup_as_interrupt()
    code = main()
    gc.freeze()
    atexit.register(_quiet_shutdown)  # runs before the handlers registered earlier (Ray's) and the teardown
    return code


def _hangup_as_interrupt() -> None:
    """A hangup (the terminal or ssh session gone) stops the command as Ctrl-C does, through its cleanup: by
    default it would end the process at once, leaving what it started mid-way (a `rayeval up`'s detached
    engines, placement groups and claimed name) outside any pool, holding the cluster's resources. A hangup
    ignored (nohup) stays ignored. SIGTERM needs nothing: Ray's driver turns it into SystemExit."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
        signal.signal(signal.SIGHUP, signal.default_int_handler)


def _quiet_shutdown() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
