"""Where this machine's warm CLI server is found (cluster.cli.front_server), the switches that concern it, and
what a client tells it about itself: the process it would run a command as, with the environment and import
path this `rayeval` process started with. Plain Python: the `rayeval` entry imports it first."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from cluster import timeline

DISABLE_ENV = "RAYEVAL_WARM_CLI"  # "0": every command runs in its own process, server or not
SOCKET_DIR_ENV = "RAYEVAL_WARM_CLI_DIR"  # the server's folder (default: this user's folder in /tmp)
# The environment this process started with, before Ray's import and rayeval's own settings (Ray's token mode)
# changed it: a server that `rayeval up` starts takes this one, which the commands typed after it will have.
STARTING_ENV = dict(os.environ)
STARTING_PATH = list(sys.path)  # likewise (`import ray` adds its third-party folder)


def socket_path() -> Path:
    """The server's socket for this interpreter and this copy of rayeval: another virtual environment or
    checkout has a server of its own."""
    identity = f"{sys.executable}\0{Path(__file__).resolve().parents[2]}".encode()
    folder = os.environ.get(SOCKET_DIR_ENV) or os.path.join("/tmp", f"rayeval-{os.getuid()}")
    return Path(folder) / f"cli-{hashlib.sha256(identity).hexdigest()[:12]}.sock"


def log_path() -> Path:
    """The server's log: when it started and stopped, each command it forked for, each it refused and why."""
    return socket_path().with_suffix(".log")


def command_request(argv: list[str]) -> dict:
    """What the server needs to run `rayeval ARGV` as this process would: the command's arguments, and this
    process as it started (environment, import path) and is (working directory, umask, CPU affinity)."""
    mask = os.umask(0)
    os.umask(mask)
    return {
        "argv": argv,
        "sys_argv": sys.argv,
        "env": STARTING_ENV,
        "cwd": os.getcwd(),
        "umask": mask,
        "affinity": sorted(os.sched_getaffinity(0)),
        "executable": sys.executable,
        "path": STARTING_PATH,
        "started_at": timeline.process_start(),
    }
