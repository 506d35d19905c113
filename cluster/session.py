"""Connecting to Ray: an existing cluster (`--address`) or a local one that rayeval starts and stops."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import ray
from ray.exceptions import AuthenticationError

from cluster import timeline
from cluster.addresses import check_address_reachable
from cluster.engines import ReplicaPlan
from cluster.errors import ClusterError, first_line
from cluster.head_env import head_env_assignments
from cluster.jobs.auth import TOKEN_HELP, enable_token_auth

if TYPE_CHECKING:
    from cluster.plan import RunPlan

log = logging.getLogger(__name__)

# A Ray client session that has not started after this long is named in a warning with the head's fix (a
# healthy one started in 3 to 9 s on a 2-core VM, busy or not; a hung one waits for good, with no timeout).
CLIENT_START_WARNING_S = 60.0


def local_cpus(plan: ReplicaPlan, replicas: int) -> int:
    """Logical CPUs for a local cluster: at least the cores, and enough for every replica's bundle.

    Ray's CPU count is a scheduling unit, not a core; engine threads are pinned separately
    (VLLM_CPU_OMP_THREADS_BIND), so a 2-core machine can host two replicas that each ask for one unit
    while the coordinator, which lives in the driver, asks for none.
    """
    needed = int(-(-plan.bundle.get("CPU", 0) * replicas // 1))
    return max(os.cpu_count() or 1, needed)


@contextmanager
def ray_session(address: str | None, plan: ReplicaPlan, replicas: int, verbose: bool) -> Iterator[None]:
    if ray.is_initialized():  # a notebook or Ray client session the caller already opened
        yield
        return
    if address:
        _connect(address, verbose)
        log.info("connected to Ray cluster at %s", address)
    else:
        cpus = local_cpus(plan, replicas)
        # address="local": always a new cluster; without it Ray joins the last `ray start` cluster on this machine
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            log_to_driver=verbose,
            logging_level=logging.WARNING,
            # Ray would start one idle worker per logical CPU and hold ray.init until they run; the run's actors
            # get theirs on demand, and on a small machine those idle interpreters slow the engines' start.
            _system_config={"prestart_worker_first_driver": False},
        )
        log.info("started a local Ray cluster with %d logical CPUs", cpus)
    _serialization_without_arrow()
    timeline.mark("ray started")
    try:
        yield
    finally:
        if not address:
            _stop_autoscaler_monitor()
        ray.shutdown()
        timeline.mark("ray stopped")


def _serialization_without_arrow() -> None:
    """Build this driver's Ray serialization context now, with pyarrow hidden from it.

    Ray builds the context at the driver's first call that serializes, and imports pyarrow there to register
    Ray Data's Arrow serializers: on a warm pool that is the pool's adoption, on the way to the first request
    (pyarrow's import 0.07 s on the 2-core VM, 0.35 s on the H200 machine, docs/BENCHMARKS.md). A run's
    driver sends no Arrow data through Ray (requests and completions are plain objects) and imports pyarrow
    for its files beside generation (run.records), so this session, which ends with its run, lacks nothing.
    Sessions that outlive a run (`connect()`, a notebook's) keep Ray's serializers: this runs in
    `ray_session` only. A `None` in sys.modules makes `import pyarrow` raise ModuleNotFoundError, which Ray
    reads as "pyarrow not installed"; it is removed right after, so the next import loads pyarrow."""
    if "pyarrow" in sys.modules or ray.util.client.ray.is_connected():
        return
    sys.modules["pyarrow"] = None  # type: ignore[assignment]
    try:
        ray.put(None)  # the first serialization builds the context
    finally:
        del sys.modules["pyarrow"]


def _stop_autoscaler_monitor() -> None:
    """Stop the local cluster's autoscaler monitor before `ray.shutdown()`. Ray stops it after the GCS, and
    its SIGTERM handler then reports to the stopped GCS until Ray's one-second grace ends: one second of
    every local run's end. A fixed local cluster has nothing for it to scale or save, so it is killed."""
    import signal

    import psutil

    for child in psutil.Process().children():
        try:
            if any(part.endswith("autoscaler/_private/monitor.py") for part in child.cmdline()):
                child.send_signal(signal.SIGKILL)
        except psutil.Error:  # it exited meanwhile
            continue


def connect(address: str | None = None, *, verbose: bool = False) -> bool:
    """Join an existing cluster at `address` (else $RAY_ADDRESS) and leave the session open, as
    `ray.init(address)` would, done the way rayeval's own commands connect: Ray's auth token is taken from
    where Ray keeps it (no RAY_AUTH_MODE to export) and a Ray client session whose start fails is tried
    again. Returns whether a session was opened (False: one was already open, and it is kept)."""
    if ray.is_initialized():
        return False
    target = address or os.environ.get("RAY_ADDRESS")
    if not target:
        raise ClusterError(
            "No Ray cluster to reach: call cluster.connect('ray://HEAD:10001') first, or give the address "
            "(--address ray://HEAD:10001)."
        )
    _connect(target, verbose)
    return True


@contextmanager
def joined_session(address: str | None, verbose: bool = False) -> Iterator[None]:
    """An open Ray session, or one joined at `address` (else $RAY_ADDRESS) for the block and left after."""
    if not connect(address, verbose=verbose):
        yield
        return
    try:
        yield
    finally:
        ray.shutdown()


def _connect(address: str, verbose: bool, attempts: int = 3, pause_s: float = 5.0) -> None:
    """Join an existing cluster, with Ray's token when one is at hand. A Ray client connection is tried up
    to three times, seconds apart: the client server of a head started without cluster.head_env's variables at
    times fails to start the session's own server ("Initialization failure from server": that server dies as
    it is forked, ray-project/ray#63202) and succeeds on a later try; the final error names the head's fix."""
    check_address_reachable(address)  # Ray would retry an address where nothing answers for minutes
    token = enable_token_auth()
    if token:
        log.info("using the Ray auth token from %s", token)
    for attempt in range(1, attempts + 1):
        try:
            with _warned_if_slow(address, CLIENT_START_WARNING_S):
                ray.init(address=address, log_to_driver=verbose, logging_level=logging.WARNING)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises several types here; the user needs one message
            server_lost = address.startswith("ray://") and "Initialization failure" in str(exc)
            if server_lost and attempt < attempts:
                log.info("Ray client session did not start (%s); trying again", first_line(exc))
                time.sleep(pause_s)
                continue
            auth = isinstance(exc, AuthenticationError) or "authentication" in str(exc).lower()
            raise ClusterError(
                f"Could not connect to the Ray cluster at {address} ({first_line(exc)}). Check the address "
                "(host:port of the head's GCS, `auto` on a cluster node, or ray://head:10001 for Ray client) and "
                "that `ray start --head` is running there (for `rayeval run`, leaving --address out starts a local "
                "cluster instead)."
                + (f" {TOKEN_HELP}" if auth else "")
                + (
                    f" The head's Ray client server may have lost the session's server as it forked it, {attempts} "
                    f"times (ray-project/ray#63202): where its `ray start` ran without {head_env_assignments()}, "
                    "start the head with it in its environment (docs/CLUSTERS.md)."
                    if server_lost
                    else ""
                )
            ) from None


@contextmanager
def _warned_if_slow(address: str, after_s: float) -> Iterator[None]:
    """Log a warning with the head's fix if a Ray client session has not started `after_s` seconds into the
    block: Ray's client gives no sign while a session's server hangs as it is forked, it only waits."""
    if not address.startswith("ray://"):
        yield
        return
    timer = threading.Timer(after_s, _warn_slow_client_start, args=(address, after_s))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _warn_slow_client_start(address: str, after_s: float) -> None:
    log.warning(
        "The Ray client session at %s has not started after %.0f s. Ray's client server can hang as it starts "
        "a session's server when the head's `ray start` ran without %s (ray-project/ray#63202): start the "
        "head with it in its environment (docs/CLUSTERS.md), then interrupt this and connect again.",
        address, after_s, head_env_assignments(),
    )  # fmt: skip


def cluster_has_gpus() -> bool:
    return ray.cluster_resources().get("GPU", 0) > 0


def device_from_cluster(plan: RunPlan) -> bool:
    """Whether the plan's device is the cluster's to say: engines (not an endpoint) on a cluster given by
    `--address`, with `--device auto`."""
    config = plan.config
    return bool(config.cluster.address) and config.cluster.device == "auto" and not plan.model.endpoint


def on_the_clusters_device(plan: RunPlan) -> RunPlan:
    """Within a session on the cluster given by `--address` (`--device auto`): the plan on the cluster's
    device (GPU where any node has one), not on what the machine that planned it has."""
    if device_from_cluster(plan):
        return plan.on_device("gpu" if cluster_has_gpus() else "cpu")
    return plan
