"""The connected cluster's head node: where the actors that hold the cluster's state live (the warm-pool
registry, a run's coordinator), as Ray Serve keeps its controller there. A worker node can be lost with its
work; the head's loss ends the cluster anyway."""

from __future__ import annotations

from typing import Any

HEAD_RESOURCE = "node:__internal_head__"  # Ray's resource of the head node


def head_node_id(nodes: list[dict[str, Any]]) -> str | None:
    """The live head's node id among `ray.nodes()`; None where none reports Ray's head resource."""
    for node in nodes:
        if node.get("Alive") and HEAD_RESOURCE in node.get("Resources", {}):
            return str(node["NodeID"])
    return None
