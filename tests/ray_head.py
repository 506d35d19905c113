"""A real `ray start --head` cluster for the tests of the ways users reach a cluster from outside it (Ray Jobs,
Ray client): its own ports, temp dir and auth token, token authentication on, the dashboard running."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cluster.cli.front_paths import SOCKET_DIR_ENV
from cluster.head_env import CLIENT_SERVER_HEAD_ENV
from tests.ports import free_ports
from tests.runs import ray_cli


def is_engine_actor(pid: int) -> bool:
    """A live engine actor's worker process: Ray titles it `ray::EngineActor...`."""
    import psutil

    try:
        process = psutil.Process(pid)
        return " ".join(process.cmdline()).startswith("ray::EngineActor") and (
            process.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


@dataclass
class HeadNode:
    process: subprocess.Popen[str]
    temp_dir: Path
    token_path: Path
    gcs_port: int
    dashboard_port: int
    client_port: int
    base_env: dict[str, str] | None = None  # the environment its clients start from (default: this process's)

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def client_address(self) -> str:
        return f"ray://127.0.0.1:{self.client_port}"

    def client_env(self) -> dict[str, str]:
        """What a user's machine has: the cluster's token in a file, and no RAY_AUTH_MODE (rayeval sets it), nor
        pytest's name of the test running (which differs from test to test, where a user's shell stays the same,
        so that the runs of the tests match `rayeval up`'s warm CLI server, cluster.cli.front_server)."""
        env = {
            k: v
            for k, v in (self.base_env if self.base_env is not None else os.environ).items()
            if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "RAY_API")) and k != "PYTEST_CURRENT_TEST"
        }
        # the warm CLI server that `rayeval up` starts for this cluster's runs: one per test cluster, gone with it
        return {
            **env,
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            SOCKET_DIR_ENV: str(self.temp_dir / "cli"),
        }

    def pids(self) -> set[int]:
        """Every live process of this cluster: the head's descendants (raylet, workers, engines and their
        cores), and what a daemon left its parent for, still in the head's process group."""
        import psutil

        found = set()
        try:
            found = {p.pid for p in psutil.Process(self.process.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == self.process.pid:
                    found.add(process.pid)
            except (ProcessLookupError, psutil.Error):
                continue
        return found

    def engine_actor_pids(self) -> list[int]:
        """The live engine actors of this cluster, by the pid of their worker process (titled
        `ray::EngineActor...`), sorted."""
        return sorted(pid for pid in self.pids() if is_engine_actor(pid))

    def engine_core_pids(self) -> list[int]:
        """The live vLLM engine cores of this cluster (the kernel's name for them is `VLLM::EngineCor`), sorted."""
        found = []
        for pid in self.pids():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::EngineCor"):
                    found.append(pid)
        return sorted(found)

    def placement_groups(self) -> list[dict]:
        """Every placement group of this cluster that is not removed (name, state), from Ray's state API on
        its dashboard, read by a process that does not join the cluster."""
        read = (
            "import json, sys\n"
            "from ray.util.state import list_placement_groups\n"
            "found = list_placement_groups(address=sys.argv[1], detail=True, limit=10000)\n"
            "print(json.dumps([{'name': g.name, 'state': g.state} for g in found if g.state != 'REMOVED']))\n"
        )
        done = subprocess.run([sys.executable, "-c", read, self.dashboard], capture_output=True, text=True,
                              env={**self.client_env(), "RAY_AUTH_MODE": "token"}, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        """`ray start --block` stops what it started on SIGTERM; the process group catches any straggler."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_head(
    num_cpus: int = 2,
    timeout_s: float = 90,
    env: dict[str, str] | None = None,
    base_env: dict[str, str] | None = None,
    client_server_env: Mapping[str, str] = CLIENT_SERVER_HEAD_ENV,
    num_gpus: int = 0,
) -> HeadNode:
    """A `ray start --head` cluster with token auth; `env`: more of the node's own environment (what its
    workers and actors inherit, such as a store's credentials); `base_env`: what `client_env` starts from;
    `client_server_env`: what users are told to start a head that serves Ray clients with (cluster.head_env);
    `num_gpus`: GPUs the head declares (Ray schedules by the count; none need be there)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))  # short: Ray's socket paths are length-limited
    token_path = temp_dir / "auth_token"
    token_path.write_text(secrets.token_hex(32))
    gcs, dashboard, client, agent = free_ports(4)
    bin_dir = str(
        Path(sys.executable).parent
    )  # the job's `rayeval` is this environment's, as on a cluster node
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",  # a test cluster has nothing to drain on its stop
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        **client_server_env,
        **(env or {}),
    }
    command = [
        ray_cli(), "start", "--head", "--block", f"--port={gcs}", f"--dashboard-port={dashboard}",
        "--dashboard-host=127.0.0.1", f"--ray-client-server-port={client}", f"--num-cpus={num_cpus}",
        f"--num-gpus={num_gpus}",
        f"--temp-dir={temp_dir}", "--disable-usage-stats", "--include-dashboard=true",
        # the dashboard agent's HTTP port (Ray's default 52365 is fixed): the job server needs that agent, and
        # the test run's shared cluster (tests/warm_cluster.py) holds the default while other heads start
        f"--dashboard-agent-listen-port={agent}",
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True, text=True)  # fmt: skip
    head = HeadNode(process, temp_dir, token_path, gcs, dashboard, client, base_env)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert process.poll() is None, f"ray start --head exited with {process.returncode}"
        if _serves_jobs(head.dashboard) and _answers(client):
            return head
        time.sleep(0.5)
    head.stop()
    raise AssertionError(f"the head node's dashboard ({dashboard}) did not answer within {timeout_s:g} s")


def _serves_jobs(dashboard: str) -> bool:
    """The job server is up once its API answers at all (401 without a token is an answer)."""
    try:
        urllib.request.urlopen(f"{dashboard}/api/jobs/", timeout=2)  # noqa: S310 - a local test cluster
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0
