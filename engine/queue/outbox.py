"""The outbox: every send of every purpose is a `messages` row, and every change of a row's
status goes through `transition`, a compare-and-set that writes its `message_events` row in the
same transaction. Any actor may run twice; only one of two racing transitions wins.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from sqlalchemy import and_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from engine.core import clock, metrics
from engine.store.dialect import insert_ignore, insert_rows
from engine.store.models import OPEN_STATUSES, message_events, messages


def record_events(
    conn: Connection,
    org_id: int,
    message_ids: Sequence[int],
    event: str,
    *,
    attempt: int | None = None,
    provider_status: str | None = None,
    detail: Mapping[str, Any] | None = None,
    at: datetime | None = None,
) -> None:
    """Append one event per message (the history is append-only), a few hundred rows per statement."""
    if not message_ids:
        return
    at = at or clock.now()
    rows = [
        {
            "org_id": org_id,
            "message_id": mid,
            "event": event,
            "attempt": attempt,
            "provider_status": provider_status,
            "detail": dict(detail) if detail else None,
            "created_at": at,
        }
        for mid in message_ids
    ]
    record_event_rows(conn, rows)


def record_event_rows(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append `message_events` rows, each a full row (org_id, message_id, event, attempt,
    provider_status, detail, created_at): what a batch writes when its rows differ."""
    insert_rows(conn, message_events, rows)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["event"]] = counts.get(row["event"], 0) + 1
    for event, count in counts.items():
        metrics.message_events(event, count)


def transition(
    conn: Connection,
    org_id: int,
    message_id: int,
    from_statuses: Iterable[str],
    to_status: str,
    event: str,
    *,
    values: Mapping[str, Any] | None = None,
    detail: Mapping[str, Any] | None = None,
    provider_status: str | None = None,
    attempt: int | None = None,
) -> bool:
    """Move one message from any of `from_statuses` to `to_status`; False if it was not in one."""
    moved = transition_where(
        conn,
        org_id,
        messages.c.id == message_id,
        from_statuses,
        to_status,
        event,
        values=values,
        detail=detail,
        provider_status=provider_status,
        attempt=attempt,
    )
    return bool(moved)


def transition_where(
    conn: Connection,
    org_id: int,
    where: ColumnElement[bool],
    from_statuses: Iterable[str],
    to_status: str,
    event: str,
    *,
    values: Mapping[str, Any] | None = None,
    detail: Mapping[str, Any] | None = None,
    provider_status: str | None = None,
    attempt: int | None = None,
) -> list[int]:
    """Move every message of the org matching `where` and in `from_statuses`; return their ids."""
    now = clock.now()
    stmt = (
        update(messages)
        .where(and_(messages.c.org_id == org_id, messages.c.status.in_(tuple(from_statuses)), where))
        .values(status=to_status, updated_at=now, **dict(values or {}))
        .returning(messages.c.id)
    )
    ids = [row.id for row in conn.execute(stmt)]
    record_events(conn, org_id, ids, event, detail=detail, provider_status=provider_status, attempt=attempt, at=now)
    return ids


def cancel_open(conn: Connection, org_id: int, where: ColumnElement[bool], reason: str) -> list[int]:
    """Cancel every message matching `where` that has not gone out yet."""
    return transition_where(
        conn, org_id, where, OPEN_STATUSES, "cancelled", "cancelled",
        values={"skip_reason": reason, "lease_until": None}, detail={"reason": reason},
    )


def enqueue(
    conn: Connection,
    *,
    org_id: int,
    contact_id: int,
    channel_kind: str,
    purpose: str,
    idempotency_key: str,
    template_key: str | None = None,
    payload: Mapping[str, Any] | None = None,
    appointment_id: int | None = None,
    appointment_starts_at: datetime | None = None,
    enrollment_id: int | None = None,
    rule_id: int | None = None,
    due_at: datetime | None = None,
    expires_at: datetime | None = None,
    respect_window: bool = True,
    channel_id: int | None = None,
) -> int | None:
    """Put one message in the outbox; returns its id, or None if the key already exists.

    With `respect_window` the row starts as `new` and the planner places it inside the org's
    sending window; without, it is `pending` at `due_at` (replies to a patient who just wrote).
    """
    now = clock.now()
    due = due_at or now
    stmt = insert_ignore(conn, messages, ("org_id", "idempotency_key")).values(
        org_id=org_id,
        purpose=purpose,
        contact_id=contact_id,
        channel_kind=channel_kind,
        channel_id=channel_id,
        appointment_id=appointment_id,
        appointment_starts_at=appointment_starts_at,
        enrollment_id=enrollment_id,
        rule_id=rule_id,
        template_key=template_key,
        respect_window=respect_window,
        payload=dict(payload) if payload else None,
        idempotency_key=idempotency_key,
        status="new" if respect_window else "pending",
        nominal_due_at=due,
        due_at=None if respect_window else due,
        next_attempt_at=None if respect_window else due,
        expires_at=expires_at,
        attempts=0,
        created_at=now,
        updated_at=now,
    ).returning(messages.c.id)
    row = conn.execute(stmt).first()
    if row is None:
        return None
    record_events(conn, org_id, [row.id], "queued", at=now)
    return int(row.id)


def find_id(conn: Connection, org_id: int, idempotency_key: str) -> int | None:
    """The id of the org's message with that idempotency key, if any."""
    return conn.execute(
        select(messages.c.id).where(messages.c.org_id == org_id, messages.c.idempotency_key == idempotency_key)
    ).scalar()


def answer_inbound(conn: Connection, org_id: int, contact_id: int, kind: str, inbound_id: int, template_key: str,
                   appointment_id: int | None = None) -> None:
    """Answer a patient's message on the channel kind they wrote on, right away (they just wrote):
    a confirmation, a cancellation or an opt-out acknowledged, once per message and template."""
    enqueue(
        conn, org_id=org_id, contact_id=contact_id, channel_kind=kind, purpose=template_key,
        idempotency_key=f"inbound:{inbound_id}:{template_key}", template_key=template_key,
        appointment_id=appointment_id, respect_window=False,
    )
