"""Caixa do sandbox: what the sandbox provider "sent", as one chat per contact, and a box to answer
as the patient.

The sandbox records each message in `sandbox_messages`; the engine's `messages` row with the same
channel and provider id says which contact it was for and how far it got (sent, delivered, read).
A few sandbox rows have no such row (a channel's test send): they join the contact whose phone or
e-mail they went to, or form a conversation of their own under the bare address.

A reply goes through `admin.sandbox_chat.reply_as_patient` (the path `lembra sandbox reply` takes
too): in-process, as the sandbox provider's own webhook body with the channel's secret, to
`admin.webhooks.deliver`, so it travels the same inbound path as a real provider's: verified,
stored, then matched to OK / CANCELAR / SAIR by the engine. Agents read and reply (answering as
the patient changes nothing a real patient could not). Every query is scoped to the signed-in user's org.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flask import abort, current_app, flash, redirect, request, url_for
from flask_admin import expose
from sqlalchemy import and_, or_, select
from sqlalchemy.engine import Connection

from admin.i18n import _, _l, current_locale
from admin.ids import valid_id
from admin.sandbox_chat import MAX_REPLY, reply_as_patient
from admin.views.base import (
    KIND_LABELS,
    PURPOSE_LABELS,
    TenantPageView,
    badge,
    db_session,
    is_editor,
    local_dt,
    org_id,
)
from admin.live import POLL
from admin.views.followup.handoff import handoff_state
from admin.views.words import reply_outcome_text
from engine.core import clock
from engine.store.models import channels, contacts, inbound_messages, messages, sandbox_messages
from engine.store.runtime import Runtime
from gateway.errors import WebhookError

#: Recent rows of each direction scanned to build the contact list (the sandbox is for trying things
#: out; a busier org still sees its latest conversations).
LIST_ROWS = 500
#: Messages of each direction shown in one conversation, the latest ones.
THREAD_ROWS = 200
#: Messages the engine sends because of a patient's reply: on a tie in time (a frozen test clock, or
#: the same millisecond) they come after the reply that caused them.
REPLY_PURPOSES = ("confirm_ack", "cancel_ack", "optout_confirmation")

#: Day and time in the contact list, short enough to leave room for the name, per console language.
SHORT_FORMATS = {"pt_BR": "%d/%m %H:%M", "en": "%m-%d %H:%M"}

#: What the engine made of a reply (inbound_messages.outcome), in the receptionist's words.
#: The quick-reply buttons the engine puts on WhatsApp reminders, by payload action.
BUTTON_TITLES = {"confirm": _l("Confirmar"), "cancel": _l("Cancelar")}


@dataclass
class Entry:
    """One bubble of a conversation."""

    outgoing: bool
    at: datetime
    tie: int  # order among entries at the same instant (see REPLY_PURPOSES)
    row_id: int
    text: str
    kind: str
    subject: str | None = None
    buttons: list[dict[str, str]] = field(default_factory=list)
    status: str | None = None
    purpose: str | None = None
    outcome: str | None = None
    processed: bool = True

    @property
    def replyable(self) -> bool:
        """The patient can answer it here (e-mail replies are not an inbound path of the engine)."""
        return self.outgoing and self.kind != "email"


@dataclass
class Conversation:
    """One entry of the contact list."""

    contact_id: int | None
    address: str | None
    name: str
    last_at: datetime
    last_text: str
    last_outgoing: bool
    last_tie: int = 0

    @property
    def args(self) -> dict[str, Any]:
        """The query string that opens it."""
        return {"contact": self.contact_id} if self.contact_id is not None else {"address": self.address}


def _outgoing_query(oid: int) -> Any:
    sm = sandbox_messages
    return (
        select(sm.c.id, sm.c.channel_id, sm.c.provider_message_id, sm.c.to_address, sm.c.subject, sm.c.body,
               sm.c.buttons, sm.c.created_at, channels.c.kind, messages.c.id.label("message_id"),
               messages.c.contact_id, messages.c.status, messages.c.purpose)
        .join(channels, and_(channels.c.id == sm.c.channel_id, channels.c.org_id == oid))
        .outerjoin(messages, and_(messages.c.org_id == oid, messages.c.channel_id == sm.c.channel_id,
                                  messages.c.provider_message_id.is_not(None),
                                  messages.c.provider_message_id == sm.c.provider_message_id))
        .where(sm.c.org_id == oid)
    )


def _incoming_query(oid: int) -> Any:
    im = inbound_messages
    return (
        select(im.c.id, im.c.channel_id, im.c.from_address, im.c.text, im.c.button_payload, im.c.received_at,
               im.c.contact_id, im.c.outcome, im.c.processed_at, channels.c.kind)
        .join(channels, and_(channels.c.id == im.c.channel_id, channels.c.org_id == oid,
                             channels.c.provider == "sandbox"))
        .where(im.c.org_id == oid)
    )


def _contacts_by_address(conn: Connection, oid: int, addresses: set[str]) -> dict[str, list[int]]:
    """The org's contacts whose stored phone (E.164, as the sandbox got it) or e-mail is one of these."""
    if not addresses:
        return {}
    lowered = {a.lower() for a in addresses}
    out: dict[str, list[int]] = {}
    for row in conn.execute(
        select(contacts.c.id, contacts.c.phone, contacts.c.email)
        .where(contacts.c.org_id == oid, contacts.c.erased_at.is_(None),
               or_(contacts.c.phone.in_(addresses), contacts.c.email.in_(lowered)))
        .order_by(contacts.c.id)
    ):
        for address in addresses:
            if address == row.phone or (row.email and address.lower() == row.email):
                out.setdefault(address, []).append(int(row.id))
    return out


