"""A run whose coordinator lives inside the cluster: a named, detached Ray actor that plans and runs it, so a
Ray client (a notebook, `--address ray://...`) only starts it, follows its progress and fetches the result.
A client that disconnects leaves the run going; `attach(run_id)` from a new session follows it again.

Where its files go is a rule: the coordinator runs on the head node (or the node `--coordinator-node`
names), pinned there, and every path of the config is that node's; a relative path is refused before
anything starts, since the client's folders mean nothing there. The variables the run needs from the
client's machine (`forwarded_env`) reach it in a method call. Once its run has ended, it exits when a
client has fetched the result, or after `coordinator_idle_timeout_s` without one; its files stay.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cluster.config import RunConfig
from cluster.errors import ClusterError
from cluster.forwarded_env import ForwardedEnv, api_key_names, collect, names_for
from cluster.head_node import head_node_id
from cluster.progress import Stage, progress_bar, snapshot
from cluster.run.paths import StoredConfigOverrides
from cluster.run.result import RunResult, load_records
from evaluators.errors import EvalInputError

log = logging.getLogger(__name__)

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
    lives until a client has fetched the result and released it, or until it has been idle that long."""

    def __init__(
        self, config: dict[str, Any], retry_failed: bool, stored: StoredConfigOverrides | None = None
    ) -> None:
        self.config = RunConfig.model_validate(config)
        self.stored = stored  # a --judge-only run's flags, merged into its config.yaml here, on this node
        self.retry_failed = retry_failed
        self.result: RunResult | None = None
        self.error: str | None = None
        self.error_is_input = False
        self.last_contact = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="rayeval-run", daemon=True)

    def begin(self, env: ForwardedEnv) -> str:
        """Take the variables the client handed over, start the run, and say which node it runs on."""
        env.apply()
        log.info("run %s: variables from the client: %s", self.config.run_id, env)
        self.thread.start()
        threading.Thread(target=self._exit_when_idle, name="rayeval-idle", daemon=True).start()
        return ray.util.get_node_ip_address()

    def _run(self) -> None:
        from cluster.plan import build_plan
        from cluster.preflight import preflight
        from cluster.run.coordinator import run_evaluation
        from cluster.session import cluster_has_gpus

        try:
            if self.stored is not None:
                self.config = self.stored.config(self.config.output_dir, self.config.run_id)
            device = None  # planned inside the cluster, whose GPUs decide `auto`
            if self.config.cluster.device == "auto":
                device = "gpu" if cluster_has_gpus() else "cpu"
            plan = build_plan(self.config, device=device)
            preflight(plan)  # a client run is checked here, where it is planned, and nowhere else
            self.result = run_evaluation(plan, progress=False, retry_failed=self.retry_failed)
        except EvalInputError as exc:
            self.error, self.error_is_input = str(exc), True
        except Exception as exc:  # noqa: BLE001 - the client shows it as the run's error
            self.error = str(exc) if isinstance(exc, ClusterError) else f"{type(exc).__name__}: {exc}"
        finally:
            self.last_contact = time.monotonic()  # the idle time counts from the run's end

    def _exit_when_idle(self) -> None:
        """Once the run has ended, go when no client has asked anything for the idle timeout."""
        idle_s = self.config.cluster.coordinator_idle_timeout_s
        while self.thread.is_alive() or time.monotonic() - self.last_contact < idle_s:
            time.sleep(min(1.0, idle_s / 4))
        log.warning("run %s: no client fetched its result for %g s; exiting", self.config.run_id, idle_s)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def status(self) -> RunStatus:
        self.last_contact = time.monotonic()
        return RunStatus(
            self.config.run_id or "", snapshot(), not self.thread.is_alive(), self.error, self.error_is_input
        )

    def result_of_run(self) -> RunResult | None:
        self.last_contact = time.monotonic()
        return self.result

    def records(self) -> dict[str, Any]:
        """The finished run's per-sample records, one pandas DataFrame per task."""
        self.last_contact = time.monotonic()
        return load_records(self.result.run_dir, missing_ok=True) if self.result is not None else {}

    def release(self) -> None:
        ray.actor.exit_actor()


class RemoteRun:
    """The client's handle on a run inside the cluster."""

    def __init__(self, run_id: str, actor: ray.actor.ActorHandle, node_ip: str = "") -> None:
        self.run_id = run_id
        self.actor = actor
        self.node_ip = node_ip  # the coordinator's node, where the run folder is

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


def start_remote(
    config: RunConfig, retry_failed: bool = False, stored: StoredConfigOverrides | None = None
) -> RemoteRun:
    """Start the run's coordinator inside the cluster, on its node, under a name made from its run id, and
    hand it the variables it needs from this machine."""
    check_paths_for_the_cluster(config)
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
    node_id = coordinator_node(config.cluster.coordinator_node)
    actor = RunCoordinator.options(
        name=name,
        namespace=NAMESPACE,
        lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(config.model_dump(mode="json"), retry_failed, stored)
    node_ip = ray.get(actor.begin.remote(collect(names_for(config), api_key_names(config))))
    log.info(
        "run %s is coordinated on node %s; its folder: %s/%s", run_id, node_ip, config.output_dir, run_id
    )
    return RemoteRun(run_id, actor, node_ip)


def check_paths_for_the_cluster(config: RunConfig) -> None:
    """Refuse a relative path before the run goes to the cluster: there it would be resolved on the
    coordinator's node, against a folder the user never chose."""
    paths = {"--output-dir": [config.output_dir], "--lora": [config.model.lora]}
    paths["lm_eval.include_path (--include-path)"] = list(config.lm_eval.include_path)
    for task in config.tasks:
        paths[f"tasks.{task.name}.data_path"] = [task.data_path]
        paths[f"tasks.{task.name}.fewshot_path"] = [task.fewshot_path]
    for setting, values in paths.items():
        for value in values:
            if value is not None and "://" not in value and not Path(value).is_absolute():
                raise EvalInputError(
                    f"{setting} {value} is a relative path, but this run is coordinated inside the cluster, on "
                    "the head node (or --coordinator-node), where every path of the config is that node's: give "
                    f"an absolute path there, on storage you can read back (a filesystem mounted at the same "
                    f"path on every node, the head's own disk, or for --output-dir object storage such as "
                    f"s3://BUCKET/PREFIX), e.g. {setting.split()[0]} /shared/{value}."
                )


def coordinator_node(wanted: str | None) -> str:
    """The node id of the head node, or of the node `wanted` names (its IP address, hostname or node id)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if wanted is None and (head := head_node_id(nodes)) is not None:
        return head
    for node in nodes:
        if wanted in (node["NodeID"], node.get("NodeManagerAddress"), node.get("NodeManagerHostname")):
            return str(node["NodeID"])
    known = ", ".join(f"{n.get('NodeManagerAddress')} ({n.get('NodeManagerHostname')})" for n in nodes)
    raise EvalInputError(
        f"--coordinator-node {wanted}: no live node of this cluster has that address, hostname or node id "
        f"(its nodes: {known}); leave it out to run the coordinator on the head node."
        if wanted
        else f"This cluster reports no head node to coordinate the run on (its nodes: {known}); name one "
        "with --coordinator-node."
    )


def attach_remote(run_id: str) -> RemoteRun:
    try:
        return RemoteRun(run_id, ray.get_actor(actor_name(run_id), namespace=NAMESPACE))
    except ValueError:
        raise ClusterError(
            f"No run '{run_id}' is running in this cluster, nor waiting to hand over its result (a result is "
            "handed over once). Its run folder on the cluster holds what it wrote; rerun it to resume."
        ) from None
