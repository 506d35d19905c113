"""The `rayeval` command's entry: a `rayeval run` is handed to this machine's warm CLI server when one is up
(cluster.cli.front_server, started by `rayeval up`), and runs in this process otherwise.

The server has imported what a run imports before its first request (the CLI, its config, Ray, the run's
modules: about a second on a 2-core VM, more on a GPU host's Python) and forks a process per command, which
takes this process's arguments, environment, working directory, CPU affinity and its standard input, output
and error (passed over the socket), so the command behaves as it would here, only without those imports.
This module imports nothing heavy: a command that the server refuses (its code or environment differs from
this process's) or that no server can take starts here with no more than a failed connection's cost.

The wire: this side sends one length-prefixed JSON request with its three standard streams attached; the server
answers with JSON lines, `{"pid": N}` once the command's process runs (or `{"refused": REASON}`), then
`{"status": CODE}` when it ends (a negative CODE: killed by that signal). Signals this process gets (Ctrl-C,
SIGTERM, SIGHUP) go on to the command's process; if this process goes away, the command's process is
interrupted as Ctrl-C would.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import sys

from cluster.cli.front_paths import DISABLE_ENV, command_request, socket_path

COMMANDS = frozenset({"run"})  # the commands the server takes; the rest always run here
STREAMS = (0, 1, 2)
ANSWER_TIMEOUT_S = 10.0  # for the server's first answer (it checks its code and forks: milliseconds)


def entry() -> int:
    """`rayeval ARGS`: through the warm CLI server when it takes the command, else in this process."""
    argv = sys.argv[1:]
    if argv[:1] and argv[0] in COMMANDS and os.environ.get(DISABLE_ENV, "1") != "0":
        code = run_through_server(argv)
        if code is not None:
            return code
    from cluster.cli.app import entry as entry_here

    return entry_here()


def run_through_server(argv: list[str]) -> int | None:
    """The command's exit status, run by the server; None when no server took it (none up, or it refused)."""
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(ANSWER_TIMEOUT_S)
        conn.connect(str(socket_path()))
        send_request(conn, command_request(argv))
        answers = conn.makefile("r", encoding="utf-8")
        first = json.loads(answers.readline() or "{}")
    except (OSError, ValueError):
        return None  # no server, or one that went away: the command runs here
    if "pid" not in first:
        if "--verbose" in argv:
            print(
                f"rayeval: the warm CLI server did not take the command: {first.get('refused')}",
                file=sys.stderr,
            )
        conn.close()
        return None
    conn.settimeout(None)
    return _follow(int(first["pid"]), answers)


def send_request(conn: socket.socket, body: dict) -> None:
    data = json.dumps(body).encode()
    fds = array.array("i", STREAMS)
    conn.sendmsg([struct.pack("!I", len(data)), data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])


def _follow(pid: int, answers) -> int:  # noqa: ANN001 - a text file over the socket
    """Forward this process's signals to the command's process until the server reports how it ended."""

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(pid, signum)  # its process group, as a terminal's Ctrl-C reaches a command's children
        except ProcessLookupError:
            try:
                os.kill(pid, signum)  # it has not made its group yet
            except ProcessLookupError:
                pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    while True:
        try:
            line = answers.readline()
        except InterruptedError:
            continue
        if not line:
            print(
                f"rayeval: the warm CLI server went away while process {pid} ran the command; its exit status "
                "is unknown (the run folder says what finished; rerunning the command resumes it)",
                file=sys.stderr,
            )
            return 1
        status = json.loads(line).get("status")
        if status is None:
            continue
        if status < 0:  # killed by a signal: end the same way
            signal.signal(-status, signal.SIG_DFL)
            os.kill(os.getpid(), -status)
            return 128 - status
        return int(status)
