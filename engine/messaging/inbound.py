"""Inbound: webhooks in, replies understood (SPEC §5, §6).

`receive` verifies and stores what a provider sent (nothing is stored when the signature or the
body is bad; a retried webhook is a no-op); `process_inbound` then acts on each new patient
message: SAIR opts out, OK/CONFIRMAR confirms, CANCELAR cancels the appointment the reminder was
about. Status events go to engine/messaging/statuses.py; what the clinic's own number sent
(`from_me`) to engine/messaging/clinic_phone.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl

from sqlalchemy import and_, bindparam, select, update
from sqlalchemy.engine import Connection

from engine.people import appointments as appts
from engine.core import clock
from engine.people.contacts import find_all_by_address, opt_out
from engine.store.dialect import insert_ignore
from engine.flows.replies import on_reply
from engine.flows.runtime import FOLLOWUP_PURPOSE
from engine.flows.triggers import on_free_text
from engine.core.ids import valid_id
from engine.queue.inbox import open_inbox_item
from engine.words.keywords import classify, parse_keywords
from engine.store.models import (
    CHANNEL_KINDS,
    PROVIDERS,
    appointments,
    channels,
    inbound_messages,
    messages,
    orgs,
    preferences,
    webhook_events,
)
from engine.queue.outbox import answer_inbound
from engine.reminders.populate import refresh_appointment
from engine.queue.address_optouts import block_sender
from engine.core.redact import redact
from engine.store.runtime import Runtime
from engine.messaging import clinic_phone
from engine.messaging.statuses import apply_status
from engine.messaging import voice
from engine.messaging.meta_categories import apply_event as apply_template_event
from gateway.contract import (
    ConnectionEvent,
    InboundMessageEvent,
    StatusEvent,
    TemplateEvent,
    WebhookRequest,
)
from gateway.errors import UnknownChannel
from gateway.webhook_body import clean_json, clean_text

log = logging.getLogger(__name__)


@dataclass
class Received:
    """What a webhook delivery produced."""

    inbound_ids: list[int] = field(default_factory=list)
    statuses_applied: int = 0
    response_body: str | None = None
    response_status: int = 200
    response_content_type: str = "text/plain"
    duplicate: bool = False  # the same delivery (same bytes, same channel) was already stored


def receive(rt: Runtime, provider: str, channel_id: int, request: WebhookRequest) -> Received:
    """Verify, parse and store one webhook delivery. Raises a WebhookError subclass when refused.

    A replayed delivery (the same bytes to the same channel) adds no `webhook_events` row, and its
    events change nothing (inbound messages are unique per provider id, statuses only move forward,
    a connection state already recorded is not written again)."""
    if provider not in PROVIDERS or not valid_id(channel_id):
        # An id past bigint (or a provider name with a NUL) would fail in the database: 404.
        raise UnknownChannel("no such channel")
    with rt.db.connect() as conn:
        channel = conn.execute(
            select(channels).where(channels.c.id == channel_id, channels.c.provider == provider)
        ).first()
    if channel is None:
        raise UnknownChannel("no such channel")
    parsed = rt.providers.get(channel).parse_webhook(request)
    received = Received(response_body=parsed.response_body, response_status=parsed.response_status,
                        response_content_type=parsed.response_content_type)
    if not parsed.events:
        return received
    # What a provider parsed from a form body (or a JSON string inside the JSON) may still hold a
    # NUL or an unpaired surrogate, which PostgreSQL refuses: stored cleaned, answered 2xx.
    events = [_cleaned(event) for event in parsed.events]
    org_id = channel.org_id
    now = clock.now()
    with rt.db.begin() as conn:
        stored = conn.execute(insert_ignore(conn, webhook_events, ("channel_id", "body_sha256")).values(
            org_id=org_id, channel_id=channel.id, provider=provider, events=len(events),
            body=_redacted_body(request.body), received_at=now,
            body_sha256=hashlib.sha256(bytes(request.body or b"")).hexdigest(),
        ).returning(webhook_events.c.id)).first()
        received.duplicate = stored is None
        for event in events:
            if isinstance(event, InboundMessageEvent):
                if event.from_me and clinic_phone.sent_by_us(conn, org_id, channel.id, event.provider_message_id):
                    continue  # the echo of a send of ours: the outbox has it
                row = conn.execute(
                    insert_ignore(conn, inbound_messages, ("channel_id", "provider_message_id")).values(
                        org_id=org_id, channel_id=channel.id, provider_message_id=event.provider_message_id,
                        from_address=event.from_address, text=event.text, button_payload=event.button_payload,
                        in_reply_to=event.in_reply_to, received_at=now, from_me=event.from_me,
                        # the clinic's own voice note is a staff message: nothing to transcribe
                        **voice.pending_values(None if event.from_me else event.audio),
                    ).returning(inbound_messages.c.id)
                ).first()
                if row is not None:
                    received.inbound_ids.append(int(row.id))
            elif isinstance(event, StatusEvent):
                if apply_status(conn, org_id, channel.id, event):
                    received.statuses_applied += 1
            elif isinstance(event, ConnectionEvent):
                apply_connection(conn, channel, event)
            elif isinstance(event, TemplateEvent):
                apply_template_event(conn, channel, event)  # the provider checked it is this WABA's
    return received


#: Connection states after which nothing can be sent until an operator reconnects the number.
BROKEN_STATES = ("close", "refused")


def apply_connection(conn: Connection, channel: Any, event: ConnectionEvent, *, notify: bool = True) -> None:
    """Follow the provider's connection: a closed number marks the channel broken (and tells the
    operator in the inbox, unless `notify` is False: the console's connect page, where the operator
    is looking at the state), an open one makes it active again."""
    now = clock.now()
    values: dict[str, Any] = {"status_detail": f"{event.state}:{event.detail}"[:100] if event.detail else event.state[:100],
                              "updated_at": now}
    if event.state == "open" and channel.status == "broken":
        values["status"] = "active"
    elif event.state in BROKEN_STATES and channel.status == "active":
        values["status"] = "broken"
        if notify:
            open_inbox_item(conn, channel.org_id, "channel_broken",
                            f"channel:{channel.id}:broken:{int(now.timestamp())}",
                            channel_id=channel.id, detail=f"the number disconnected ({event.state})")
    recorded = channel.status_detail or ""
    if "status" not in values and (recorded == values["status_detail"]
                                   or (event.detail is None and recorded.split(":", 1)[0] == event.state)):
        # Nothing new (a repeated webhook, or the console polling the state while the operator scans
        # the QR): writing anyway would bump `updated_at`, which makes every ProviderPool rebuild the
        # channel's provider, and would replace a webhook's reason ("close:401") with the bare state.
        return
    conn.execute(update(channels).where(channels.c.org_id == channel.org_id, channels.c.id == channel.id)
                 .values(**values))


def _redacted_body(body: bytes) -> Any:
    """The delivery's JSON with personal data removed; form bodies as their redacted fields.
    Cleaned for jsonb: no NUL, no unpaired surrogate, NaN and Infinity as null."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        try:
            data = {k: v for k, v in parse_qsl(body.decode("utf-8"), keep_blank_values=True)}
        except UnicodeDecodeError:
            return None
    try:
        return redact(clean_json(data))
    except RecursionError:
        return None


