"""Conversations: the patient replies that no keyword handled, waiting for a person (SPEC §6).

There is one store of inbound messages (`inbound_messages`, written by engine/messaging/inbound.py, read by
the follow-up engine too); a reply needs a person when `process_inbound` could not act on it
(free text, a keyword with no appointment, a number no contact carries) and no follow-up flow
handles it. A reply a flow's waiting node took is the flow's while a run holds it unread (that
is decided in the transaction that stores the reply, so a person is never told to answer it
first); once read, it is the flow's when the flow understood it and went on (`flow_handled_at`),
and a person's otherwise (the fallback edge, a run that ended, paused or failed before reading
it, or that has not read it FLOW_CHANCE after it came). A person marks it handled (`handled_at` /
`handled_by`) or answers it: the answer is an ordinary outbox message (purpose
`conversation_reply`, linked to the inbound by its payload and idempotency key), so it has its
events and goes out once through the normal dispatch. On Meta, outside the 24 h customer-service
window only an approved template may go, so `reply_options` says why and offers it instead; to a
contact who opted out (or never consented) nothing goes. A person may also write first
(`send_to_contact`, the contact's page) with the same rules and the same outbox.
Every query here filters on the org.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable, Sequence

from sqlalchemy import and_, case, exists, func, not_, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from engine.core import clock
from engine.people.appointments import LIVE
from engine.tenants.channels import default_channel
from engine.queue.conversation_window import last_inbound, window_open
from engine.flows.lifecycle import CLOCKED
from engine.store.models import appointments, channels, contacts, enrollments, inbound_messages, messages, orgs, users
from engine.queue.outbox import enqueue
from engine.messaging.dispatch.batch import refusal
from engine.messaging.templates import find_template
from gateway.webhook_body import clean_text

#: What `process_inbound` could not act on: no keyword or button did anything with the reply.
NEEDS_PERSON = ("free_text", "no_appointment", "unknown_contact", "voice_note")
#: How a thread names a message the clinic wrote on its own phone (an `inbound_messages` row, `from_me`).
CLINIC_PHONE_PURPOSE = "clinic_phone"
#: The outbox purpose of an answer written in the console.
REPLY_PURPOSE = "conversation_reply"
#: The approved WhatsApp template that reopens a conversation after Meta's window closed.
REOPEN_TEMPLATE = "conversation_reopen"
#: A WhatsApp text is at most 4096 characters; a receptionist's answer is far shorter.
MAX_REPLY = 1000
#: Messages of each direction shown in one thread, the latest ones.
THREAD_ROWS = 200
#: The key a reply form carries (made when the form is shown): a double submit sends once.
FORM_KEY = re.compile(r"^[0-9a-f]{32}$")
#: Outbox rows not shown in a thread: reminders still being planned or waiting for their hour.
_NOT_YET = ("new", "pending", "claimed")
STATES = ("open", "handled", "all")
#: How long a reply a run holds unread is the flow's alone: a step reads it within seconds, so a
#: run that has not read it by then is stuck (its AI failing, the workers down) and the patient
#: should not wait on it.
FLOW_CHANCE = timedelta(minutes=15)


def needs_person(oid: int) -> ColumnElement[bool]:
    """The org's inbound messages a person should see (an opt-out from an unknown number is not one:
    the engine blocked the number already)."""
    im = inbound_messages
    return and_(im.c.org_id == oid, im.c.processed_at.is_not(None), im.c.outcome.in_(NEEDS_PERSON),
                or_(im.c.intent.is_(None), im.c.intent != "optout"))


def held_by_flow(oid: int) -> Any:
    """A run of the org still holds the reply unread: its waiting node took it and reads it at
    its next step. A run that ended, died or is paused for a hand-off holds nothing."""
    e = enrollments
    return exists().where(e.c.org_id == oid, e.c.pending_inbound_id == inbound_messages.c.id,
                          e.c.status.in_(CLOCKED))


def with_flow(oid: int, now: datetime) -> ColumnElement[bool]:
    """The reply is the flow's for now: a run holds it unread, and it came less than FLOW_CHANCE ago."""
    return and_(held_by_flow(oid), inbound_messages.c.processed_at > now - FLOW_CHANCE)


