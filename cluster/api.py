"""The Python entry point: what the CLI, a Ray job entrypoint and a notebook all call.

    import cluster
    result = cluster.evaluate({"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}, "tasks": ["ifeval"], "limit": 50})
    print(result.table)

Inside an existing Ray session (`cluster.connect("ray://head:10001")` or `ray.init` first) the session is
reused; otherwise a local cluster is started, or `cluster.address` is joined.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from cluster.config import RunConfig, build_config
from cluster.judging import local_judge_replicas
from cluster.plan import RunPlan, build_plan
from cluster.preflight import preflight
from cluster.run import RunResult, load_records, run_evaluation
from cluster.session import device_from_cluster, joined_session, on_the_clusters_device, ray_session

if TYPE_CHECKING:
    from cluster.run.paths import StoredConfigOverrides


def evaluate(
    config: RunConfig | dict[str, Any],
    *,
    verbose: bool = False,
    progress: bool = True,
    retry_failed: bool = False,
    records: bool = False,
) -> RunResult:
    """Run the evaluation the config describes (its `mode` says full, inference only or judge only).

    Through a Ray client (`cluster.connect("ray://...")` first, or `cluster.address: ray://...`) the run is
    coordinated inside the cluster and followed from here (`evaluate_in_cluster`). `records=True` adds each
    task's per-sample records to the result as a pandas DataFrame."""
    run_config = config if isinstance(config, RunConfig) else build_config(config, {}, "the config")
    if through_ray_client(run_config):
        return evaluate_in_cluster(run_config, progress=progress, retry_failed=retry_failed, records=records)
    result = evaluate_plan(
        build_plan(run_config), verbose=verbose, progress=progress, retry_failed=retry_failed
    )
    if records:
        result.records = load_records(result.run_dir)
    return result


def through_ray_client(config: RunConfig) -> bool:
    """Whether this process reaches the cluster as a Ray client (a session already open, or a ray:// address)."""
    if (config.cluster.address or "").startswith("ray://"):
        return True
    if "ray" not in sys.modules:  # no Ray session can be open without Ray loaded
        return False
    from ray.util.client import ray as client

    return bool(client.is_connected())


def evaluate_in_cluster(
    config: RunConfig,
    *,
    progress: bool = True,
    retry_failed: bool = False,
    records: bool = False,
    stored: StoredConfigOverrides | None = None,
) -> RunResult:
    """Start the run's coordinator inside the cluster and follow it; a client that goes away leaves it
    running, and `attach(run_id)` follows it again. `stored`: the command's settings for a --judge-only run,
    merged into its saved config.yaml on the coordinator's node."""
    from cluster.run.remote import start_remote

    with joined_session(config.cluster.address):
        run = start_remote(config, retry_failed, stored)
        print(  # a notebook has no logging set up; the run id is what a later attach needs
            f"rayeval: run {run.run_id} is coordinated inside the cluster, on node {run.node_ip}, which writes "
            f"its folder {config.output_dir}/{run.run_id}; if this session goes away, "
            f"cluster.attach('{run.run_id}') (or `rayeval attach {run.run_id}`) follows it again.",
            file=sys.stderr,
        )
        try:
            return run.wait(progress=progress, records=records)
        except KeyboardInterrupt:
            print(
                f"rayeval: stopped following run {run.run_id}; it goes on in the cluster. "
                f"cluster.attach('{run.run_id}') or `rayeval attach {run.run_id}` follows it again.",
                file=sys.stderr,
            )
            raise


def attach(
    run_id: str, address: str | None = None, *, progress: bool = True, records: bool = False
) -> RunResult:
    """Follow a run coordinated inside the cluster (started through a Ray client) to its end and return its
    result, from any client session: `cluster.connect("ray://head:10001")` first, or give `address`."""
    from cluster.run.remote import attach_remote

    with joined_session(address):
        return attach_remote(run_id).wait(progress=progress, records=records)


def evaluate_plan(
    plan: RunPlan,
    *,
    verbose: bool = False,
    progress: bool = True,
    retry_failed: bool = False,
) -> RunResult:
    config = plan.config
    preflight(plan)
    if not config.cluster.address:  # heavy scorer imports (IFEval's nltk) go on while a local Ray starts
        for task_plan in plan.tasks:
            task_plan.task.preload_scorer()
    replicas = config.cluster.replicas + local_judge_replicas(plan)
    with ray_session(config.cluster.address, plan.replica, replicas, verbose):
        plan = on_the_clusters_device(plan)
        return run_evaluation(plan, verbose=verbose, progress=progress, retry_failed=retry_failed)


def dry_run_on_cluster(plan: RunPlan) -> tuple[RunPlan, str | None]:
    """A `--dry-run --address`'s plan, on that cluster's device as the run would be, and which warm pool would
    serve it (`sources.explain`; None for an endpoint's model). The cluster is joined once for both, and not
    at all where neither asks it (a --device given and --no-warm-pools)."""
    from cluster.sources import explain

    asks_pools = not plan.model.endpoint and plan.config.cluster.warm_pools
    if not device_from_cluster(plan) and not asks_pools:
        return plan, None if plan.model.endpoint else explain(plan)
    with joined_session(plan.config.cluster.address, verbose=False):
        planned = on_the_clusters_device(plan)
        return planned, None if plan.model.endpoint else explain(planned)
