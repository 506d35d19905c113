"""Where one replica's engine goes: the resources it asks of Ray, the layout of its placement group on a
cluster's nodes, and the executor that layout needs. Plain Python: a plan and a dry run read it without Ray."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.config import RunConfig


class ExecutorKind(StrEnum):
    """How one replica's engine runs its tensor- and pipeline-parallel workers."""

    SINGLE = "single"  # one worker, inside the engine's own process
    MP = "mp"  # vLLM's multiprocessing executor: worker processes on the replica's one node (the faster one)
    RAY = "ray"  # vLLM's Ray executor: one Ray actor per worker, on the replica's bundles over several nodes


@dataclass(frozen=True)
class ReplicaLayout:
    """One replica's placement group: its bundles, Ray's strategy for them, and the executor that fits."""

    bundles: tuple[dict[str, float], ...]
    strategy: str
    executor: ExecutorKind

    def describe(self) -> str:
        shown = " + ".join(_resources(b) for b in self.bundles)
        where = "on one node" if self.strategy == "STRICT_PACK" else "packed, then spread over nodes"
        return f"{len(self.bundles)} bundle(s) {shown} {where} (executor: {self.executor})"


@dataclass(frozen=True)
class ReplicaPlan:
    """Resources of one replica: `bundle` is all of it, and fits one node when the node is big enough."""

    bundle: dict[str, float]
    workers: int

    def describe(self) -> str:
        return f"{_resources(self.bundle)} for {self.workers} engine worker(s)"

    def one_node(self) -> ReplicaLayout:
        executor = ExecutorKind.MP if self.workers > 1 else ExecutorKind.SINGLE
        return ReplicaLayout((dict(self.bundle),), "STRICT_PACK", executor)

    def over_nodes(self) -> ReplicaLayout | None:
        """One bundle per GPU worker (the first also holds the engine's CPU), for vLLM's Ray executor. None
        where that cannot be: one worker, or CPU engines (vLLM's CPU backend has no Ray executor)."""
        gpus = self.bundle.get("GPU", 0)
        if self.workers < 2 or gpus != self.workers:
            return None
        first = {k: v for k, v in self.bundle.items() if k != "GPU"} | {"GPU": 1.0}
        rest = ({"GPU": 1.0},) * (self.workers - 1)
        return ReplicaLayout((first, *rest), "PACK", ExecutorKind.RAY)

    def layout_for(self, nodes: list[dict[str, float]]) -> ReplicaLayout | None:
        """The layout for a cluster whose nodes have these resources (totals, not what is free now): one node
        where one holds the whole replica, else over nodes where the GPU nodes hold its bundles together;
        None where neither fits."""
        if any(_holds(node, self.bundle) for node in nodes):
            return self.one_node()
        spread = self.over_nodes()
        if spread is None or not any(_holds(node, spread.bundles[0]) for node in nodes):
            return None
        return spread if sum(int(node.get("GPU", 0)) for node in nodes) >= self.workers else None

    def layout_note(self) -> str:
        """For --dry-run, before any cluster is seen: the layout each kind of cluster gets."""
        one, spread = self.one_node(), self.over_nodes()
        if spread is None:
            return one.describe()
        return (
            f"{one.describe()}; where no node has {self.workers} GPUs: {spread.describe()}. Ray picks the "
            "nodes when the replica is placed; the run log and summary.json (engines[].nodes) name them"
        )


def _holds(node: dict[str, float], bundle: dict[str, float]) -> bool:
    return all(node.get(k, 0) >= v for k, v in bundle.items())


def _resources(bundle: dict[str, float]) -> str:
    return "{" + ", ".join(f"{v:g} {k}" for k, v in sorted(bundle.items())) + "}"


def replica_plan(config: RunConfig, device: str) -> ReplicaPlan:
    workers = config.model.tensor_parallel_size * config.model.pipeline_parallel_size
    per_worker = config.cluster.cpus_per_worker
    if device == "gpu":
        return ReplicaPlan({"CPU": per_worker, "GPU": float(workers)}, workers)
    return ReplicaPlan({"CPU": per_worker * workers}, workers)
