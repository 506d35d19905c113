"""A command's process, forked by the warm CLI server (cluster.cli.front_server): it takes on its client's
arguments, environment, working directory, CPU affinity and standard streams, runs the command as `rayeval`
would, sends its exit status to the client and exits without returning to the server's code."""

from __future__ import annotations

import atexit
import json
import os
import random
import signal
import socket
import sys
import threading
import traceback

from cluster import timeline


def run_command(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """Become the client's command, run it, report, exit. Never returns."""
    code = 1
    try:
        _take_on(request, fds)
        _interrupt_when_client_leaves(conn)
        code = _run()
        for thread in threading.enumerate():  # what the interpreter's exit would wait for
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()  # the handlers a normal exit runs (Ray's shutdown, logging's flush)
    except BaseException:  # noqa: BLE001 - nothing may return into the server's loop
        traceback.print_exc()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client leaving now must not raise in here
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            conn.sendall(json.dumps({"status": code}).encode() + b"\n")
        except (OSError, ValueError):
            pass  # the client went away
        os._exit(code)


def _take_on(request: dict, fds: list[int]) -> None:
    """This process as the client's: its streams, place, environment, arguments and start."""
    os.setpgid(0, 0)  # a group of its own: the client's forwarded signals reach its children too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
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
    random.seed()  # not the server's sequence, which every fork would repeat
    timeline.started_at(float(request["started_at"]))


def _interrupt_when_client_leaves(conn: socket.socket) -> None:
    """The client's end closing (its process killed) interrupts the command as Ctrl-C would: a run stops
    where it is, and the same command resumes it."""

    conn.settimeout(None)

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
