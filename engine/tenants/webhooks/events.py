"""The events the clinic's system can subscribe to, their payloads, and `emit`.

A payload is `{"type", "timestamp", "data"}` whose data holds ids, the clinic's own external ids,
instants with their offset, statuses and reason codes: never a phone number, an e-mail, a name or
a message's text (the receiver asks the API for those, with its key, if it needs them).

`emit` runs in the caller's transaction: the delivery rows commit with the change they tell
about, or not at all. The builders below read what the payload needs only when some endpoint of
the org subscribes to the event, so an org without webhooks pays one indexed query per event.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.store.models import appointments, contacts, enrollments, webhook_deliveries, webhook_endpoints

APPOINTMENT_BOOKED = "appointment.booked"
APPOINTMENT_MOVED = "appointment.moved"
APPOINTMENT_CONFIRMED = "appointment.confirmed"
APPOINTMENT_CANCELLED = "appointment.cancelled"
CONTACT_OPTED_OUT = "contact.opted_out"
RUN_ENDED = "run.ended"
RUN_NOTIFIED = "run.notified"
#: The event types an endpoint may subscribe to, in the order the documentation lists them.
EVENT_TYPES = (APPOINTMENT_BOOKED, APPOINTMENT_MOVED, APPOINTMENT_CONFIRMED, APPOINTMENT_CANCELLED,
               CONTACT_OPTED_OUT, RUN_ENDED, RUN_NOTIFIED)
#: The test event `POST /webhook-endpoints/{id}/test` sends; no endpoint subscribes to it.
PING = "ping"
#: A reason or source code as the payload may carry it (a code, never free text).
_CODE = re.compile(r"[a-z][a-z0-9_:.-]{0,63}")

Data = Mapping[str, Any] | Callable[[], Mapping[str, Any]]


def new_webhook_id() -> str:
    """A delivery's `webhook-id`: unique, kept across retries (the receiver's dedupe key)."""
    return f"msg_{uuid.uuid4().hex}"


def envelope(event_type: str, data: Mapping[str, Any], at: datetime | None = None) -> dict[str, Any]:
    """The JSON body of an event: its type, when it happened (ISO 8601, UTC) and its data."""
    return {"type": event_type, "timestamp": (at or clock.now()).isoformat(), "data": dict(data)}


def subscribed(conn: Connection, org_id: int, event_type: str) -> list[int]:
    """The org's active endpoints that subscribe to `event_type`, by id."""
    rows = conn.execute(select(webhook_endpoints.c.id, webhook_endpoints.c.event_types).where(
        webhook_endpoints.c.org_id == org_id, webhook_endpoints.c.active.is_(True))
        .order_by(webhook_endpoints.c.id)).all()
    return [int(row.id) for row in rows if event_type in (row.event_types or ())]


class Listeners:
    """`subscribed`, read once per (org, event type) for a transaction that emits many events: a
    claim that ends 200 runs of one org asks once, not 200 times. Use it within one transaction
    (an endpoint added later is not seen)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._seen: dict[tuple[int, str], list[int]] = {}

    def __call__(self, org_id: int, event_type: str) -> list[int]:
        key = (org_id, event_type)
        if key not in self._seen:
            self._seen[key] = subscribed(self._conn, org_id, event_type)
        return self._seen[key]


def emit(conn: Connection, org_id: int, event_type: str, data: Data, *,
         listeners: Listeners | None = None) -> list[int]:
    """Write one pending delivery of the event per subscribed active endpoint, in `conn`'s
    transaction; `data` may be a callable, called only when some endpoint subscribes; `listeners`
    remembers the subscriptions across the events of one transaction.
    Returns the deliveries' ids (empty when nobody listens)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type: {event_type}")
    targets = listeners(org_id, event_type) if listeners is not None else subscribed(conn, org_id, event_type)
    if not targets:
        return []
    body = envelope(event_type, data() if callable(data) else data)
    return enqueue(conn, org_id, targets, event_type, body)


def enqueue(conn: Connection, org_id: int, endpoint_ids: Iterable[int], event_type: str,
            body: Mapping[str, Any]) -> list[int]:
    """One pending delivery of `body` per endpoint, due now; returns their ids."""
    now = clock.now()
    rows = [dict(org_id=org_id, endpoint_id=endpoint_id, event_type=event_type, webhook_id=new_webhook_id(),
                 payload=dict(body), status="pending", attempts=0, next_attempt_at=now, revision=0, created_at=now)
            for endpoint_id in endpoint_ids]
    if not rows:
        return []
    return [int(i) for i in conn.execute(insert(webhook_deliveries).returning(webhook_deliveries.c.id), rows)
            .scalars()]


# --- payloads -----------------------------------------------------------------------------------

def _code(value: Any) -> str | None:
    """`value` when it is a code (lowercase, no spaces), else None: a payload carries no free text."""
    return value if isinstance(value, str) and _CODE.fullmatch(value) else None


def _local(instant: datetime | None, zone: str | None) -> str | None:
    """An instant as ISO 8601 with the appointment's own offset (-03:00 in São Paulo)."""
    if instant is None:
        return None
    try:
        return instant.astimezone(ZoneInfo(zone or "UTC")).isoformat()
    except (ZoneInfoNotFoundError, ValueError):
        return instant.isoformat()


