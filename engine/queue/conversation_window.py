"""Meta's customer-service window: free text may go to a patient who wrote on the channel within
the last 24 hours; outside it only an approved template may. Read by dispatch at send time, by the
follow-up engine's message nodes and by Conversas before a person answers."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Iterable

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from engine.store.dialect import in_pairs
from engine.store.models import inbound_messages

CONVERSATION_WINDOW = timedelta(hours=24)


def window_open(last_inbound_at: datetime | None, now: datetime) -> bool:
    """Whether a patient who last wrote at `last_inbound_at` may still get free text (Meta's 24 h)."""
    return last_inbound_at is not None and now - last_inbound_at < CONVERSATION_WINDOW


def last_inbound(conn: Connection, contacts_of_orgs: Iterable[tuple[int, int]]) -> dict[tuple[int, int, int], datetime]:
    """(org, channel, contact) → when that contact last wrote on that channel, for each
    (org, contact) pair asked about."""
    im = inbound_messages.c
    return {(r.org_id, r.channel_id, r.contact_id): r.last for r in conn.execute(
        select(im.org_id, im.channel_id, im.contact_id, func.max(im.received_at).label("last"))
        .where(in_pairs(conn, (im.org_id, im.contact_id), contacts_of_orgs),
               im.from_me.is_(False))  # the clinic's own phone writing opens no window
        .group_by(im.org_id, im.channel_id, im.contact_id))}


def conversation_open(conn: Connection, org_id: int, channel_id: int, contact_id: int, now: datetime) -> bool:
    """Whether the patient wrote on this channel within the last 24 hours (`Batch.conversation_open`
    for one contact, outside a send)."""
    return window_open(last_inbound(conn, [(org_id, contact_id)]).get((org_id, channel_id, contact_id)), now)
