"""The warm CLI server: one process per machine, interpreter and copy of rayeval that has imported what a
`rayeval run` imports before its first request, and forks a process for each command a client
(cluster.cli.front) hands it.

`rayeval up` starts it beside the pool (cluster.cli.front_control), for the runs that follow on this machine; it
stops after its idle timeout with no command running, at `rayeval down --all`, or at the first command
after a file of its imported code changed on disk. It takes a command only when the command's process would be
the same as one started from nothing: the same user, interpreter and import path (a checkout that shadows its
packages is refused), the same environment (shell bookkeeping such as PWD aside; the names of variables that
differ are logged, never their values), imported files unchanged, and no thread of its own (a fork copies only
the thread that forks). Otherwise the client runs the command itself.

The server is single-threaded: it accepts, checks and forks, and reaps its children between connections; a
command's process sends its own exit status to its client as its last act, and the server reports the status of
one that a signal ended.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.machinery
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from cluster.cli.front_command import run_command
from cluster.cli.front_paths import socket_path

# What a warm `rayeval run` imports before its first request: the CLI and its config, Ray, the run's modules.
PRELOAD = (
    "cluster.cli.app",
    "cluster.api",
    "cluster.run.coordinator",
    "cluster.sources.registry",
    "cluster.engines.warm",
    "cluster.engines.pool",
)
SHELL_BOOKKEEPING = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "COLUMNS", "LINES"})
MAX_REQUEST_BYTES = 16 << 20


@dataclass
class CodeState:
    """What the server imported, as it was on disk when it started."""

    files: dict[str, tuple[int, int]]  # module file -> (mtime_ns, size)
    packages: dict[str, str]  # top-level module name -> the folder or file it was imported from
    env: dict[str, str]  # the environment before the imports, which a client's must equal
    set_by_imports: dict[str, str]  # what the imports set in it (`import ray`: RAY_CLIENT_MODE, ...)
    path: list[str]  # sys.path before the imports, which a client's must equal but for its first entry
    path_after: list[str]  # sys.path after them (`import ray` adds its third-party folder)

    @classmethod
    def after_imports(cls, modules: tuple[str, ...]) -> CodeState:
        env, path = dict(os.environ), list(sys.path)
        for name in modules:
            importlib.import_module(name)
        set_by_imports = {k: v for k, v in os.environ.items() if env.get(k) != v}
        files, packages = {}, {}
        for name, module in list(sys.modules.items()):
            origin = getattr(module, "__file__", None)
            if not origin or not os.path.isabs(origin):
                continue
            try:
                stat = os.stat(origin)
            except OSError:
                continue
            files[origin] = (stat.st_mtime_ns, stat.st_size)
            if "." not in name:
                is_package = os.path.basename(origin).startswith("__init__.")
                packages[name] = os.path.dirname(origin) if is_package else origin
        return cls(files, packages, env, set_by_imports, path, list(sys.path))

    def command_view(self, request: dict) -> dict:
        """The request as the command's process takes it on: the client's environment and import path with
        what the server's imports added to them, as the command's own imports would have."""
        first = request["path"][0] if request["path"] else ""
        path = [first if entry == self.path[0] else entry for entry in self.path_after]
        return {**request, "env": {**request["env"], **self.set_by_imports}, "path": path}

    def changed(self) -> list[str]:
        """Imported files that changed (or went) since the server started."""
        found = []
        for path, (mtime_ns, size) in self.files.items():
            try:
                stat = os.stat(path)
            except OSError:
                found.append(path)
                continue
            if (stat.st_mtime_ns, stat.st_size) != (mtime_ns, size):
                found.append(path)
        return found

    def refusal(self, request: dict) -> str | None:
        """Why a command's process forked from here would differ from one started from nothing; None if not."""
        if request.get("executable") != sys.executable:
            return f"another interpreter ({request.get('executable')})"
        env = request.get("env", {})
        differ = sorted(
            name
            for name in set(env) | set(self.env)
            if name not in SHELL_BOOKKEEPING and env.get(name) != self.env.get(name)
        )
        if differ:
            return f"the environment differs in {', '.join(differ)}"
        path = request.get("path", [])
        if path[1:] != self.path[1:]:
            return "another import path (sys.path)"
        if path and path[0] != self.path[0]:
            shadowed = self.shadowed_by(path[0])
            if shadowed:
                return f"{path[0]} holds other copies of {', '.join(shadowed)}"
        return None

    def shadowed_by(self, folder: str) -> list[str]:
        """Top-level modules the server imported that `folder`, first on a client's path, has other copies of
        (a regular package or a module file: a folder without `__init__` does not shadow one found later)."""
        suffixes = importlib.machinery.all_suffixes()
        found = []
        for name, origin in self.packages.items():
            base = os.path.join(folder, name)
            candidates = [base] if os.path.exists(os.path.join(base, "__init__.py")) else []
            candidates += [base + suffix for suffix in suffixes if os.path.exists(base + suffix)]
            if any(os.path.realpath(c) != os.path.realpath(origin) for c in candidates):
                found.append(name)
        return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.cli.front_server", description=__doc__)
    parser.add_argument(
        "--idle-timeout", type=float, default=3600.0, help="seconds with no command, then exit"
    )
    args = parser.parse_args()
    state = CodeState.after_imports(PRELOAD)
    gc.collect()
    gc.freeze()  # the imported heap stays out of every fork's collections (and so unshared pages uncopied)
    Server(socket_path(), state, args.idle_timeout).serve()


