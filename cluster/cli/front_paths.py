"""Where this machine's warm CLI server is found (cluster.cli.front_server), the switch that concerns it, how a
message to it is framed and who is at the other end of a connection, and what a client tells it about itself:
the process it would run a command as, with the environment and import path this `rayeval` process started
with. Plain Python: the `rayeval` entry imports it first."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import socket
import stat
import struct
import sys
from pathlib import Path

from cluster import timeline

WARM_CLI_ENV = "RAYEVAL_WARM_CLI"  # "0": every command runs in its own process, server or not
SOCKET_DIR_ENV = "RAYEVAL_WARM_CLI_DIR"  # the server's folder (default: this user's folder in /tmp)
# The environment this process started with, before Ray's import and rayeval's own settings (Ray's token mode)
# changed it: a server that `rayeval up` starts takes this one, which the commands typed after it will have.
STARTING_ENV = dict(os.environ)
STARTING_PATH = list(sys.path)  # likewise (`import ray` adds its third-party folder)
# Signals a command handles as it was started to: ignored ones stay ignored (`nohup`, `cmd &` in a script).
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LIMITS = ("RLIMIT_NOFILE", "RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_NPROC")
NAMESPACES = ("mnt", "net", "pid", "uts", "ipc", "user")


def enabled() -> bool:
    return os.environ.get(WARM_CLI_ENV, "1") != "0"


def socket_path() -> Path:
    """The server's socket for this interpreter and this copy of rayeval: another virtual environment or
    checkout has a server of its own."""
    identity = f"{sys.executable}\0{Path(__file__).resolve().parents[2]}".encode()
    folder = os.environ.get(SOCKET_DIR_ENV) or os.path.join("/tmp", f"rayeval-{os.getuid()}")
    return Path(folder) / f"cli-{hashlib.sha256(identity).hexdigest()[:12]}.sock"


def log_path() -> Path:
    """The server's log: when it started and stopped, each command it forked for, each it refused and why."""
    return socket_path().with_suffix(".log")


def private_folder(folder: Path, create: bool = False) -> bool:
    """Whether `folder` is this user's own and closed to others (not a link): only then is a socket in it the
    server's and not another user's, and a lock or log file opened in it not a planted link."""
    if create:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def framed(message: dict) -> bytes:
    """A message to the server: its JSON's length (4 bytes, network order), then the JSON."""
    body = json.dumps(message).encode()
    return struct.pack("!I", len(body)) + body


def peer_uid(conn: socket.socket) -> int:
    """The user of the process at the other end of a Unix socket, as the kernel says (SO_PEERCRED)."""
    return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]


def command_request(argv: list[str]) -> dict:
    """What the server needs to run `rayeval ARGV` as this process would: the command's arguments, and this
    process as it started (environment, import path, interpreter flags) and is (working directory, umask, CPU
    affinity, limits, namespaces and cgroup, ignored signals), which it compares with its own."""
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
        "ignored_signals": [int(s) for s in FORWARDED_SIGNALS if signal.getsignal(s) == signal.SIG_IGN],
        "process": process_traits(),
    }


def process_traits() -> dict:
    """What a forked process inherits from the server and cannot take from its client: interpreter flags,
    resource limits, priority, namespaces and cgroup. A server takes a command only where these are equal."""
    namespaces = {}
    for name in NAMESPACES:
        try:
            namespaces[name] = os.readlink(f"/proc/self/ns/{name}")
        except OSError:
            namespaces[name] = None
    try:
        cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        cgroup = None
    return {
        "flags": repr(sys.flags),
        "warnoptions": sys.warnoptions,
        "xoptions": {k: str(v) for k, v in sys._xoptions.items()},
        "limits": {name: resource.getrlimit(getattr(resource, name)) for name in LIMITS},
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "namespaces": namespaces,
        "cgroup": cgroup,
    }
