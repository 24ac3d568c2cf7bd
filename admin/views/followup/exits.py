"""A step's exit in the reader's words (Completo, Sim, Sem resposta, the class's name…): the
builder's edges, the Testar panel and a run's timeline say them alike."""

from __future__ import annotations

from typing import Any, Mapping

from admin.i18n import _
from engine.flows.graph import GraphIndex


def edge_words() -> dict[str, Any]:
    """The name of each kind of exit, as the canvas writes it on an edge."""
    return {"always": _("Sempre"), "cond_true": _("Sim"), "cond_false": _("Não"),
            "no_reply": _("Sem resposta"), "replied": _("Respondeu"), "fallback": _("Outra resposta"),
            "complete": _("Completo"), "gave_up": _("Desistiu"), "ok": _("Feito"), "failed": _("Falhou"),
            "unavailable": _("Sem horário")}


def class_label(graph: GraphIndex, node_id: str | None, slug: Any) -> Any:
    """A class under the name the builder gave it on this node ("Não quer", in its `labels`); the
    slug when the node has no name for it (or the version has no such node)."""
    if node_id is None or not isinstance(slug, str):
        return slug
    try:
        labels = graph.config(node_id).get("labels") or {}
    except KeyError:
        return slug
    named = labels.get(slug) if isinstance(labels, Mapping) else None
    return named if isinstance(named, str) and named else slug


def exit_label(condition: Mapping[str, Any] | None, graph: GraphIndex, node_id: str | None,
               edges: Mapping[str, Any] | None = None) -> str | None:
    """An exit (`{"type", "value"?}`, as a step's event records it) in the canvas's words."""
    if not condition:
        return None
    edges = edges if edges is not None else edge_words()
    kind, value = condition.get("type"), condition.get("value")
    if kind == "class_match":
        return str(class_label(graph, node_id, value))
    if kind == "cond_result":
        return str(edges.get("cond_true" if value else "cond_false"))
    if kind == "always" and node_id is not None and _type(graph, node_id) == "ai_classify":
        return str(edges.get("fallback"))
    return str(edges.get(kind, kind))


def _type(graph: GraphIndex, node_id: str) -> str | None:
    try:
        return graph.type(node_id)
    except KeyError:
        return None


def last_class_label(graph: GraphIndex, slug: str | None) -> str | None:
    """A run's last class (`enrollments.last_class`) under its name in the version that ran: the
    first classifying step of that version that names it; `no_reply` as its exit's name; the slug
    when no step names it (a class of a version published before classes had names)."""
    if not slug:
        return None
    if slug == "no_reply":
        return str(edge_words()["no_reply"])
    for node_id in graph.node_ids:
        if graph.type(node_id) == "ai_classify":
            named = class_label(graph, node_id, slug)
            if named != slug:
                return str(named)
    return slug
