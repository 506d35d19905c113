"""The warm CLI server: one process per user, machine, interpreter and copy of rayeval that has imported what
a `rayeval run` imports before its first request, and forks a process for each command a client
(cluster.cli.front) hands it.

`rayeval up` starts it beside the pool (cluster.cli.front_control), for the runs that follow on this machine; it
stops after its idle timeout with no command running, at `rayeval down --all`, when another server takes its
socket, or at the first command after a file of its imported code changed on disk. It takes a command only
where the command's process would be the one started from nothing (cluster.cli.front_state: the same user,
interpreter, process traits, environment and import path; refusals name the variables that differ, never their
values) and it has no thread of its own (a fork copies only the thread that forks). Otherwise the client runs
the command itself.

The server is single-threaded: it accepts, checks and forks, and reaps its children between connections; a
command's process sends its own exit status to its client as its last act, and the server reports a signal
that ended one. Idle, it wakes every few seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from cluster.cli.front_command import BLOCKED_ACROSS_FORK, run_command
from cluster.cli.front_paths import peer_uid, private_folder, socket_path
from cluster.cli.front_state import CodeState

# What a warm `rayeval run` imports before its first request: the CLI and its config, Ray, the run's modules.
PRELOAD = (
    "cluster.cli.app",
    "cluster.api",
    "cluster.run.coordinator",
    "cluster.sources.registry",
    "cluster.engines.warm",
    "cluster.engines.pool",
)
BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"
THREADS_END_S = 3.0  # a scorer's loading thread ends once its module is loaded
MAX_REQUEST_BYTES = 16 << 20
RECEIVE_TIMEOUT_S = 2.0
IDLE_POLL_S, BUSY_POLL_S = 5.0, 0.5


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.cli.front_server", description=__doc__)
    parser.add_argument(
        "--idle-timeout", type=float, default=3600.0, help="seconds with no command, then exit"
    )
    parser.add_argument(
        "--no-scorers", action="store_true", help="leave the default tasks' scorers to each run (see below)"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its children are reaped here, whatever it inherited
    started_env = dict(os.environ)
    load = ScorerLoad()
    try:
        state = CodeState.after_imports(PRELOAD, then=(lambda: None) if args.no_scorers else load)
    except ScorersNotLoaded as exc:  # the runs load them themselves, from this server's start again
        _log(f"{exc}; starting again without the scorers")
        sys.stdout.flush()
        sys.stderr.flush()
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # what the imports opened without close-on-exec
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:], "--no-scorers"], started_env)
    gc.collect()
    gc.freeze()  # the imported heap stays out of every fork's collections (and so unshared pages uncopied)
    Server(socket_path(), state, args.idle_timeout, scorer_facts=load.facts).serve()


class ScorersNotLoaded(Exception):
    """The default tasks' scorers did not load cleanly here (an error, or a thread left behind)."""


@dataclass
class ScorerLoad:
    """The default tasks' scorers (IFEval's checkers and langdetect's profiles), loaded as a run loads them in
    the background once its first requests are out: a run forked from here finds them loaded, so their import
    takes none of the CPU its engines generate on (on two cores the engine's threads hold both). Where they
    do not load cleanly, ScorersNotLoaded: the server starts again without them (a forked run would inherit a
    failed load, where a fresh process tries again).

    No thread may outlive the load (a server with another thread takes no command: a fork copies only the
    thread that forks): the loading thread is joined, and nltk's numpy loads its OpenBLAS with one thread, so
    the runs forked from here compute numpy's linear algebra on one thread where a fresh process would start
    one per core. Their numbers are the same bits: rayeval's statistics do no BLAS product
    (`evaluators.judging.statistics.row_sums`); its engines are processes of their own.

    The variables the load sets are undone (`CodeState.after_imports`), so a forked run starts with the
    environment a fresh one starts with. lm-eval's import sets Hugging Face's download settings
    (HF_XET_HIGH_PERFORMANCE, and HF_HUB_ENABLE_HF_TRANSFER where hf_transfer is installed) where a fresh run
    imports it; a forked run that downloads an lm-eval task's data goes without them (slower, the same data)."""

    # what the loaded scorers chose by (nltk's Punkt data, where nltk loaded); None: nothing to compare
    facts: tuple[bool, ...] | None = None

    def __call__(self) -> None:
        if _thread_count() > 1:
            raise ScorersNotLoaded("this process had threads before the scorers' load")
        if any(not os.path.isabs(path) for path in os.environ.get("NLTK_DATA", "").split(os.pathsep) if path):
            raise ScorersNotLoaded(
                "NLTK_DATA names a relative folder, which each run finds from its own directory"
            )
        blas_threads = os.environ.get(BLAS_THREADS_ENV)
        os.environ[BLAS_THREADS_ENV] = "1"  # read when OpenBLAS loads; the environment is restored below
        try:
            from cluster.config.options import DEFAULT_TASKS

            for name in DEFAULT_TASKS:
                _scorer_loaded(name)
            self.facts = _scorer_facts() if "nltk" in sys.modules else None
        except ScorersNotLoaded:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure here leaves the scorers to the runs
            raise ScorersNotLoaded(f"the scorers did not load here ({type(exc).__name__}: {exc})") from exc
        finally:
            if blas_threads is None:
                os.environ.pop(BLAS_THREADS_ENV, None)
            else:
                os.environ[BLAS_THREADS_ENV] = blas_threads
        _threads_ended()


