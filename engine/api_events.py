"""What the REST API writes besides the domain rows: contact events for the follow-up engine
(hand-off started/ended, stage changed) and the audit trail of every API write."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

from sqlalchemy import insert
from sqlalchemy.engine import Connection

from engine import clock
from engine.models import audit_log, contact_events

EVENT_TYPES = ("handoff_started", "handoff_ended", "stage_changed")
#: Fields whose values never go into the audit trail (only the fact that they changed).
REDACTED_FIELDS = frozenset({"name", "phone", "email", "text", "subject", "body", "key", "key_hash"})


def record_contact_event(
    conn: Connection, *, org_id: int, contact_id: int, type: str, stage: str | None = None,
    at: datetime | None = None,
) -> tuple[int, datetime, datetime]:
    """Append one contact event; returns (id, at, created_at). The caller checked the contact."""
    if type not in EVENT_TYPES:
        raise ValueError(f"type must be one of {', '.join(EVENT_TYPES)}")
    now = clock.now()
    at = at or now
    payload: dict[str, Any] = {"at": at.isoformat()}
    if stage is not None:
        payload["stage"] = stage
    event_id = int(conn.execute(
        insert(contact_events).values(org_id=org_id, contact_id=contact_id, type=type, payload=payload,
                                      created_at=now).returning(contact_events.c.id)
    ).scalar_one())
    from engine.flows import replies, triggers

    # The follow-up engine acts in the same transaction: pause or resume runs, start flows.
    if type == "handoff_started":
        replies.on_handoff_started(conn, org_id, contact_id)
    elif type == "handoff_ended":
        replies.on_handoff_ended(conn, org_id, contact_id)
    triggers.on_contact_event(conn, org_id, contact_id, type, payload, event_id)
    return event_id, at, now


def redact(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Changes as they may be stored: personal data and secrets become a marker."""
    out: dict[str, Any] = {}
    for field, value in changes.items():
        if field in REDACTED_FIELDS and value is not None:
            out[field] = "[redacted]"
        elif isinstance(value, datetime):
            out[field] = value.isoformat()
        else:
            out[field] = value
    return out


def audit(
    conn: Connection, *, org_id: int, action: str, entity: str, entity_id: int | None,
    changes: Mapping[str, Any] | None = None, api_key_id: int | None = None, user_id: int | None = None,
) -> None:
    """One audit_log row: who (key or user) did what to which row, without secrets or PII values."""
    conn.execute(insert(audit_log).values(
        org_id=org_id, user_id=user_id, api_key_id=api_key_id, action=action, entity=entity,
        entity_id=entity_id, changes=redact(changes) if changes else None, created_at=clock.now(),
    ))
