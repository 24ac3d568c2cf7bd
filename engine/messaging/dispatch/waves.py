"""Between two waves of provider calls, in one transaction: the accepted calls of the wave that
returned become `sent`, the next wave becomes `sending` (its calls begin right after the commit),
and both get their events. Each move is a compare-and-set: `sent` from `sending` (or `unknown`, a
slow call that finished after the sweep took its row), `sending` from `claimed` while the claim's
lease runs.

PostgreSQL does all of it in one statement, built once: two `UPDATE … FROM unnest(…)` in CTEs,
the upsert of the next slots of the recipients a late wave calls (`recipient_pacing.late_moves`;
a statement of its own before, on about half the waves of a busy drain) and the INSERT of their
events. A wave is at most the calls a worker process has in flight (8 by default), and the three
statements built anew for each wave (two `update_per_row`, one `record_event_rows`) cost a worker
about 0.5 ms of CPU per message, as much again as everything else it does
(docs/benchmarks-history.md, 2026-12-06). SQLite runs the three statements, and
`recipient_pacing.sending`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Sequence

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    Text,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from engine.core import metrics
from engine.store.dialect import in_values, insert_rows, int_array, update_per_row
from engine.messaging.dispatch.ready import Prepared, Ready
from engine.messaging.dispatch.claim import WORKER_ID
from engine.store.models import message_events, messages
from engine.store.models import recipient_pacing as recipient_pacing_table
from engine.queue import recipient_pacing
from engine.store.runtime import Runtime
from gateway.contract import SendResult


@dataclass
class Sent:
    """One message the provider accepted."""

    prepared: Prepared
    result: SendResult


def settle_wave(conn: Connection, rt: Runtime, sent: Sequence[Sent], wave: Sequence[Ready],
                now: datetime) -> tuple[set[int], list[Prepared]]:
    """Mark the accepted messages `sent` and the checked messages of the next wave `sending`, with
    their events; returns the ids that became `sent` and the wave's messages that became
    `sending` (in order). A message of the wave is left out when it is no longer `claimed`
    (settled, or another worker's) or when its claim's lease has run out: the sweep may already be
    handing it out again, and, still `claimed`, it goes back to the queue at no cost."""
    if not sent and not wave:
        return set(), []
    rows = {item.msg.id: _sending_values(rt, item, now) for item in wave}
    moves = recipient_pacing.late_moves([item.spacing for item in wave if item.spacing is not None], now)
    if conn.dialect.name == "postgresql":
        moved_sent, moved_sending = _settle_in_one_statement(conn, sent, wave, rows, moves, now)
    else:
        moved_sent, moved_sending = _settle_in_three_statements(conn, sent, wave, rows, now)
        recipient_pacing.sending(conn, [move for move in moves
                                        if any(mid in moved_sending for mid in move.message_ids)])
    for event, count in (("sent", len(moved_sent)), ("sending", len(moved_sending))):
        if count:
            metrics.message_events(event, count)
    send_timeout = timedelta(seconds=rt.settings.send_timeout)
    prepared = [Prepared(org_id=item.msg.org_id, message_id=item.msg.id, attempt=moved_sending[item.msg.id],
                         channel=item.channel, rendered=item.rendered, provider=item.provider,
                         start_by=rows[item.msg.id]["lease_until"] - send_timeout, send_at=item.send_at,
                         due_at=item.msg.due_at)
                for item in wave if item.msg.id in moved_sending]
    return moved_sent, prepared


def observe_sent(sent: Sequence[Sent], moved: set[int], now: datetime) -> None:
    """Count the lateness of the messages that became `sent`, once their transaction committed."""
    for s in sent:
        if s.prepared.message_id in moved:
            metrics.lateness(s.prepared.channel.kind, s.prepared.due_at, now)


def _sending_values(rt: Runtime, item: Ready, now: datetime) -> dict[str, Any]:
    """What marking one message `sending` writes of its own: its channel and text, and its lease,
    from its paced slot for a paced message."""
    billing = item.billing or {}
    return {"channel_id": item.channel.id, "subject": item.rendered.outbound.subject,
            "body": item.rendered.outbound.text, "lease_until": (item.send_at or now) + rt.settings.lease,
            "price_category": billing.get("price_category"), "price_free": billing.get("price_free"),
            "price_country": billing.get("price_country"),
            "slot": item.send_at.isoformat() if item.send_at else None}


def _settle_in_one_statement(conn: Connection, sent: Sequence[Sent], wave: Sequence[Ready],
                             rows: dict[int, dict[str, Any]], moves: Sequence[recipient_pacing.LateMove],
                             now: datetime) -> tuple[set[int], dict[int, int]]:
    callers = [(key, mid) for key, move in enumerate(moves) for mid in move.message_ids]
    params = {
        "now": now, "worker": WORKER_ID,
        "sent_id": [s.prepared.message_id for s in sent], "sent_org_id": [s.prepared.org_id for s in sent],
        "sent_provider_message_id": [s.result.provider_message_id for s in sent],
        "sent_attempt": [s.prepared.attempt for s in sent],
        "sent_provider_status": [s.result.provider_status for s in sent],
        "wave_id": list(rows), "wave_org_id": [item.msg.org_id for item in wave],
        **{f"wave_{name}": [row[name] for row in rows.values()]
           for name in ("channel_id", "subject", "body", "lease_until", "price_category", "price_free",
                        "price_country", "slot")},
        "late_key": list(range(len(moves))),
        **{f"late_{name}": [move.row[name] for move in moves]
           for name in ("channel_id", "recipient", "org_id", "next_allowed_at")},
        "caller_key": [key for key, _ in callers], "caller_message_id": [mid for _, mid in callers],
    }
    params.update({name: int_array(params[name]) for name in INT_ARRAYS})
    moved_sent: set[int] = set()
    moved_sending: dict[int, int] = {}
    for message_id, event, attempt in conn.execute(_wave_statement(), params).all():
        if event == "sent":
            moved_sent.add(message_id)
        else:
            moved_sending[message_id] = attempt
    return moved_sent, moved_sending


#: The wave statement's arrays of ints, each sent as one array literal (`int_array`): psycopg
#: dumps a list element by element in Python, and dumping this statement's arrays took 4.9 % of
#: a sending worker's samples (docs/benchmarks-history.md, 2026-12-07, session 12).
INT_ARRAYS = ("sent_id", "sent_org_id", "sent_attempt", "wave_id", "wave_org_id", "wave_channel_id", "late_key",
              "late_channel_id", "late_org_id", "caller_key", "caller_message_id")


@functools.cache
def _wave_statement() -> Any:
    """PostgreSQL: the whole move between two waves as one statement of constant text (so
    SQLAlchemy builds, keys and compiles it once, and psycopg prepares it once)."""
    m, e = messages.c, message_events.c
    now = bindparam("now", type_=m.updated_at.type)

    def array(name: str, type_: Any) -> Any:
        if name in INT_ARRAYS:  # sent as `int_array` text
            return cast(bindparam(name, type_=Text()), postgresql.ARRAY(type_))
        return bindparam(name, type_=postgresql.ARRAY(type_))

    accepted = func.unnest(
        array("sent_id", BigInteger()), array("sent_org_id", BigInteger()), array("sent_provider_message_id", Text()),
        array("sent_attempt", Integer()), array("sent_provider_status", Text()),
    ).table_valued("id", "org_id", "provider_message_id", "attempt", "provider_status").render_derived(
        name="accepted")
    sent = (
        update(messages)
        .where(m.id == accepted.c.id, m.org_id == accepted.c.org_id,
               or_(m.status == "sending", m.status == "unknown"))  # not IN (…): its text is expanded per call
        .values(status="sent", sent_at=now, lease_until=None, error_code=None, error_detail=None, updated_at=now,
                provider_message_id=accepted.c.provider_message_id)
        .returning(m.id, m.org_id, accepted.c.attempt, accepted.c.provider_status)
        .cte("sent")
    )
    marked = func.unnest(
        array("wave_id", BigInteger()), array("wave_org_id", BigInteger()), array("wave_channel_id", BigInteger()),
        array("wave_subject", Text()), array("wave_body", Text()), array("wave_lease_until", m.lease_until.type),
        array("wave_price_category", Text()), array("wave_price_free", Boolean()), array("wave_price_country", Text()),
        array("wave_slot", Text()),
    ).table_valued("id", "org_id", "channel_id", "subject", "body", "lease_until", "price_category", "price_free",
                   "price_country", "slot").render_derived(name="marked")
    sending = (
        update(messages)
        # The lease is compared as `lease_until - now > 0`, which no index answers: written as
        # `lease_until > now`, PostgreSQL read every leased row through `messages_leased` and
        # joined them with the wave (a cost growing with the claims in flight) instead of reading
        # the wave's rows by the primary key.
        .where(m.id == marked.c.id, m.org_id == marked.c.org_id, m.status == "claimed",
               m.lease_until - now > timedelta(0))
        .values(status="sending", attempts=m.attempts + 1, claimed_by=bindparam("worker", type_=Text()),
                updated_at=now, channel_id=marked.c.channel_id, subject=marked.c.subject, body=marked.c.body,
                lease_until=marked.c.lease_until, price_category=marked.c.price_category,
                price_free=marked.c.price_free, price_country=marked.c.price_country)
        .returning(m.id, m.org_id, m.attempts, marked.c.slot)
        .cte("sending")
    )
    # The late recipients of the messages that became `sending` (recipient_pacing.late_moves),
    # their slots counted from now: written in the order of `late_key`, which is the order a
    # check's `reserve` locks rows in, so a wave and a check never wait for each other in a cycle.
    p = recipient_pacing_table.c
    late = func.unnest(
        array("late_key", Integer()), array("late_channel_id", BigInteger()), array("late_recipient", Text()),
        array("late_org_id", BigInteger()), array("late_next_allowed_at", p.next_allowed_at.type),
    ).table_valued("key", "channel_id", "recipient", "org_id", "next_allowed_at").render_derived(name="late")
    callers = func.unnest(array("caller_key", Integer()), array("caller_message_id", BigInteger())).table_valued(
        "key", "message_id").render_derived(name="callers")
    called = select(callers.c.key).join(sending, sending.c.id == callers.c.message_id)
    paced = recipient_pacing.move_forward(
        postgresql.insert(recipient_pacing_table).from_select(
            ["channel_id", "recipient", "org_id", "next_allowed_at", "taken_by"],
            select(late.c.channel_id, late.c.recipient, late.c.org_id, late.c.next_allowed_at,
                   literal("sending", Text())).where(late.c.key.in_(called)).order_by(late.c.key),
        )).cte("paced")
    json_null = cast(literal("null"), e.detail.type)  # as every other event without a detail
    events = union_all(
        select(sent.c.org_id, sent.c.id, literal("sent"), sent.c.attempt, sent.c.provider_status, json_null, now),
        select(sending.c.org_id, sending.c.id, literal("sending"), sending.c.attempts, cast(None, Text()),
               case((sending.c.slot.is_(None), json_null),
                    else_=cast(func.jsonb_build_object("slot", sending.c.slot), e.detail.type)),
               now),
    )
    return (insert(message_events)
            .from_select(["org_id", "message_id", "event", "attempt", "provider_status", "detail", "created_at"],
                         events)
            .add_cte(paced)  # run though nothing reads it
            .returning(e.message_id, e.event, e.attempt))


def _settle_in_three_statements(conn: Connection, sent: Sequence[Sent], wave: Sequence[Ready],
                                rows: dict[int, dict[str, Any]], now: datetime) -> tuple[set[int], dict[int, int]]:
    m = messages.c
    events: list[dict[str, Any]] = []
    moved_sent: set[int] = set()
    if sent:
        by_id = {s.prepared.message_id: s for s in sent}
        for row in update_per_row(
                conn, messages,
                {mid: {"provider_message_id": s.result.provider_message_id} for mid, s in by_id.items()},
                where=[in_values(conn, m.org_id, sorted({s.prepared.org_id for s in sent})),
                       m.status.in_(("sending", "unknown"))],
                values={"status": "sent", "sent_at": now, "lease_until": None, "error_code": None,
                        "error_detail": None, "updated_at": now},
                returning=[m.id]):
            moved_sent.add(row.id)
            s = by_id[row.id]
            events.append({"org_id": s.prepared.org_id, "message_id": row.id, "event": "sent",
                           "attempt": s.prepared.attempt, "provider_status": s.result.provider_status,
                           "detail": None, "created_at": now})
    moved_sending: dict[int, int] = {}
    if wave:
        by_id_ = {item.msg.id: item for item in wave}
        for row in update_per_row(
                conn, messages,
                {mid: {name: value for name, value in row.items() if name != "slot"} for mid, row in rows.items()},
                where=[in_values(conn, m.org_id, sorted({item.msg.org_id for item in wave})), m.status == "claimed",
                       m.lease_until > now],
                values={"status": "sending", "attempts": m.attempts + 1, "claimed_by": WORKER_ID, "updated_at": now},
                returning=[m.id, m.attempts]):
            moved_sending[row.id] = row.attempts
            slot = rows[row.id]["slot"]
            events.append({"org_id": by_id_[row.id].msg.org_id, "message_id": row.id, "event": "sending",
                           "attempt": row.attempts, "provider_status": None, "created_at": now,
                           "detail": {"slot": slot} if slot else None})
    insert_rows(conn, message_events, events)  # as record_event_rows, whose counting settle_wave does

    return moved_sent, moved_sending