def _cleaned(event: Any) -> Any:
    """The event with every text field as a text column can hold it (`clean_text`)."""
    changes = {f.name: clean_text(value) for f in fields(event)
               if isinstance(value := getattr(event, f.name), str) and value != clean_text(value)}
    return replace(event, **changes) if changes else event


#: How old an unprocessed patient message must be before the scheduler pokes the workers again.
#: Well past a normal poke's round trip, so a busy queue is not doubled.
REPOKE_AFTER = timedelta(minutes=1)


def unprocessed(rt: Runtime, *, limit: int) -> list[int]:
    """Ids of patient messages stored but still not acted on after REPOKE_AFTER, oldest first.

    The webhook pokes the workers once; a poke lost with the broker, or retries that ran out on
    a database error, would otherwise leave a SAIR unread for ever (the row is the truth)."""
    with rt.db.connect() as conn:
        return [int(i) for i in conn.execute(
            select(inbound_messages.c.id)
            .where(inbound_messages.c.processed_at.is_(None),
                   inbound_messages.c.received_at < clock.now() - REPOKE_AFTER)
            .order_by(inbound_messages.c.received_at).limit(limit)
        ).scalars()]


def process_inbound(rt: Runtime, inbound_id: int) -> str | None:
    """Act on one stored patient message, once; returns the outcome (None if already done).

    A voice note still `pending` is downloaded and transcribed first (`voice.prepare`), outside
    the transaction that acts on it; a text reply (nearly all) is read once, with its lock."""
    prepared = False
    while True:
        with rt.db.begin() as conn:
            inbound = conn.execute(_UNPROCESSED_LOCKED if conn.dialect.name == "postgresql" else _UNPROCESSED,
                                   {"inbound_id": inbound_id}).first()
            if inbound is None:
                return None
            if prepared or inbound.voice_state != "pending":
                outcome = _process(conn, inbound)
                break
        voice.prepare(rt, inbound_id)
        prepared = True
    if outcome is not None:
        log.info("inbound processed", extra={"inbound_id": inbound_id, "outcome": outcome})
    return outcome


