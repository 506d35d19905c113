"""Warm pools on a real `ray start --head` cluster (token auth on, 2 CPUs) with real engines of the embedded
model: `rayeval up` starts one, runs with its engine settings generate on it without starting an engine and
answer as a cold run does (float32 greedy, against the shared base run), two runs at once share it (and a
third, killed mid-way, leaves it healthy), a run asking more replicas starts the rest beside it, a run with
other settings is not served by it (and a dry run says why), a pool replica killed between runs is replaced by
the next run, `--keep-warm` leaves a run's engines up for their idle time, and `down` stops a pool; a registry
that another version started is refused (a sweep beside it starts engines of its own); idle, the
pool's engine core wakes rarely. The pool's replica
starts once for the whole module; the run with more replicas, the kept-warm run and the replacement start one
engine each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.cli.front_paths import WARM_CLI_ENV
from cluster.engines.idle_wakeups import GROUP_THREAD_SLACK_NS
from cluster.engines.settings import cpu_has_native_bf16
from cluster.models.default import default_model_dir
from tests.ray_head import HeadNode, start_head
from tests.runs import (
    BASE_IFEVAL_ARGS,
    BASE_IFEVAL_LIMIT,
    MODEL_DIR,
    rayeval,
    records,
    start_in_background,
    wait_for_records,
)
from tests.wakeups import timer_slack_ns, wakeups_per_second

pytestmark = pytest.mark.slow

POOL = "smol-f32"
POOL_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "1024"]  # BASE_IFEVAL_ARGS' engines


@pytest.fixture(scope="module")
def head() -> Iterator[HeadNode]:
    node = start_head(num_cpus=2)
    yield node
    node.stop()


@pytest.fixture(scope="module")
def pool(head: HeadNode) -> Iterator[HeadNode]:
    started = rayeval("up", *POOL_FLAGS, "--name", POOL, "--idle-timeout", "1h", "--address", head.gcs_address,
                      env=head.client_env())  # fmt: skip
    assert started.returncode == 0, started.stderr[-3000:]
    assert started.stdout.startswith(f"warm pool {POOL} started: 1 replica(s) of ")
    yield head


def run_on(head: HeadNode, tmp_path: Path, run_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return rayeval("run", *BASE_IFEVAL_ARGS, "--limit", str(BASE_IFEVAL_LIMIT), "--address", head.gcs_address,
                   "--output-dir", str(tmp_path), "--run-id", run_id, *extra, env=head.client_env())  # fmt: skip


def summary_of(tmp_path: Path, run_id: str) -> dict:
    return json.loads((tmp_path / run_id / "summary.json").read_text())["run"]


def pools_listed(head: HeadNode) -> dict[str, list[str]]:
    listed = rayeval("pools", "--address", head.gcs_address, env=head.client_env())
    assert listed.returncode == 0, listed.stderr[-3000:]
    return {row.split("\t")[0]: row.split("\t") for row in listed.stdout.splitlines()[1:] if "\t" in row}


def test_runs_on_a_warm_pool_start_no_engine_and_answer_as_a_cold_run(
    pool: HeadNode, tmp_path, base_ifeval_records
):
    head = pool
    before = head.engine_actor_pids()
    for run_id in ("warm-1", "warm-2"):
        done = run_on(head, tmp_path, run_id)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"engines: warm (pool {POOL};" in done.stdout and "s of engine start saved" in done.stdout
        source = summary_of(tmp_path, run_id)["engines_source"]
        assert source["kind"] == "warm" and source["pool"] == POOL and not source["started_by_this_run"]
        (engine,) = summary_of(tmp_path, run_id)["engines"]  # the pool's: its actor's vLLM import, its build
        assert engine["import_s"] > 0 and engine["start_s"] > 0
        assert source["start_saved_s"] == pytest.approx(engine["import_s"] + engine["start_s"], abs=2e-3)
        rows = records(tmp_path / run_id / "samples" / MODEL_DIR / "ifeval.jsonl")
        assert [r["output"] for r in rows] == [r["output"] for r in base_ifeval_records]  # float32 greedy
    assert head.engine_actor_pids() == before  # no engine started, none stopped
    (row,) = pools_listed(head).values()
    assert row[0] == POOL and row[3] == "1" and int(row[6]) == 2 * BASE_IFEVAL_LIMIT and row[7] == "-"
    assert row[8] == "3600 s" and row[9].startswith("dtype=float32, max_model_len=1024, ")  # its settings
    # idle between runs, the engine core's process-group threads sleep (cluster.engines.idle_wakeups): gloo's
    # 10 ms wait alone would wake each about 100 times a second
    (core,) = head.engine_core_pids()
    slack = timer_slack_ns(core, "gloo_tcp_loop")  # None: reading it needs CAP_SYS_NICE, which CI may lack
    assert slack is None or (slack and set(slack.values()) == {GROUP_THREAD_SLACK_NS}), slack
    # about 10 a second on an idle machine; the kernel folds a slack timeout into other wake-ups, which a busy
    # machine (the rest of the suite) has more of, so the bound is half the 100 of gloo's bare wait
    rates = wakeups_per_second(core, "gloo_tcp_loop")
    assert rates and max(rates.values()) < 50, rates


def test_two_runs_at_once_share_the_pool_and_a_third_killed_mid_way_leaves_it_healthy(
    pool: HeadNode, tmp_path
):
    """Three runs start together on the one-replica pool; the third is SIGKILLed once it has results. The
    other two finish with every sample once, their generation overlapping (neither waited for the other), and
    the pool serves the tests after this one."""
    head = pool
    argv = ["run", "--tasks", "ifeval", "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
            "--no-progress", "--max-tokens", "32", "--address", head.gcs_address, "--output-dir", str(tmp_path),
            "--limit", "16", "--temperature", "0.7", "--max-in-flight", "4"]  # fmt: skip
    # four requests in flight per run (a setting of the run: the pool serves it), so each run's generation
    # lasts several rounds and the two windows overlap whatever the CPU's speed and the runs' start skew;
    # the killed run in its own process, as a driver that dies (through the warm CLI server, killing its client
    # would interrupt it as Ctrl-C does)
    envs = {
        "side-a": head.client_env(),
        "side-b": head.client_env(),
        "killed": {**head.client_env(), WARM_CLI_ENV: "0"},
    }
    runs = {run_id: start_in_background([*argv, "--run-id", run_id, "--seed", seed], env=envs[run_id])
            for run_id, seed in (("side-a", "1"), ("side-b", "2"), ("killed", "3"))}  # fmt: skip
    wait_for_records(runs["killed"], tmp_path / "killed" / "cache" / "completions.jsonl", 2)
    os.killpg(runs.pop("killed").pid, signal.SIGKILL)
    for run_id, process in runs.items():
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        rows = records(tmp_path / run_id / "samples" / MODEL_DIR / "ifeval.jsonl")
        assert sorted(r["doc_id"] for r in rows) == list(range(16)) and all(r["error"] is None for r in rows)
        assert summary_of(tmp_path, run_id)["engines_source"]["pool"] == POOL
    (a_start, a_end), (b_start, b_end) = (summary_of(tmp_path, r)["generation_window"] for r in runs)
    assert a_start < b_end and b_start < a_end  # their generation overlapped: neither waited for the other
    # each learned from its lease's renewals that others held the pool, and so took its part of the window
    sharing = [summary_of(tmp_path, r)["engines_source"]["runs_sharing_at_most"] for r in runs]
    assert max(sharing) >= 2 and max(sharing) <= 3, sharing


def test_a_run_asking_more_replicas_than_the_pool_has_starts_the_rest_beside_it(
    pool: HeadNode, tmp_path, base_ifeval_records
):
    """Two replicas asked of the one-replica pool: the run starts one beside it for itself (stopped at its end),
    answers as a cold run, and the pool counts only the requests its own replica served."""
    head = pool
    before, served = head.engine_actor_pids(), int(pools_listed(head)[POOL][6])
    done = run_on(head, tmp_path, "beside", "--replicas", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    run = summary_of(tmp_path, "beside")
    source = run["engines_source"]
    assert (
        source["pool"] == POOL
        and source["own_replicas_beyond_the_pool"] == 1
        and source["start_saved_s"] == 0
    )
    assert run["replicas"] == 2 and len(run["engines"]) == 2
    rows = records(tmp_path / "beside" / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert [r["output"] for r in rows] == [r["output"] for r in base_ifeval_records]  # float32 greedy
    pools_replica, its_own = (engine["name"] for engine in run["engines"])  # the pool's first
    by_replica = {name: r["sequences"] for name, r in run["dispatch"]["per_replica"].items()}
    assert set(by_replica) == {pools_replica, its_own} and sum(by_replica.values()) == BASE_IFEVAL_LIMIT
    assert by_replica[its_own] > 0  # so the pool's count below tells its replica's requests from the run's
    assert int(pools_listed(head)[POOL][6]) - served == by_replica[pools_replica]
    deadline = (
        time.time() + 30
    )  # the replica started beside the pool is gone with the run (killed, not waited)
    while time.time() < deadline and head.engine_actor_pids() != before:
        time.sleep(0.5)
    assert head.engine_actor_pids() == before


def test_up_of_a_pool_already_there_says_what_it_holds_and_keeps_it_up_at_least_as_long(pool: HeadNode):
    head = pool
    again = rayeval("up", *POOL_FLAGS, "--replicas", "2", "--idle-timeout", "2h", "--no-warm-cli", "--address",
                    head.gcs_address, env=head.client_env())  # fmt: skip  # no engine starts
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.startswith(f"warm pool {POOL} already running: 1 replica(s) of ")
    assert (
        f"(--replicas 2 asked: runs that need more start the rest beside it; `rayeval down {POOL}`"
        in again.stdout
    )
    assert "stops after 7200 s unused" in again.stdout  # raised from the fixture's 1h, never lowered
    shorter = rayeval("up", *POOL_FLAGS, "--idle-timeout", "10m", "--no-warm-cli", "--address", head.gcs_address,
                      env=head.client_env())  # fmt: skip
    assert "stops after 7200 s unused" in shorter.stdout and "asked" not in shorter.stdout


def test_a_registry_that_ray_restarts_still_knows_the_pools(pool: HeadNode, tmp_path):
    """The registry's process killed: Ray restarts the actor, which reads its records back from the cluster,
    so the pool is still listed and still serves (its engines were never lost)."""
    head = pool
    (registry,) = [
        pid for pid in head.pids() if Path(f"/proc/{pid}/comm").read_text().startswith("ray::PoolRegist")
    ]
    os.kill(registry, signal.SIGKILL)
    assert set(pools_listed(head)) == {POOL}
    assert (
        f"warm pool {POOL} would serve this run (1 replica)"
        in run_on(head, tmp_path, "x", "--dry-run").stdout
    )
    assert registry not in head.pids()


def test_a_pool_that_cannot_be_placed_in_time_leaves_nothing_behind(pool: HeadNode, tmp_path):
    """Two replicas on a cluster with one CPU free: one placement group is placed, the other waits until the
    placement timeout. The pool's groups are detached (they outlive the command): every one is removed, so
    the CPU the first one took is free again, and no pool is listed. No engine starts."""
    head = pool
    config = tmp_path / "quick.yaml"
    config.write_text("cluster:\n  placement_timeout_s: 3\n")
    failed = rayeval("up", *POOL_FLAGS, "--max-model-len", "768", "--replicas", "2", "--name", "unplaced",
                     "--config", str(config), "--address", head.gcs_address, env=head.client_env())  # fmt: skip
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert "2 replica(s) of" in failed.stderr and "could not be placed within 3 s" in failed.stderr
    assert f"Warm pools hold replicas here: {POOL} (1 x " in failed.stderr  # what holds the CPU, and the fix
    assert [g for g in head.placement_groups() if "unplaced" in g["name"]] == []
    assert set(pools_listed(head)) == {POOL}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["ctrl-c", "hangup"])
def test_ctrl_c_while_a_runs_engines_start_stops_them_at_once_and_leaves_no_pool(
    pool: HeadNode, tmp_path, signum
):
    """A run that starts its own engines, to keep warm as a pool, gets Ctrl-C (or its terminal hangs up)
    while its engine actor imports vLLM (seconds before the engine is ready): the start gives up instead of
    finishing first, and what it started is gone: no engine actor, no placement group, no pool."""
    head = pool
    pool_engines = head.engine_actor_pids()
    argv = ["run", *BASE_IFEVAL_ARGS, "--limit", "2", "--max-model-len", "768", "--keep-warm", "10m",
            "--address", head.gcs_address, "--output-dir", str(tmp_path), "--run-id", "cut"]  # fmt: skip
    proc = start_in_background(argv, env=head.client_env())
    deadline = time.time() + 120
    while time.time() < deadline and head.engine_actor_pids() == pool_engines:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "rayeval: interrupted" in err, err[-3000:]
    assert "replica-0 ready" not in err and "Traceback" not in err
    deadline = time.time() + 30
    while time.time() < deadline and head.engine_actor_pids() != pool_engines:
        time.sleep(0.5)
    assert head.engine_actor_pids() == pool_engines
    assert [g["name"] for g in head.placement_groups()] == [f"rayeval-pool-{POOL}-replica-0"]
    assert set(pools_listed(head)) == {POOL}


def test_a_run_with_other_settings_is_not_served_and_a_dry_run_says_why(pool: HeadNode, tmp_path):
    head = pool
    pool_engines = head.engine_actor_pids()
    dry = run_on(head, tmp_path, "other", "--max-model-len", "768", "--keep-warm", "10s", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert (
        "no warm pool has these engine settings: the run starts its own (kept warm 10 s after it as a pool of "
        "their own)" in dry.stdout
    )
    assert f"warm pool {POOL} would not: max_model_len 1024 (wanted 768)" in dry.stdout
    same = run_on(head, tmp_path, "same", "--dry-run")
    assert f"warm pool {POOL} would serve this run (1 replica)" in same.stdout
    # a local judge of the pool's model: its engines are the pool's, whatever the model under test's revision
    judged = run_on(head, tmp_path, "judged", "--tasks", "alpaca_eval", "--judge", f"local:{default_model_dir()}",
                    "--revision", "main", "--dry-run")  # fmt: skip
    assert judged.returncode == 0, judged.stderr[-3000:]
    assert f"warm pool {POOL} would not: revision None (wanted 'main')" in judged.stdout
    assert f"the judge's engines: warm pool {POOL} would serve this run (1 replica)" in judged.stdout
    more = run_on(head, tmp_path, "more", "--replicas", "2", "--dry-run")
    assert (
        f"warm pool {POOL} would serve this run (1 replica); the run starts 1 more beside it" in more.stdout
    )
    cold = run_on(head, tmp_path, "cold", "--no-warm-pools", "--keep-warm", "10s", "--dry-run")
    assert (
        "warm pools: not used (--no-warm-pools); the run starts its own engines (kept warm 10 s after it as a "
        "pool of their own)" in cold.stdout
    )
    # `--dtype auto` is the pool's float32 engine where the CPU has no native bfloat16, another engine elsewhere
    auto = run_on(head, tmp_path, "auto", "--dtype", "auto", "--dry-run")
    assert auto.returncode == 0, auto.stderr[-3000:]
    assert (
        f"warm pool {POOL} would not: dtype 'float32' (wanted 'auto'; auto is 'bfloat16' on its nodes)"
        if cpu_has_native_bf16()
        else f"warm pool {POOL} would serve this run (1 replica)"
    ) in auto.stdout

    # 20 s: time for the run's exit and the listing below on a slow machine before the pool's idle time ends
    done = run_on(head, tmp_path, "other", "--max-model-len", "768", "--keep-warm", "20s")
    assert done.returncode == 0, done.stderr[-3000:]
    source = summary_of(tmp_path, "other")["engines_source"]
    assert source["kind"] == "warm" and source["started_by_this_run"] and source["pool"] != POOL
    assert (
        f"engines: started by this run and left up as warm pool {source['pool']} for the runs that follow "
        f"(stopped after 20 s unused; `rayeval down {source['pool']}` stops it now)" in done.stdout
    )
    listed = pools_listed(head)
    assert set(listed) == {POOL, source["pool"]}  # the run's engines stay up as a pool of their own...
    deadline = time.time() + 120
    while time.time() < deadline and source["pool"] in listed:
        time.sleep(2)
        listed = pools_listed(head)
    assert set(listed) == {POOL}  # ...until their idle time is over, when their engine stops too
    deadline = time.time() + 60
    while time.time() < deadline and head.engine_actor_pids() != pool_engines:
        time.sleep(0.5)
    assert head.engine_actor_pids() == pool_engines


# A traceback the replica logged and lived through (a stand-in, written into its log: an engine cannot be made
# to log a handled error on demand). The run after it ends with the replica well, so a later death's cause is
# looked for after it.
LIVED_THROUGH = "Traceback (most recent call last):\nValueError: a handled error the replica lived through\n"


def test_a_dead_pool_replica_is_replaced_by_the_next_run(pool: HeadNode, tmp_path, base_ifeval_records):
    head = pool
    (victim,) = head.engine_actor_pids()
    victim_log = os.readlink(f"/proc/{victim}/fd/2")  # the actor's stderr: Ray's worker-*.err on this node
    with open(victim_log, "a") as handle:
        handle.write(LIVED_THROUGH)
    well = run_on(head, tmp_path, "before-kill")
    assert well.returncode == 0 and f"engines: warm (pool {POOL};" in well.stdout, well.stderr[-3000:]
    assert LIVED_THROUGH in Path(victim_log).read_text()  # still there: the replica's own writes append
    os.kill(victim, signal.SIGKILL)
    done = run_on(head, tmp_path, "after-kill")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"pool {POOL}: replica-0 had died" in done.stderr and "replacing it" in done.stderr
    # its cause names the engine's log on its node, and is not the traceback it had lived through
    assert victim_log in done.stderr and "lived through" not in done.stderr
    # it waited for the replacement's start: no start saved is claimed
    assert f"engines: warm (pool {POOL}; the run started 1 engine(s) itself" in done.stdout
    assert summary_of(tmp_path, "after-kill")["engines_source"]["start_saved_s"] == 0
    rows = records(tmp_path / "after-kill" / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert [r["output"] for r in rows] == [r["output"] for r in base_ifeval_records]
    (replacement,) = head.engine_actor_pids()
    assert replacement != victim
    assert pools_listed(head)[POOL][3] == "1"  # still one replica: the replacement, registered in the pool


def test_down_stops_the_pool_and_its_engines_and_what_a_killed_start_left(pool: HeadNode):
    """`down --all` stops the pool, and the detached engine actor and placement group of a `rayeval up`
    killed outright (SIGKILL: no cleanup can run) while its engine started, which `pools` points at."""
    head = pool
    unknown = rayeval("down", "no-such-pool", "--address", head.gcs_address, env=head.client_env())
    assert (
        unknown.returncode == 1
        and f"No warm pool named no-such-pool on this cluster (its pools: {POOL})" in unknown.stderr
    )
    pool_engines = head.engine_actor_pids()
    killed = start_in_background(["up", *POOL_FLAGS, "--max-model-len", "640", "--name", "killed", "--no-warm-cli",
                                  "--address", head.gcs_address], env={**head.client_env(), WARM_CLI_ENV: "0"})  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and head.engine_actor_pids() == pool_engines:
        assert killed.poll() is None, killed.communicate()[1][-3000:]
        time.sleep(0.2)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    listed = rayeval("pools", "--address", head.gcs_address, env=head.client_env())
    assert "1 engine actor(s) named as a pool's belong to no pool listed" in listed.stderr, listed.stderr[
        -3000:
    ]
    assert "rayeval-pool-killed-replica-0" in listed.stderr and set(pools_listed(head)) == {POOL}
    stopped = rayeval("down", "--all", "--address", head.gcs_address, env=head.client_env())
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    # and the warm CLI server that the pool's `rayeval up` started (its socket in this cluster's folder)
    assert stopped.stdout.splitlines() == [
        f"stopped 1 warm pool(s): {POOL}",
        "stopped 1 engine actor(s) and 1 placement group(s) that belonged to no pool: "
        "rayeval-pool-killed-replica-0",
        "stopped this machine's warm CLI server",
    ]
    deadline = time.time() + 30
    while time.time() < deadline and head.engine_actor_pids():
        time.sleep(0.5)
    assert head.engine_actor_pids() == [] and pools_listed(head) == {} and head.placement_groups() == []
    # the name the killed start had claimed is free again
    assert script_on_cluster(head, CLAIM_NAME, "killed")[-1] == "claimed: killed"


# A registry as an earlier rayeval started it: its `all` and `remove`, no `version` (a stand-in: an older
# release cannot be installed here). It replaces the cluster's registry, by name, in the rayeval namespace.
OLD_REGISTRY = """
import sys
import ray
ray.init(address=sys.argv[1], namespace="rayeval", logging_level="ERROR")
ray.kill(ray.get_actor("rayeval-pools"), no_restart=True)