def _fresh(row: Any, now: datetime) -> bool:
    """`with_flow` for a row read with its `held` column."""
    return bool(row.held) and row.processed_at is not None and row.processed_at > now - FLOW_CHANCE


def waiting_for_person(oid: int, now: datetime | None = None) -> ColumnElement[bool]:
    """"Para responder": a reply a person should see that no one handled, no flow understood and
    no run holds for now (`with_flow`)."""
    im = inbound_messages
    return and_(needs_person(oid), im.c.handled_at.is_(None), im.c.flow_handled_at.is_(None),
                not_(with_flow(oid, now or clock.now())))


@dataclass(frozen=True)
class FlowReading:
    """What a follow-up flow did with a reply one of its waiting nodes took. `state` is
    `reading` (a run holds it unread, `with_flow`), `late` (a run still holds it, past
    FLOW_CHANCE), `understood` (the flow handled it), `not_understood` (it read it and left it to
    a person) or `dropped` (the run ended, paused or failed before reading it); the rest are
    codes and node ids of the reading step."""

    enrollment_id: int
    pointer_id: int
    version_id: int
    state: str
    reason: str | None = None
    label: str | None = None
    node: str | None = None
    next: str | None = None


@dataclass(frozen=True)
class AppointmentRef:
    """The appointment a reply is about."""

    id: int
    starts_at: datetime
    professional: str | None
    status: str


@dataclass(frozen=True)
class Item:
    """One inbound message waiting for (or handled by) a person."""

    id: int
    channel_id: int
    channel_name: str
    channel_kind: str
    channel_provider: str
    contact_id: int | None
    contact_name: str | None
    from_address: str | None
    text: str | None
    button_payload: str | None
    in_reply_to: str | None
    received_at: datetime
    outcome: str | None
    handled_at: datetime | None
    handled_by: str | None  # the e-mail of the user who handled it
    appointment: AppointmentRef | None = None
    flow: FlowReading | None = None
    held: bool = False  # a run holds it unread, for now (`with_flow`)
    flow_handled_at: datetime | None = None

    @property
    def state(self) -> str:
        """`open` ("Para responder"), `flow` (a run is reading it), `flow_handled` (a flow
        understood it) or `handled` (a person did)."""
        if self.handled_at is not None:
            return "handled"
        if self.flow_handled_at is not None:
            return "flow_handled"
        if self.held:
            return "flow"
        return "open"


@dataclass(frozen=True)
class Entry:
    """One bubble of a thread: a patient's message, or one of ours."""

    outgoing: bool
    at: datetime
    row_id: int
    text: str | None
    status: str | None = None
    purpose: str | None = None
    outcome: str | None = None
    handled: bool = True
    flow: FlowReading | None = None
    #: A voice note: its state (transcribed / needs_person / pending), its catalogue reason, and
    #: whether its audio is kept (the console plays it from `voice_audio`).
    voice_state: str | None = None
    voice_reason: str | None = None
    has_audio: bool = False


@dataclass(frozen=True)
class ReplyOptions:
    """What the console may send now. `reason` is a catalogue code saying why free text cannot go."""

    free_text: bool
    template_key: str | None = None
    reason: str | None = None

    @property
    def can_send(self) -> bool:
        """Whether anything at all (free text or the template) may go."""
        return self.free_text or self.template_key is not None


@dataclass(frozen=True)
class ReplyResult:
    """What became of a reply: the outbox row, or a catalogue code (refused or already sent)."""

    message_id: int | None
    code: str


