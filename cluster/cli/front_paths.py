"""Where this machine's warm CLI server is found (cluster.cli.front_server), the switches that concern it, and
the environment a `rayeval` process started with. Plain Python: the `rayeval` entry imports it first."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

DISABLE_ENV = "RAYEVAL_WARM_CLI"  # "0": every command runs in its own process, server or not
SOCKET_DIR_ENV = "RAYEVAL_WARM_CLI_DIR"  # the server's folder (default: this user's folder in /tmp)
# The environment this process started with, before Ray's import and rayeval's own settings (Ray's token mode)
# changed it: a server that `rayeval up` starts takes this one, which the commands typed after it will have.
STARTING_ENV = dict(os.environ)


def socket_path() -> Path:
    """The server's socket for this interpreter and this copy of rayeval: another virtual environment or
    checkout has a server of its own."""
    identity = f"{sys.executable}\0{Path(__file__).resolve().parents[2]}".encode()
    folder = os.environ.get(SOCKET_DIR_ENV) or os.path.join("/tmp", f"rayeval-{os.getuid()}")
    return Path(folder) / f"cli-{hashlib.sha256(identity).hexdigest()[:12]}.sock"


def log_path() -> Path:
    """The server's log: when it started and stopped, each command it forked for, each it refused and why."""
    return socket_path().with_suffix(".log")