@ray.remote(num_cpus=0)
class PoolRegistry:
    def all(self):
        return []

    def remove(self, name):
        return None

old = PoolRegistry.options(name="rayeval-pools", lifetime="detached").remote()
ray.get(old.all.remote())
"""


# A LoRA sweep asks the cluster for a warm pool to hold for its steps (`SharedReplicas.hold_warm_pool`), and a
# step's run asks for the pool the sweep holds by name (`SourceRequest.warm_pool`): what each does beside a
# registry of another version (and what a run does there), and where the held pool is no longer there. No engine
# starts.
SWEEP_BESIDE_REGISTRY = """
import logging
import sys
from dataclasses import replace

import ray

from cluster.config import build_config
from cluster.errors import ClusterError
from cluster.plan import build_model_plan
from cluster.run.shared import SharedReplicas
from cluster.sources import choose

logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
ray.init(address=sys.argv[1], logging_level="ERROR")
plan = build_model_plan(build_config({}, {}, "the test"), "cpu")
shared = SharedReplicas(plan, lora=True)
if sys.argv[2] == "hold":
    print("held:", shared.hold_warm_pool(plan.model.path))
elif sys.argv[2] == "run":  # a run that would use a pool or keep its engines warm as one: its own, nothing kept
    run = replace(shared._request(plan.model.path), shared=None, warm_pools=True, keep_warm_s=600.0)
    print("run:", choose(run).kind.value)
