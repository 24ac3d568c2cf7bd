"""What the Fluxos list does to a whole flow besides creating it: duplicate it (a draft copy, never
published) and delete it.

A flow is deleted only while nothing points at it: no run, past or live (a run's history — its
events, the replies it read, the messages it sent — names its flow and version, and must stay
readable: a flow that has run is disabled, never deleted), and no other flow of the org that
starts it (`do` → start_flow, in a draft or in the active version). An agent's list of flows
simply loses it.
"""

from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from engine.core.errors import DomainError
from engine.flows import lifecycle
from engine.flows.versions import FlowNameTaken, create_flow, get_flow
from engine.store.models import agents, enrollments, flow_claims, flow_pointers, flow_versions


class FlowInUse(DomainError):
    """The flow cannot be deleted: `why` is "live" (`count` runs in progress), "history" (it has
    run before) or "started_by" (the flow named `other` starts it)."""

    def __init__(self, why: str, *, count: int = 0, other: str | None = None) -> None:
        super().__init__(f"flow in use: {why}")
        self.why, self.count, self.other = why, count, other


def duplicate_flow(conn: Connection, org_id: int, pointer_id: int, *, names: Iterable[str]) -> int:
    """A draft copy of the org's flow (its draft graph and settings), under the first of `names`
    no flow of the org has; FlowNotFound for another org's flow, FlowNameTaken when every name
    is taken. The copy is unpublished: it starts nobody until someone publishes it."""
    source = get_flow(conn, org_id, pointer_id)
    for name in names:
        try:
            return create_flow(conn, org_id, name=name, draft_graph=source.draft_graph,
                               trigger_config=source.trigger_config, handoff_policy=source.handoff_policy,
                               cancel_on_reply=source.cancel_on_reply, max_steps=source.max_steps,
                               resume_grace_minutes=source.resume_grace_minutes)
        except FlowNameTaken:
            continue
    raise FlowNameTaken("every copy name is taken")


def _starts(graph: Any, pointer_id: int) -> bool:
    """Whether a graph has a node that starts flow `pointer_id`."""
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    for node in nodes if isinstance(nodes, list) else ():
        config = node.get("config") if isinstance(node, dict) else None
        if isinstance(config, dict) and config.get("action") == "start_flow" and config.get("flow_id") == pointer_id:
            return True
    return False


def delete_flow(conn: Connection, org_id: int, pointer_id: int) -> Any:
    """Delete one of the org's flows and its versions; returns the deleted pointer row.
    FlowNotFound for another org's flow; FlowInUse when something needs it (the caller rolls
    back: an agent's list may already have lost the flow)."""
    flow = get_flow(conn, org_id, pointer_id)
    e = enrollments.c
    live, total = conn.execute(
        select(func.coalesce(func.sum(case((e.status.in_(lifecycle.LIVE), 1), else_=0)), 0), func.count())
        .where(e.org_id == org_id, e.pointer_id == pointer_id)).one()
    if live:
        raise FlowInUse("live", count=int(live))
    if total:
        raise FlowInUse("history", count=int(total))
    active = flow_versions.alias("active")
    others = conn.execute(
        select(flow_pointers.c.name, flow_pointers.c.draft_graph, active.c.graph)
        .outerjoin(active, (active.c.id == flow_pointers.c.active_version_id) & (active.c.org_id == org_id))
        .where(flow_pointers.c.org_id == org_id, flow_pointers.c.id != pointer_id))
    for other in others:
        if _starts(other.draft_graph, pointer_id) or _starts(other.graph, pointer_id):
            raise FlowInUse("started_by", other=other.name)
    for agent in conn.execute(select(agents.c.id, agents.c.flow_pointer_ids).where(agents.c.org_id == org_id)):
        ids = agent.flow_pointer_ids if isinstance(agent.flow_pointer_ids, list) else []
        if pointer_id in ids:
            conn.execute(update(agents).where(agents.c.org_id == org_id, agents.c.id == agent.id)
                         .values(flow_pointer_ids=[i for i in ids if i != pointer_id]))
    try:
        # A run a trigger starts meanwhile holds the pointer by its key: the delete then fails
        # and nothing is written (the savepoint), like a flow found with a run above.
        with conn.begin_nested():
            conn.execute(delete(flow_claims).where(flow_claims.c.org_id == org_id,
                                                   flow_claims.c.pointer_id == pointer_id))
            conn.execute(delete(flow_versions).where(flow_versions.c.org_id == org_id,
                                                     flow_versions.c.pointer_id == pointer_id))
            conn.execute(delete(flow_pointers).where(flow_pointers.c.org_id == org_id,
                                                     flow_pointers.c.id == pointer_id))
    except IntegrityError:
        raise FlowInUse("history") from None
    return flow