def _outgoing_entry(row: Any) -> Entry:
    return Entry(
        outgoing=True, at=row.created_at, tie=2 if row.purpose in REPLY_PURPOSES else 0, row_id=int(row.id),
        text=row.body or "", kind=row.kind, subject=row.subject,
        buttons=[b for b in (row.buttons or []) if isinstance(b, dict) and b.get("id")],
        status=row.status, purpose=row.purpose,
    )


def _incoming_entry(row: Any) -> Entry:
    text = row.text
    if text is None and row.button_payload:
        # Payloads are "confirm:<appointment id>" / "cancel:<id>" (engine/messaging/templates.py); show the button.
        action = row.button_payload.partition(":")[0]
        title = BUTTON_TITLES.get(action, row.button_payload)
        text = _("Tocou no botão “%(botao)s”", botao=title)
    return Entry(outgoing=False, at=row.received_at, tie=1, row_id=int(row.id), text=text or "", kind=row.kind,
                 outcome=row.outcome, processed=row.processed_at is not None)


def conversations(conn: Connection, oid: int) -> list[Conversation]:
    """The org's sandbox conversations, the most recent first (from the latest LIST_ROWS rows of each
    direction)."""
    out_rows = conn.execute(_outgoing_query(oid).order_by(sandbox_messages.c.id.desc()).limit(LIST_ROWS)).all()
    in_rows = conn.execute(_incoming_query(oid).order_by(inbound_messages.c.id.desc()).limit(LIST_ROWS)).all()
    loose = {r.to_address for r in out_rows if r.contact_id is None} | \
        {r.from_address for r in in_rows if r.contact_id is None and r.from_address}
    by_address = _contacts_by_address(conn, oid, loose)

    found: dict[tuple[str, Any], Conversation] = {}

    def add(keys: list[tuple[str, Any]], entry: Entry) -> None:
        for key in keys:
            conv = found.get(key)
            if conv is None:
                conv = found[key] = Conversation(
                    contact_id=key[1] if key[0] == "c" else None, address=key[1] if key[0] == "a" else None,
                    name=key[1] if key[0] == "a" else "", last_at=entry.at, last_text=entry.text,
                    last_outgoing=entry.outgoing, last_tie=entry.tie)
            if (entry.at, entry.tie) > (conv.last_at, conv.last_tie):
                conv.last_at, conv.last_text, conv.last_outgoing, conv.last_tie = \
                    entry.at, entry.text, entry.outgoing, entry.tie

    for r in out_rows:
        add(_keys(r.contact_id, r.to_address, by_address), _outgoing_entry(r))
    for r in in_rows:
        add(_keys(r.contact_id, r.from_address, by_address), _incoming_entry(r))

    ids = [conv.contact_id for conv in found.values() if conv.contact_id is not None]
    if ids:
        for row in conn.execute(select(contacts.c.id, contacts.c.name, contacts.c.phone, contacts.c.email)
                                .where(contacts.c.org_id == oid, contacts.c.id.in_(ids))):
            found[("c", int(row.id))].name = row.name or row.phone or row.email or _("Contato %(id)s", id=row.id)
    return sorted(found.values(), key=lambda c: c.last_at, reverse=True)