def _base_query(oid: int) -> Any:
    im = inbound_messages
    return (
        select(im, channels.c.name.label("channel_name"), channels.c.kind.label("channel_kind"),
               channels.c.provider.label("channel_provider"), contacts.c.name.label("contact_name"),
               users.c.email.label("handler_email"), held_by_flow(oid).label("held"))
        .join(channels, and_(channels.c.id == im.c.channel_id, channels.c.org_id == oid))
        .outerjoin(contacts, and_(contacts.c.id == im.c.contact_id, contacts.c.org_id == oid))
        .outerjoin(users, and_(users.c.id == im.c.handled_by, users.c.org_id == oid))
        .where(needs_person(oid))
    )


def _state_filter(query: Any, state: str, oid: int, now: datetime) -> Any:
    im = inbound_messages
    if state == "open":
        return query.where(waiting_for_person(oid, now))
    if state == "handled":
        return query.where(or_(im.c.handled_at.is_not(None), im.c.flow_handled_at.is_not(None)))
    return query


def _item(row: Any, now: datetime, appointment: AppointmentRef | None = None, flow: FlowReading | None = None) -> Item:
    return Item(
        id=int(row.id), channel_id=int(row.channel_id), channel_name=row.channel_name, channel_kind=row.channel_kind,
        channel_provider=row.channel_provider, contact_id=row.contact_id, contact_name=row.contact_name,
        from_address=row.from_address, text=row.text, button_payload=row.button_payload, in_reply_to=row.in_reply_to,
        received_at=row.received_at, outcome=row.outcome, handled_at=row.handled_at, handled_by=row.handler_email,
        appointment=appointment, flow=flow, held=_fresh(row, now), flow_handled_at=row.flow_handled_at,
    )


def _items(conn: Connection, oid: int, rows: Sequence[Any], now: datetime) -> list[Item]:
    about = appointments_for(conn, oid, rows)
    readings = flow_readings(conn, oid, rows, now)
    return [_item(row, now, about.get(int(row.id)), readings.get(int(row.id))) for row in rows]


def flow_readings(conn: Connection, oid: int, inbounds: Sequence[Any], now: datetime) -> dict[int, FlowReading]:
    """What a flow did with each reply a waiting node took, by inbound id (one query for the
    runs of a whole page). Each row carries its `flow_*` columns, `processed_at` and `held`
    (`held_by_flow`)."""
    taken = [r for r in inbounds if r.flow_enrollment_id is not None]
    if not taken:
        return {}
    e = enrollments
    runs = {int(row.id): row for row in conn.execute(
        select(e.c.id, e.c.pointer_id, e.c.version_id)
        .where(e.c.org_id == oid, e.c.id.in_({int(r.flow_enrollment_id) for r in taken})))}
    found: dict[int, FlowReading] = {}
    for r in taken:
        run = runs.get(int(r.flow_enrollment_id))
        if run is None:
            continue
        result = r.flow_result if isinstance(r.flow_result, dict) else {}
        if r.flow_handled_at is not None:
            state = "understood"
        elif _fresh(r, now):
            state = "reading"
        elif r.held:
            state = "late"
        elif result:
            state = "not_understood"
        else:
            state = "dropped"

        def text(key: str) -> str | None:
            value = result.get(key)
            return value if isinstance(value, str) else None

        found[int(r.id)] = FlowReading(
            enrollment_id=int(run.id), pointer_id=int(run.pointer_id), version_id=int(run.version_id), state=state,
            reason=text("reason"), label=text("class"), node=text("node"), next=text("next"))
    return found


def unhandled_count(conn: Connection, oid: int) -> int:
    """How many of the org's replies wait for a person (the menu's count)."""
    return int(conn.execute(select(func.count()).select_from(inbound_messages)
                            .where(waiting_for_person(oid, clock.now()))).scalar_one())


def list_items(conn: Connection, oid: int, *, state: str = "open", page: int = 0,
               page_size: int = 50) -> tuple[list[Item], int]:
    """One page of the org's replies in `state` (open first when "all"), newest first, and the total."""
    state = state if state in STATES else "open"
    im = inbound_messages
    now = clock.now()
    total = int(conn.execute(_state_filter(select(func.count()).select_from(im).where(needs_person(oid)), state, oid,
                                           now)).scalar_one())
    # Open first as a CASE: NULLs sort first on SQLite and last on PostgreSQL.
    open_first = case((waiting_for_person(oid, now), 0), else_=1)
    rows = conn.execute(_state_filter(_base_query(oid), state, oid, now)
                        .order_by(open_first, im.c.received_at.desc(), im.c.id.desc())
                        .limit(page_size).offset(max(page, 0) * page_size)).all()
    return _items(conn, oid, rows, now), total


