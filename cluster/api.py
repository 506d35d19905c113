"""The Python entry point: what the CLI, a Ray job entrypoint and a notebook all call.

    import cluster
    result = cluster.evaluate({"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}, "tasks": ["ifeval"], "limit": 50})
    print(result.table)

Inside an existing Ray session (`ray.init("ray://head:10001")` first) the session is reused; otherwise a
local cluster is started, or `cluster.address` is joined.
"""

from __future__ import annotations

from typing import Any

from cluster.config import RunConfig, build_config
from cluster.plan import RunPlan, build_plan, local_judge_replicas, replica_plan
from cluster.preflight import preflight
from cluster.run import RunResult, run_evaluation
from cluster.session import cluster_has_gpus, ray_session


def evaluate(
    config: RunConfig | dict[str, Any],
    *,
    verbose: bool = False,
    progress: bool = True,
    retry_failed: bool = False,
) -> RunResult:
    """Run the evaluation the config describes (its `mode` says full, inference only or judge only)."""
    run_config = config if isinstance(config, RunConfig) else build_config(config, {}, "the config")
    return evaluate_plan(
        build_plan(run_config), verbose=verbose, progress=progress, retry_failed=retry_failed
    )


def evaluate_plan(
    plan: RunPlan,
    *,
    verbose: bool = False,
    progress: bool = True,
    retry_failed: bool = False,
) -> RunResult:
    config = plan.config
    preflight(plan)
    replicas = config.cluster.replicas + local_judge_replicas(plan)
    with ray_session(config.cluster.address, plan.replica, replicas, verbose):
        if config.cluster.address and config.cluster.device == "auto":
            plan.device = "gpu" if cluster_has_gpus() else "cpu"
            plan.replica = replica_plan(config, plan.device)
        return run_evaluation(plan, verbose=verbose, progress=progress, retry_failed=retry_failed)
