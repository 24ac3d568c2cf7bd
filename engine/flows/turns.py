"""What a node that talks with the patient reads: the channel it can reach them on, the
messages of the turn it answers, and what the AI knows of the conversation."""

from __future__ import annotations

from typing import Any, Callable

from sqlalchemy import select
from sqlalchemy.engine import Connection

from engine.flows import facts
from engine.flows.ai.base import AIContext, Turn
from engine.flows.reach import Reach
from engine.flows.step import Snapshot
from engine.people.contacts import opt_out
from engine.queue.outbox import answer_inbound
from engine.store.models import inbound_messages
from engine.words.keywords import parse_keywords

#: The kinds tried, in order, when a node does not say.
DEFAULT_KINDS = ("whatsapp", "sms", "email")
#: The fragments of one turn read at most (a patient who sends twenty lines in a row is still read).
MAX_FRAGMENTS = 10


def ai_context(conn: Connection, snap: Snapshot) -> AIContext:
    """What the AI knows of the conversation: the org, the patient's first name, the history."""
    org = snap.org
    first = (snap.contact.name or "").split()
    history = tuple(Turn(role, text, at) for role, text, at in
                    facts.conversation(conn, org.id, snap.contact.id) if text)
    return AIContext(
        org_name=org.name, persona=getattr(snap.agent, "persona", None), contact_first_name=first[0] if first else None,
        locale=snap.contact.locale or org.locale, timezone=org.timezone, now=snap.now, history=history,
        org_keywords={"confirm": parse_keywords(org.confirm_keywords), "cancel": parse_keywords(org.cancel_keywords)},
    )


def usable_kind(conn: Connection, snap: Snapshot, kinds: tuple[str, ...]) -> tuple[str, Any] | None:
    """The first kind the contact consented to (refusals follow the address), has an address for
    and the org can send on."""
    org_id = snap.org.id
    reach = snap.reach or Reach([(org_id, snap.contact)])
    consented = reach.kinds(conn, org_id, snap.contact)
    for kind in kinds:
        address = snap.contact.email if kind == "email" else snap.contact.phone
        if kind not in consented or not address:
            continue
        channel = reach.channel(conn, org_id, kind)
        if channel is not None:
            return kind, channel
    return None


def turn_fragments(conn: Connection, snap: Snapshot) -> list[tuple[int, str]]:
    """The turn's messages: the reply the run holds and what the patient wrote after it, in order."""
    rows = conn.execute(select(inbound_messages.c.id, inbound_messages.c.text, inbound_messages.c.button_payload)
                        .where(inbound_messages.c.org_id == snap.org.id,
                               inbound_messages.c.contact_id == snap.contact.id,
                               inbound_messages.c.id >= snap.reply.id,
                               inbound_messages.c.from_me.is_(False))  # the clinic's phone: not the patient
                        .order_by(inbound_messages.c.id).limit(MAX_FRAGMENTS)).all()
    return [(row.id, row.text or row.button_payload or "") for row in rows] or [(snap.reply.id, snap.reply.text or "")]


def opted_out_in_words(snap: Snapshot, kind: str | None) -> Callable[[Connection], None]:
    """The patient refused every message in words ("não quero mais receber mensagens") in the middle
    of a conversation: as SAIR would, every channel is refused for the contact (their other runs end,
    queued messages are cancelled, the clinic's system hears of it) and the refusal is acknowledged
    on the channel they wrote on."""
    org_id, contact_id, inbound_id = snap.org.id, snap.contact.id, snap.reply.id

    def record(conn: Connection) -> None:
        opt_out(conn, org_id, contact_id, source="flow_reply", evidence=f"inbound:{inbound_id}")
        if kind is not None:
            answer_inbound(conn, org_id, contact_id, kind, inbound_id, "optout_confirmation")

    return record