def items_after(conn: Connection, oid: int, *, state: str = "open", after: int | None = None,
                limit: int = 50) -> list[Item]:
    """Up to `limit` of the org's replies in `state`, in id order after `after`: the REST API's
    cursor pages (the console pages `list_items`, newest first)."""
    state = state if state in STATES else "open"
    query = _state_filter(_base_query(oid), state, oid, clock.now())
    if after is not None:
        query = query.where(inbound_messages.c.id > after)
    rows = conn.execute(query.order_by(inbound_messages.c.id).limit(limit)).all()
    return _items(conn, oid, rows, clock.now())


def find_item(conn: Connection, oid: int, inbound_id: int) -> Item | None:
    """One of the org's replies that a person should see; None for any other id."""
    row = conn.execute(_base_query(oid).where(inbound_messages.c.id == inbound_id)).first()
    return _items(conn, oid, [row], clock.now())[0] if row is not None else None


def appointments_for(conn: Connection, oid: int, inbounds: Sequence[Any]) -> dict[int, AppointmentRef]:
    """The appointment each reply is about, by inbound id. A reply a follow-up run took is about
    that run's appointment (none for a run that has none: never a guess). Any other: the one of
    the message it answered (WhatsApp's context), else the contact's next live one, else their
    latest past one that was not cancelled. At most four queries for a whole page, not four per
    reply."""
    a = appointments
    columns = (a.c.id, a.c.contact_id, a.c.starts_at, a.c.professional, a.c.status)
    found: dict[int, AppointmentRef] = {}
    taken = [r for r in inbounds if r.flow_enrollment_id is not None]
    if taken:
        e = enrollments
        of_run = {int(row.run_id): row for row in conn.execute(
            select(*columns, e.c.id.label("run_id"))
            .join(e, and_(e.c.appointment_id == a.c.id, e.c.org_id == oid))
            .where(a.c.org_id == oid, e.c.id.in_({int(r.flow_enrollment_id) for r in taken})))}
        for r in taken:
            row = of_run.get(int(r.flow_enrollment_id))
            if row is not None:
                found[int(r.id)] = AppointmentRef(id=int(row.id), starts_at=row.starts_at,
                                                  professional=row.professional, status=row.status)
    # A taken reply whose run has no appointment is only about the message it answered, if any.
    rows = [r for r in inbounds if r.contact_id is not None and int(r.id) not in found
            and (r.flow_enrollment_id is None or r.in_reply_to)]
    if not rows:
        return found
    contact_ids = {int(r.contact_id) for r in rows}
    answered: dict[tuple[int, str, int], Any] = {}
    reply_ids = {r.in_reply_to for r in rows if r.in_reply_to}
    if reply_ids:
        for row in conn.execute(
            select(*columns, messages.c.channel_id, messages.c.provider_message_id)
            .join(messages, and_(messages.c.appointment_id == a.c.id, messages.c.org_id == oid))
            .where(a.c.org_id == oid, a.c.contact_id.in_(contact_ids),
                   messages.c.provider_message_id.in_(reply_ids), messages.c.channel_id.is_not(None))
        ):
            answered[(int(row.channel_id), row.provider_message_id, int(row.contact_id))] = row
    now = clock.now()

    def first_per_contact(where: Any, order: Any) -> dict[int, Any]:
        rank = func.row_number().over(partition_by=a.c.contact_id, order_by=(order, a.c.id)).label("rank")
        ranked = (select(*columns, rank).where(a.c.org_id == oid, a.c.contact_id.in_(contact_ids), where)
                  .subquery())
        return {int(row.contact_id): row for row in conn.execute(select(ranked).where(ranked.c.rank == 1))}

    upcoming = first_per_contact(and_(a.c.starts_at > now, a.c.status.in_(LIVE)), a.c.starts_at)
    past = first_per_contact(and_(a.c.starts_at <= now, a.c.status != "cancelled"), a.c.starts_at.desc())
    for r in rows:
        cid = int(r.contact_id)
        row = answered.get((int(r.channel_id), r.in_reply_to, cid)) if r.in_reply_to else None
        if row is None and r.flow_enrollment_id is None:
            row = upcoming.get(cid) or past.get(cid)
        if row is not None:
            found[int(r.id)] = AppointmentRef(id=int(row.id), starts_at=row.starts_at,
                                              professional=row.professional, status=row.status)
    return found