def _scorer_loaded(name: str) -> None:
    from evaluators.tasks.registry import get_task

    began = time.monotonic()
    task = get_task(name)
    task.preload_scorer()
    try:
        task.wait_for_scorer()
    except KeyboardInterrupt:  # Ctrl-C while it loads: the server stops
        raise
    except BaseException as exc:  # noqa: BLE001 - the loading thread's error, whatever it was
        raise ScorersNotLoaded(f"the {name} scorer did not load here ({type(exc).__name__}: {exc})") from exc
    _log(f"loaded the {name} scorer in {time.monotonic() - began:.1f} s")


def _threads_ended() -> None:
    """Wait for the loading threads to end, in Python and then in the kernel (a joined thread's exit ends a
    moment later); ScorersNotLoaded where one is still there (a BLAS of another build, say)."""
    deadline = time.monotonic() + THREADS_END_S
    for thread in threading.enumerate():
        if thread is not threading.main_thread():
            with contextlib.suppress(Exception):  # a thread threading did not start cannot be joined
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
    while _thread_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    if _thread_count() > 1:
        raise ScorersNotLoaded("the scorers' import left threads in this process")


def _scorer_facts() -> tuple[bool, ...]:
    """What the loaded scorers chose by and a fresh process would choose by anew: whether nltk's Punkt data is
    installed (IFEval's sentence splitter is nltk's where it is, the offline Punkt where not)."""
    from evaluators.sentence_splitting import nltk_punkt_installed

    return nltk_punkt_installed()


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


