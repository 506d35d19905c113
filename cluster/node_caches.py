"""rayeval's cache on this machine or on every node of a running cluster, listed or pruned: on a cluster by a
task on each node, since each node keeps its own (its home or $RAYEVAL_CACHE there; a cluster's hosts need
not share a filesystem). Ray is imported only where a cluster is asked, so this machine's listing is quick."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cluster.errors import ClusterError
from cluster.models.cache import CacheEntry, CacheKind, list_entries, prune

if TYPE_CHECKING:
    import ray

NODE_TIMEOUT_S = 120.0  # a prune of large merged checkpoints on a slow disk takes a while


@dataclasses.dataclass(frozen=True)
class NodeAnswer:
    """One node's entries (listed or pruned), or why it gave none."""

    node: str  # the node's IP as Ray lists it; this machine's host name without a cluster
    entries: tuple[CacheEntry, ...] = ()
    problem: str = ""


def cache_entries(address: str | None, kinds: tuple[CacheKind, ...]) -> list[NodeAnswer]:
    """The cache's entries of `kinds` on this machine (no address) or on every node of the cluster."""
    return _where(address, list_entries, kinds)


def prune_caches(
    address: str | None, kinds: tuple[CacheKind, ...], unused_for_s: float, dry_run: bool
) -> list[NodeAnswer]:
    """Remove the entries of `kinds` unused for `unused_for_s` on this machine or every node (with
    `dry_run`, list them); returns what each node removed."""
    return _where(address, prune, kinds, unused_for_s, dry_run=dry_run)


def _where(
    address: str | None, work: Callable[..., list[CacheEntry]], *args: Any, **kwargs: Any
) -> list[NodeAnswer]:
    if address is None:
        return [NodeAnswer(socket.gethostname(), tuple(work(*args, **kwargs)))]
    return on_every_node(address, work, *args, **kwargs)


def on_every_node(
    address: str, work: Callable[..., list[CacheEntry]], *args: Any, **kwargs: Any
) -> list[NodeAnswer]:
    """`work(*args, **kwargs)` run by a task on each alive node of the cluster at `address` (no CPU asked,
    pinned to the node), its entries named by the node's IP; a node that fails or does not answer in time
    is reported, and the others' answers stand."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from cluster.session import joined_session

    with joined_session(address):
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        if not nodes:
            raise ClusterError(f"The cluster at {address} lists no alive node.")
        task = ray.remote(num_cpus=0, max_retries=0)(work)
        pending = {
            node["NodeManagerAddress"]: task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(*args, **kwargs)
            for node in nodes
        }
        ray.wait(list(pending.values()), num_returns=len(pending), timeout=NODE_TIMEOUT_S)
        return [_answer(ip, ref) for ip, ref in sorted(pending.items())]


def _answer(ip: str, ref: ray.ObjectRef) -> NodeAnswer:
    import ray

    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        ray.cancel(ref, force=True)
        return NodeAnswer(ip, problem=f"no answer within {NODE_TIMEOUT_S:g} s")
    try:
        entries = ray.get(ref)
    except Exception as exc:  # noqa: BLE001 - one node's failure (its disk, a version mismatch) is reported
        cause = getattr(exc, "cause", None) or exc  # the task's own exception, not Ray's wrapper
        return NodeAnswer(ip, problem=f"{type(cause).__name__}: {cause}")
    return NodeAnswer(ip, tuple(dataclasses.replace(entry, node=ip) for entry in entries))
