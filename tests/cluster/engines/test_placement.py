"""Where a replica's workers go: one node when one holds it all (vLLM's mp executor), else one GPU bundle per
worker over nodes (vLLM's Ray executor); CPU replicas only ever on one node. Plain Python, no cluster."""

from __future__ import annotations

from cluster.engines import ExecutorKind, ReplicaPlan

TP2_GPU = ReplicaPlan({"CPU": 1.0, "GPU": 2.0}, workers=2)
ONE_GPU_NODE = {"CPU": 8.0, "GPU": 1.0}


def test_a_node_that_holds_the_replica_gets_it_whole():
    layout = TP2_GPU.layout_for([ONE_GPU_NODE, {"CPU": 8.0, "GPU": 2.0}])
    assert layout is not None
    assert layout.bundles == ({"CPU": 1.0, "GPU": 2.0},)
    assert (layout.strategy, layout.executor) == ("STRICT_PACK", ExecutorKind.MP)


def test_gpu_nodes_too_small_alone_share_the_replica_with_the_ray_executor():
    layout = TP2_GPU.layout_for([{"CPU": 2.0}, ONE_GPU_NODE, ONE_GPU_NODE])
    assert layout is not None
    assert layout.bundles == ({"CPU": 1.0, "GPU": 1.0}, {"GPU": 1.0})
    assert (layout.strategy, layout.executor) == ("PACK", ExecutorKind.RAY)
    assert "packed, then spread over nodes (executor: ray)" in layout.describe()


def test_too_few_gpus_in_all_or_no_node_for_the_engine_is_no_layout():
    assert TP2_GPU.layout_for([ONE_GPU_NODE]) is None
    assert TP2_GPU.layout_for([{"GPU": 1.0}, {"GPU": 1.0}]) is None  # no node has the engine's CPU too


def test_cpu_replicas_never_span_nodes():
    tp2_cpu = ReplicaPlan({"CPU": 2.0}, workers=2)
    assert tp2_cpu.over_nodes() is None
    assert tp2_cpu.layout_for([{"CPU": 1.0}, {"CPU": 1.0}]) is None
    one = tp2_cpu.layout_for([{"CPU": 4.0}])
    assert one is not None and one.executor is ExecutorKind.MP


def test_one_worker_runs_in_the_engine_process():
    layout = ReplicaPlan({"CPU": 1.0, "GPU": 1.0}, workers=1).layout_for([ONE_GPU_NODE])
    assert layout is not None and layout.executor is ExecutorKind.SINGLE