@dataclass
class Server:
    path: Path
    state: CodeState
    idle_timeout_s: float
    children: dict[int, socket.socket] = field(default_factory=dict)
    served: int = 0
    listener: socket.socket | None = None
    identity: tuple[int, int, int] = (0, 0, 0)  # the socket file's device, inode and change time: still ours?
    scorer_facts: tuple[bool, ...] | None = None  # what the loaded scorers chose by (None: none loaded)

    def serve(self) -> None:
        self.listener, self.identity = _listen(self.path)
        _log(f"serving on {self.path} (pid {os.getpid()}), idle timeout {self.idle_timeout_s:g} s")
        last_used = time.monotonic()
        try:
            while self.listener is not None or self.children:
                if self.reap():
                    last_used = time.monotonic()
                if self.listener is not None and _identity(self.path) != self.identity:
                    self.stop_listening("its socket is another server's now")
                if self.listener is not None and not self.children:
                    if time.monotonic() - last_used > self.idle_timeout_s:
                        self.stop_listening("idle timeout")
                        continue
                waiting = [self.listener] if self.listener is not None else []
                if select.select(waiting, [], [], BUSY_POLL_S if self.children else IDLE_POLL_S)[0]:
                    self.accept()
                    last_used = time.monotonic()
        finally:
            self.stop_listening("exiting")

    def stop_listening(self, why: str) -> None:
        """Take no more commands: the socket goes at once (a client runs its command itself, without waiting),
        running commands finish."""
        if self.listener is None:
            return
        self.listener.close()
        self.listener = None
        if _identity(self.path) == self.identity:
            self.path.unlink(missing_ok=True)
        _log(f"taking no more commands: {why}")

    def accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError as exc:  # out of descriptors, a client that left: the next one may do
            _log(f"accept failed: {exc}")
            return
        try:
            self.take(conn)
        except Exception as exc:  # noqa: BLE001 - one client's bad message must not end the server
            _log(f"a client's message failed: {type(exc).__name__}: {exc}")
            conn.close()

    def take(self, conn: socket.socket) -> None:
        """One client's message: a command to fork for, or `ping` / `stop`."""
        if peer_uid(conn) != os.getuid():
            _log("refused a client of another user")
            conn.close()
            return
        request, fds = _receive(conn)
        try:
            if request.get("stop"):
                _send(conn, {"stopping": True, "pid": os.getpid()})
                conn.close()
                self.stop_listening("asked to stop")
                return
            refused = self.refusal(request)
            if request.get("ping"):  # `rayeval up`'s: would this server take its commands?
                _send(conn, {"pid": os.getpid(), "served": self.served, "refused": refused})
                conn.close()
            elif refused:
                _log(f"refused a command: {refused}")
                _send(conn, {"refused": refused})
                conn.close()
            else:
                self.fork(conn, request, fds)
        finally:
            for fd in fds:  # the command's process has its own copies
                os.close(fd)

    def refusal(self, request: dict) -> str | None:
        changed = self.state.changed()
        if changed:
            self.stop_listening("its code changed on disk")  # it exits once its commands end
            return f"its code changed on disk ({changed[0]}{' and more' if len(changed) > 1 else ''})"
        if threading.active_count() > 1 or _thread_count() > 1:
            self.stop_listening("it has threads")
            return "it has threads, which a fork would not copy"
        if self.scorer_facts is not None and _scorer_facts() != self.scorer_facts:
            self.stop_listening("nltk's Punkt data changed since its scorers loaded")
            return "nltk's Punkt data changed since its scorers loaded"
        argv = request.get("argv")
        if not request.get("ping") and not (isinstance(argv, list) and argv):
            return "a request without a command"
        return self.state.refusal(request)

    def fork(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        if len(fds) != 3:
            _send(conn, {"refused": "the standard streams did not arrive"})
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_ACROSS_FORK)  # until the child's handlers are set
        pid = os.fork()
        if pid == 0:
            try:
                for other in [self.listener, *self.children.values()]:
                    if other is not None:
                        other.close()
                run_command(conn, self.state.command_view(request), fds)
            finally:
                os._exit(70)  # never back into the server's loop (its clean-up would remove the socket)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, BLOCKED_ACROSS_FORK)
        self.served += 1
        self.children[pid] = conn
        _log(
            f"command {self.served}: pid {pid} runs `rayeval {request['argv'][0]}` in {request.get('cwd', '?')}"
        )
        _send(conn, {"pid": pid})

    def reap(self) -> bool:
        """Collect ended commands; tell a client whose command a signal ended (the others told it themselves).
        Whether any ended."""
        ended = False
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done == 0:
                continue
            ended = True
            conn = self.children.pop(pid)
            if os.WIFSIGNALED(status):
                try:
                    _send(conn, {"signal": os.WTERMSIG(status)})
                except OSError:
                    pass  # the client went away
            conn.close()
        return ended


def _listen(path: Path) -> tuple[socket.socket, tuple[int, int, int]]:
    """The server's socket, created under a temporary name and renamed into place (a client never connects to
    a socket that is not listening yet), readable by this user only; with its file's identity."""
    if not private_folder(path.parent, create=True):
        raise SystemExit(f"{path.parent} must belong to this user and be closed to others (chmod 700)")
    staging = path.parent / f".{os.getpid()}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(staging))
    os.chmod(staging, 0o600)
    listener.listen(64)
    os.replace(staging, path)
    return listener, _identity(path)


def _identity(path: Path) -> tuple[int, int, int]:
    try:
        info = path.stat()
    except OSError:
        return (0, 0, 0)
    return (info.st_dev, info.st_ino, info.st_ctime_ns)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One message as `front_paths.framed` frames it, and the descriptors sent with it (closed here if the
    message fails)."""
    fds: list[int] = []
    try:
        conn.settimeout(RECEIVE_TIMEOUT_S)
        header, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * 4), socket.MSG_CMSG_CLOEXEC)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(struct.unpack(f"{len(data) // 4}i", data[: len(data) - len(data) % 4]))
        if len(header) != 4:
            raise ValueError("a short header")
        size = struct.unpack("!I", header)[0]
        if size > MAX_REQUEST_BYTES:
            raise ValueError(f"a request of {size} bytes")
        body = bytearray()
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("a request cut short")
            body += chunk
        request = json.loads(body)
        if not isinstance(request, dict):
            raise ValueError("a request that is not an object")
        return request, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _log(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