@dataclass
class Server:
    path: Path
    state: CodeState
    idle_timeout_s: float
    children: dict[int, socket.socket] = field(default_factory=dict)
    served: int = 0
    stopping: bool = False

    def serve(self) -> None:
        listener, inode = _listen(self.path)
        _log(f"serving on {self.path} (pid {os.getpid()}), idle timeout {self.idle_timeout_s:g} s")
        last_used = time.monotonic()
        try:
            while not (self.stopping and not self.children):
                self.reap()
                if not self.stopping and not _still_at(self.path, inode):
                    _log(f"{self.path} is no longer this server's socket: taking no more commands")
                    self.stopping = True
                if not self.children and time.monotonic() - last_used > self.idle_timeout_s:
                    _log("idle timeout: exiting")
                    break
                if self.stopping:
                    time.sleep(0.1)
                    continue
                if select.select([listener], [], [], 0.5)[0]:
                    conn, _ = listener.accept()
                    last_used = time.monotonic()
                    self.take(conn, listener)
        finally:
            listener.close()
            if _still_at(self.path, inode):  # not a newer server's socket
                self.path.unlink(missing_ok=True)

    def take(self, conn: socket.socket, listener: socket.socket) -> None:
        """One client's message: a command to fork for, or `ping` / `stop`."""
        fds: list[int] = []
        try:
            conn.settimeout(5)
            request, fds = _receive(conn)
            if request.get("stop"):
                self.stopping = True
                _send(conn, {"stopping": True, "pid": os.getpid()})
                conn.close()
                return
            if request.get("ping"):  # `rayeval up`'s: would this server take its commands?
                answer = {"pid": os.getpid(), "served": self.served}
                _send(conn, {**answer, "refused": self.state.changed()[:1] or self.state.refusal(request)})
                conn.close()
                return
            refused = self.refusal(conn, request)
            if refused:
                _log(f"refused a command: {refused}")
                _send(conn, {"refused": refused})
                conn.close()
                return
            self.fork(conn, listener, request, fds)
        except (OSError, ValueError) as exc:
            _log(f"a client's message failed: {exc}")
            conn.close()
        finally:
            for fd in fds:  # the command's process has its own copies
                os.close(fd)

    def refusal(self, conn: socket.socket, request: dict) -> str | None:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            return "another user"
        changed = self.state.changed()
        if changed:
            self.stopping = True  # its code is old: it takes nothing more and exits once its commands end
            return f"its code changed on disk ({changed[0]}{' and more' if len(changed) > 1 else ''})"
        if threading.active_count() > 1 or len(os.listdir("/proc/self/task")) > 1:
            self.stopping = True
            return "it has threads, which a fork would not copy"
        return self.state.refusal(request)

    def fork(self, conn: socket.socket, listener: socket.socket, request: dict, fds: list[int]) -> None:
        if len(fds) != 3:
            _send(conn, {"refused": "the standard streams did not arrive"})
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            keep = {conn.fileno(), *fds}
            for other in [listener, *self.children.values()]:
                if other.fileno() not in keep:
                    other.close()
            run_command(conn, self.state.command_view(request), fds)  # never returns
        self.served += 1
        self.children[pid] = conn
        _log(f"command {self.served}: pid {pid} runs `rayeval {request['argv'][0]}`")
        _send(conn, {"pid": pid})

    def reap(self) -> None:
        """Collect ended commands; tell a client whose command a signal ended (the others told it themselves)."""
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done == 0:
                continue
            conn = self.children.pop(pid)
            if os.WIFSIGNALED(status):
                try:
                    _send(conn, {"status": -os.WTERMSIG(status)})
                except OSError:
                    pass  # the client went away
            conn.close()


def _listen(path: Path) -> tuple[socket.socket, int]:
    """The server's socket, created under a temporary name and renamed into place (a client never connects to
    a socket that is not listening yet), readable by this user only; with the inode it has in its folder."""
    folder = path.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SystemExit(f"{folder} must belong to this user and be closed to others (chmod 700 {folder})")
    staging = folder / f".{path.name}.{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(staging))
    os.chmod(staging, 0o600)
    listener.listen(64)
    os.replace(staging, path)
    return listener, path.stat().st_ino


def _still_at(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino == inode
    except OSError:
        return False


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One length-prefixed JSON message and the descriptors sent with it."""
    fds: list[int] = []
    header, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * 4))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // 4}i", data[: len(data) - len(data) % 4]))
    if len(header) != 4:
        raise ValueError("a short header")
    size = struct.unpack("!I", header)[0]
    if size > MAX_REQUEST_BYTES:
        raise ValueError(f"a request of {size} bytes")
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("a request cut short")
        body += chunk
    return json.loads(body), fds


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _log(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
