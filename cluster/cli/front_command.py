"""A command's process, forked by the warm CLI server (cluster.cli.front_server): once its client says go, it
takes on the client's arguments, environment, working directory, CPU affinity, ignored signals and standard
streams, runs the command as `rayeval` would, ends as the interpreter's exit would (its threads joined, its
exit handlers run), sends its exit status to the client and exits without returning to the server's code."""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import sys
import threading

from cluster import timeline
from cluster.cli.front_paths import FORWARDED_SIGNALS

# Signals the server blocks across a fork: in the forked process they wait until its own handlers are set.
BLOCKED_ACROSS_FORK = {*FORWARDED_SIGNALS, signal.SIGTSTP, signal.SIGCONT, signal.SIGWINCH}


def run_command(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """Become the client's command, run it, report, exit. Never returns."""
    code = 70  # EX_SOFTWARE, unless the command gives its own
    try:
        if _client_says_go(conn):
            _take_on(request, fds)
            _interrupt_when_client_leaves(conn)
            code = _run()
            threading._shutdown()  # what the interpreter's exit waits for: non-daemon threads, executors'
            atexit._run_exitfuncs()  # the handlers a normal exit runs (Ray's shutdown, logging's flush)
    except BaseException:  # noqa: BLE001 - nothing may return into the server's loop
        sys.excepthook(*sys.exc_info())
    finally:
        for signum in BLOCKED_ACROSS_FORK:  # the client leaving now must not raise in here
            signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
        _report(conn, code)
        os._exit(code)


def _client_says_go(conn: socket.socket) -> bool:
    """The client's go-ahead (one byte): a client that gave up waiting has closed its end and runs the command
    itself, so this process must not run it too."""
    conn.settimeout(None)
    try:
        return conn.recv(1) == b"g"
    except OSError:
        return False


def _take_on(request: dict, fds: list[int]) -> None:
    """This process as the client's: its streams, place, environment, arguments, signals and start."""
    os.setpgid(0, 0)  # a group of its own: the client's forwarded signals reach its children too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGCHLD,
        signal.SIGTSTP,
        signal.SIGCONT,
        signal.SIGWINCH,
    ):
        signal.signal(signum, signal.SIG_DFL)
    for signum in request.get("ignored_signals", []):
        signal.signal(signum, signal.SIG_IGN)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdout.reconfigure(line_buffering=os.isatty(1))
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    os.sched_setaffinity(0, request["affinity"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["sys_argv"])
    sys.path[:] = request["path"]
    timeline.started_at(float(request["started_at"]))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, BLOCKED_ACROSS_FORK)


def _interrupt_when_client_leaves(conn: socket.socket) -> None:
    """The client's end closing (its process killed) interrupts the command as Ctrl-C would: a run stops
    where it is, and the same command resumes it."""

    def watch() -> None:
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, name="rayeval-client-watch", daemon=True).start()


def _run() -> int:
    """`rayeval` on the client's arguments (sys.argv), its status as the command's exit would give it."""
    from cluster.cli.app import entry

    try:
        return entry()
    except SystemExit as exc:  # argparse's errors and --help
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1


def _report(conn: socket.socket, code: int) -> None:
    """Flush what the command wrote (Python's buffers and C's) and tell the client how it ended."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        ctypes.CDLL(None).fflush(None)
        conn.sendall(json.dumps({"status": code}).encode() + b"\n")
    except (OSError, ValueError):
        pass  # the client went away
