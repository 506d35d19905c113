"""CPU thread binding of engine replicas (pure arithmetic; no engine starts)."""

from __future__ import annotations

from cluster.pool import cpu_thread_binding


def test_replicas_sharing_a_node_get_disjoint_cores():
    assert cpu_thread_binding(0, 1, 1, 2) == "0,1"
    assert [cpu_thread_binding(i, 2, 1, 2) for i in range(2)] == ["0", "1"]
    assert cpu_thread_binding(0, 1, 3, 2) == "0|1|0"  # a TP=3 replica on two cores shares them round-robin


def test_the_cores_this_process_may_use_are_respected():
    # `taskset -c 4-7 rayeval run ...`: the replicas bind inside the allowed set, never to cores 0-3
    assert [cpu_thread_binding(i, 2, 1, [4, 5, 6, 7]) for i in range(2)] == ["4,5", "6,7"]
    assert cpu_thread_binding(0, 1, 1, [1]) == "1"
