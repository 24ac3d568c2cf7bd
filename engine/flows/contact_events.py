"""Contact events the clinic reports (through the API or the console): a hand-off started or
ended, a stage changed. Each is stored and acted on by the follow-up engine in the same
transaction: runs are paused or resumed, flows triggered by the event start."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.flows import replies, triggers
from engine.store.models import contact_events

EVENT_TYPES = ("handoff_started", "handoff_ended", "stage_changed")


def record_contact_event(
    conn: Connection, *, org_id: int, contact_id: int, type: str, stage: str | None = None,
    at: datetime | None = None, source: str | None = None,
) -> tuple[int, datetime, datetime]:
    """Append one contact event; returns (id, at, created_at). The caller checked the contact.
    `source` names who started or ended a hand-off when it was not a person's request
    (`clinic_phone`, `quiet`: engine/messaging/clinic_phone.py)."""
    if type not in EVENT_TYPES:
        raise ValueError(f"type must be one of {', '.join(EVENT_TYPES)}")
    now = clock.now()
    at = at or now
    payload: dict[str, Any] = {"at": at.isoformat()}
    if stage is not None:
        payload["stage"] = stage
    if source is not None:
        payload["source"] = source
    event_id = int(conn.execute(
        insert(contact_events).values(org_id=org_id, contact_id=contact_id, type=type, payload=payload,
                                      created_at=now).returning(contact_events.c.id)
    ).scalar_one())
    # The follow-up engine acts in the same transaction: pause or resume runs, start flows.
    if type == "handoff_started":
        replies.on_handoff_started(conn, org_id, contact_id)
    elif type == "handoff_ended":
        replies.on_handoff_ended(conn, org_id, contact_id)
    triggers.on_contact_event(conn, org_id, contact_id, type, payload, event_id)
    return event_id, at, now