def appointment_data(conn: Connection, org_id: int, appointment_id: int, **extra: Any) -> dict[str, Any]:
    """The data of an appointment event: its ids, its patient's ids, its time and status."""
    row = conn.execute(
        select(appointments.c.id, appointments.c.external_id, appointments.c.contact_id, appointments.c.starts_at,
               appointments.c.timezone, appointments.c.status, appointments.c.cancel_source,
               contacts.c.external_id.label("contact_external_id"))
        .select_from(appointments.join(contacts, (contacts.c.id == appointments.c.contact_id)
                                       & (contacts.c.org_id == appointments.c.org_id)))
        .where(appointments.c.org_id == org_id, appointments.c.id == appointment_id)).one()
    data: dict[str, Any] = {
        "appointment_id": int(row.id), "appointment_external_id": row.external_id,
        "contact_id": int(row.contact_id), "contact_external_id": row.contact_external_id,
        "starts_at": _local(row.starts_at, row.timezone), "status": row.status,
    }
    for key, value in extra.items():
        data[key] = _local(value, row.timezone) if isinstance(value, datetime) else value
    return data


def appointment_confirmed(conn: Connection, org_id: int, appointment_id: int) -> list[int]:
    """`appointment.confirmed`: the patient (OK, a button) or the clinic confirmed it."""
    return emit(conn, org_id, APPOINTMENT_CONFIRMED, lambda: appointment_data(conn, org_id, appointment_id))


def appointment_cancelled(conn: Connection, org_id: int, appointment_id: int, *, source: str | None) -> list[int]:
    """`appointment.cancelled`, with who cancelled it (`patient` or `clinic`)."""
    return emit(conn, org_id, APPOINTMENT_CANCELLED,
                lambda: appointment_data(conn, org_id, appointment_id, cancel_source=_code(source)))


def appointment_booked(conn: Connection, org_id: int, appointment_id: int, *, reason: str | None = None,
                       replaces_appointment_id: int | None = None) -> list[int]:
    """`appointment.booked`: a new appointment booked by Lembra (a flow's booking action; a
    no-show's rebooking names the one it `replaces_appointment_id`). `reason` is a code."""
    return emit(conn, org_id, APPOINTMENT_BOOKED, lambda: appointment_data(
        conn, org_id, appointment_id, reason=_code(reason), replaces_appointment_id=replaces_appointment_id))


def appointment_moved(conn: Connection, org_id: int, appointment_id: int, *, old_starts_at: datetime,
                      reason: str | None = None) -> list[int]:
    """`appointment.moved`: the appointment now starts at `starts_at`, no longer at `old_starts_at`."""
    return emit(conn, org_id, APPOINTMENT_MOVED, lambda: appointment_data(
        conn, org_id, appointment_id, old_starts_at=old_starts_at, reason=_code(reason)))


def contact_opted_out(conn: Connection, org_id: int, contact_id: int, *, channel_kinds: Iterable[str],
                      source: str | None) -> list[int]:
    """`contact.opted_out`: the contact refused these channel kinds (`source`: how, as a code)."""
    kinds = sorted(channel_kinds)

    def data() -> dict[str, Any]:
        external_id = conn.execute(select(contacts.c.external_id).where(
            contacts.c.org_id == org_id, contacts.c.id == contact_id)).scalar()
        return {"contact_id": int(contact_id), "contact_external_id": external_id, "channel_kinds": kinds,
                "source": _code(source)}

    return emit(conn, org_id, CONTACT_OPTED_OUT, data)


def run_notified(conn: Connection, org_id: int, enrollment_id: int, *, node_id: str, signal: str,
                 collected: Mapping[str, Any]) -> list[int]:
    """`run.notified`: a flow's step told the clinic's system something (`signal`, a code the flow
    names), with what the run collected that carries no personal data (dates, times, periods,
    choices, numbers, yes/no: the caller leaves out texts, phones and e-mails)."""

    def data() -> dict[str, Any]:
        row = conn.execute(
            select(enrollments.c.id, enrollments.c.pointer_id, enrollments.c.contact_id,
                   enrollments.c.appointment_id, contacts.c.external_id.label("contact_external_id"),
                   appointments.c.external_id.label("appointment_external_id"))
            .select_from(enrollments.outerjoin(contacts, (contacts.c.id == enrollments.c.contact_id)
                                               & (contacts.c.org_id == enrollments.c.org_id))
                         .outerjoin(appointments, (appointments.c.id == enrollments.c.appointment_id)
                                    & (appointments.c.org_id == enrollments.c.org_id)))
            .where(enrollments.c.org_id == org_id, enrollments.c.id == enrollment_id)).one()
        return {"run_id": int(row.id), "flow_id": int(row.pointer_id), "node_id": node_id, "signal": _code(signal),
                "contact_id": row.contact_id, "contact_external_id": row.contact_external_id,
                "appointment_id": row.appointment_id, "appointment_external_id": row.appointment_external_id,
                "collected": dict(collected)}

    return emit(conn, org_id, RUN_NOTIFIED, data)


def run_ended(conn: Connection, org_id: int, enrollment_id: int, *, status: str, outcome: str | None,
              reason: str | None, listeners: Listeners | None = None) -> list[int]:
    """`run.ended`: a follow-up run left its flow (completed, cancelled or dead), and why
    (`listeners`: the subscriptions read once for many runs, see `Listeners`)."""

    def data() -> dict[str, Any]:
        row = conn.execute(
            select(enrollments.c.id, enrollments.c.pointer_id, enrollments.c.contact_id,
                   enrollments.c.appointment_id, contacts.c.external_id.label("contact_external_id"))
            .select_from(enrollments.outerjoin(contacts, (contacts.c.id == enrollments.c.contact_id)
                                               & (contacts.c.org_id == enrollments.c.org_id)))
            .where(enrollments.c.org_id == org_id, enrollments.c.id == enrollment_id)).one()
        return {"run_id": int(row.id), "flow_id": int(row.pointer_id), "contact_id": row.contact_id,
                "contact_external_id": row.contact_external_id, "appointment_id": row.appointment_id,
                "status": status, "outcome": _code(outcome), "reason": _code(reason)}

    return emit(conn, org_id, RUN_ENDED, data, listeners=listeners)