else:
    from cluster.engines.warm import registry

    registry()  # the cluster's registry is up; the pool the step names is not in it
    try:
        choose(replace(shared._request(plan.model.path), warm_pool="held-pool"))
    except ClusterError as exc:
        print("step:", exc)
"""


CLAIM_NAME = """
import sys
import ray
from cluster.engines.warm import registry
ray.init(address=sys.argv[1], logging_level="ERROR")
found = registry()
name = ray.get(found.claim_name.remote(sys.argv[2]))
ray.get(found.release_name.remote(name))
print("claimed:", name)
"""


def script_on_cluster(head: HeadNode, script: str, *args: str) -> list[str]:
    """The lines a Python script prints, run as a client of the head's cluster (its address first among its
    arguments); it must exit 0."""
    done = subprocess.run([sys.executable, "-c", script, head.gcs_address, *args], capture_output=True, text=True,
                          env={**head.client_env(), "RAY_AUTH_MODE": "token"}, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_a_registry_another_version_started_is_refused_held_by_no_sweep_and_stopped_by_down_all(
    pool: HeadNode,
):
    head = pool
    script_on_cluster(head, OLD_REGISTRY)
    refused = rayeval("pools", "--address", head.gcs_address, env=head.client_env())
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "registry was started by another version of rayeval" in refused.stderr
    assert "`rayeval down --all` (with this --address) stops its pools and it" in refused.stderr
    # a sweep beside it holds no pool and starts engines of its own, and says why
    said = script_on_cluster(head, SWEEP_BESIDE_REGISTRY, "hold")
    assert said[-1] == "held: None" and any(
        line.startswith("WARNING the sweep starts its own engines: This cluster's warm-pool registry was "
                        "started by another version of rayeval") for line in said
    )  # fmt: skip
    said = script_on_cluster(head, SWEEP_BESIDE_REGISTRY, "run")  # a run beside it starts its own engines
    assert said[-1] == "run: own" and any(
        line.startswith("WARNING the run starts its own engines and keeps none warm: This cluster's warm-pool "
                        "registry was started by another version") for line in said
    )  # fmt: skip
    stopped = rayeval("down", "--all", "--address", head.gcs_address, env=head.client_env())
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert pools_listed(head) == {}  # a registry of this version again
    # a sweep's step whose held pool is gone fails with the way out, instead of starting engines of its own
    assert script_on_cluster(head, SWEEP_BESIDE_REGISTRY, "step")[-1] == (
        "step: Warm pool held-pool, which the sweep holds for its steps, no longer serves them (stopped with "
        "`rayeval down`?): run the sweep again; it reuses every finished step."
    )


# Two runs that found one replica dead enter their replacements in the cluster's registry, one after the other
# (synthetic records: which replica a run started is all the registry sees).
TWO_REPLACEMENTS = """
import sys
import ray
from cluster.engines import EngineInfo
from cluster.engines.placement import ReplicaPlan
from cluster.engines.warm import PoolKey, PoolRecord, registry
from cluster.engines import engine_settings
from cluster.config import ModelOptions

