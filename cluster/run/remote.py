"""A run whose coordinator lives inside the cluster: a named, detached Ray actor that plans and runs it, so a
Ray client (a notebook, `--address ray://...`) only starts it, follows its progress and fetches the result.
A client that disconnects leaves the run going; `attach(run_id)` from a new session follows it again."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from cluster.config import RunConfig
from cluster.errors import ClusterError
from cluster.progress import Stage, progress_bar, snapshot
from cluster.run.result import RunResult, load_records
from evaluators.errors import EvalInputError

NAMESPACE = "rayeval"
POLL_S = 1.0


def actor_name(run_id: str) -> str:
    return f"rayeval-run-{run_id}"


@dataclass(frozen=True)
class RunStatus:
    run_id: str
    stages: list[Stage]
    finished: bool
    error: str | None  # the run's own one-paragraph error, when it failed
    error_is_input: bool = False  # a bad input (exit 2 in the CLI) rather than a cluster failure


# Asks for no CPU: the coordinator waits on its replicas and must never take a slot a replica needs.
@ray.remote(num_cpus=0, max_restarts=0)
class RunCoordinator:
    """Plans and runs one evaluation in a thread, and answers its status, result and records meanwhile. It
    lives until a client has fetched the result and released it."""

    def __init__(self, config: dict[str, Any], retry_failed: bool) -> None:
        self.config = RunConfig.model_validate(config)
        if (
            not Path(self.config.output_dir).expanduser().is_absolute()
        ):  # a worker's cwd is Ray's, not a user's
            self.config.output_dir = str(Path.home() / self.config.output_dir)
        self.retry_failed = retry_failed
        self.result: RunResult | None = None
        self.error: str | None = None
        self.error_is_input = False
        self.thread = threading.Thread(target=self._run, name="rayeval-run", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from cluster.plan import build_plan, replica_plan
        from cluster.preflight import preflight
        from cluster.run.coordinator import run_evaluation
        from cluster.session import cluster_has_gpus

        try:
            plan = build_plan(self.config)
            if self.config.cluster.device == "auto":
                plan.device = "gpu" if cluster_has_gpus() else "cpu"
                plan.replica = replica_plan(self.config, plan.device)
            preflight(plan)
            self.result = run_evaluation(plan, progress=False, retry_failed=self.retry_failed)
        except EvalInputError as exc:
            self.error, self.error_is_input = str(exc), True
        except Exception as exc:  # noqa: BLE001 - the client shows it as the run's error
            self.error = str(exc) if isinstance(exc, ClusterError) else f"{type(exc).__name__}: {exc}"

    def status(self) -> RunStatus:
        return RunStatus(
            self.config.run_id or "", snapshot(), not self.thread.is_alive(), self.error, self.error_is_input
        )

    def result_of_run(self) -> RunResult | None:
        return self.result

    def records(self) -> dict[str, Any]:
        """The finished run's per-sample records, one pandas DataFrame per task."""
        return load_records(self.result.run_dir) if self.result is not None else {}

    def release(self) -> None:
        ray.actor.exit_actor()


class RemoteRun:
    """The client's handle on a run inside the cluster."""

    def __init__(self, run_id: str, actor: ray.actor.ActorHandle) -> None:
        self.run_id = run_id
        self.actor = actor

    def wait(self, progress: bool = True, records: bool = False) -> RunResult:
        """Follow the run's progress until it ends; return its result (with its per-sample records as
        DataFrames when asked) and let the coordinator go."""
        bars: dict[str, Any] = {}
        status = ray.get(self.actor.status.remote())
        while not status.finished:
            _draw(status.stages, bars, progress)
            time.sleep(POLL_S)
            status = ray.get(self.actor.status.remote())
        for bar, _ in bars.values():
            bar.stop()
        if status.error is not None:
            self.actor.release.remote()
            raise (EvalInputError if status.error_is_input else ClusterError)(status.error)
        result = ray.get(self.actor.result_of_run.remote())
        if records:
            result.records = ray.get(self.actor.records.remote())
        self.actor.release.remote()
        return result


def _draw(stages: list[Stage], bars: dict[str, Any], enabled: bool) -> None:
    for stage in stages:
        if stage.label not in bars:
            bar = progress_bar(stage.label, enabled)
            bar.start()
            bars[stage.label] = (bar, bar.add_task(stage.label, total=stage.total))
        bar, task = bars[stage.label]
        bar.update(task, completed=stage.completed, total=stage.total)


def start_remote(config: RunConfig, retry_failed: bool = False) -> RemoteRun:
    """Start the run's coordinator inside the cluster under a name made from its run id."""
    if config.run_id is None:
        config = config.model_copy(update={"run_id": f"run-{time.strftime('%Y%m%d-%H%M%S')}"})
    run_id = str(config.run_id)
    name = actor_name(run_id)
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        pass
    else:
        raise ClusterError(
            f"Run '{run_id}' is already running in this cluster. Follow it with cluster.attach('{run_id}') "
            "(or `rayeval attach`), or give another --run-id."
        )
    actor = RunCoordinator.options(name=name, namespace=NAMESPACE, lifetime="detached").remote(
        config.model_dump(mode="json"), retry_failed
    )
    return RemoteRun(run_id, actor)


def attach_remote(run_id: str) -> RemoteRun:
    try:
        return RemoteRun(run_id, ray.get_actor(actor_name(run_id), namespace=NAMESPACE))
    except ValueError:
        raise ClusterError(
            f"No run '{run_id}' is running in this cluster, nor waiting to hand over its result (a result is "
            "handed over once). Its run folder on the cluster holds what it wrote; rerun it to resume."
        ) from None
