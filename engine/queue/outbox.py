"""The outbox: every send of every purpose is a `messages` row, and every change of a row's
status goes through `transition`, a compare-and-set that writes its `message_events` row in the
same transaction. Any actor may run twice; only one of two racing transitions wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from sqlalchemy import and_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from engine.core import clock, metrics
from engine.store.dialect import insert_rows, update_per_row
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


def defer_many(conn: Connection, deferred: Sequence[tuple[int, int, datetime]], reason: str) -> list[int]:
    """Put claimed messages back in the queue, each until its own instant, in two statements for
    any count (`transition` is two a message): `deferred` is (org_id, message_id, until) triples.
    Returns the ids moved; a message no longer `claimed` is left alone, as `transition` leaves it."""
    if not deferred:
        return []
    now = clock.now()
    org_of = {message_id: org_id for org_id, message_id, _ in deferred}
    moved = [row.id for row in update_per_row(
        conn, messages,
        {message_id: {"org_id": org_id, "next_attempt_at": until} for org_id, message_id, until in deferred},
        match=("org_id",), where=[messages.c.status == "claimed"],
        values={"status": "pending", "lease_until": None, "updated_at": now}, returning=[messages.c.id])]
    record_event_rows(conn, [{"org_id": org_of[message_id], "message_id": message_id, "event": "deferred",
                              "attempt": None, "provider_status": None, "detail": {"reason": reason},
                              "created_at": now} for message_id in moved])
    return moved


def cancel_open(conn: Connection, org_id: int, where: ColumnElement[bool], reason: str) -> list[int]:
    """Cancel every message matching `where` that has not gone out yet."""
    return transition_where(
        conn, org_id, where, OPEN_STATUSES, "cancelled", "cancelled",
        values={"skip_reason": reason, "lease_until": None}, detail={"reason": reason},
    )


@dataclass(frozen=True)
class Outgoing:
    """One message to put in the outbox: whom it is for, on what kind of channel, why (its
    `purpose`), its idempotency key (one message per org and key, ever) and what it says."""

    org_id: int
    contact_id: int
    channel_kind: str
    purpose: str
    idempotency_key: str
    template_key: str | None = None
    payload: Mapping[str, Any] | None = None
    appointment_id: int | None = None
    appointment_starts_at: datetime | None = None
    enrollment_id: int | None = None
    rule_id: int | None = None
    due_at: datetime | None = None
    expires_at: datetime | None = None
    #: `new` and placed by the planner inside the org's sending window; False: `pending` at
    #: `due_at` (replies to a patient who just wrote).
    respect_window: bool = True
    channel_id: int | None = None


def enqueue(conn: Connection, **message: Any) -> int | None:
    """Put one message in the outbox (the fields of `Outgoing`); returns its id, or None if the
    key already exists."""
    return enqueue_many(conn, [Outgoing(**message)])[0]


def enqueue_many(conn: Connection, outgoing: Sequence[Outgoing]) -> list[int | None]:
    """Put messages in the outbox, in one statement for the rows and one for their `queued`
    events (a claim's follow-ups, not a statement and an event per message); returns each one's
    id, or None where its key was already taken (before, or by an earlier one of `outgoing`).

    With `respect_window` a row starts as `new` and the planner places it inside the org's
    sending window, writing its `queued` (or `skipped`) event then, as it does for the reminders
    populate writes `new` (an event here too gave it two `queued`); without, it is `pending` at
    `due_at` (replies to a patient who just wrote), `queued` here."""
    if not outgoing:
        return []
    now = clock.now()
    rows = [_row(message, now) for message in outgoing]
    written = insert_rows(conn, messages, rows, ignore_conflicts=("org_id", "idempotency_key"),
                          returning=(messages.c.id, messages.c.org_id, messages.c.idempotency_key))
    new = {(row.org_id, row.idempotency_key): int(row.id) for row in written}
    ids: list[int | None] = []
    for message in outgoing:
        # A key given twice in one batch was written once: the first of them has the id.
        ids.append(new.pop((message.org_id, message.idempotency_key), None))
    record_event_rows(conn, [{"org_id": message.org_id, "message_id": message_id, "event": "queued",
                              "attempt": None, "provider_status": None, "detail": None, "created_at": now}
                             for message, message_id in zip(outgoing, ids)
                             if message_id is not None and not message.respect_window])
    return ids


def _row(message: Outgoing, now: datetime) -> dict[str, Any]:
    due = message.due_at or now
    window = message.respect_window
    return {
        "org_id": message.org_id, "purpose": message.purpose, "contact_id": message.contact_id,
        "channel_kind": message.channel_kind, "channel_id": message.channel_id,
        "appointment_id": message.appointment_id, "appointment_starts_at": message.appointment_starts_at,
        "enrollment_id": message.enrollment_id, "rule_id": message.rule_id, "template_key": message.template_key,
        "respect_window": window, "payload": dict(message.payload) if message.payload else None,
        "idempotency_key": message.idempotency_key, "status": "new" if window else "pending",
        "nominal_due_at": due, "due_at": None if window else due, "next_attempt_at": None if window else due,
        "expires_at": message.expires_at, "attempts": 0, "created_at": now, "updated_at": now,
    }


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
