"""Inbound (SPEC §5, §6) through the sandbox webhook: receive → process_inbound, and status events."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import func, select, update

from engine.messaging import dispatch
from engine.messaging.inbound import process_inbound, receive
from engine.store.models import (
    appointments,
    channels,
    inbound_messages,
    message_events,
    messages,
    preferences,
)
from gateway.contract import WebhookRequest
from gateway.errors import BadSignature, MalformedWebhook, UnknownChannel
from tests.factories import World, local, sandbox_headers

UTC = timezone.utc
PHONE = "+5516999887766"
#: Thursday 2026-12-03 14:00 São Paulo; its 24 h reminder goes on Wednesday 14:00.
APPOINTMENT = local(2026, 12, 3, 14, 0)
DUE = local(2026, 12, 2, 14, 0).astimezone(UTC)
_ids = itertools.count(1)


def request(body: Any, headers: dict[str, str] | None = None) -> WebhookRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return WebhookRequest(method="POST", url="/webhooks/sandbox", headers=headers or {}, body=raw)


def reply(rt, channel_id: int, *, text: str | None = None, button: str | None = None, sender: str = PHONE,
          in_reply_to: str | None = None, message_id: str | None = None) -> list[str | None]:
    """The patient writes; returns the outcome of each new inbound message."""
    payload: dict[str, Any] = {"type": "message", "id": message_id or f"in-{next(_ids)}", "from": sender,
                               "timestamp": rt_now_ts()}
    if text is not None:
        payload["text"] = text
    if button is not None:
        payload["button"] = button
    if in_reply_to is not None:
        payload["in_reply_to"] = in_reply_to
    received = receive(rt, "sandbox", channel_id, request(payload, sandbox_headers(rt, channel_id)))
    return [process_inbound(rt, inbound_id) for inbound_id in received.inbound_ids]


def status(rt, channel_id: int, provider_message_id: str, value: str, at: datetime, **extra: Any) -> int:
    payload = {"type": "status", "id": provider_message_id, "status": value, "timestamp": at.timestamp(), **extra}
    return receive(rt, "sandbox", channel_id, request(payload, sandbox_headers(rt, channel_id))).statuses_applied


def rt_now_ts() -> float:
    from engine.core import clock

    return clock.now().timestamp()


def send_due(rt) -> list[int]:
    """Claim and send everything due now; returns the ids sent."""
    sent = []
    for mid in dispatch.claim_due(rt, limit=100):
        if dispatch.send_one(rt, mid) == "sent":
            sent.append(mid)
    return sent


def clinic(rt, slug: str = "clinica", *, cancel_notice: bool = True) -> World:
    world = World(rt, slug)
    world.channel("whatsapp")
    world.channel("email")
    world.rule(1440)
    world.rule(120, kinds=("email",))
    if cancel_notice:
        world.rule(0, trigger="on_cancel", purpose="session_cancellation")
    return world


def reminded(rt, clock, world: World) -> tuple[int, int, Any]:
    """A contact, an appointment, and its 24 h reminder sent on WhatsApp."""
    contact = world.contact()
    appointment = world.appointment(contact, APPOINTMENT)
    clock.set(DUE)
    [reminder_id] = send_due(rt)
    return contact, appointment, world.message(reminder_id)


def appointment_row(rt, appointment_id: int) -> Any:
    with rt.db.connect() as conn:
        return conn.execute(select(appointments).where(appointments.c.id == appointment_id)).one()


def inbound_count(rt) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(inbound_messages)).scalar_one()


def prefs(rt, contact_id: int) -> dict[str, tuple[bool, bool]]:
    """kind → (opted_in, opted_out)."""
    with rt.db.connect() as conn:
        rows = conn.execute(select(preferences).where(preferences.c.contact_id == contact_id)).all()
    return {r.kind: (bool(r.opted_in), r.opted_out_at is not None) for r in rows}


# --- opt-out -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["SAIR", "sair", " Sair! "])
def test_sair_opts_out_of_everything_and_confirms_once(rt, clock, text):
    world = clinic(rt)
    contact, appointment, reminder = reminded(rt, clock, world)
    open_before = [m.id for m in world.messages(status="pending")]
    assert open_before  # the 2 h e-mail reminder
    clock.advance(timedelta(minutes=7))

    assert reply(rt, world.channels["whatsapp"], text=text) == ["opted_out"]

    assert prefs(rt, contact) == {k: (False, True) for k in ("whatsapp", "email", "sms")}
    for mid in open_before:
        row = world.message(mid)
        assert (row.status, row.skip_reason) == ("cancelled", "opted_out")
    assert world.message(reminder.id).status == "sent"  # what went out stays as it was
    [goodbye] = world.messages(purpose="optout_confirmation")
    assert (goodbye.status, goodbye.channel_kind, goodbye.due_at) == ("pending", "whatsapp", clock.now())
    assert send_due(rt) == [goodbye.id]
    last = world.sandbox()[-1]
    assert "não receberá mais mensagens" in last.body
    assert len(world.sandbox()) == 2
    # Nothing is queued for them afterwards, even for a new appointment.
    world.appointment(contact, local(2026, 12, 4, 14, 0))
    world.populate()
    assert [m.status for m in world.messages() if m.purpose == "session_reminder"].count("pending") == 0
    assert appointment_row(rt, appointment).status == "scheduled"
    # Saying it again changes nothing and is not answered a second time.
    assert reply(rt, world.channels["whatsapp"], text=text) == ["already_opted_out"]
    assert len(world.messages(purpose="optout_confirmation")) == 1


def test_opt_out_reply_from_whatsapp_jid_is_matched(rt, clock):
    world = clinic(rt)
    contact, _, _ = reminded(rt, clock, world)
    assert reply(rt, world.channels["whatsapp"], text="SAIR", sender="5516999887766@s.whatsapp.net") == ["opted_out"]
    assert prefs(rt, contact)["whatsapp"] == (False, True)


# --- confirm -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["OK", "CONFIRMAR", "sim"])
def test_confirm_confirms_the_appointment_of_the_latest_reminder(rt, clock, text):
    world = clinic(rt)
    contact = world.contact()
    sooner = world.appointment(contact, local(2026, 12, 3, 16, 0))
    later = world.appointment(contact, local(2026, 12, 3, 18, 0))
    clock.set(local(2026, 12, 2, 16, 0))
    send_due(rt)
    clock.set(local(2026, 12, 2, 18, 0))
    send_due(rt)  # the latest reminder is about the later appointment
    clock.advance(timedelta(minutes=20))

    assert reply(rt, world.channels["whatsapp"], text=text) == ["confirmed"]

    assert appointment_row(rt, later).status == "confirmed"
    assert appointment_row(rt, later).confirmed_at == clock.now()
    assert appointment_row(rt, sooner).status == "scheduled"
    [ack] = world.messages(purpose="confirm_ack")
    assert (ack.appointment_id, ack.status) == (later, "pending")
    assert send_due(rt) == [ack.id]
    assert "confirmada" in world.sandbox()[-1].body
    assert "18:00" in world.sandbox()[-1].body


def test_reply_to_a_specific_reminder_confirms_that_appointment(rt, clock):
    world = clinic(rt)
    contact = world.contact()
    sooner = world.appointment(contact, local(2026, 12, 3, 16, 0))
    later = world.appointment(contact, local(2026, 12, 3, 18, 0))
    clock.set(local(2026, 12, 2, 16, 0))
    [first] = send_due(rt)
    clock.set(local(2026, 12, 2, 18, 0))
    send_due(rt)
    quoted = world.message(first).provider_message_id
    assert reply(rt, world.channels["whatsapp"], text="ok", in_reply_to=quoted) == ["confirmed"]
    assert appointment_row(rt, sooner).status == "confirmed"
    assert appointment_row(rt, later).status == "scheduled"


def test_confirm_button_names_the_appointment(rt, clock):
    world = clinic(rt)
    contact = world.contact()
    sooner = world.appointment(contact, local(2026, 12, 3, 16, 0))
    later = world.appointment(contact, local(2026, 12, 3, 18, 0))
    clock.set(local(2026, 12, 2, 16, 0))
    send_due(rt)
    clock.set(local(2026, 12, 2, 18, 0))
    send_due(rt)  # the latest reminder is about the later appointment, but the button names the sooner
    first, second = world.sandbox()
    assert [b["id"] for b in first.buttons] == [f"confirm:{sooner}", f"cancel:{sooner}"]
    assert [b["id"] for b in second.buttons] == [f"confirm:{later}", f"cancel:{later}"]
    assert reply(rt, world.channels["whatsapp"], button=f"confirm:{sooner}") == ["confirmed"]
    assert appointment_row(rt, sooner).status == "confirmed"
    assert appointment_row(rt, later).status == "scheduled"


def test_confirming_twice_acks_once(rt, clock):
    world = clinic(rt)
    _, appointment, _ = reminded(rt, clock, world)
    assert reply(rt, world.channels["whatsapp"], text="OK") == ["confirmed"]
    assert reply(rt, world.channels["whatsapp"], text="OK") == ["appointment_confirmed"]
    assert len(world.messages(purpose="confirm_ack")) == 1
    assert appointment_row(rt, appointment).status == "confirmed"


# --- cancel ------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", [{"text": "CANCELAR"}, {"text": "cancelar."}, {"button": "cancel:{id}"}])
def test_cancel_cancels_the_appointment_and_its_reminders(rt, clock, how):
    world = clinic(rt)
    contact, appointment, reminder = reminded(rt, clock, world)
    [pending] = world.messages(status="pending")  # the 2 h e-mail reminder
    kwargs = {k: v.format(id=appointment) for k, v in how.items()}

    assert reply(rt, world.channels["whatsapp"], **kwargs) == ["cancelled"]

    row = appointment_row(rt, appointment)
    assert (row.status, row.cancel_source) == ("cancelled", "patient")
    assert world.message(pending.id).status == "cancelled"
    assert world.events(pending.id)[-1] == "cancelled"
    [item] = world.inbox()
    assert (item.kind, item.appointment_id) == ("appointment_cancelled_by_patient", appointment)
    assert world.messages(purpose="session_cancellation") == []  # the clinic's notice is not for this
    [ack] = world.messages(purpose="cancel_ack")
    assert ack.status == "pending"
    assert send_due(rt) == [ack.id]
    assert "cancelada" in world.sandbox()[-1].body
    # Consent is untouched: cancelling an appointment is not opting out.
    assert prefs(rt, contact)["whatsapp"] == (True, False)


# --- nothing to do -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["vou sair mais cedo", "ok, mas posso chegar 10 min atrasada?", "Obrigada!"])
def test_free_text_changes_nothing(rt, clock, text):
    world = clinic(rt)
    contact, appointment, _ = reminded(rt, clock, world)
    before = [(m.id, m.status) for m in world.messages()]
    assert reply(rt, world.channels["whatsapp"], text=text) == ["free_text"]
    assert [(m.id, m.status) for m in world.messages()] == before
    assert appointment_row(rt, appointment).status == "scheduled"
    assert prefs(rt, contact) == {k: (True, False) for k in ("whatsapp", "email", "sms")}
    assert world.inbox() == []
    with rt.db.connect() as conn:
        row = conn.execute(select(inbound_messages)).one()
    assert (row.outcome, row.intent, row.contact_id) == ("free_text", None, contact)


def test_unknown_sender_changes_nothing(rt, clock):
    world = clinic(rt)
    _, appointment, _ = reminded(rt, clock, world)
    before = [(m.id, m.status) for m in world.messages()]
    assert reply(rt, world.channels["whatsapp"], text="CANCELAR", sender="+5511912345678") == ["unknown_contact"]
    assert [(m.id, m.status) for m in world.messages()] == before
    assert appointment_row(rt, appointment).status == "scheduled"


# --- webhook hygiene -------------------------------------------------------------------------


def test_same_webhook_twice_is_a_no_op(rt, clock):
    world = clinic(rt)
    _, appointment, _ = reminded(rt, clock, world)
    channel_id = world.channels["whatsapp"]
    assert reply(rt, channel_id, text="OK", message_id="wamid-1") == ["confirmed"]
    assert reply(rt, channel_id, text="OK", message_id="wamid-1") == []
    assert inbound_count(rt) == 1
    assert len(world.messages(purpose="confirm_ack")) == 1
    with rt.db.connect() as conn:
        [inbound_id] = conn.execute(select(inbound_messages.c.id)).scalars().all()
    assert process_inbound(rt, inbound_id) is None  # a redelivered task does nothing either
    assert len(world.messages(purpose="confirm_ack")) == 1
    assert appointment_row(rt, appointment).status == "confirmed"


def test_bad_secret_is_refused_and_nothing_is_stored(rt, clock):
    world = World(rt)
    channel_id = world.channel("whatsapp", webhook_secret="s3cr3t")
    world.contact()
    body = {"type": "message", "id": "m1", "from": PHONE, "text": "SAIR"}
    for headers in ({}, {"X-Sandbox-Secret": "wrong"}, {"X-Sandbox-Secret": "s3cr3t "}):
        with pytest.raises(BadSignature):
            receive(rt, "sandbox", channel_id, request(body, headers))
    assert inbound_count(rt) == 0
    received = receive(rt, "sandbox", channel_id, request(body, {"x-sandbox-secret": "s3cr3t"}))
    assert len(received.inbound_ids) == 1


def test_every_sandbox_channel_gets_a_secret_of_its_own_and_its_webhook_needs_it(rt, clock):
    world, other = World(rt, slug="clinica-a"), World(rt, slug="clinica-b")
    channel_id, other_id = world.channel("whatsapp"), other.channel("whatsapp")
    world.contact()
    secret = sandbox_headers(rt, channel_id)["X-Sandbox-Secret"]
    assert len(secret) >= 40 and secret != sandbox_headers(rt, other_id)["X-Sandbox-Secret"]
    with rt.db.connect() as conn:
        row = conn.execute(select(channels).where(channels.c.id == channel_id)).one()
    assert row.credentials is not None and secret.encode() not in row.credentials  # sealed like any credential
    assert "webhook_secret" not in (row.settings or {})
    body = {"type": "message", "id": "m1", "from": PHONE, "text": "SAIR"}
    for headers in ({}, {"X-Sandbox-Secret": ""}, sandbox_headers(rt, other_id)):
        with pytest.raises(BadSignature):
            receive(rt, "sandbox", channel_id, request(body, headers))
    assert inbound_count(rt) == 0
    assert len(receive(rt, "sandbox", channel_id, request(body, {"X-Sandbox-Secret": secret})).inbound_ids) == 1


def test_a_sandbox_channel_created_before_secrets_takes_no_webhook(rt, clock):
    world = World(rt)
    channel_id = world.channel("whatsapp")
    world.contact()
    with rt.db.begin() as conn:  # how a channel created by an older release looks
        conn.execute(update(channels).where(channels.c.id == channel_id).values(credentials=None, key_version=None))
    for headers in ({}, {"X-Sandbox-Secret": ""}, {"X-Sandbox-Secret": "None"}):
        with pytest.raises(BadSignature):
            receive(rt, "sandbox", channel_id, request({"type": "message", "id": "m1", "from": PHONE,
                                                         "text": "CANCELAR"}, headers))
    assert inbound_count(rt) == 0


MALFORMED = [
    b"not json",
    b"[1, 2]",
    b"",
    {"type": "message", "from": PHONE, "text": "SAIR"},
    {"type": "message", "id": "m1", "text": "SAIR"},
    {"type": "message", "id": "m1", "from": PHONE},
    {"type": "message", "id": "m1", "from": PHONE, "text": 42},
    {"type": "status", "id": "sbx-1", "status": "exploded"},
    {"type": "message", "id": "m1", "from": PHONE, "text": "SAIR", "timestamp": "yesterday"},
    {"type": "wat", "id": "m1"},
]


def test_malformed_body_is_refused_and_nothing_is_stored(rt, clock):
    world = clinic(rt)
    contact, _, reminder = reminded(rt, clock, world)
    before = [(m.id, m.status) for m in world.messages()]
    channel_id = world.channels["whatsapp"]
    headers = sandbox_headers(rt, channel_id)  # signed right: the body is what is refused
    for body in MALFORMED:
        with pytest.raises(MalformedWebhook):
            receive(rt, "sandbox", channel_id, request(body, headers))
    assert inbound_count(rt) == 0
    assert [(m.id, m.status) for m in world.messages()] == before
    assert prefs(rt, contact)["whatsapp"] == (True, False)


def test_unknown_channel(rt, clock):
    world = World(rt)
    channel_id = world.channel("whatsapp")
    body = {"type": "message", "id": "m1", "from": PHONE, "text": "SAIR"}
    with pytest.raises(UnknownChannel):
        receive(rt, "sandbox", channel_id + 1000, request(body))
    with pytest.raises(UnknownChannel):  # right id, wrong provider in the URL
        receive(rt, "meta", channel_id, request(body))
    assert inbound_count(rt) == 0


# --- tenants -----------------------------------------------------------------------------------


def test_reply_on_org_a_channel_never_touches_org_b(rt, clock):
    a = clinic(rt, "clinica-a")
    b = clinic(rt, "clinica-b")
    b_contact, b_appointment, _ = reminded(rt, clock, b)  # B's patient, same phone as below
    b_before = [(m.id, m.status) for m in b.messages()]
    channel_a = a.channels["whatsapp"]

    # A does not know this number at all.
    assert reply(rt, channel_a, text="CANCELAR") == ["unknown_contact"]
    assert reply(rt, channel_a, text="SAIR") == ["unknown_contact"]
    assert reply(rt, channel_a, button=f"confirm:{b_appointment}") == ["unknown_contact"]

    # A knows the same number as its own patient (with no appointment of its own).
    a_contact = a.contact()
    assert reply(rt, channel_a, button=f"cancel:{b_appointment}") == ["no_appointment"]
    assert reply(rt, channel_a, text="OK") == ["no_appointment"]
    assert reply(rt, channel_a, text="SAIR") == ["opted_out"]
    assert prefs(rt, a_contact)["whatsapp"] == (False, True)

    assert appointment_row(rt, b_appointment).status == "scheduled"
    assert [(m.id, m.status) for m in b.messages()] == b_before
    assert prefs(rt, b_contact) == {k: (True, False) for k in ("whatsapp", "email", "sms")}
    assert b.inbox() == []
    with rt.db.connect() as conn:
        orgs_seen = set(conn.execute(select(inbound_messages.c.org_id)).scalars())
    assert orgs_seen == {a.org_id}


# --- status events -----------------------------------------------------------------------------


def test_late_delivered_never_overwrites_read(rt, clock):
    world = clinic(rt)
    _, _, reminder = reminded(rt, clock, world)
    channel_id, pid = world.channels["whatsapp"], reminder.provider_message_id
    t = clock.now()
    assert status(rt, channel_id, pid, "read", t + timedelta(minutes=2)) == 1
    assert status(rt, channel_id, pid, "delivered", t + timedelta(minutes=1)) == 0
    row = world.message(reminder.id)
    assert (row.status, row.read_at, row.delivered_at) == ("read", t + timedelta(minutes=2), None)
    assert world.events(reminder.id)[-1] == "read"
    assert "delivered" not in world.events(reminder.id)


def test_duplicate_delivered_adds_one_event(rt, clock):
    world = clinic(rt)
    _, _, reminder = reminded(rt, clock, world)
    channel_id, pid = world.channels["whatsapp"], reminder.provider_message_id
    at = clock.now() + timedelta(seconds=5)
    assert status(rt, channel_id, pid, "delivered", at) == 1
    assert status(rt, channel_id, pid, "delivered", at) == 0
    assert status(rt, channel_id, pid, "sent", at) == 0
    assert world.events(reminder.id).count("delivered") == 1
    row = world.message(reminder.id)
    assert (row.status, row.delivered_at) == ("delivered", at)
    assert status(rt, channel_id, pid, "read", at + timedelta(minutes=1)) == 1
    assert world.events(reminder.id)[-2:] == ["delivered", "read"]


def test_failed_status_after_sent_marks_failed(rt, clock):
    world = clinic(rt)
    _, _, reminder = reminded(rt, clock, world)
    assert status(rt, world.channels["whatsapp"], reminder.provider_message_id, "failed", clock.now(),
                  error_code="131026") == 1
    row = world.message(reminder.id)
    assert (row.status, row.error_code) == ("failed", "131026")
    # A late delivered for a failed message changes nothing.
    assert status(rt, world.channels["whatsapp"], reminder.provider_message_id, "delivered", clock.now()) == 0
    assert world.message(reminder.id).status == "failed"


def test_status_resolves_an_unknown_outcome(rt, clock):
    world = clinic(rt)
    contact = world.contact()
    world.appointment(contact, APPOINTMENT)
    clock.set(DUE)
    [mid] = [m.id for m in world.messages(channel_kind="whatsapp")]
    assert dispatch.claim_due(rt, limit=10) == [mid]
    [prepared], _ = dispatch.prepare(rt, [mid])
    result = rt.providers.get(prepared.channel).send(prepared.rendered.outbound)  # the worker dies after this
    with rt.db.begin() as conn:  # what the provider's id would be once the status webhook names it
        conn.execute(update(messages).where(messages.c.id == mid).values(provider_message_id=result.provider_message_id))
    clock.advance(rt.settings.lease + timedelta(seconds=1))
    assert dispatch.sweep_leases(rt) == (0, 1)
    assert world.message(mid).status == "unknown"
    assert status(rt, world.channels["whatsapp"], result.provider_message_id, "delivered", clock.now()) == 1
    row = world.message(mid)
    assert (row.status, row.error_code) == ("delivered", None)


def test_status_from_another_orgs_channel_is_ignored(rt, clock):
    a = clinic(rt, "clinica-a")
    b = clinic(rt, "clinica-b")
    _, _, reminder = reminded(rt, clock, a)
    assert status(rt, b.channels["whatsapp"], reminder.provider_message_id, "read", clock.now()) == 0
    assert world_status(a, reminder.id) == "sent"


def world_status(world: World, message_id: int) -> str:
    return world.message(message_id).status


def test_status_for_an_unknown_message_is_ignored(rt, clock):
    world = clinic(rt)
    _, _, reminder = reminded(rt, clock, world)
    assert status(rt, world.channels["whatsapp"], "sbx-nope", "read", clock.now()) == 0
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(message_events)
                            .where(message_events.c.event == "read")).scalar_one() == 0


# --- a number shared by several contacts -------------------------------------------------------


def _family(rt, clock) -> tuple[World, int, int, int, int]:
    """A parent and a child on the same phone; the latest reminder was about the child's session."""
    world = clinic(rt)
    parent = world.contact(name="Marta Souza", phone=PHONE, email="marta@example.com")
    child = world.contact(name="Lucas Souza", phone=PHONE, email=None)
    parent_appt = world.appointment(parent, local(2026, 12, 3, 10, 0))
    child_appt = world.appointment(child, local(2026, 12, 3, 16, 0))
    clock.set(local(2026, 12, 2, 10, 0))
    send_due(rt)
    clock.set(local(2026, 12, 2, 16, 0))
    send_due(rt)
    return world, parent, child, parent_appt, child_appt