ray.init(address=sys.argv[1], namespace="rayeval", logging_level="ERROR")
found = registry()
settings = engine_settings(ModelOptions(), "/models/twin", "cpu")
def info(name):
    return EngineInfo(name, "node", 1, 1.0, 64, 1024, "0.32.0")
ray.get(found.put.remote(PoolRecord("twin", PoolKey.of(settings), settings, ReplicaPlan({"CPU": 1.0}, 1), 0.5,
                                    3600.0, engines={"replica-0": info("replica-0")}, groups={"replica-0": "00"})))
first = ray.get(found.replaced.remote("twin", "replica-0", info("replica-0.aaaaaa"), "01"))
second = ray.get(found.replaced.remote("twin", "replica-0", info("replica-0.bbbbbb"), "02"))
gone = ray.get(found.replaced.remote("no-such-pool", "replica-0", info("replica-0.cccccc"), "03"))
# the first replacement died in turn and a third run replaced it: a late run is handed that one
third = ray.get(found.replaced.remote("twin", "replica-0.aaaaaa", info("replica-0.dddddd"), "04"))
late = ray.get(found.replaced.remote("twin", "replica-0", info("replica-0.eeeeee"), "05"))
print(first.name, second.name, gone, third.name, late.name, sorted(ray.get(found.get.remote("twin")).engines))
ray.get(found.remove.remote("twin"))
"""


def test_two_runs_replacing_one_dead_replica_keep_the_first_replacement(pool: HeadNode):
    head = pool
    said = script_on_cluster(head, TWO_REPLACEMENTS)
    # the second run is handed the first's replacement (it stops its own); a pool stopped meanwhile: None
    assert said[-1] == (
        "replica-0.aaaaaa replica-0.aaaaaa None replica-0.dddddd replica-0.dddddd ['replica-0.dddddd']"
    )
    assert set(pools_listed(head)) <= {POOL}