def thread(conn: Connection, oid: int, item: Item) -> list[Entry]:
    """The conversation with the reply's sender, oldest first: every message they wrote (handled by
    a keyword or not) and every message of ours that went (or is going) out to them."""
    im = inbound_messages
    if item.contact_id is not None:
        phone = conn.execute(select(contacts.c.phone).where(contacts.c.org_id == oid,
                                                            contacts.c.id == item.contact_id)).scalar()
        theirs = or_(im.c.contact_id == item.contact_id,
                     and_(im.c.contact_id.is_(None), im.c.from_address == (phone or item.from_address)))
    else:
        theirs = and_(im.c.contact_id.is_(None), im.c.from_address == item.from_address)
    in_rows = conn.execute(
        select(im.c.id, im.c.text, im.c.button_payload, im.c.received_at, im.c.outcome, im.c.intent,
               im.c.handled_at, im.c.processed_at, im.c.flow_enrollment_id, im.c.flow_result, im.c.flow_handled_at,
               im.c.from_me, held_by_flow(oid).label("held"), im.c.voice_state, im.c.voice_reason,
               im.c.audio.is_not(None).label("has_audio"))
        .where(im.c.org_id == oid, theirs).order_by(im.c.id.desc()).limit(THREAD_ROWS)).all()
    now = clock.now()
    readings = flow_readings(conn, oid, in_rows, now)
    entries = []
    for r in in_rows:
        if r.from_me:
            # Written on the clinic's own phone (engine/messaging/clinic_phone.py): one of ours.
            entries.append(Entry(outgoing=True, at=r.received_at, row_id=int(r.id), text=r.text,
                                 purpose=CLINIC_PHONE_PURPOSE))
            continue
        reading = readings.get(int(r.id))
        entries.append(Entry(
            outgoing=False, at=r.received_at, row_id=int(r.id), text=r.text or r.button_payload, outcome=r.outcome,
            handled=(r.handled_at is not None or r.outcome not in NEEDS_PERSON or r.intent == "optout"
                     or r.flow_handled_at is not None or _fresh(r, now)),
            flow=reading, voice_state=r.voice_state, voice_reason=r.voice_reason, has_audio=bool(r.has_audio)))
    if item.contact_id is not None:
        out_rows = conn.execute(
            select(messages.c.id, messages.c.body, messages.c.payload, messages.c.status, messages.c.purpose,
                   messages.c.created_at, messages.c.sent_at)
            .where(messages.c.org_id == oid, messages.c.contact_id == item.contact_id,
                   or_(messages.c.status.not_in(_NOT_YET), messages.c.purpose == REPLY_PURPOSE))
            .order_by(messages.c.id.desc()).limit(THREAD_ROWS)).all()
        for r in out_rows:
            written = (r.payload or {}).get("text") if isinstance(r.payload, dict) else None
            entries.append(Entry(outgoing=True, at=r.sent_at or r.created_at, row_id=int(r.id),
                                 text=r.body or (written if isinstance(written, str) else None),
                                 status=r.status, purpose=r.purpose))
    return sorted(entries, key=lambda e: (e.at, e.outgoing, e.row_id))


