"""CPU thread binding of engine replicas, and the engine cores of GPU replicas pinned to cores of their own
(arithmetic, and real child processes; no engine starts)."""

from __future__ import annotations

import os
import subprocess

from cluster.engines import cpu_thread_binding, engine_core_cpus, pin_descendants, single_worker_omp_env


def test_replicas_sharing_a_node_get_disjoint_cores():
    assert cpu_thread_binding(0, 1, 1, 2) == "0,1"
    assert [cpu_thread_binding(i, 2, 1, 2) for i in range(2)] == ["0", "1"]
    assert cpu_thread_binding(0, 1, 3, 2) == "0|1|0"  # a TP=3 replica on two cores shares them round-robin


def test_a_one_worker_replicas_engine_core_gets_the_openmp_environment_of_its_cores():
    # the worker runs inside the engine core, which inherits these from the actor (vLLM's mp executor would
    # set the same for a worker process of its own)
    assert single_worker_omp_env("0,1") == {
        "OMP_NUM_THREADS": "2",
        "OMP_PLACES": "{0,1}",
        "OMP_PROC_BIND": "true",
    }
    assert single_worker_omp_env("6")["OMP_NUM_THREADS"] == "1"


def test_the_cores_this_process_may_use_are_respected():
    # `taskset -c 4-7 rayeval run ...`: the replicas bind inside the allowed set, never to cores 0-3
    assert [cpu_thread_binding(i, 2, 1, [4, 5, 6, 7]) for i in range(2)] == ["4,5", "6,7"]
    assert cpu_thread_binding(0, 1, 1, [1]) == "1"


def test_gpu_replicas_engine_cores_get_cores_of_their_own_from_the_top():
    cpus = list(range(32))
    assert [engine_core_cpus(i, 2, cpus) for i in range(2)] == [[30, 31], [28, 29]]
    assert engine_core_cpus(0, 1, [4, 5, 6, 7]) == [6, 7]  # inside what `taskset` allows
    assert [engine_core_cpus(i, 3, [0, 1, 2, 3]) for i in range(3)] == [[3], [2], [1]]  # one each when short
    assert engine_core_cpus(0, 3, [0, 1]) == []  # fewer cores than replicas: none is pinned


def test_pinning_moves_every_thread_of_the_named_child_process_and_no_other():
    # real processes: a `sleep` child to pin, and a `cat` child beside it that must keep its CPUs
    allowed = sorted(os.sched_getaffinity(0))
    target = [allowed[-1]]
    sleeper = subprocess.Popen(["sleep", "30"])
    other = subprocess.Popen(["cat"], stdin=subprocess.PIPE)
    try:
        assert pin_descendants(os.getpid(), target, name_prefix="sleep") == [sleeper.pid]
        assert os.sched_getaffinity(sleeper.pid) == set(target)
        assert os.sched_getaffinity(other.pid) == set(allowed)
    finally:
        sleeper.kill()
        other.kill()
        sleeper.wait()
        other.wait()