def _keys(contact_id: int | None, address: str | None, by_address: dict[str, list[int]]) -> list[tuple[str, Any]]:
    if contact_id is not None:
        return [("c", int(contact_id))]
    if address and address in by_address:
        return [("c", cid) for cid in by_address[address]]
    return [("a", address or "?")]


def thread(conn: Connection, oid: int, *, contact: Any = None, address: str | None = None) -> list[Entry]:
    """One conversation, oldest first: a contact's (its own messages and replies, plus loose rows to or
    from its phone or e-mail) or a bare address's."""
    sm, im = sandbox_messages, inbound_messages
    if contact is not None:
        addresses = [a for a in (contact.phone, contact.email) if a]
        out_where = or_(messages.c.contact_id == contact.id,
                        and_(messages.c.id.is_(None), sm.c.to_address.in_(addresses)))
        in_where = or_(im.c.contact_id == contact.id, and_(im.c.contact_id.is_(None), im.c.from_address.in_(addresses)))
    else:
        out_where = and_(messages.c.id.is_(None), sm.c.to_address == address)
        in_where = and_(im.c.contact_id.is_(None), im.c.from_address == address)
    out_rows = conn.execute(_outgoing_query(oid).where(out_where).order_by(sm.c.id.desc()).limit(THREAD_ROWS)).all()
    in_rows = conn.execute(_incoming_query(oid).where(in_where).order_by(im.c.id.desc()).limit(THREAD_ROWS)).all()
    entries = [_outgoing_entry(r) for r in out_rows] + [_incoming_entry(r) for r in in_rows]
    return sorted(entries, key=lambda e: (e.at, e.tie, e.row_id))


