"""Starting and stopping this machine's warm CLI server (cluster.cli.front_server) from `rayeval up` and
`rayeval down --all`: plain Python that talks to it over its socket and starts it as a process of its own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from cluster.cli.front_paths import (
    STARTING_ENV,
    command_request,
    framed,
    log_path,
    private_folder,
    socket_path,
)

START_TIMEOUT_S = 60.0  # its imports, the scorers, and once more without them where they fail


def start_server(idle_timeout_s: float) -> int | None:
    """This machine's warm CLI server for this interpreter and copy of rayeval, started unless one that would
    take this process's commands answers; its pid, or None when none answered within START_TIMEOUT_S (the runs
    then import for themselves; its log says why). Several `rayeval up` at once start one server: the first to
    hold the lock file starts it, the others find it."""
    import fcntl

    path = socket_path()
    if not private_folder(path.parent, create=True):
        return None
    with _private_file(path.with_suffix(".lock")) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _answers(path)
        if found and not found.get("refused"):
            return int(found["pid"])
        if found:  # its code is older than the files', or it was started from another environment: it
            _message(path, {"stop": True})  # finishes its commands and exits, and a new one serves this one's
        with _private_file(log_path()) as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "cluster.cli.front_server", "--idle-timeout", f"{idle_timeout_s:g}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=STARTING_ENV,
                cwd=Path(__file__).resolve().parents[2],
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and server.poll() is None:
            found = _answers(path)
            if found:
                return int(found["pid"])
            time.sleep(0.1)
    return None


def stop_server() -> int | None:
    """Ask this machine's warm CLI server to stop (it lets running commands finish); its pid, or None."""
    path = socket_path()
    answer = _message(path, {"stop": True}) if private_folder(path.parent) else None
    return int(answer["pid"]) if answer else None


def _private_file(path: Path):  # noqa: ANN202 - an open binary file
    """Open for appending, this user's only, never through a link someone put in its place."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600), "ab")


def _message(path: Path, message: dict, timeout_s: float = 5.0) -> dict | None:
    """Send a message without streams to the server at `path`; its answer, or None when none answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(str(path))
            conn.sendall(framed(message))
            return json.loads(conn.makefile("r").readline() or "null")
    except (OSError, ValueError):
        return None


def _answers(path: Path) -> dict | None:
    """The server's pid and whether it would refuse the commands of this process's environment."""
    return _message(path, {**command_request([]), "ping": True})
