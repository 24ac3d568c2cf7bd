"""The low-level writes every part of the flows engine shares: the event log of an enrollment
and ending live enrollments in bulk (opt-out, hand-off cancel, a disabled flow, erasure).

Every change to an enrollment bumps its `revision`, so a claim taken before the change is
recognised as stale when its actor runs (see runtime.advance).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Sequence

from sqlalchemy import and_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from engine.core import clock, metrics
from engine.store.dialect import insert_rows
from engine.flows.schema import NODE_TYPES
from engine.store.models import enrollment_events, enrollments, messages
from engine.queue.outbox import cancel_open
from engine.tenants.webhooks import events as webhooks

#: Statuses of an enrollment that is still in its flow (the partial unique index's set).
LIVE = ("active", "waiting_reply", "paused_handoff")
#: Statuses the clock drives (next_eval_at is set).
CLOCKED = ("active", "waiting_reply")
TERMINAL = ("completed", "cancelled", "dead")
#: The outcome kinds of a step, as the run timeline shows them.
STEP_STATUSES = ("ok", "skipped", "failed", "waiting", "deferred", "stale")
#: What a `step` event can be about: a node, or the wake that found nothing to do.
STEP_KINDS = NODE_TYPES + ("wake",)


def record_event(
    conn: Connection, org_id: int, enrollment_id: int, event_type: str, key: str, *,
    node_id: str | None = None, payload: Mapping[str, Any] | None = None, at: datetime | None = None,
) -> bool:
    """Append one event, once per (enrollment, key); False when the key was already there."""
    journal = Journal()
    journal.add(org_id, enrollment_id, event_type, key, node_id=node_id, payload=payload, at=at)
    return journal.flush(conn) == 1


class Journal:
    """Events of several enrollments appended together: a claim's steps are one multi-row
    `INSERT`, not one statement per enrollment. Each event is still written once per
    (enrollment, key)."""

    def __init__(self) -> None:
        self._rows: list[dict[str, Any]] = []

    def add(self, org_id: int, enrollment_id: int, event_type: str, key: str, *, node_id: str | None = None,
            payload: Mapping[str, Any] | None = None, at: datetime | None = None) -> None:
        """Queue one event for `flush`."""
        self._rows.append({"org_id": org_id, "enrollment_id": enrollment_id, "node_id": node_id,
                           "event_type": event_type, "payload": dict(payload) if payload else None,
                           "idempotency_key": key, "created_at": at or clock.now()})

    def flush(self, conn: Connection) -> int:
        """Write the queued events in the connection's transaction; returns how many were new."""
        rows, self._rows = self._rows, []
        if not rows:
            return 0
        # One statement text for any count of rows (PostgreSQL reads them from one JSON
        # parameter): a multi-row VALUES was compiled again for every claim, and the rows as
        # executemany parameters made SQLAlchemy render a VALUES list of a claim's rows that
        # psycopg split into placeholders again for every claim (a quarter of a with-send
        # worker's samples in bench/flows.py --py-spy).
        stored = {(r.enrollment_id, r.idempotency_key) for r in insert_rows(
            conn, enrollment_events, rows, ignore_conflicts=("enrollment_id", "idempotency_key"),
            returning=(enrollment_events.c.enrollment_id, enrollment_events.c.idempotency_key))}
        for row in rows:
            if (row["enrollment_id"], row["idempotency_key"]) in stored:
                _count_step(row["event_type"], row["payload"])
        return len(stored)


def _count_step(event_type: str, payload: Mapping[str, Any] | None) -> None:
    """Count a newly stored `step` event (its kind, status and LLM calls) in the metrics."""
    if event_type != "step" or not payload:
        return
    kind = payload.get("kind")
    status = payload.get("status")
    metrics.flow_step(kind if kind in STEP_KINDS else "other", status if status in STEP_STATUSES else "other",
                      int(payload.get("llm_calls") or 0))


def step_payload(
    *, kind: str, status: str, reason: str, next_node: str | None = None, until: datetime | None = None,
    llm_calls: int = 0, params: Mapping[str, Any] | None = None, exit: tuple[str, Any] | None = None,
) -> dict[str, Any]:
    """The payload of a `step` event: one line of a run's timeline (no patient data in it). `exit`
    is the edge condition the step left by to `next_node`, recorded as `{"type", "value"?}`."""
    payload: dict[str, Any] = {"kind": kind, "status": status, "reason": reason, "llm_calls": llm_calls}
    if next_node is not None:
        payload["next"] = next_node
        if exit is not None:
            payload["exit"] = {"type": exit[0]} if exit[1] is None else {"type": exit[0], "value": exit[1]}
    if until is not None:
        payload["until"] = until.isoformat()
    if params:
        payload["params"] = dict(params)
    return payload


def end_live(
    conn: Connection, org_id: int, where: ColumnElement[bool], *, status: str, outcome: str | None,
    reason: str, statuses: Sequence[str] = LIVE,
) -> list[int]:
    """End every live enrollment of the org matching `where`: status, outcome and reason set,
    clock stopped, its follow-ups not yet sent cancelled, one event each. Returns their ids."""
    now = clock.now()
    rows = conn.execute(
        update(enrollments)
        .where(and_(enrollments.c.org_id == org_id, enrollments.c.status.in_(tuple(statuses)), where))
        .values(status=status, outcome=outcome, cancel_reason=reason, next_eval_at=None, lease_until=None,
                pending_inbound_id=None, ended_at=now, updated_at=now, revision=enrollments.c.revision + 1)
        .returning(enrollments.c.id, enrollments.c.current_node_id, enrollments.c.revision)
    ).all()
    if not rows:
        return []
    ids = [row.id for row in rows]
    cancel_open(conn, org_id, messages.c.enrollment_id.in_(ids), reason)
    for row in rows:
        record_event(conn, org_id, row.id, "ended", f"ended:{row.revision}", node_id=row.current_node_id,
                     payload={"status": status, "outcome": outcome, "reason": reason}, at=now)
        webhooks.run_ended(conn, org_id, row.id, status=status, outcome=outcome, reason=reason)
    return ids


def live_ids(conn: Connection, org_id: int, contact_ids: Sequence[int], *, lock: bool = False) -> list[Any]:
    """The live enrollments of these contacts (id, pointer, version, node, status, revision, the
    reply held, the place in a conversation). With `lock`, their rows stay locked (PostgreSQL) until
    the caller's transaction ends: a step under way on one of them is waited for and then seen as
    it committed, rather than racing it."""
    query = (select(enrollments.c.id, enrollments.c.pointer_id, enrollments.c.version_id,
                    enrollments.c.current_node_id, enrollments.c.status, enrollments.c.revision,
                    enrollments.c.pending_inbound_id, enrollments.c.ask_state)
             .where(enrollments.c.org_id == org_id, enrollments.c.contact_id.in_(list(contact_ids)),
                    enrollments.c.status.in_(LIVE))
             .order_by(enrollments.c.id))
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return conn.execute(query).all()
