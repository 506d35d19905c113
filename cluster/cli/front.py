"""The `rayeval` command's entry: a `rayeval run` is handed to this machine's warm CLI server when one is up
(cluster.cli.front_server, started by `rayeval up`), and runs in this process otherwise.

The server has imported what a run imports before its first request (the CLI, its config, Ray, the run's
modules: about a second on a 2-core VM, more on a GPU host's Python) and forks a process per command, which
takes this process's arguments, environment, working directory, CPU affinity and its standard input, output
and error (passed over the socket), so the command behaves as it would here, only without those imports.
This module imports nothing heavy: a command that the server refuses (its code, environment or process
differs from this one's) or that no server can take starts here with no more than a failed connection's cost.

The wire: this side sends one length-prefixed JSON request with its three standard streams attached. The server
answers with JSON lines: `{"pid": N}` once it has forked (or `{"refused": REASON}`); this side answers that with
one byte, without which the command's process runs nothing (a client that gave up waiting runs the command
itself, once); then `{"status": CODE}` or `{"signal": N}` when the command ends. Signals this process gets
(Ctrl-C, SIGTERM, SIGHUP; Ctrl-Z and `fg`; a terminal's resize) go on to the command's process group; if this
process goes away, the command is interrupted as by Ctrl-C.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
from typing import TextIO

from cluster.cli.front_paths import (
    FORWARDED_SIGNALS,
    command_request,
    enabled,
    framed,
    peer_uid,
    private_folder,
    socket_path,
)

COMMANDS = frozenset({"run"})  # the commands the server takes; the rest always run here
STREAMS = (0, 1, 2)
ANSWER_TIMEOUT_S = 10.0  # for the server's first answer (it checks its code and forks: milliseconds)


def entry() -> int:
    """`rayeval ARGS`: through the warm CLI server when it takes the command, else in this process."""
    argv = sys.argv[1:]
    if argv[:1] and argv[0] in COMMANDS and enabled():
        code = run_through_server(argv)
        if code is not None:
            return code
    from cluster.cli.app import entry as entry_here

    return entry_here()


def run_through_server(argv: list[str]) -> int | None:
    """The command's exit status, run by the server; None when no server took it (none up, or it refused)."""
    path = socket_path()
    if not private_folder(path.parent):
        return None  # no server, or a folder someone else could have put a socket in
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(ANSWER_TIMEOUT_S)
        conn.connect(str(path))
        if peer_uid(conn) != os.getuid():
            conn.close()
            return None
        request = command_request(argv)
        send_request(conn, request)
        answers = conn.makefile("r", encoding="utf-8")
        first = json.loads(answers.readline() or "{}")
        if "pid" in first:
            conn.sendall(b"g")  # go: the command's process runs from here on, and this one follows it
    except (OSError, ValueError):
        return None  # no server, one that went away, or one too slow: the command runs here
    if "pid" not in first:
        if "--verbose" in argv:
            print(
                f"rayeval: the warm CLI server did not take the command: {first.get('refused')}",
                file=sys.stderr,
            )
        conn.close()
        return None
    conn.settimeout(None)
    return _follow(int(first["pid"]), answers, set(request["ignored_signals"]))


def send_request(conn: socket.socket, body: dict) -> None:
    """The request, whole, with this process's standard streams attached to its first bytes."""
    data = framed(body)
    fds = array.array("i", STREAMS)
    sent = conn.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    conn.sendall(data[sent:])


def _follow(pid: int, answers: TextIO, ignored: set[int]) -> int:
    """Forward this process's signals to the command's process group until the server says how it ended."""

    def forward(signum: int, _frame: object) -> None:
        for kill in (os.killpg, os.kill):  # os.kill: it may not have made its group yet
            try:
                kill(pid, signum)
                return
            except ProcessLookupError:
                continue

    def stop(signum: int, _frame: object) -> None:  # Ctrl-Z: the command stops, then this process
        forward(signal.SIGTSTP, _frame)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)

    def resume(signum: int, _frame: object) -> None:  # `fg` / `bg`
        signal.signal(signal.SIGTSTP, stop)
        forward(signal.SIGCONT, _frame)

    for signum in FORWARDED_SIGNALS:
        if signum not in ignored:
            signal.signal(signum, forward)
    signal.signal(signal.SIGWINCH, forward)
    signal.signal(signal.SIGTSTP, stop)
    signal.signal(signal.SIGCONT, resume)
    return _outcome(pid, answers)


def _outcome(pid: int, answers: TextIO) -> int:
    """The command's exit status, or this process ended by the signal that ended it."""
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
        answer = json.loads(line)
        if "status" in answer:
            return int(answer["status"])
        if "signal" in answer:
            signum = int(answer["signal"])
            if signum not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return 128 + signum
