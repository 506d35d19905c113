"""The local Ray cluster a run starts: it starts no idle workers (an actor gets its worker on demand), and it
is stopped at the end with nothing left behind, its autoscaler monitor (which has nothing to scale on a fixed
local cluster) stopped first so that Ray's shutdown does not wait out the monitor's grace period; its driver's
serialization context is built without pyarrow, and Arrow data still travels. A real local cluster, no engine.
Joining a cluster (`cluster.connect`): the address it needs, a Ray client session start that fails and is
tried again, and one that hangs, named with the head's fix."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray

import cluster
from cluster import session
from cluster.engines import ReplicaPlan
from cluster.errors import ClusterError
from cluster.session import _stop_autoscaler_monitor, ray_session
from tests.warm_cluster import shared_pids


def _ray_children() -> list[str]:
    """This process's Ray descendants, less the test run's shared cluster (tests/warm_cluster.py) and its
    S3 server (tests/object_store.py: its command line names the bucket rayeval-test)."""
    found = []
    shared = shared_pids()
    for child in psutil.Process().children(recursive=True):
        if child.pid in shared:
            continue
        try:
            command = child.cmdline()
        except psutil.Error:
            continue
        if command and Path(command[0]).name != "weed":
            found.append(" ".join(command))
    return [c for c in found if "ray" in c]


def _live_children(matches: Callable[[psutil.Process], bool], recursive: bool) -> list[psutil.Process]:
    """This process's children (all descendants where `recursive`) that are not zombies and that `matches`."""
    found = []
    for child in psutil.Process().children(recursive=recursive):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and matches(child):
                found.append(child)
        except psutil.Error:  # it exited meanwhile
            continue
    return found


def _running_monitors() -> list[psutil.Process]:
    def is_monitor(child: psutil.Process) -> bool:
        return any(part.endswith("autoscaler/_private/monitor.py") for part in child.cmdline())

    return _live_children(is_monitor, recursive=False)


def _idle_workers() -> list[psutil.Process]:
    return _live_children(lambda child: child.name().startswith("ray::IDLE"), recursive=True)


def test_a_local_session_stops_its_cluster_monitor_first_and_leaves_no_process():
    with ray_session(None, ReplicaPlan({"CPU": 1}, 1), 1, verbose=False):
        assert ray.is_initialized()
        assert len(_running_monitors()) == 1
        _stop_autoscaler_monitor()  # what the session's end does before ray.shutdown()
        deadline = time.time() + 5
        while _running_monitors() and time.time() < deadline:
            time.sleep(0.05)
        assert _running_monitors() == []
        assert ray.cluster_resources()["CPU"] >= 1  # the cluster itself goes on without it
        began = time.perf_counter()
    stop_s = time.perf_counter() - began
    assert not ray.is_initialized()
    deadline = time.time() + 10
    while _ray_children() and time.time() < deadline:
        time.sleep(0.2)
    assert _ray_children() == []
    print(f"local Ray cluster stopped in {stop_s:.2f} s")  # Ray waits 1 s more when the monitor is left to it


def test_a_local_session_starts_no_idle_workers_and_an_actor_gets_one_on_demand():
    @ray.remote(num_cpus=1)
    class Echo:
        def pid(self) -> int:
            import os

            return os.getpid()

    with ray_session(None, ReplicaPlan({"CPU": 1}, 1), 1, verbose=False):
        time.sleep(2)  # Ray's prestart, were it on, would have one worker per logical CPU running by now
        assert _idle_workers() == []
        actor = Echo.remote()
        worker_pid = ray.get(actor.pid.remote(), timeout=60)
        assert psutil.pid_exists(worker_pid)
        ray.kill(actor)


def test_a_runs_session_does_not_import_pyarrow_and_a_table_still_travels_through_ray():
    """Ray imports pyarrow where it builds a driver's serialization context (0.35 s on the H200 machine, on a
    warm run's way to its first request); a run's session builds it with pyarrow hidden. pyarrow then imports
    as usual, and a table put into Ray comes back equal (pickled, as any object without Ray's serializer).
    Its own process: the test run's has imported pyarrow already."""
    script = (
        "import sys, ray\n"
        "from cluster.engines import ReplicaPlan\n"
        "from cluster.session import ray_session\n"
        "with ray_session(None, ReplicaPlan({'CPU': 1}, 1), 1, verbose=False):\n"
        "    back = ray.get(ray.put([1, 2]))\n"
        "    print(back, 'pyarrow' in sys.modules)\n"
        "    import pyarrow\n"
        "    table = pyarrow.table({'x': [1, 2, 3]})\n"
        "    print(ray.get(ray.put(table)).equals(table))\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=root,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[1,", "2]", "False", "True"], done.stdout


