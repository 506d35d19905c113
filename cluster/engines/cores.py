"""Which cores a CPU replica's engine threads use, decided on the replica's own node.

A Ray cluster's nodes are other machines: the driver's cores say nothing about them (a node with fewer cores
has not got the driver's core ids; one with more would sit idle). So the pool only tells each engine actor
which of its node's CPU replicas it is (`ENGINE_CORE_SLOT_ENV`, "index/count"), and the actor binds its
engine's threads among the cores its own process may use (`os.sched_getaffinity`: a cpuset, a container's
limit, `taskset`), before vLLM reads the environment.
"""

from __future__ import annotations

import os

# "index/count": which of the node's replicas this actor is, set by the pool (cores and GPU engine-core pins)
ENGINE_CORE_SLOT_ENV = "RAYEVAL_ENGINE_CORE_SLOT"
BINDING_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_thread_binding(local_index: int, local_count: int, workers: int, cores: int | list[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for one CPU replica: its own cores, one core list per worker rank.

    Replicas sharing a node get disjoint cores while there are enough; with fewer cores than workers the
    ranks share cores round-robin (`0|1|0` runs a TP=3 replica on two cores). `cores` is a count (cores
    0..n-1) or the ids of the cores this process may use (`taskset -c 2,3 rayeval run` binds to 2 and 3).
    """
    ids = list(range(cores)) if isinstance(cores, int) else sorted(cores)
    count = len(ids)
    per_replica = max(1, count // max(1, local_count))
    first = (local_index * per_replica) % count
    mine = [ids[(first + i) % count] for i in range(per_replica)]
    if len(mine) >= workers:
        per_worker = len(mine) // workers
        groups = [mine[i * per_worker : (i + 1) * per_worker] for i in range(workers)]
    else:
        groups = [[mine[i % len(mine)]] for i in range(workers)]
    return "|".join(",".join(str(c) for c in group) for group in groups)


def single_worker_omp_env(binding: str) -> dict[str, str]:
    """The OpenMP environment of a one-worker CPU replica's engine core, where its worker runs (the actor's
    `_engine_config`): what vLLM's multiprocessing executor sets for a worker process of its own (thread count,
    the cores as one place, threads bound to it), set here because the engine core inherits the actor's
    environment. Without it a Ray worker's OMP_NUM_THREADS (Ray sets it from the actor's CPUs) would hold."""
    cores = binding.split(",")
    return {"OMP_NUM_THREADS": str(len(cores)), "OMP_PLACES": "{" + binding + "}", "OMP_PROC_BIND": "true"}


def replica_slot() -> tuple[int, int]:
    """(index, count) of this replica among its node's replicas, as the pool set it; (0, 1) when unset."""
    index, _, count = os.environ.get(ENGINE_CORE_SLOT_ENV, "0/1").partition("/")
    try:
        return int(index), max(1, int(count))
    except ValueError:
        return 0, 1


def bind_this_node(workers: int) -> dict[str, str]:
    """The CPU engine's thread binding among the cores this process may use on this node, set into this
    process's environment (the engine core and its workers inherit it); returns what was set."""
    index, count = replica_slot()
    binding = cpu_thread_binding(index, count, workers, sorted(os.sched_getaffinity(0)))
    env = {BINDING_ENV: binding}
    if workers == 1:
        env |= single_worker_omp_env(binding)
    os.environ.update(env)
    return env
