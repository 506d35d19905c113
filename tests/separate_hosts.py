"""Hosts that really are separate machines as far as Ray and rayeval can tell, built on this one machine with
Linux namespaces and cpusets, and a real Ray cluster across them (token authentication on).

What each host has of its own:
- **network**: its own network namespace with one interface, `eth0`, at 10.231.N.k/24 (N is this run's, k the
  host's place), a default route out of it and `lo`. The hosts meet on a bridge that lives in one more namespace
  of the run's own (the "switch"); nothing of it is in the machine's own namespace, so a host's ports (Ray's
  defaults: 6379, 8265, 10001) clash with nothing else, and no host can be reached from the machine outside or
  the other way round: traffic stays between the run's hosts.
- **home and temporary folder**: its own mount namespace, `/home` bound to `<base>/<host>/home` and `/tmp` to
  `<base>/<host>/tmp` (HOME=/home), and a fresh tmpfs on `/dev/shm` (Ray's object store). `~/.ray/auth_token`,
  `~/.cache/rayeval/models/...`, `/tmp/ray/session_*/logs` and a relative output folder are per host; the
  test reads them from outside through `Host.home`, `Host.tmp` and `Host.path_inside`.
- **cores**: its own cgroup-v1 cpuset (`/sys/fs/cgroup/cpuset/rvhN-<host>`): `os.sched_getaffinity(0)` and
  /proc/<pid>/status show only its cores, and a process cannot take another core (EINVAL), as on a machine that
  lacks it. A client host (the "laptop") may share cores with the others.
- **name**: its own UTS namespace, hostname = the host's name, and an /etc/hosts naming every host.

What they share, and why that is enough: the filesystem outside /home and /tmp (this checkout, the venv and
its interpreter under /root/.pyenv: every node of a real cluster has rayeval installed at one path too), the
kernel, memory, and the PID space (pids are global, so a test can read /proc/<pid>/status of a process on any
host; `os.cpu_count()` still says how many cores the machine has). rayeval must not assume that a file written
on one node can be read on another, that a path means the same on the client and the cluster, that cores,
environment variables or ports of the driver's machine exist on an engine's node, or that a node can reach
the client: each of those is separated here. What stays shared is what it may take for granted on a
cluster installed alike on every node.

Ray on the hosts: `ray start --head --block` on the head, bound to its address, `ray start --address=... --block`
on each worker host, each reading its own copy of the cluster's token from its own `~/.ray/auth_token`; the
homes of the head and the clients hold the embedded default model (hard links to this machine's copy), the
workers' homes do not (an engine there builds its own). Every process started in a host
is in its cpuset; teardown kills every process in the run's cpusets and namespaces, then removes them. A run
killed before its teardown leaves them behind under its number; the next run finds the number's lock free
(`/tmp/rayeval-separate-hosts/N.lock`, held while a run lives) and removes them.

Use it with `separate_hosts(specs, base_dir)` and `ray_cluster(head, workers)`, or through `separate_cluster`
(the tests' fixture `separate_hosts` in tests/cluster/conftest.py: head, one worker on core 1, a laptop).
Run as a module inside a host (`python -m tests.separate_hosts port|nodes ...`) it waits for Ray's ports and
nodes there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.head_env import CLIENT_SERVER_HEAD_ENV

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable  # the venv's interpreter: the shared filesystem has it at the same path on every host
VENV_BIN = Path(sys.executable).parent
PREFIX = "rvh"  # every namespace and cpuset of a run is named rvh<N>-<host>
CPUSET = Path("/sys/fs/cgroup/cpuset")
LOCKS = Path("/tmp/rayeval-separate-hosts")
SUBNET = "10.231.{number}.{index}"
NUMBERS = range(1, 255)
SWITCH = "switch"
HOST_NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")
# Run in the host's fresh mount and UTS namespaces: "$1" home, "$2" tmp, "$3" hosts file, "$4" name, "$5" cwd.
# /etc/hosts first: the backing folders may lie under the machine's /tmp, hidden once /tmp is bound over.
# "$6": this checkout's path under /tmp, where it lies there (a CI clone may): bound into the host's own /tmp at
# the same path first, so that the host's /tmp hides everything of the machine's but the checkout and its venv.
ENTER = (
    'mount --bind "$3" /etc/hosts && mount --bind "$1" /home'
    ' && { [ -z "$6" ] || { mkdir -p "$2/$6" && mount --bind "/tmp/$6" "$2/$6"; }; } && mount --rbind "$2" /tmp'
    ' && mount -t tmpfs -o mode=1777 shm /dev/shm && hostname "$4" && cd "$5" && shift 6 && exec "$@"'
)
CHECKOUT_UNDER_TMP = str(REPO.relative_to("/tmp")) if REPO.is_relative_to("/tmp") else ""
JOIN = 'echo $$ > "$1" && shift && exec "$@"'  # into the cpuset before `ip netns exec` hides /sys/fs/cgroup
HIDDEN_PREFIXES = ("RAY_", "RAYEVAL_", "PYTEST_", "XDG_")
HIDDEN_NAMES = {"HOME", "PWD", "OLDPWD", "TMPDIR", "TMP", "TEMP", "PYTHONPATH", "VIRTUAL_ENV"}
RAY_LOGS = ("gcs_server.out", "raylet.out", "raylet.err", "dashboard.log", "ray_client_server.err")


class HostSetupError(RuntimeError):
    """The hosts or their Ray cluster could not be built; the message says what failed."""


@dataclass(frozen=True)
class HostSpec:
    name: str  # lower-case letters and digits, at most 10: it names namespaces and the hostname
    cores: frozenset[int]

    def __init__(self, name: str, cores: Iterable[int]) -> None:
        if not HOST_NAME.match(name):
            raise ValueError(f"host name {name!r}: lower-case letters and digits, at most 10, a letter first")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "cores", frozenset(cores))


@dataclass(eq=False)
class Host:
    """One host: run commands in it with `run`, `popen`, `python` and `rayeval`; read its files from outside
    through `home`, `tmp` and `path_inside`."""

    name: str
    ip: str
    cores: frozenset[int]
    root: Path  # outside: home/, tmp/ and the logs of what the fixture started there
    netns: str
    cpuset: Path
    hosts_file: Path
    processes: list[subprocess.Popen[str]] = field(default_factory=list, repr=False)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def path_inside(self, path: str | Path) -> Path:
        """Where a path as this host sees it lies outside: /home and /tmp are its backing folders, the rest is
        the shared filesystem. Its /dev/shm is a tmpfs that only its own processes see."""
        path = Path(path)
        if path.is_relative_to("/dev/shm"):
            raise ValueError(f"{path} is in {self.name}'s own tmpfs, not visible from outside")
        for inside, outside in ((Path("/home"), self.home), (Path("/tmp"), self.tmp)):
            if path.is_relative_to(inside):
                return outside / path.relative_to(inside)
        return path

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This host's environment: the machine's, less Ray's, rayeval's and pytest's variables (RAY_ADDRESS
        among them), XDG folders and the test process's HOME, TMPDIR, PWD, PYTHONPATH and VIRTUAL_ENV; then
        HOME=/home, the venv's bin first on PATH, this checkout on PYTHONPATH, and `extra`."""
        env = {
            k: v for k, v in os.environ.items() if k not in HIDDEN_NAMES and not k.startswith(HIDDEN_PREFIXES)
        }
        env.update(HOME="/home", PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(REPO))
        return {**env, **(extra or {})}

    def command(self, argv: Sequence[str], cwd: str = "/home") -> list[str]:
        """`argv` as a command line of the machine that runs it inside this host (no shell sees `argv`)."""
        return [
            "sh", "-c", JOIN, "join", str(self.cpuset / "cgroup.procs"),
            "ip", "netns", "exec", self.netns,
            "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "sh", "-c", ENTER, "enter", str(self.home), str(self.tmp), str(self.hosts_file), self.name, cwd,
            CHECKOUT_UNDER_TMP, *argv,
        ]  # fmt: skip

    def popen(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str = "/home",
        **popen_args: Any,
    ) -> subprocess.Popen[str]:
        """Start `argv` in this host, in a process group of its own; `env` is added to `environ()`."""
        self.processes = [p for p in self.processes if p.poll() is None]
        popen_args = {"stdin": subprocess.DEVNULL, "text": True, **popen_args}
        process = subprocess.Popen(self.command(argv, cwd), env=self.environ(env), cwd="/",
                                   start_new_session=True, **popen_args)  # fmt: skip
        self.processes.append(process)
        return process

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str = "/home",
        timeout: float = 120,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` in this host to its end, its output captured; on timeout its process group is killed
        and TimeoutExpired raised, as `subprocess.run` does."""
        stdin = subprocess.PIPE if input is not None else subprocess.DEVNULL
        pipe = subprocess.PIPE
        process = self.popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=pipe, stderr=pipe)
        try:
            out, err = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            process.communicate()
            raise
        return subprocess.CompletedProcess(list(argv), process.returncode, out, err)

    def python(self, code: str, *args: str, **run_args: Any) -> subprocess.CompletedProcess[str]:
        """`python -c code args...` with the venv's interpreter, in this host."""
        return self.run([PYTHON, "-c", code, *args], **run_args)

    def rayeval(self, *args: str, timeout: float = 900, **run_args: Any) -> subprocess.CompletedProcess[str]:
        """`rayeval args...` (`python -m cluster.cli`, this checkout's) as a user of this host runs it."""
        return self.run([PYTHON, "-m", "cluster.cli", *args], timeout=timeout, **run_args)

    def pids(self) -> list[int]:
        """Every process now running in this host (its cpuset's), to read /proc/<pid>/... from outside."""
        return sorted(int(pid) for pid in (self.cpuset / "cgroup.procs").read_text().split())

    def ray_log_dir(self) -> Path | None:
        """The newest Ray session's log folder on this host, seen from outside (session_latest is a link
        that only resolves inside)."""
        sessions = sorted((self.tmp / "ray").glob("session_2*"), key=lambda p: p.stat().st_mtime)
        return sessions[-1] / "logs" if sessions else None


def kill_group(process: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


# ---- the hosts -------------------------------------------------------------------------------------------


def require_host_tools(specs: Sequence[HostSpec] = ()) -> None:
    """Fail (not skip: CI runs these tests as root on the same image) when this machine cannot build hosts."""
    import pytest

    problems = [] if os.geteuid() == 0 else ["root (namespaces, veth pairs and cpusets need it)"]
    tools = ("ip", "unshare", "mount", "hostname")
    problems += [f"the `{tool}` command" for tool in tools if not shutil.which(tool)]
    if not (CPUSET / "cgroup.procs").is_file():
        problems.append(f"the cgroup-v1 cpuset hierarchy at {CPUSET}")
    else:
        wanted = set().union(*(spec.cores for spec in specs))
        if missing := wanted - machine_cores():
            problems.append(f"cores {sorted(missing)} (this machine's cpuset has {sorted(machine_cores())})")
    if problems:
        pytest.fail("separate hosts need " + "; ".join(problems), pytrace=False)


def machine_cores() -> set[int]:
    return parse_cpu_list((CPUSET / "cpuset.effective_cpus").read_text())


def parse_cpu_list(text: str) -> set[int]:
    """Linux's list format: "0-2,5" -> {0, 1, 2, 5}."""
    cores: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


@contextlib.contextmanager
def separate_hosts(specs: Sequence[HostSpec], base_dir: Path) -> Iterator[dict[str, Host]]:
    """Build the hosts (by name, in `specs` order) under `base_dir`; on the way out, whatever happened, every
    process in them is killed and every namespace and cpuset removed."""
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"host names must differ: {names}")
    number, lock = claim_number()
    hosts: dict[str, Host] = {}
    try:
        make_switch(name_of(number, SWITCH))
        hosts_file = base_dir / "hosts"
        for index, spec in enumerate(specs, 1):
            hosts[spec.name] = make_host(spec, number, index, base_dir, hosts_file)
        lines = ["127.0.0.1 localhost", "::1 localhost", *(f"{h.ip} {h.name}" for h in hosts.values())]
        hosts_file.write_text("\n".join(lines) + "\n")
        yield hosts
    finally:
        try:
            stop_processes([p for host in hosts.values() for p in host.processes])
            remove_run(number)
        finally:
            os.close(lock)


def name_of(number: int, host: str) -> str:
    return f"{PREFIX}{number}-{host}"


def claim_number() -> tuple[int, int]:
    """A run number (its subnet, and the names of its namespaces and cpusets) no living run holds, with its
    lock held; leftovers of killed runs are removed first."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    for number in sorted(leftover_numbers()):
        lock = try_lock(number)
        if lock is not None:
            try:
                remove_run(number)
            finally:
                os.close(lock)
    for number in NUMBERS:
        lock = try_lock(number)
        if lock is not None:
            return number, lock
    raise HostSetupError(f"every run number in {NUMBERS} is held by a living run ({LOCKS})")


def try_lock(number: int) -> int | None:
    fd = os.open(LOCKS / f"{number}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def leftover_numbers() -> set[int]:
    names = [p.name for p in CPUSET.glob(f"{PREFIX}*")] + netns_names()
    return {int(m.group(1)) for name in names if (m := re.match(rf"^{PREFIX}(\d+)-", name))}


def netns_names() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HostSetupError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def make_switch(switch: str) -> None:
    ip("netns", "add", switch)
    ip("-n", switch, "link", "add", "br0", "type", "bridge")
    ip("-n", switch, "link", "set", "br0", "up")


def make_host(spec: HostSpec, number: int, index: int, base_dir: Path, hosts_file: Path) -> Host:
    """Host number `index` of run `number`: its namespace, wired to the switch's bridge, and its cpuset."""
    netns, switch = name_of(number, spec.name), name_of(number, SWITCH)
    address = SUBNET.format(number=number, index=index)
    ip("netns", "add", netns)
    port = f"{PREFIX}{number}p{index}"  # the switch's end of the pair (15 characters at most)
    ip("link", "add", port, "netns", switch, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip("-n", switch, "link", "set", port, "master", "br0", "up")
    ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
    ip("-n", netns, "link", "set", "eth0", "up")
    ip("-n", netns, "link", "set", "lo", "up")
    # A default route, as a machine has: Ray finds a node's own address by the route out of it.
    ip("-n", netns, "route", "add", "default", "dev", "eth0")
    host = Host(spec.name, address, spec.cores, base_dir / spec.name, netns, make_cpuset(netns, spec.cores),
                hosts_file)  # fmt: skip
    host.home.mkdir(parents=True)
    host.tmp.mkdir()
    host.tmp.chmod(0o1777)
    return host


def make_cpuset(name: str, cores: frozenset[int]) -> Path:
    cpuset = CPUSET / name
    cpuset.mkdir()
    (cpuset / "cpuset.cpus").write_text(",".join(map(str, sorted(cores))))
    (cpuset / "cpuset.mems").write_text((CPUSET / "cpuset.mems").read_text().strip())
    return cpuset


def stop_processes(processes: Sequence[subprocess.Popen[str]], grace_s: float = 10) -> None:
    """SIGTERM to each process group (`ray start --block` stops its own on it), SIGKILL after `grace_s`."""
    live = [p for p in processes if p.poll() is None]
    for process in live:
        kill_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        kill_group(process)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


def remove_run(number: int, timeout_s: float = 30) -> None:
    """Kill every process in run `number`'s cpusets and network namespaces, then remove those."""
    tag = name_of(number, "")
    cpusets = sorted(CPUSET.glob(f"{tag}*"))
    namespaces = [name for name in netns_names() if name.startswith(tag)]
    deadline = time.monotonic() + timeout_s
    while pids := run_pids(cpusets, namespaces):
        if time.monotonic() > deadline:
            raise HostSetupError(f"processes {sorted(pids)} of {tag}* outlived SIGKILL for {timeout_s:g} s")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    for name in namespaces:
        ip("netns", "del", name)
    for cpuset in cpusets:
        remove_cpuset(cpuset, deadline)


def run_pids(cpusets: Sequence[Path], namespaces: Sequence[str]) -> set[int]:
    pids: set[int] = set()
    for cpuset in cpusets:
        with contextlib.suppress(FileNotFoundError):
            pids.update(int(pid) for pid in (cpuset / "cgroup.procs").read_text().split())
    for name in namespaces:
        listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
        pids.update(int(pid) for pid in listed.stdout.split())
    return pids - {os.getpid()}


def remove_cpuset(cpuset: Path, deadline: float) -> None:
    """rmdir, tried again while the kernel still counts a just-killed process in it."""
    while True:
        try:
            cpuset.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# ---- a Ray cluster on them ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RayPorts:
    """The head's ports: Ray's defaults, free because each host has a network of its own."""

    gcs: int = 6379
    dashboard: int = 8265
    client: int = 10001


@dataclass
class RayCluster:
    head: Host
    workers: list[Host]
    token: str
    ports: RayPorts
    dashboard_host: str
    raylets: dict[str, subprocess.Popen[str]] = field(default_factory=dict, repr=False)

    @property
    def gcs_address(self) -> str:
        return f"{self.head.ip}:{self.ports.gcs}"

    @property
    def client_address(self) -> str:
        return f"ray://{self.head.ip}:{self.ports.client}"

    @property
    def dashboard_url(self) -> str:
        host = self.head.ip if self.dashboard_host in ("0.0.0.0", "::") else self.dashboard_host
        return f"http://{host}:{self.ports.dashboard}"

    @property
    def hosts(self) -> list[Host]:
        return [self.head, *self.workers]

    def log_tails(self, lines: int = 15) -> str:
        return log_tails(self.hosts, lines)


@contextlib.contextmanager
def ray_cluster(
    head: Host,
    workers: Sequence[Host],
    *,
    clients: Sequence[Host] = (),
    head_cpus: int = 0,
    worker_cpus: int = 1,
    dashboard_host: str | None = None,
    ports: RayPorts | None = None,
    timeout_s: float = 120,
) -> Iterator[RayCluster]:
    """`ray start` on the head and each worker, token auth on; each of them and each client host gets its own
    copy of the token in ~/.ray/auth_token, and the head and the clients one of the default model, which a
    driver or coordinator resolves there. The workers have none: an engine of the default model builds it on
    its own node, as on a cluster whose nodes were set up without it. Yields once every worker is registered
    and the dashboard and the Ray client server answer; stops the Ray processes on the way out."""
    token = secrets.token_hex(32)
    model = default_model()
    for host in (head, *workers, *clients):
        install_token(host, token)
    for host in (head, *clients):
        install_model(host, model)
    cluster = RayCluster(head, list(workers), token, ports or RayPorts(), dashboard_host or head.ip)
    try:
        start_head(cluster, head_cpus)
        for worker in workers:
            start_worker(cluster, worker, worker_cpus, timeout_s)
        await_nodes(cluster, timeout_s)
        yield cluster
    finally:
        stop_processes(list(cluster.raylets.values()))


def install_token(host: Host, token: str) -> None:
    path = host.home / ".ray" / "auth_token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token)
    path.chmod(0o600)


def default_model() -> Path:
    """This machine's embedded default model (built by `make setup`), as rayeval finds it outside the hosts."""
    from cluster.models.default import default_model_dir

    model = default_model_dir()
    if not (model / "config.json").is_file():
        raise HostSetupError(f"the embedded default model is not at {model}: run `make setup`")
    return model


def install_model(host: Host, model: Path) -> None:
    """The model where rayeval looks in the host's home: hard links where the filesystem allows, else a copy."""
    target = host.home / ".cache" / "rayeval" / "models" / model.name
    target.parent.mkdir(parents=True, exist_ok=True)
    linked = subprocess.run(["cp", "-al", str(model), str(target)], capture_output=True, check=False)
    if linked.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(model, target)


# Token auth on, as `ray start` has it by default; no drain on SIGTERM (up to 30 s by default): the nodes'
# state is in the hosts' own folders and goes with them.
RAYLET_ENV = {"RAY_AUTH_MODE": "token", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


def ray_command(*args: str) -> list[str]:
    return [str(VENV_BIN / "ray"), "start", "--block", "--disable-usage-stats", *args]


def start_raylet(cluster: RayCluster, host: Host, env: Mapping[str, str], argv: list[str]) -> None:
    log = (host.root / "ray-start.log").open("a")
    with log:
        cluster.raylets[host.name] = host.popen(argv, env={**RAYLET_ENV, **env}, stdout=log,
                                                stderr=subprocess.STDOUT)  # fmt: skip


def start_head(cluster: RayCluster, num_cpus: int) -> None:
    """The head as a user is told to start one that serves Ray clients (cluster.head_env)."""
    head, ports = cluster.head, cluster.ports
    start_raylet(cluster, head, CLIENT_SERVER_HEAD_ENV, ray_command(
        "--head", f"--node-ip-address={head.ip}", f"--port={ports.gcs}", f"--num-cpus={num_cpus}",
        f"--dashboard-host={cluster.dashboard_host}", f"--dashboard-port={ports.dashboard}",
        "--include-dashboard=true", f"--ray-client-server-port={ports.client}",
    ))  # fmt: skip


def start_worker(cluster: RayCluster, worker: Host, num_cpus: int, timeout_s: float) -> None:
    """Once the head's GCS answers from the worker's side of the network, `ray start` joins it there."""
    head_ip, port = cluster.head.ip, str(cluster.ports.gcs)
    reached = worker.run([PYTHON, "-m", "tests.separate_hosts", "port", head_ip, port, str(timeout_s)],
                         timeout=timeout_s + 30)  # fmt: skip
    if reached.returncode != 0:
        raise HostSetupError(f"{worker.name} did not reach the head's GCS at {head_ip}:{port}: "
                             f"{reached.stderr.strip()}\n{log_tails(cluster.hosts)}")  # fmt: skip
    start_raylet(cluster, worker, {}, ray_command(
        f"--address={cluster.gcs_address}", f"--node-ip-address={worker.ip}", f"--num-cpus={num_cpus}",
    ))  # fmt: skip


def await_nodes(cluster: RayCluster, timeout_s: float) -> None:
    """Wait, in the head host, until every node is alive in the GCS and the dashboard and client ports answer."""
    ports = f"{cluster.ports.dashboard},{cluster.ports.client}"
    argv = [PYTHON, "-m", "tests.separate_hosts", "nodes", cluster.gcs_address, ports, str(timeout_s),
            *(host.ip for host in cluster.hosts)]  # fmt: skip
    done = cluster.head.run(argv, env={"RAY_AUTH_MODE": "token"}, timeout=timeout_s + 60)
    if done.returncode != 0:
        exited = {name: p.returncode for name, p in cluster.raylets.items() if p.poll() is not None}
        raise HostSetupError(
            f"the Ray cluster on the separate hosts did not come up within {timeout_s:g} s "
            f"(ray start exited: {exited or 'none'}): {done.stderr.strip()[-2000:]}\n"
            f"{log_tails(cluster.hosts)}"
        )


def log_tails(hosts: Iterable[Host], lines: int = 15) -> str:
    """The last lines of `ray start`'s output and of Ray's main logs on each host."""
    parts = []
    for host in hosts:
        logs = host.ray_log_dir()
        files = [host.root / "ray-start.log", *((logs / name for name in RAY_LOGS) if logs else ())]
        for file in files:
            if file.is_file():
                tail = "\n".join(file.read_text(errors="replace").splitlines()[-lines:])
                parts.append(f"--- {host.name}: {file} ---\n{tail}")
    return "\n".join(parts)


# ---- the tests' fixture ----------------------------------------------------------------------------------


@dataclass
class SeparateCluster:
    """Hosts by name with Ray across some of them: `head`, `worker` (the first worker) and `laptop` (a client
    machine outside the cluster) name the fixture's."""

    hosts: dict[str, Host]
    ray: RayCluster

    @property
    def head(self) -> Host:
        return self.ray.head

    @property
    def worker(self) -> Host:
        return self.ray.workers[0]

    @property
    def laptop(self) -> Host:
        return self.hosts["laptop"]

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]


FIXTURE_HOSTS = (HostSpec("head", {0}), HostSpec("worker", {1}), HostSpec("laptop", {0, 1}))


@contextlib.contextmanager
def separate_cluster(
    base_dir: Path,
    specs: Sequence[HostSpec] = FIXTURE_HOSTS,
    workers: Sequence[str] = ("worker",),
    **ray_args: Any,
) -> Iterator[SeparateCluster]:
    """The first of `specs` is the head, those named in `workers` join it, the others are clients (with the
    token and the model, outside the cluster); `ray_args` go to `ray_cluster`."""
    require_host_tools(specs)
    with separate_hosts(specs, base_dir) as hosts:
        head = hosts[specs[0].name]
        joined = [hosts[name] for name in workers]
        clients = [host for name, host in hosts.items() if name != head.name and name not in workers]
        with ray_cluster(head, joined, clients=clients, **ray_args) as ray_on_hosts:
            yield SeparateCluster(hosts, ray_on_hosts)


# ---- run inside a host: wait for Ray -----------------------------------------------------------------------


def await_port(address: str, port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(1)
            if sock.connect_ex((address, port)) == 0:
                return True
        time.sleep(0.2)
    return False


def await_registered(gcs_address: str, ports: list[int], ips: set[str], deadline: float) -> str | None:
    """None once Ray's GCS lists every one of `ips` alive and the head's `ports` answer; else what is missing."""
    head_ip, gcs_port = gcs_address.rsplit(":", 1)
    if not await_port(head_ip, int(gcs_port), deadline):
        return f"the GCS at {gcs_address} does not answer"
    import ray

    ray.init(address=gcs_address, logging_level="WARNING", log_to_driver=False)
    alive: set[str] = set()
    while time.monotonic() < deadline:
        alive = {node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
        if ips <= alive:
            break
        time.sleep(0.5)
    else:
        return f"nodes alive: {sorted(alive)}, waiting for {sorted(ips - alive)}"
    silent = [port for port in ports if not await_port(head_ip, port, deadline)]
    return f"the head's ports {silent} do not answer" if silent else None


def main(argv: list[str]) -> int:
    """`port ADDRESS PORT TIMEOUT` or `nodes GCS_ADDRESS PORT,PORT TIMEOUT IP...`: exit 0 once there."""
    if argv[0] == "port":
        deadline = time.monotonic() + float(argv[3])
        if await_port(argv[1], int(argv[2]), deadline):
            return 0
        print(f"{argv[1]}:{argv[2]} does not answer", file=sys.stderr)
        return 1
    gcs_address, ports, timeout, *ips = argv[1:]
    missing = await_registered(gcs_address, [int(p) for p in ports.split(",")], set(ips),
                               time.monotonic() + float(timeout))  # fmt: skip
    if missing is not None:
        print(missing, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