def test_connect_without_an_address_names_both_ways_to_give_one(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(
        ClusterError, match=r"cluster.connect\('ray://HEAD:10001'\).*--address ray://HEAD:10001"
    ):
        cluster.connect()


def test_connect_tries_a_ray_client_session_again_when_its_server_fails_to_start(
    monkeypatch: pytest.MonkeyPatch,
):
    """Ray's client proxy at times loses the session's server as it forks it (ray-project/ray#63202), which
    cannot be caused on demand: a stand-in for `ray.init` raises Ray's message for it a set number of times."""
    calls: list[str] = []
    failures = {"left": 2}

    def flaky_init(address: str, **_: object) -> None:
        calls.append(address)
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionAbortedError("Initialization failure from server:\npsutil.ZombieProcess ...")

    monkeypatch.setattr("cluster.session.ray.init", flaky_init)
    monkeypatch.setattr("cluster.session.ray.is_initialized", lambda: False)
    monkeypatch.setattr("cluster.session.check_address_reachable", lambda address: None)  # no host "head"
    monkeypatch.setattr("cluster.session.time.sleep", lambda _s: None)
    assert cluster.connect("ray://head:10001") is True
    assert calls == ["ray://head:10001"] * 3  # two failed starts, then the session

    calls.clear()
    failures["left"] = 3
    with pytest.raises(
        ClusterError, match="Could not connect to the Ray cluster at ray://head:10001"
    ) as raised:
        cluster.connect("ray://head:10001")
    assert len(calls) == 3  # three tries, then the error names the address, what to check and the head's fix
    assert "may have lost the session's server as it forked it, 3 times" in str(raised.value)
    assert "GRPC_ENABLE_FORK_SUPPORT=false" in str(raised.value)


def test_a_ray_client_session_that_does_not_start_is_named_with_the_heads_fix(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """Ray's client server at times hangs for good as it forks a session's server (ray-project/ray#63202, on a
    head started without cluster.head_env's variables), which cannot be caused on demand: a stand-in for
    `ray.init` returns only once the warning (its time shortened to 0.5 s) is out, as long as that takes."""
    monkeypatch.setattr("cluster.session.CLIENT_START_WARNING_S", 0.5)
    monkeypatch.setattr("cluster.session.ray.is_initialized", lambda: False)
    monkeypatch.setattr("cluster.session.check_address_reachable", lambda address: None)  # no host "head"
    warned = threading.Event()
    warn = session._warn_slow_client_start
    monkeypatch.setattr("cluster.session._warn_slow_client_start", lambda *args: (warn(*args), warned.set()))
    timers: list[threading.Timer] = []

    class RecordedTimer(threading.Timer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            timers.append(self)

    monkeypatch.setattr("cluster.session.threading.Timer", RecordedTimer)
    monkeypatch.setattr("cluster.session.ray.init", lambda address, **_: warned.wait(60))
    with caplog.at_level(logging.WARNING, logger="cluster.session"):
        assert cluster.connect("ray://head:10001") is True
    assert warned.is_set()
    [message] = [record.getMessage() for record in caplog.records if record.name == "cluster.session"]
    assert "The Ray client session at ray://head:10001 has not started after 0 s" in message
    assert "GRPC_ENABLE_FORK_SUPPORT=false" in message and "docs/CLUSTERS.md" in message

    caplog.clear()
    monkeypatch.setattr("cluster.session.ray.init", lambda address, **_: None)
    with caplog.at_level(logging.WARNING, logger="cluster.session"):
        # a session that starts in time: its timer cancelled
        assert cluster.connect("ray://head:10001") is True
        assert timers[-1].finished.is_set() and len(timers) == 2
        assert cluster.connect("head:6379") is True  # not Ray client's address: no timer at all
    assert len(timers) == 2
    assert not [record for record in caplog.records if record.name == "cluster.session"]


def test_a_dry_run_on_a_cluster_plans_on_the_clusters_device_not_the_laptops():
    """`--dry-run --address` joins the cluster to learn its device, as the run would: a cluster whose head
    declares a GPU (a stand-in: Ray schedules by the declared count, and no engine starts in a dry run) gets
    GPU replicas, though this machine has none."""
    from tests.ray_head import start_head
    from tests.runs import rayeval

    head = start_head(num_cpus=1, num_gpus=1)
    try:
        planned = rayeval("run", "--tasks", "ifeval", "--address", head.gcs_address, "--dry-run",
                          env=head.client_env(), local=True)  # fmt: skip
    finally:
        head.stop()
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "replicas  1 x {1 CPU, 1 GPU} for 1 engine worker(s) on gpu" in planned.stdout


def test_an_address_where_nothing_answers_fails_within_seconds_for_every_command(capsys):
    """Ray retries a GCS or Ray-client address where nothing listens for a minute or more; every command that
    joins a cluster (pools, down, attach, jobs by GCS address, a dry run) asks first, for seconds."""
    import time

    from cluster.cli import main

    for argv in (["pools"], ["down", "p"], ["attach", "r1"], ["jobs", "list"], ["run", "--dry-run"]):
        address = "ray://127.0.0.1:1" if argv[0] == "attach" else "127.0.0.1:1"
        started = time.monotonic()
        assert main([*argv, "--address", address]) == 2, argv
        assert "nothing answers at 127.0.0.1:1" in capsys.readouterr().err, argv
        assert time.monotonic() - started < 10, argv
