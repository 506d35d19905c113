"""The local Ray cluster a run starts: it is stopped at the end with nothing left behind, its autoscaler
monitor (which has nothing to scale on a fixed local cluster) stopped first so that Ray's shutdown does not
wait out the monitor's grace period. A real local cluster, no engine."""

from __future__ import annotations

import time

import psutil
import ray

from cluster.plan import ReplicaPlan
from cluster.session import _stop_autoscaler_monitor, ray_session


def _ray_children() -> list[str]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            found.append(" ".join(child.cmdline()))
        except psutil.Error:
            continue
    return [c for c in found if "ray" in c]


def _running_monitors() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and any(
                part.endswith("autoscaler/_private/monitor.py") for part in child.cmdline()
            ):
                found.append(child)
        except psutil.Error:
            continue
    return found


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