def voice_audio(conn: Connection, oid: int, inbound_id: int) -> tuple[bytes, str] | None:
    """A voice note's audio and type, for the console's player; None when the reply is not the
    org's or has no audio (retention or erasure removed it)."""
    row = conn.execute(select(inbound_messages.c.audio, inbound_messages.c.media_mime).where(
        inbound_messages.c.org_id == oid, inbound_messages.c.id == inbound_id,
        inbound_messages.c.audio.is_not(None))).first()
    return (bytes(row.audio), row.media_mime or "audio/ogg") if row is not None else None


def mark_handled(conn: Connection, oid: int, inbound_ids: Iterable[int], user_id: int | None) -> list[int]:
    """Mark these open replies of the org handled by the user (None: through the REST API, by a
    key); returns the ids that changed (another org's, an already handled one or one no person
    needed are left alone)."""
    ids = [int(i) for i in inbound_ids]
    if not ids:
        return []
    return [int(row.id) for row in conn.execute(
        update(inbound_messages)
        .where(needs_person(oid), inbound_messages.c.id.in_(ids), inbound_messages.c.handled_at.is_(None))
        .values(handled_at=clock.now(), handled_by=user_id)
        .returning(inbound_messages.c.id))]


def reply_options(conn: Connection, oid: int, item: Item, now: datetime | None = None) -> ReplyOptions:
    """What may be sent to the reply's sender now, on the channel kind they wrote on."""
    if item.contact_id is None:
        return ReplyOptions(free_text=False, reason="conversation_unknown_contact")
    return contact_options(conn, oid, item.contact_id, item.channel_kind, now)


def contact_options(conn: Connection, oid: int, contact_id: int, kind: str | None,
                    now: datetime | None = None) -> ReplyOptions:
    """What a person may send the contact now on `kind`: nothing to a contact who refused it (or
    never consented: the rule dispatch applies at send time), free text inside Meta's 24 h window
    (or on a provider without one), else the approved template that reopens the conversation."""
    channel = default_channel(conn, oid, kind) if kind is not None else None
    if kind is None or channel is None:
        return ReplyOptions(free_text=False, reason="conversation_no_channel")
    if refusal(conn, oid, contact_id, kind) is not None:
        return ReplyOptions(free_text=False, reason="conversation_opted_out")
    last = last_inbound(conn, [(oid, contact_id)]).get((oid, channel.id, contact_id))
    if channel.provider != "meta" or window_open(last, now or clock.now()):
        return ReplyOptions(free_text=True)
    # Outside Meta's 24 h window only an approved template goes (the provider refuses free text);
    # the sentence says whether the patient wrote long ago or never wrote on this channel.
    closed = "conversation_window_closed" if last is not None else "conversation_window_not_open"
    org = conn.execute(select(orgs.c.locale).where(orgs.c.id == oid)).one()
    locale = conn.execute(select(contacts.c.locale).where(contacts.c.org_id == oid,
                                                          contacts.c.id == contact_id)).scalar() or org.locale
    template = find_template(conn, oid, REOPEN_TEMPLATE, kind, locale)
    if template is None or not template.meta_template_name:
        return ReplyOptions(free_text=False, reason=f"{closed}_no_template")
    return ReplyOptions(free_text=False, template_key=REOPEN_TEMPLATE, reason=closed)


def compose_kind(conn: Connection, oid: int, contact_id: int) -> str | None:
    """The channel kind a person writing first to the contact uses: the one they last wrote on,
    else the first kind (WhatsApp, SMS, e-mail) the org has a channel for and the contact an
    address on; None when there is none."""
    last = conn.execute(
        select(channels.c.kind).select_from(inbound_messages.join(
            channels, and_(channels.c.id == inbound_messages.c.channel_id, channels.c.org_id == oid)))
        .where(inbound_messages.c.org_id == oid, inbound_messages.c.contact_id == contact_id)
        .order_by(inbound_messages.c.id.desc()).limit(1)).scalar()
    if last is not None:
        return str(last)
    row = conn.execute(select(contacts.c.phone, contacts.c.email)
                       .where(contacts.c.org_id == oid, contacts.c.id == contact_id)).first()
    if row is None:
        return None
    for kind, address in (("whatsapp", row.phone), ("sms", row.phone), ("email", row.email)):
        if address and default_channel(conn, oid, kind) is not None:
            return kind
    return None