def test_shared_number_cancel_hits_the_appointment_the_reminder_was_about(rt, clock):
    world, parent, child, parent_appt, child_appt = _family(rt, clock)
    assert reply(rt, world.channels["whatsapp"], text="CANCELAR") == ["cancelled"]
    assert appointment_row(rt, child_appt).status == "cancelled"
    assert appointment_row(rt, parent_appt).status == "scheduled"
    [ack] = world.messages(purpose="cancel_ack")
    assert (ack.contact_id, ack.appointment_id) == (child, child_appt)
    with rt.db.connect() as conn:
        assert conn.execute(select(inbound_messages.c.contact_id)).scalar_one() == child


def test_shared_number_confirm_button_for_the_other_contact(rt, clock):
    world, parent, child, parent_appt, child_appt = _family(rt, clock)
    assert reply(rt, world.channels["whatsapp"], button=f"confirm:{parent_appt}") == ["confirmed"]
    assert appointment_row(rt, parent_appt).status == "confirmed"
    assert appointment_row(rt, child_appt).status == "scheduled"


def test_shared_number_sair_stops_every_message_to_that_number(rt, clock):
    world, parent, child, parent_appt, child_appt = _family(rt, clock)
    open_before = world.messages(status="pending")
    assert {m.contact_id for m in open_before} == {parent}  # the parent's 2 h e-mail reminder
    assert reply(rt, world.channels["whatsapp"], text="SAIR") == ["opted_out"]
    assert prefs(rt, parent)["whatsapp"] == (False, True)
    assert prefs(rt, child)["whatsapp"] == (False, True)
    assert all(world.message(m.id).status == "cancelled" for m in open_before)
    assert len(world.messages(purpose="optout_confirmation")) == 1
    # A new appointment for the child sends nothing to the number that said SAIR.
    world.appointment(child, local(2026, 12, 4, 16, 0))
    assert [m for m in world.messages(status="pending") if m.purpose == "session_reminder"] == []