#: The patient message to act on, not yet acted on; on PostgreSQL locked, skipped when another
#: worker holds it.
_UNPROCESSED = select(inbound_messages).where(inbound_messages.c.id == bindparam("inbound_id"),
                                              inbound_messages.c.processed_at.is_(None))
_UNPROCESSED_LOCKED = _UNPROCESSED.with_for_update(skip_locked=True)


def _process(conn: Connection, inbound: Any) -> str | None:
    """Act on the locked, unprocessed `inbound` and record its outcome (None: nothing done)."""
    if inbound.from_me:
        # The clinic's own number wrote: a staff message, or the echo of a send of ours.
        acted = clinic_phone.act(conn, inbound)
        if acted is None:
            return None  # an echo (deleted), or not known yet (the repoke asks again)
        outcome, contact_id = acted
        intent = None
    else:
        outcome, intent, contact_id = _act(conn, inbound)
    conn.execute(
        update(inbound_messages)
        .where(inbound_messages.c.org_id == inbound.org_id, inbound_messages.c.id == inbound.id)
        .values(processed_at=clock.now(), outcome=outcome, intent=intent, contact_id=contact_id)
    )
    return outcome


#: An org's row and the kind of one of its channels, in one read.
_ORG_AND_CHANNEL_KIND = (
    select(orgs, channels.c.kind.label("channel_kind"))
    .join_from(orgs, channels, and_(channels.c.org_id == orgs.c.id, channels.c.id == bindparam("channel_id")))
    .where(orgs.c.id == bindparam("org_id"))
)


def _act(conn: Connection, inbound: Any) -> tuple[str, str | None, int | None]:
    org_id = inbound.org_id
    # The org's row (its keywords, its debounce), with the kind of the channel the reply came on.
    org = conn.execute(_ORG_AND_CHANNEL_KIND, {"org_id": org_id, "channel_id": inbound.channel_id}).one()
    kind = org.channel_kind
    # Several contacts may share the number (a parent books for the children): the reply is about
    # whichever of them the reminder went to, and SAIR stops every message to that number.
    contact_ids = find_all_by_address(conn, org_id, inbound.from_address or "")
    if voice.needs_person(inbound):  # a voice note no one could transcribe: a person listens to it
        first = contact_ids[0] if contact_ids else None
        return voice.route_to_person(conn, org_id, first), None, first
    if not contact_ids:
        if _intent(org, inbound)[0] == "optout":
            # No contact carries the number yet: the refusal still holds for whoever gets it later.
            block_sender(conn, org_id, inbound.from_address, source=f"reply:{kind}",
                         evidence=f"inbound:{inbound.id}")
            return "unknown_contact", "optout", None
        return "unknown_contact", None, None
    contact_id = contact_ids[0]
    intent, button_appointment = _intent(org, inbound)
    taken = {"routed": 0, "conversing": 0}
    if intent != "optout":
        # Every reply reaches the follow-up engine (a waiting classify, cancel-on-reply).
        taken = on_reply(conn, org, contact_ids, inbound.id)
    if intent is None and not taken["routed"]:
        # Free text no run took may start the org's flow for what it means ("posso remarcar?").
        about = _target_appointment(conn, org_id, contact_ids, inbound, None)
        on_free_text(conn, org, int(about.contact_id) if about is not None else contact_id, inbound,
                     about.id if about is not None else None)
    if intent is None or taken["conversing"] or (
            intent in ("confirm", "cancel") and button_appointment is None and _answers_a_flow(conn, org_id, contact_ids)):
        # A run that is talking with the patient reads the reply as part of its conversation: "2"
        # picks the second time offered, it does not cancel the appointment as it would a reminder.
        # So does a keyword whose last message was a flow's, not a reminder: a "2" that comes just
        # after the run took the first pick, a "sim" to "quer que a gente reserve um horário?".
        return "free_text", None, contact_id
    if intent == "optout":
        already = _fully_opted_out(conn, org_id, contact_ids)
        for cid in contact_ids:
            opt_out(conn, org_id, cid, source=f"reply:{kind}", evidence=f"inbound:{inbound.id}")
        if not already:  # one goodbye, not one per repeated SAIR
            answer_inbound(conn, org_id, contact_id, kind, inbound.id, "optout_confirmation")
        return ("already_opted_out" if already else "opted_out"), intent, contact_id
    appointment = _target_appointment(conn, org_id, contact_ids, inbound, button_appointment)
    if appointment is None:
        return "no_appointment", intent, contact_id
    contact_id = int(appointment.contact_id)
    if intent == "confirm":
        if not appts.confirm(conn, org_id, appointment.id):
            return f"appointment_{appointment.status}", intent, contact_id
        answer_inbound(conn, org_id, contact_id, kind, inbound.id, "confirm_ack", appointment.id)
        return "confirmed", intent, contact_id
    if not appts.cancel(conn, org_id, appointment.id, source="patient"):
        return f"appointment_{appointment.status}", intent, contact_id
    refresh_appointment(conn, org_id, appointment.id)
    open_inbox_item(conn, org_id, "appointment_cancelled_by_patient", f"appointment:{appointment.id}:patient_cancel",
                    appointment_id=appointment.id, detail="the patient cancelled by replying to a reminder")
    answer_inbound(conn, org_id, contact_id, kind, inbound.id, "cancel_ack", appointment.id)
    return "cancelled", intent, contact_id


