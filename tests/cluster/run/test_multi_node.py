"""Replicas over several Ray nodes: a head and two worker nodes, each its own raylet with its own CPUs
(`ray.cluster_utils.Cluster`, real processes on this machine). The replicas land one per worker; a worker
node removed mid-run loses nothing: its in-flight work goes back on the queue, a replacement replica starts
on the node that has room and takes its share, and every sample ends scored exactly once (issue 21)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from tests.runs import ENGINE_FLAGS, MODEL_DIR, records, start_in_background, wait_for_records


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory) -> Iterator[Cluster]:
    """One cluster for the module: the refusal test runs first on it, then the lost-node test removes a node."""
    token = tmp_path_factory.mktemp("three_nodes") / "auth_token"
    token.write_text(secrets.token_hex(32))
    with token_auth(token):  # on, as `ray start` has it by default; the run finds the token and uses it
        # the head hosts no replica; its GCS marks a silent node dead after 3 missed 1 s health checks (Ray's
        # default, 5 of 3 s, gave the survivor 15 s more of the rest, and on a slow machine it finished
        # everything before the replacement joined, so the test saw none take a share)
        head = {
            "num_cpus": 0,
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
        }
        cluster = Cluster(initialize_head=True, head_node_args=head)
        cluster.add_node(num_cpus=2)
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        yield cluster
        cluster.shutdown()


@contextmanager
def token_auth(token: Path) -> Iterator[None]:
    """This process and the runs it starts use `token`; Ray reads the mode and token once, so it is told to
    read them again on the way in and on the way out."""
    from ray._raylet import AuthenticationTokenLoader, Config

    names = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)})
    try:
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def test_a_cpu_replica_larger_than_any_node_is_refused_naming_the_numbers(three_nodes: Cluster, tmp_path):
    """Four CPUs per replica, nodes of two: vLLM's CPU backend has no Ray executor, so a CPU replica cannot
    span nodes (a GPU one would, docs/BENCHMARKS.md "One model over two nodes"), and the run stops before any
    engine starts."""
    argv = ["run", "--address", three_nodes.address, "--tasks", "ifeval", "--limit", "2", "--tensor-parallel-size",
            "2", "--cpus-per-worker", "2", "--output-dir", str(tmp_path), "--run-id", "big", *ENGINE_FLAGS]  # fmt: skip
    proc = start_in_background(argv)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "Each replica needs {4 CPU} for 2 engine worker(s)" in err and "offers 2 CPU" in err
    assert "vLLM's CPU backend runs a replica on one node only" in err
    assert "Traceback" not in err


def test_a_worker_node_lost_mid_run_is_replaced_and_loses_nothing(three_nodes: Cluster, tmp_path):
    first, second = three_nodes.worker_nodes
    # 48 questions at one sequence per engine: the rest outlasts a replacement's engine start on a fast CPU too
    argv = ["run", "--address", three_nodes.address, "--tasks", "ifeval", "--limit", "48", "--replicas", "2",
            "--max-num-seqs", "1", "--output-dir", str(tmp_path), "--run-id", "nodes", *ENGINE_FLAGS, "--max-tokens", "32"]  # fmt: skip
    store = tmp_path / "nodes" / "cache" / "completions.jsonl"
    proc = start_in_background(argv)
    wait_for_records(proc, store, 4)
    three_nodes.remove_node(second, allow_graceful=False)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]

    summary = json.loads((tmp_path / "nodes" / "summary.json").read_text())["run"]
    engines = {e["name"]: e["node_id"] for e in summary["engines"]}
    assert all(e["nodes"] == [e["node_id"]] and e["executor"] == "single" for e in summary["engines"])
    assert {engines["replica-0"], engines["replica-1"]} == {first.node_id, second.node_id}  # one per worker
    lost = next(name for name in ("replica-0", "replica-1") if engines[name] == second.node_id)
    dispatch = summary["dispatch"]
    assert dispatch["per_replica"][lost]["dead"] and dispatch["requeues"] >= 1
    (replacement,) = dispatch["replacements"]
    assert dispatch["replacements"][replacement] == lost
    assert engines[replacement] == first.node_id  # the only node left with room
    assert dispatch["per_replica"][replacement]["groups"] >= 1  # it took a share of the rest
    assert summary["replica_restarts"] == {"allowed": 2, "used": 1}
    assert summary["samples_failed"] == 0
    rows = records(tmp_path / "nodes" / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert sorted(r["doc_id"] for r in rows) == list(range(48)) and all(r["error"] is None for r in rows)
    assert f"in place of {lost}" in err
    # the warm-pool registry the run entered its pool and replacement in lives on the head and was never lost
    # (on the lost node, Ray restarted it while the run called it, and the replacement failed as "unavailable")
    assert registry_node(three_nodes.address) == (three_nodes.head_node.node_id, 0)


def registry_node(address: str) -> tuple[str, int]:
    """The node id of the cluster's warm-pool registry and the times Ray restarted it, read by a process of its
    own joined to the cluster."""
    script = (
        "import sys, ray\n"
        "from ray.util.state import list_actors\n"
        "from cluster.engines.warm import REGISTRY_NAME\n"
        "ray.init(address=sys.argv[1], logging_level='ERROR')\n"
        "(found,) = list_actors(filters=[('name', '=', REGISTRY_NAME), ('state', '=', 'ALIVE')], detail=True)\n"
        "print(found.node_id, found.num_restarts)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, address], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    node_id, restarts = done.stdout.strip().splitlines()[-1].split()
    return node_id, int(restarts)