def test_connection_updates_break_and_restore_the_channel(rt, clock):
    from sqlalchemy import select as _select

    from engine.messaging.inbound import apply_connection
    from engine.store.models import channels as channels_table
    from engine.store.models import inbox_items
    from gateway.contract import ConnectionEvent

    world = clinic(rt)
    channel_id = world.channels["whatsapp"]

    def channel():
        with rt.db.connect() as conn:
            return conn.execute(_select(channels_table).where(channels_table.c.id == channel_id)).one()

    with rt.db.begin() as conn:
        apply_connection(conn, channel(), ConnectionEvent(state="close", detail="401"))
    assert (channel().status, channel().status_detail) == ("broken", "close:401")
    with rt.db.connect() as conn:
        assert conn.execute(_select(inbox_items.c.kind)).scalars().all() == ["channel_broken"]
    with rt.db.begin() as conn:
        apply_connection(conn, channel(), ConnectionEvent(state="open"))
    assert channel().status == "active"


# --- a lost poke -------------------------------------------------------------------------------


def test_a_sair_whose_poke_was_lost_is_handed_to_the_workers_again_once(rt, clock):
    """The webhook stores the message and pokes the workers; if that poke is lost (a flushed
    broker, retries that ran out), the scheduler hands the stored message out again."""
    from engine.fleet.scheduler import Scheduler

    world = clinic(rt)
    contact, _, _ = reminded(rt, clock, world)
    payload = {"type": "message", "id": "in-lost", "from": PHONE, "timestamp": rt_now_ts(), "text": "SAIR"}
    [inbound_id] = receive(rt, "sandbox", world.channels["whatsapp"],
                           request(payload, sandbox_headers(rt, world.channels["whatsapp"]))).inbound_ids
    pokes: list[list[int]] = []
    assert Scheduler(rt, lambda ids: None, enqueue_inbound=lambda ids: pokes.append(list(ids))).tick().repoked == 0
    assert pokes == [], "a fresh message is the webhook's poke's to handle"

    clock.advance(timedelta(minutes=1, seconds=1))
    assert Scheduler(rt, lambda ids: None, enqueue_inbound=lambda ids: pokes.append(list(ids))).tick().repoked == 1
    assert pokes == [[inbound_id]]
    assert [process_inbound(rt, i) for i in pokes[0]] == ["opted_out"]
    assert prefs(rt, contact)["whatsapp"] == (False, True)

    clock.advance(timedelta(minutes=5))
    assert Scheduler(rt, lambda ids: None, enqueue_inbound=lambda ids: pokes.append(list(ids))).tick().repoked == 0
    assert process_inbound(rt, inbound_id) is None, "acted on once"