def _answers_a_flow(conn: Connection, org_id: int, contact_ids: list[int]) -> bool:
    """Whether the latest message the contacts got came from a follow-up flow (the reminders' own
    keywords answer reminders, not a flow's question)."""
    purpose = conn.execute(
        select(messages.c.purpose).where(messages.c.org_id == org_id, messages.c.contact_id.in_(contact_ids),
                                         messages.c.sent_at.is_not(None))
        .order_by(messages.c.sent_at.desc(), messages.c.id.desc()).limit(1)).scalar()
    return purpose == FOLLOWUP_PURPOSE


def _fully_opted_out(conn: Connection, org_id: int, contact_ids: list[int]) -> bool:
    """True when every kind of every one of these contacts is already opted out."""
    rows = conn.execute(
        select(preferences.c.opted_out_at).where(preferences.c.org_id == org_id,
                                                 preferences.c.contact_id.in_(contact_ids))
    ).scalars().all()
    return len(rows) >= len(contact_ids) * len(CHANNEL_KINDS) and all(at is not None for at in rows)


def _intent(org: Any, inbound: Any) -> tuple[str | None, int | None]:
    """The reply's intent; a button payload like 'confirm:42' also names the appointment."""
    if inbound.button_payload:
        action, _, ref = inbound.button_payload.partition(":")
        if action in ("confirm", "cancel"):
            return action, int(ref) if ref.isdigit() else None
    keywords = {
        "optout": parse_keywords(org.optout_keywords),
        "confirm": parse_keywords(org.confirm_keywords),
        "cancel": parse_keywords(org.cancel_keywords),
    }
    return classify(inbound.text or "", {k: v for k, v in keywords.items() if v}), None


def _target_appointment(conn: Connection, org_id: int, contact_ids: list[int], inbound: Any,
                        from_button: int | None) -> Any:
    """The appointment a reply is about: the button's, else the replied-to message's, else the
    one of the latest reminder sent to the contacts, else their next upcoming one."""
    now = clock.now()
    live = and_(appointments.c.org_id == org_id, appointments.c.contact_id.in_(contact_ids))
    if from_button is not None:
        return conn.execute(select(appointments).where(live, appointments.c.id == from_button)).first()
    if inbound.in_reply_to:
        row = conn.execute(
            select(appointments).join(messages, and_(messages.c.appointment_id == appointments.c.id,
                                                     messages.c.org_id == org_id))
            .where(live, messages.c.provider_message_id == inbound.in_reply_to)
        ).first()
        if row is not None:
            return row
    row = conn.execute(
        select(appointments).join(messages, and_(messages.c.appointment_id == appointments.c.id,
                                                 messages.c.org_id == org_id))
        .where(live, messages.c.contact_id.in_(contact_ids), messages.c.rule_id.is_not(None),
               messages.c.status.in_(("sent", "delivered", "read")),
               appointments.c.starts_at > now)
        .order_by(messages.c.sent_at.desc()).limit(1)
    ).first()
    if row is not None:
        return row
    return conn.execute(
        select(appointments).where(live, appointments.c.starts_at > now, appointments.c.status.in_(appts.LIVE))
        .order_by(appointments.c.starts_at).limit(1)
    ).first()