def clean_reply(text: str | None) -> tuple[str | None, str | None]:
    """The typed answer as it may be sent, or a catalogue code saying what is wrong with it."""
    cleaned = clean_text(text or "").replace("\r\n", "\n").strip()
    if not cleaned:
        return None, "conversation_text_required"
    if len(cleaned) > MAX_REPLY:
        return None, "conversation_text_too_long"
    return cleaned, None


def send_reply(conn: Connection, oid: int, item: Item, user_id: int | None, form_key: str, *,
               text: str | None = None, use_template: bool = False) -> ReplyResult:
    """Queue the console's answer to `item` (free text, or the approved template when asked) and
    mark the sender's open replies handled. One form key sends once: a resubmitted form answers
    `conversation_already_sent`."""
    if not FORM_KEY.match(form_key):
        raise ValueError("form key")
    if item.contact_id is None:
        return ReplyResult(None, "conversation_unknown_contact")
    return _send(conn, oid, item.contact_id, item.channel_kind, user_id, reply_options(conn, oid, item),
                 key=f"conversation:{item.id}:{form_key}", text=text, use_template=use_template,
                 payload={"inbound_id": item.id},
                 appointment_id=item.appointment.id if item.appointment is not None else None, answered=item.id)


def send_to_contact(conn: Connection, oid: int, contact_id: int, user_id: int, form_key: str, *,
                    text: str | None = None, use_template: bool = False) -> ReplyResult:
    """Queue a message a person writes first to the contact (from the contact's page) on
    `compose_kind`, with the rules and the outbox of an answer: refused to a contact who opted
    out, free text only inside Meta's window, the approved template outside it. The contact's
    open replies count as answered."""
    if not FORM_KEY.match(form_key):
        raise ValueError("form key")
    kind = compose_kind(conn, oid, contact_id)
    options = contact_options(conn, oid, contact_id, kind)
    if kind is None:
        return ReplyResult(None, options.reason or "conversation_no_channel")
    return _send(conn, oid, contact_id, kind, user_id, options, key=f"compose:{contact_id}:{form_key}",
                 text=text, use_template=use_template, payload={})


def _send(conn: Connection, oid: int, contact_id: int, kind: str, user_id: int | None, options: ReplyOptions, *,
          key: str, text: str | None, use_template: bool, payload: dict[str, Any],
          appointment_id: int | None = None, answered: int | None = None) -> ReplyResult:
    """Queue what `options` allow (the one outbox row, sent once per key) and mark the contact's
    open replies handled."""
    template_key: str | None = None
    if use_template:
        if options.template_key is None:
            return ReplyResult(None, options.reason or "conversation_template_not_needed")
        template_key = options.template_key
    else:
        if not options.free_text:
            return ReplyResult(None, options.reason or "conversation_no_channel")
        cleaned, problem = clean_reply(text)
        if problem is not None:
            return ReplyResult(None, problem)
        payload = {**payload, "text": cleaned}
    message_id = enqueue(
        conn, org_id=oid, contact_id=contact_id, channel_kind=kind, purpose=REPLY_PURPOSE,
        idempotency_key=key, template_key=template_key, payload=payload or None, appointment_id=appointment_id,
        respect_window=False,  # a person is writing now, not a reminder waiting for its hour
    )
    if message_id is None:
        return ReplyResult(None, "conversation_already_sent")
    open_ids = set(conn.execute(select(inbound_messages.c.id).where(
        needs_person(oid), inbound_messages.c.contact_id == contact_id,
        inbound_messages.c.handled_at.is_(None))).scalars().all())
    mark_handled(conn, oid, open_ids | ({answered} if answered is not None else set()), user_id)
    return ReplyResult(message_id, "conversation_reply_queued")
