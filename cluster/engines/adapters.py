"""A LoRA adapter on every engine's node: the run reads the adapter's files where it is coordinated (where it
was checked) and copies them through Ray's object store to each replica's node whose filesystem lacks the
folder or holds other files at its path (hosts without shared storage), into that node's rayeval cache
(`models.checkpoints.staged_adapter_dir`). Nodes that hold the very files (the same digest) get nothing."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from cluster.errors import ClusterError
from cluster.models.checkpoints import adapter_digest, adapter_files
from sharding.requests import Adapter

log = logging.getLogger(__name__)


def stage_adapter(actors: Sequence[Any], adapter: Adapter) -> list[str]:
    """Copy `adapter` to the nodes of those engine actors that lack it; returns those nodes' addresses. An
    actor that does not answer is left out (the dispatcher finds it dead and its replacement gets the copy);
    a ClusterError where a node lacks the adapter and this machine no longer holds the files the run planned."""
    answers = _answers([actor.has_adapter.remote(adapter) for actor in actors])
    lacking = [actor for actor, found in zip(actors, answers, strict=True) if found is False]
    if not lacking:
        return []
    folder = Path(adapter.path)
    files = adapter_files(folder) if folder.is_dir() else {}
    if adapter_digest(files) != adapter.digest:
        raise ClusterError(
            f"LoRA adapter {adapter.name}: {len(lacking)} replica node(s) lack it at {adapter.path}, and "
            f"{adapter.path} on this node ({ray.util.get_node_ip_address()}) is missing or was changed since the "
            "run was planned, so no copy can be made. Keep the adapter's folder where the run is coordinated "
            "until it ends."
        )
    boxed = [ray.put(files)]  # in a list: an actor that finds the files meanwhile does not fetch them
    nodes = [node for node in _answers([a.stage_adapter.remote(adapter, boxed) for a in lacking]) if node]
    megabytes = sum(map(len, files.values())) / 1e6
    log.info("LoRA adapter %s (%.1f MB) copied to node(s) %s", adapter.name, megabytes, ", ".join(nodes))
    return nodes


def _answers(refs: list[Any]) -> list[Any]:
    """Each call's answer, None for an actor that died or is out of reach."""
    found = []
    for ref in refs:
        try:
            found.append(ray.get(ref))
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            log.warning("an engine did not answer about its LoRA adapter: %s", exc)
            found.append(None)
    return found
