"""One Ray cluster for the whole test run, holding warm pools of the engines most tests ask for, so that a
test's `rayeval run` generates at once instead of starting Ray and an engine (about 20 s each on two cores).

It is rayeval's own warm-pool feature used as a user would: a `ray start --head` cluster (token auth on),
`rayeval up` once per engine setting the tests share (ENGINE_FLAGS' engines, BASE_IFEVAL_ARGS' float32 ones,
and LoRA-capable ones for BASE_IFEVAL_ARGS' runs with an adapter), and `tests.runs.rayeval("run", ...)` adding
`--address` of this cluster with `--keep-warm off`: a run whose engine settings match a pool generates on it,
any other starts its own engines on this cluster and stops them after. The cluster starts with the first run
that needs it (in a run of the whole suite: as the session starts, in the background, while the tests that need
no cluster run first) and stops when the test run ends (`pytest_sessionfinish` in tests/conftest.py). Tests whose
subject is an engine's start or death, or the local cluster a command starts itself, opt out with
`rayeval(..., local=True)` (or start their own cluster); `RAYEVAL_TESTS_LOCAL=1` turns the shared cluster off
for a whole test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass

from tests.ray_head import HeadNode, start_head

# tests.runs.ENGINE_FLAGS' engine settings
ENGINE_POOL = ["--enforce-eager", "--max-model-len", "1024", "--kv-cache-gib", "0.5"]
AUTO_POOL = "tests-auto"  # tests.runs.ENGINE_FLAGS' engines, where `auto` is bfloat16
FLOAT32_POOL = "tests-float32"  # tests.runs.BASE_IFEVAL_ARGS'; ENGINE_FLAGS' too where `auto` is float32
POOLS = {
    AUTO_POOL: ENGINE_POOL,
    FLOAT32_POOL: [*ENGINE_POOL, "--dtype", "float32"],
    # BASE_IFEVAL_ARGS' runs with a LoRA adapter (`--lora PATH`, rank up to the default --max-lora-rank)
    "tests-lora": [*ENGINE_POOL, "--dtype", "float32", "--lora-slots", "4"],
}
# Ray's scheduling units, not cores: the pools' replicas, and runs' own engines beside them. Memory is what
# bounds the pools: each CPU engine holds about 3 GB (proportional set sizes measured with a 1 GiB KV cache: its
# core 2.4, its actor 0.65, the forkserver it starts from 0.4; the 0.5 GiB cache takes half a GB off the core),
# so three pools (two where `auto` is float32) leave room for about three engines of the tests' own on 24 GiB.
# lm-eval's own vLLM engines (the reference runs) keep vLLM's 1 GiB.
CPUS = 8


@dataclass
class WarmCluster:
    head: HeadNode

    def run_args(self) -> list[str]:
        return ["--address", self.head.gcs_address, "--keep-warm", "off"]

    def env(self) -> dict[str, str]:
        return self.head.client_env()


_cluster: WarmCluster | None = None
_lock = threading.Lock()
# The environment of the test run as it began, which every `rayeval` of the shared cluster starts from (its
# `rayeval up` and the tests' runs, as one user's shell): the test process's own imports of Ray, vLLM and torch
# later set variables in os.environ (KMP_*, TORCHINDUCTOR_*, HF_HUB_OFFLINE, ...) that a user's shell would not
# have, and which would make every later run unlike the warm CLI server that `rayeval up` started.
_SESSION_ENV = dict(os.environ)


def enabled() -> bool:
    return os.environ.get("RAYEVAL_TESTS_LOCAL", "") != "1"


def warm_cluster() -> WarmCluster:
    """The test run's shared cluster with its pools, started on first use (or waited for, while
    `start_in_background` starts it)."""
    with _lock:
        return _started()


def _started() -> WarmCluster:
    """The shared cluster, started now if it is not yet; the caller holds `_lock`."""
    global _cluster
    if _cluster is None:
        head = start_head(num_cpus=CPUS, base_env=_SESSION_ENV)
        try:
            from cluster.models import ensure_default_model

            ensure_default_model()  # once, before the pools' processes would each build it
            up(head, pools_here())
        except BaseException:
            head.stop()
            raise
        _cluster = WarmCluster(head)
    return _cluster


def start_in_background() -> None:
    """Start the shared cluster on a thread of its own, so that the tests which need no cluster run meanwhile
    (tests/conftest.py orders them first in a run of the whole suite). It returns once that thread holds
    `_lock`: from then on `warm_cluster` and `shared_pids` wait for the start to end, so no test meets the pools
    half started. A start that fails is tried again by the first test that asks for the cluster, which then
    reports why."""
    if not enabled():
        return
    holding = threading.Event()

    def start() -> None:
        with _lock:
            holding.set()
            try:
                _started()
            except BaseException:  # noqa: BLE001 - the first test that asks starts it again and reports why
                pass

    threading.Thread(target=start, name="warm-cluster-start", daemon=True).start()
    holding.wait()


def pools_here() -> dict[str, list[str]]:
    """POOLS but the `auto` one where this CPU has no native bfloat16: there `auto` is float32, and the
    float32 pool serves ENGINE_FLAGS' runs (a pool serves a dtype asked as `auto` where it becomes the pool's)."""
    from cluster.engines.settings import cpu_has_native_bf16

    return (
        POOLS
        if cpu_has_native_bf16()
        else {name: flags for name, flags in POOLS.items() if name != AUTO_POOL}
    )


def auto_pool() -> str:
    """The pool that serves ENGINE_FLAGS' runs (dtype `auto`) on this machine."""
    return AUTO_POOL if AUTO_POOL in pools_here() else FLOAT32_POOL


def up(head: HeadNode, pools: dict[str, list[str]]) -> None:
    """`rayeval up` for every pool at once (their engines start side by side, as several users' would)."""
    started = {}
    for name, flags in pools.items():
        argv = ["up", *flags, "--name", name, "--idle-timeout", "1d", "--address", head.gcs_address]
        started[name] = subprocess.Popen([sys.executable, "-m", "cluster.cli", *argv], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, env=head.client_env())  # fmt: skip
    failed = []
    for name, process in started.items():
        _, err = process.communicate(timeout=600)
        if process.returncode != 0:
            failed.append(f"`rayeval up` for the tests' pool {name} failed:\n{err[-3000:]}")
    if failed:
        raise RuntimeError("\n".join(failed))


def shared_pids() -> set[int]:
    """Every process of the shared cluster (its raylets, pools' engines and their cores): tests that look for
    their own engine processes by name leave these out."""
    with _lock:
        head = None if _cluster is None else _cluster.head
    return set() if head is None else head.pids()


def stop_warm_cluster() -> None:
    global _cluster
    with _lock:
        if _cluster is not None:
            _cluster.head.stop()
            _cluster = None
