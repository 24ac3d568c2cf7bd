"""`GraphIndex`: the lookups the runtime makes on a published graph, as dicts built once per
version (versions are immutable, so `versions.graph_of` caches one index per version)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


def edge_key(condition_type: str, value: Any = None) -> tuple[str, Any]:
    """How the edges leaving one node are told apart: the condition type, plus the value for
    `class_match` (the class) and `cond_result` (true/false). Any other value is ignored."""
    if condition_type == "class_match":
        return condition_type, value if isinstance(value, str) else ("not a class", repr(value))
    if condition_type == "cond_result":
        # True == 1 (and hashes alike) in Python: name the booleans so 1 can never pass for true.
        return condition_type, ("true" if value else "false") if isinstance(value, bool) else ("not a boolean",
                                                                                               repr(value))
    return condition_type, None


class GraphIndex:
    """Node, config and out-edge lookups over a graph `{"nodes": [...], "edges": [...]}`.

    Meant for published (validated, normalized) graphs. On a graph that breaks the publish rules
    it still works where it can: `trigger_id` is the first trigger (None when there is none) and
    `target` answers with the first matching edge. Edges whose source is not a node are ignored.
    """

    def __init__(self, graph: Mapping[str, Any]) -> None:
        nodes: dict[str, Mapping[str, Any]] = {}
        for node in graph.get("nodes") or ():
            if node["id"] in nodes:
                raise ValueError(f"duplicate node id {node['id']!r}")
            nodes[node["id"]] = node
        out: dict[str, list[Mapping[str, Any]]] = {node_id: [] for node_id in nodes}
        targets: dict[tuple[str, str, Any], str] = {}
        for edge in graph.get("edges") or ():
            source = edge["source"]
            if source not in out:
                continue
            out[source].append(edge)
            condition = edge.get("condition") or {}
            key = edge_key(condition.get("type", ""), condition.get("value"))
            targets.setdefault((source, *key), edge["target"])
        self._nodes = MappingProxyType(nodes)
        self._out = {node_id: tuple(edges) for node_id, edges in out.items()}
        self._targets = targets
        self.node_ids: tuple[str, ...] = tuple(nodes)
        self.trigger_id: str | None = next((i for i, n in nodes.items() if n.get("type") == "trigger"), None)
        self._smart_waits = tuple(i for i, n in nodes.items()
                                  if n.get("type") == "wait" and (n.get("config") or {}).get("mode") == "smart")

    def node(self, node_id: str) -> Mapping[str, Any]:
        """The node as stored; KeyError for an id the graph does not have."""
        return self._nodes[node_id]

    def type(self, node_id: str) -> str:
        """The node's type (`trigger`, `wait`, `condition`, `ai_classify`, `action`, `end`)."""
        return self._nodes[node_id]["type"]

    def config(self, node_id: str) -> Mapping[str, Any]:
        """The node's config (complete, with defaults, in a published version)."""
        return self._nodes[node_id].get("config") or {}

    def out_edges(self, node_id: str) -> list[Mapping[str, Any]]:
        """The edges leaving the node, in graph order; KeyError for an unknown node."""
        return list(self._out[node_id])

    def target(self, node_id: str, condition_type: str, value: Any = None) -> str | None:
        """The node the edge leaving `node_id` with this condition goes to, or None when there is
        no such edge. For `class_match` the class (`value`) must match, for `cond_result` the
        boolean; for the other types `value` is ignored."""
        return self._targets.get((node_id, *edge_key(condition_type, value)))

    def smart_waits(self) -> list[str]:
        """The ids of the graph's smart waits, in graph order (the trigger plans them at once)."""
        return list(self._smart_waits)
