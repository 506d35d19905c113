"""Connecting to Ray: an existing cluster (`--address`) or a local one that rayeval starts and stops."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from cluster.plan import ReplicaPlan

log = logging.getLogger(__name__)


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
        ray.init(address=address, log_to_driver=verbose, logging_level=logging.WARNING)
        log.info("connected to Ray cluster at %s", address)
    else:
        cpus = local_cpus(plan, replicas)
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=verbose, logging_level=logging.WARNING)
        log.info("started a local Ray cluster with %d logical CPUs", cpus)
    try:
        yield
    finally:
        ray.shutdown()


def cluster_has_gpus() -> bool:
    return ray.cluster_resources().get("GPU", 0) > 0