class SandboxView(TenantPageView):
    """Caixa do sandbox (endpoint `sandbox`, /admin/sandbox/): read by every role, replies too."""

    @expose("/")
    def index(self) -> Any:
        """The contact list and the open conversation (the most recent one unless the URL names one)."""
        oid = org_id()
        session = db_session()
        conn = session.connection()
        convs = conversations(conn, oid)
        contact, address = _requested(conn, oid)
        if contact is None and address is None and convs:
            first = convs[0]
            if first.contact_id is not None:
                contact = _contact(conn, oid, first.contact_id)
            else:
                address = first.address
        selected: Conversation | None = None
        entries: list[Entry] = []
        if contact is not None or address is not None:
            entries = thread(conn, oid, contact=contact, address=address)
            if contact is None and not entries:
                abort(404)  # an address this org never sent to nor heard from
            selected = next((c for c in convs if (contact is not None and c.contact_id == contact.id)
                             or (contact is None and c.address == address)), None)
            if selected is None:  # a contact of the org with no sandbox traffic (yet), or an old one
                name = (contact.name or contact.phone or contact.email or "") if contact is not None else address
                selected = Conversation(contact_id=contact.id if contact is not None else None, address=address,
                                        name=name or "", last_at=entries[-1].at if entries else clock.now(),
                                        last_text="", last_outgoing=True)
        # Under the name, where the messages went: the contact's phone and e-mail, or the bare address.
        addresses = [a for a in (contact.phone, contact.email) if a] if contact is not None else \
            [address] if address else []
        target = next((e for e in reversed(entries) if e.replyable), None)
        has_sandbox = conn.execute(select(channels.c.id).where(
            channels.c.org_id == oid, channels.c.provider == "sandbox").limit(1)).first() is not None
        # Whether a person holds this conversation (its hand-off button posts to the contact's page).
        handoff = handoff_state(conn, oid, contact.id) if contact is not None else None
        session.rollback()  # read only; the scoped session is reused by the next request
        return self.render(
            "admin/sandbox.html", conversations=convs, selected=selected, addresses=addresses, entries=entries,
            target=target, has_sandbox=has_sandbox, can_configure=is_editor(), local_dt=local_dt, short_dt=short_dt,
            badge=badge, kind_labels=KIND_LABELS, purpose_labels=PURPOSE_LABELS, outcome_label=outcome_label,
            max_reply=MAX_REPLY, handoff=handoff, poll=POLL,
        )

    @expose("/thread/")
    def thread_rows(self) -> Any:
        """The open conversation's bubbles alone (the chat's live poll), for the contact (404 unless
        the org's own) or bare address the URL names."""
        oid = org_id()
        session = db_session()
        conn = session.connection()
        contact, address = _requested(conn, oid)
        if contact is None and address is None:
            abort(404)
        entries = thread(conn, oid, contact=contact, address=address)
        session.rollback()
        if contact is None and not entries:
            abort(404)  # an address this org never sent to nor heard from
        return self.render("admin/sandbox_thread.html", entries=entries, local_dt=local_dt, badge=badge,
                           kind_labels=KIND_LABELS, purpose_labels=PURPOSE_LABELS, outcome_label=outcome_label)

    @expose("/reply/", methods=("POST",))
    def reply(self) -> Any:
        """Send the typed text (or a tapped quick-reply button) as the patient. The app's CSRFProtect
        has already refused a POST without the session's token."""
        oid = org_id()
        raw_id = request.form.get("sandbox_message_id", "")
        if not valid_id(raw_id):
            abort(404)
        session = db_session()
        conn = session.connection()
        original = conn.execute(
            select(sandbox_messages, channels.c.kind)
            .join(channels, and_(channels.c.id == sandbox_messages.c.channel_id, channels.c.org_id == oid))
            .where(sandbox_messages.c.org_id == oid, sandbox_messages.c.id == int(raw_id))).first()
        if original is None:
            abort(404)  # another org's message, or none
        back = url_for(".index", **_conversation_args(conn, oid, original))
        session.rollback()
        text = (request.form.get("text") or "").strip()
        button = request.form.get("button") or None
        if original.kind == "email":
            flash(_("E-mails não recebem resposta pelo sandbox: responda a uma mensagem de WhatsApp ou SMS."), "error")
            return redirect(back)
        if button is not None and button not in {b.get("id") for b in (original.buttons or []) if isinstance(b, dict)}:
            abort(400)
        if button is None and not text:
            flash(_("Escreva a resposta do paciente."), "error")
            return redirect(back)
        if len(text) > MAX_REPLY:
            flash(_("A resposta passa de %(max)d caracteres.", max=MAX_REPLY), "error")
            return redirect(back)
        rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
        try:
            reply_as_patient(rt, org_id=oid, channel_id=original.channel_id, from_address=original.to_address,
                             text=text or None, button=button, in_reply_to=original.provider_message_id)
        except WebhookError as exc:
            flash(_("Resposta recusada: %(motivo)s", motivo=exc.reason), "error")
        else:
            flash(_("Resposta enviada como o paciente."), "success")
        return redirect(back)


def short_dt(value: datetime) -> str:
    """Day and time of a conversation's last message, in the org's time zone (no year)."""
    return local_dt(value, SHORT_FORMATS.get(current_locale(), SHORT_FORMATS["pt_BR"]))


def outcome_label(entry: Entry) -> str:
    """What the engine made of a patient's reply."""
    if not entry.processed:
        return _("Aguardando o Lembra processar a resposta")
    return reply_outcome_text(entry.outcome)


def _contact(conn: Connection, oid: int, contact_id: int) -> Any:
    return conn.execute(select(contacts.c.id, contacts.c.name, contacts.c.phone, contacts.c.email)
                        .where(contacts.c.org_id == oid, contacts.c.id == contact_id)).first()


def _requested(conn: Connection, oid: int) -> tuple[Any, str | None]:
    """The contact (404 unless the org's own) or bare address named in the URL, if any."""
    raw = request.args.get("contact")
    if raw is not None:
        if not valid_id(raw):
            abort(404)
        contact = _contact(conn, oid, int(raw))
        if contact is None:
            abort(404)
        return contact, None
    address = request.args.get("address") or None
    return None, address


def _conversation_args(conn: Connection, oid: int, original: Any) -> dict[str, Any]:
    """Where a sandbox message is shown: its contact's conversation, else its bare address's."""
    contact_id = conn.execute(select(messages.c.contact_id).where(
        messages.c.org_id == oid, messages.c.channel_id == original.channel_id,
        messages.c.provider_message_id == original.provider_message_id)).scalar()
    if contact_id is None:
        ids = _contacts_by_address(conn, oid, {original.to_address}).get(original.to_address)
        contact_id = ids[0] if ids else None
    return {"contact": int(contact_id)} if contact_id is not None else {"address": original.to_address}