def test_replies_handed_out_again_go_in_tasks_of_a_hundred_whatever_the_send_batch(rt, clock):
    """A reply may wait seconds on a model: a larger LEMBRA_SEND_BATCH makes send tasks larger,
    never a task of replies."""
    from dataclasses import replace

    from engine.store.runtime import Runtime
    from engine.fleet.scheduler import CONVERSATION_TASK, Scheduler

    world = clinic(rt)
    channel = world.channels["whatsapp"]
    stored = [i for n in range(CONVERSATION_TASK + 50) for i in receive(rt, "sandbox", channel, request(
        {"type": "message", "id": f"in-many-{n}", "from": f"+55169990{n:05d}", "timestamp": rt_now_ts(),
         "text": "Bom dia"}, sandbox_headers(rt, channel))).inbound_ids]
    wide = Runtime(settings=replace(rt.settings, send_batch=3 * CONVERSATION_TASK), db=rt.db,
                   keyring=rt.keyring, providers=rt.providers)
    tasks: list[list[int]] = []
    clock.advance(timedelta(minutes=1, seconds=1))

    assert Scheduler(wide, lambda ids: None, enqueue_inbound=lambda ids: tasks.append(list(ids))).tick().repoked == 150

    assert [len(task) for task in tasks] == [CONVERSATION_TASK, 50]
    assert sorted(i for task in tasks for i in task) == sorted(stored)
