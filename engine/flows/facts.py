"""What conditions and the AI read about a contact, its appointment and its enrollment.

Facts are plain values keyed by the field names of `engine.flows.conditions`; conversation
turns are the recent messages both ways, for the AI writer's context (never logged).
"""

from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from engine.store.dialect import in_pairs
from engine.store.models import contact_events, inbound_messages, messages


def contact_stage(conn: Connection, org_id: int, contact_id: int) -> str | None:
    """The stage of the contact's latest `stage_changed` event, if any."""
    payload = conn.execute(
        select(contact_events.c.payload).where(contact_events.c.org_id == org_id,
                                               contact_events.c.contact_id == contact_id,
                                               contact_events.c.type == "stage_changed")
        .order_by(contact_events.c.id.desc()).limit(1)
    ).scalar()
    return payload.get("stage") if isinstance(payload, dict) else None


def human_holds(conn: Connection, org_id: int, contact_id: int) -> bool:
    """Whether a person has taken the conversation over (a hand-off started and not ended)."""
    return (org_id, contact_id) in humans_holding(conn, [(org_id, contact_id)])


def humans_holding(conn: Connection, contacts: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    """Of these (org, contact) pairs, those whose latest hand-off event is a start: one query for a
    whole claim of enrollments."""
    pairs = sorted(set(contacts))
    if not pairs:
        return set()
    handoff = (contact_events.c.type.in_(("handoff_started", "handoff_ended")),
               in_pairs(conn, (contact_events.c.org_id, contact_events.c.contact_id), pairs))
    latest = (select(func.max(contact_events.c.id)).where(*handoff)
              .group_by(contact_events.c.org_id, contact_events.c.contact_id))
    rows = conn.execute(select(contact_events.c.org_id, contact_events.c.contact_id)
                        .where(contact_events.c.id.in_(latest), contact_events.c.type == "handoff_started"))
    return {(row.org_id, row.contact_id) for row in rows}


def gather(conn: Connection, org_id: int, *, contact: Any, appointment: Any = None, enrollment: Any = None) -> dict[str, Any]:
    """The facts of the condition fields for this contact (and appointment, and enrollment)."""
    facts: dict[str, Any] = {
        "contact.name": contact.name,
        "contact.phone": contact.phone,
        "contact.email": contact.email,
        "contact.locale": contact.locale,
        "contact.stage": contact_stage(conn, org_id, contact.id),
        "appointment.status": appointment.status if appointment is not None else None,
        "appointment.starts_at": appointment.starts_at if appointment is not None else None,
    }
    if enrollment is not None:
        facts.update({
            "enrollment.steps": enrollment.steps,
            "enrollment.llm_calls": enrollment.llm_calls,
            "enrollment.messages_sent": enrollment.messages_sent,
            "enrollment.replies": enrollment.replies,
            "enrollment.created_at": enrollment.created_at,
            "enrollment.last_reply_at": enrollment.last_reply_at,
            "enrollment.last_outbound_at": enrollment.last_outbound_at,
            "enrollment.last_class": enrollment.last_class,
        })
    return facts


def conversation(conn: Connection, org_id: int, contact_id: int, *, limit: int = 10) -> list[tuple[str, str, Any]]:
    """The last `limit` messages with the contact, oldest first, as (role, text, at)."""
    inbound = conn.execute(
        select(inbound_messages.c.text, inbound_messages.c.received_at, inbound_messages.c.from_me)
        .where(inbound_messages.c.org_id == org_id, inbound_messages.c.contact_id == contact_id,
               inbound_messages.c.text.is_not(None))
        .order_by(inbound_messages.c.received_at.desc()).limit(limit)
    ).all()
    outbound = conn.execute(
        select(messages.c.body, messages.c.sent_at)
        .where(messages.c.org_id == org_id, messages.c.contact_id == contact_id, messages.c.sent_at.is_not(None),
               messages.c.body.is_not(None))
        .order_by(messages.c.sent_at.desc()).limit(limit)
    ).all()
    # A message the clinic wrote on its own phone is stored with the inbound ones (`from_me`).
    turns = [("clinic" if row.from_me else "patient", row.text, row.received_at) for row in inbound]
    turns += [("clinic", row.body, row.sent_at) for row in outbound]
    turns.sort(key=lambda turn: turn[2])
    return turns[-limit:]
