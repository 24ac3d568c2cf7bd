"""The clinic's own phone: what the clinic's WhatsApp number sends outside Lembra.

A provider reports a message its number sent (Evolution's `messages.upsert` with `key.fromMe`,
Meta's `smb_message_echoes` of a number in coexistence with the WhatsApp Business app) as an
inbound event with `from_me`. It is one of two things:

- **an echo of a send of ours**: its provider id is an outbox row's. It is not stored (`receive`
  skips it) and starts nothing. The echo may arrive while our call to the provider is still under
  way, before the answer gave the row its id: a row `sending` (or `unknown`: the call's outcome
  was lost) on that channel, to that contact, whose text is the echo's text is ours too, and a
  stored echo found so is deleted. A `sending` row whose text differs (a template the provider
  words its own way) leaves the message unprocessed (`WAIT`): the scheduler hands it over again
  after `inbound.REPOKE_AFTER`, by when the send has its id (or its lease has run out).
- **a person at the clinic wrote** (on the phone or WhatsApp Web): a staff message of the
  conversation, stored in `inbound_messages` with `from_me` (Conversas shows it as ours), which
  hands the conversation to the staff as "Assumir a conversa" does (`record_contact_event`, the
  flows' hand-off policy: pause by default) for every contact of that number no person holds yet.
  The bot steps back while a person speaks, as Evolution's own `stopBotFromMe` does.

Such a hand-off ends after the org's `staff_quiet_minutes` without another message from the
phone (`end_quiet`, run by the scheduler), or when a person ends it on the console ("Encerrar
atendimento humano"). A hand-off a person started on the console is never ended by the quiet.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Sequence

from sqlalchemy import delete, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError, SettingRefused
from engine.flows import facts
from engine.flows.contact_events import record_contact_event
from engine.people.contacts import find_all_by_address
from engine.store.models import contact_events, inbound_messages, messages, orgs
from engine.store.runtime import Runtime

log = logging.getLogger(__name__)

OURS, STAFF, WAIT = "ours", "staff", "wait"
#: The outcome of a staff message on its `inbound_messages` row.
STAFF_OUTCOME = "staff_message"
#: The `source` of the contact events this module records.
STARTED_BY, ENDED_BY = "clinic_phone", "quiet"
#: The org's quiet time may be 0 (only a person ends the hand-off) up to a day, in minutes.
MAX_QUIET_MINUTES = 24 * 60
#: Outbox rows whose provider call may be under way or whose outcome was lost: an echo may be theirs.
_IN_FLIGHT = ("sending", "unknown")


def sent_by_us(conn: Connection, org_id: int, channel_id: int, provider_message_id: str) -> bool:
    """Whether the outbox holds a send of this channel with that provider id."""
    return conn.execute(select(messages.c.id).where(
        messages.c.org_id == org_id, messages.c.channel_id == channel_id,
        messages.c.provider_message_id == provider_message_id).limit(1)).first() is not None


def whose(conn: Connection, org_id: int, channel_id: int, *, provider_message_id: str, address: str,
          text: str | None) -> str:
    """`OURS` (an echo of a send of ours), `STAFF` (a person at the clinic wrote) or `WAIT` (a send
    to that contact is under way and the message may be its echo: ask again later)."""
    if sent_by_us(conn, org_id, channel_id, provider_message_id):
        return OURS
    contact_ids = find_all_by_address(conn, org_id, address)
    if not contact_ids:
        return STAFF  # Lembra sends only to contacts
    now = clock.now()
    rows = conn.execute(select(messages.c.status, messages.c.body, messages.c.lease_until).where(
        messages.c.org_id == org_id, messages.c.channel_id == channel_id, messages.c.contact_id.in_(contact_ids),
        messages.c.status.in_(_IN_FLIGHT), messages.c.provider_message_id.is_(None))).all()
    said = (text or "").strip()
    if said and any((row.body or "").strip() == said for row in rows):
        return OURS
    if any(row.status == "sending" and row.lease_until is not None and row.lease_until > now for row in rows):
        return WAIT
    return STAFF


def act(conn: Connection, inbound: Any) -> tuple[str, int | None] | None:
    """Act on one stored `from_me` message (process_inbound, in its transaction): (outcome,
    contact id) for a staff message, or None when it is not one yet (`WAIT`: left unprocessed) or
    never was (an echo of ours: the row is deleted, the outbox has the message)."""
    org_id = int(inbound.org_id)
    found = whose(conn, org_id, int(inbound.channel_id), provider_message_id=inbound.provider_message_id,
                  address=inbound.from_address or "", text=inbound.text)
    if found == WAIT:
        return None
    if found == OURS:
        conn.execute(delete(inbound_messages).where(inbound_messages.c.org_id == org_id,
                                                    inbound_messages.c.id == inbound.id))
        return None
    contact_ids = find_all_by_address(conn, org_id, inbound.from_address or "")
    if not contact_ids:
        return STAFF_OUTCOME, None
    quiet = int(conn.execute(select(orgs.c.staff_quiet_minutes).where(orgs.c.id == org_id)).scalar_one())
    # Only the contact's latest staff message keeps the moment the quiet ends the hand-off.
    conn.execute(update(inbound_messages).where(
        inbound_messages.c.org_id == org_id, inbound_messages.c.contact_id.in_(contact_ids),
        inbound_messages.c.quiet_until.is_not(None)).values(quiet_until=None))
    if quiet:
        conn.execute(update(inbound_messages).where(inbound_messages.c.org_id == org_id,
                                                    inbound_messages.c.id == inbound.id)
                     .values(quiet_until=clock.now() + timedelta(minutes=quiet)))
    for contact_id in contact_ids:
        if not facts.human_holds(conn, org_id, contact_id):
            record_contact_event(conn, org_id=org_id, contact_id=contact_id, type="handoff_started",
                                 source=STARTED_BY)
    return STAFF_OUTCOME, contact_ids[0]


def _started_by_phone(conn: Connection, org_id: int, contact_id: int) -> bool:
    """Whether the contact's latest hand-off event is a start by the clinic's phone."""
    row = conn.execute(select(contact_events.c.type, contact_events.c.payload).where(
        contact_events.c.org_id == org_id, contact_events.c.contact_id == contact_id,
        contact_events.c.type.in_(("handoff_started", "handoff_ended")))
        .order_by(contact_events.c.id.desc()).limit(1)).first()
    return row is not None and row.type == "handoff_started" and isinstance(row.payload, dict) \
        and row.payload.get("source") == STARTED_BY


def end_quiet(rt: Runtime, *, limit: int) -> int:
    """End the hand-offs the clinic's phone started whose staff has been quiet for the org's
    `staff_quiet_minutes` (the scheduler, every pass); returns how many ended. Each staff message
    is looked at once: its `quiet_until` is cleared in the transaction that acts on it."""
    with rt.db.connect() as conn:
        due: Sequence[Any] = conn.execute(
            select(inbound_messages.c.id, inbound_messages.c.org_id)
            .where(inbound_messages.c.quiet_until <= clock.now())
            .order_by(inbound_messages.c.quiet_until).limit(limit)).all()
    ended = 0
    for item in due:
        with rt.db.begin() as conn:
            cleared = conn.execute(update(inbound_messages).where(
                inbound_messages.c.org_id == item.org_id, inbound_messages.c.id == item.id,
                inbound_messages.c.quiet_until <= clock.now()).values(quiet_until=None)
                .returning(inbound_messages.c.from_address)).first()
            if cleared is None:
                continue  # a newer staff message took the clock over, or another pass did it
            for contact_id in find_all_by_address(conn, int(item.org_id), cleared.from_address or ""):
                if _started_by_phone(conn, int(item.org_id), contact_id):
                    record_contact_event(conn, org_id=int(item.org_id), contact_id=contact_id,
                                         type="handoff_ended", source=ENDED_BY)
                    ended += 1
    if ended:
        log.info("clinic phone hand-offs ended by quiet", extra={"count": ended})
    return ended


def set_quiet_minutes(conn: Connection, org_id: int, minutes: int) -> int:
    """Change how long the clinic's phone may stay quiet before its hand-off ends (0: only a
    person ends it). Takes effect from the next staff message."""
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not 0 <= minutes <= MAX_QUIET_MINUTES:
        raise SettingRefused("staff_quiet_minutes", "detail_integer_range",
                             f"the quiet time must be 0 to {MAX_QUIET_MINUTES} minutes", min=0, max=MAX_QUIET_MINUTES)
    if not conn.execute(update(orgs).where(orgs.c.id == org_id).values(staff_quiet_minutes=minutes,
                                                                        updated_at=clock.now())).rowcount:
        raise DomainError("no such org")
    return minutes
