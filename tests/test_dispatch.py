"""Dispatch (SPEC §4): claim, re-check, send at most once, retry on schedule, fail, fall back, sweep."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import event, insert, select, update

from engine.people import appointments as appts
from engine.messaging import dispatch
from engine.people.contacts import opt_out
from engine.store.models import channels, message_events, preferences, templates
from engine.reminders.populate import refresh_appointment
from engine.store.runtime import Runtime, install
from providers.sandbox.provider import SandboxProvider
from tests.conftest import IS_POSTGRES
from tests.factories import World, local, provider_as

UTC = timezone.utc
_stamps = itertools.count(1)

#: Wednesday 2026-12-02 14:00 in São Paulo: when the 24 h reminder of Thursday 14:00 is due.
APPOINTMENT = local(2026, 12, 3, 14, 0)
DUE = local(2026, 12, 2, 14, 0).astimezone(UTC)


def simulate(rt: Runtime, channel_id: int, mode: str | None) -> None:
    """Switch a sandbox channel's behaviour the way an operator would edit its settings."""
    settings = {"simulate": mode} if mode else {}
    with rt.db.begin() as conn:
        conn.execute(update(channels).where(channels.c.id == channel_id).values(
            settings=settings,
            updated_at=datetime(2000, 1, 1, tzinfo=UTC) + timedelta(seconds=next(_stamps))))


def reminder_world(rt: Any, *, kinds=("whatsapp",), consent=("whatsapp", "email", "sms"), offset=1440,
                   starts=APPOINTMENT, **channel_settings: Any) -> tuple[World, int, Any]:
    world = World(rt)
    for kind in dict.fromkeys(kinds):
        world.channel(kind, **(channel_settings if kind == kinds[0] else {}))
    world.rule(offset, kinds=kinds)
    contact = world.contact(consent=consent)
    appointment = world.appointment(contact, starts)
    [message] = world.messages()
    assert message.status == "pending"
    return world, appointment, message


def claim_one(rt: Runtime, message_id: int) -> None:
    assert dispatch.claim_due(rt, limit=100) == [message_id]


# --- retries -----------------------------------------------------------------------------------


def test_transient_failures_follow_the_schedule_then_dead(rt, clock):
    world, _, message = reminder_world(rt, simulate="transient")
    assert message.due_at == DUE
    expected_at = DUE
    waits = [timedelta(minutes=5), timedelta(minutes=15), timedelta(minutes=60), timedelta(hours=4)]
    for attempt, wait in enumerate(waits, start=1):
        clock.set(expected_at - timedelta(seconds=1))
        assert dispatch.claim_due(rt, limit=100) == []
        clock.set(expected_at)
        claim_one(rt, message.id)
        assert dispatch.send_one(rt, message.id) == "retried"
        row = world.message(message.id)
        assert (row.status, row.attempts, row.error_code) == ("pending", attempt, "sandbox_transient")
        assert row.next_attempt_at == expected_at + wait
        expected_at = row.next_attempt_at
    assert expected_at == DUE + timedelta(minutes=5 + 15 + 60 + 240)
    clock.set(expected_at)
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "dead"

    row = world.message(message.id)
    assert (row.status, row.attempts) == ("dead", 5)
    assert row.failed_at == expected_at
    assert world.events(message.id) == (
        ["queued"] + ["claimed", "sending", "retried"] * 4 + ["claimed", "sending", "dead"])
    [item] = world.inbox()
    assert (item.kind, item.message_id) == ("message_dead", message.id)
    assert world.sandbox() == []
    clock.advance(timedelta(days=1))
    assert dispatch.claim_due(rt, limit=100) == []


def test_retry_schedule_is_configurable(settings, clock):
    runtime = Runtime.build(dataclasses.replace(settings, retry_delays=(timedelta(minutes=1),)))
    previous = install(runtime)
    try:
        world, _, message = reminder_world(runtime, simulate="transient")
        clock.set(DUE)
        claim_one(runtime, message.id)
        assert dispatch.send_one(runtime, message.id) == "retried"
        assert world.message(message.id).next_attempt_at == DUE + timedelta(minutes=1)
        clock.advance(timedelta(minutes=1))
        claim_one(runtime, message.id)
        assert dispatch.send_one(runtime, message.id) == "dead"
    finally:
        install(previous)
        runtime.close()


def test_retry_that_would_land_after_the_appointment_expires(rt, clock):
    # 2 h reminder of Wednesday 14:00 is due at 12:00; 12:00, 12:05, 12:20, 13:20, then 17:20 > 14:00.
    starts = local(2026, 12, 2, 14, 0)
    world, _, message = reminder_world(rt, offset=120, starts=starts, simulate="transient")
    clock.set(message.due_at)
    outcomes = []
    for _ in range(4):
        claim_one(rt, message.id)
        outcomes.append(dispatch.send_one(rt, message.id))
        clock.set(max(clock.now(), world.message(message.id).next_attempt_at or clock.now()))
    assert outcomes == ["retried", "retried", "retried", "expired"]
    row = world.message(message.id)
    assert (row.status, row.attempts, row.skip_reason) == ("expired", 4, "retry_after_expiry")
    assert world.events(message.id)[-1] == "expired"
    assert world.sandbox() == []


def test_transient_then_success_sends_once(rt, clock):
    world, _, message = reminder_world(rt, simulate="transient")
    clock.set(DUE)
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "retried"
    simulate(rt, world.channels["whatsapp"], None)
    clock.advance(timedelta(minutes=5))
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "sent"
    row = world.message(message.id)
    assert (row.status, row.attempts, row.error_code) == ("sent", 2, None)
    assert row.sent_at == clock.now()
    [sent] = world.sandbox()
    assert sent.provider_message_id == row.provider_message_id


def test_disabled_channel_waits_like_a_transient_failure(rt, clock):
    world, _, message = reminder_world(rt)
    with rt.db.begin() as conn:
        conn.execute(update(channels).where(channels.c.id == world.channels["whatsapp"]).values(status="disabled"))
    clock.set(DUE)
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "retried"
    row = world.message(message.id)
    assert (row.status, row.error_code, row.next_attempt_at) == ("pending", "channel_unavailable",
                                                                 DUE + timedelta(minutes=5))
    assert world.sandbox() == []


# --- permanent failures and fallback ----------------------------------------------------------


def test_permanent_failure_fails_at_once_and_falls_back_to_email(rt, clock):
    world, appointment, message = reminder_world(rt, kinds=("whatsapp", "email"), simulate="permanent")
    clock.set(DUE)
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "failed"
    row = world.message(message.id)
    assert (row.status, row.attempts, row.error_code) == ("failed", 1, "sandbox_permanent")
    assert world.events(message.id) == ["queued", "claimed", "sending", "failed"]

    [fallback] = world.messages(channel_kind="email")
    epoch = int(APPOINTMENT.timestamp())
    assert fallback.idempotency_key == f"appointment:{appointment}:{message.rule_id}:email:{epoch}"
    assert (fallback.status, fallback.due_at) == ("pending", DUE)
    claim_one(rt, fallback.id)
    assert dispatch.send_one(rt, fallback.id) == "sent"
    [sent] = world.sandbox()
    assert sent.to_address == "ana@example.com"
    assert sent.channel_id == world.channels["email"]


def test_no_fallback_without_consent(rt, clock):
    world, _, message = reminder_world(rt, kinds=("whatsapp", "email"), consent=("whatsapp",),
                                       simulate="permanent")
    clock.set(DUE)
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "failed"
    assert [m.id for m in world.messages()] == [message.id]


def test_fallback_after_retries_still_goes_out(rt, clock):
    """A permanent failure on a later attempt still falls back, and the fallback is sent now."""
    world, _, message = reminder_world(rt, kinds=("whatsapp", "email"), simulate="transient")
    clock.set(DUE)
    for _ in range(2):
        claim_one(rt, message.id)
        assert dispatch.send_one(rt, message.id) == "retried"
        clock.set(world.message(message.id).next_attempt_at)
    simulate(rt, world.channels["whatsapp"], "permanent")
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "failed"
    [fallback] = world.messages(channel_kind="email")
    assert fallback.status == "pending"
    assert fallback.due_at == clock.now()
    claim_one(rt, fallback.id)
    assert dispatch.send_one(rt, fallback.id) == "sent"


def test_fallback_after_a_window_deferral_still_goes_out(rt, clock):
    world, _, message = reminder_world(rt, kinds=("whatsapp", "email"), simulate="permanent")
    clock.set(local(2026, 12, 2, 23, 0))  # the workers were down: backlog at 23:00
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "deferred"
    morning = local(2026, 12, 3, 8, 0).astimezone(UTC)
    clock.set(morning)
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "failed"
    [fallback] = world.messages(channel_kind="email")
    assert (fallback.status, fallback.due_at) == ("pending", morning)


# --- templates --------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    "Olá {{ undefined_var }}",
    "Olá {% if nome %}{{ nome }}",
    "Olá {{ nome + 1 }}",
    "Olá {{ nome.nao_existe.de_jeito_nenhum }}",
])
def test_template_error_fails_the_message_without_pii_and_the_worker_goes_on(rt, clock, body):
    world = World(rt)
    world.channel("whatsapp")
    world.channel("email")
    world.rule(1440, kinds=("whatsapp", "email"))
    with rt.db.begin() as conn:
        conn.execute(insert(templates).values(org_id=world.org_id, key="session_reminder", channel_kind="whatsapp",
                                              locale="pt_BR", body=body, updated_at=clock.now()))
    ana = world.contact(name="Ana Clara", phone="+5516999887766", email="ana@example.com", consent=("whatsapp",))
    bia = world.contact(name="Beatriz", phone="+5516999880000", email="bia@example.com", consent=("email",))
    world.appointment(ana, APPOINTMENT)
    world.appointment(bia, APPOINTMENT)
    [broken] = world.messages(contact_id=ana)
    [fine] = world.messages(contact_id=bia)
    clock.set(DUE)
    assert sorted(dispatch.claim_due(rt, limit=100)) == sorted([broken.id, fine.id])
    assert dispatch.send_one(rt, broken.id) == "failed"
    assert dispatch.send_one(rt, fine.id) == "sent"

    row = world.message(broken.id)
    assert (row.status, row.error_code) == ("failed", "template_error")
    assert row.error_detail
    for pii in ("Ana", "Clara", "99988", "+55", "ana@", "example.com"):
        assert pii not in row.error_detail
    assert row.body is None  # nothing rendered was kept
    assert world.events(broken.id) == ["queued", "claimed", "failed"]
    with rt.db.connect() as conn:
        details = conn.execute(select(message_events.c.detail).where(message_events.c.message_id == broken.id)).scalars()
        assert all("Ana" not in str(d) for d in details)
    [sent] = world.sandbox()
    assert sent.to_address == "bia@example.com"


# --- send-time re-checks -----------------------------------------------------------------------


def test_opt_out_after_claim_cancels(rt, clock):
    world, _, message = reminder_world(rt)
    clock.set(DUE)
    claim_one(rt, message.id)
    with rt.db.begin() as conn:
        opt_out(conn, world.org_id, message.contact_id, source="test")
    assert dispatch.send_one(rt, message.id) == "not_claimed"
    row = world.message(message.id)
    assert (row.status, row.skip_reason) == ("cancelled", "opted_out")
    assert world.sandbox() == []


def test_consent_withdrawn_after_claim_is_rechecked_at_send_time(rt, clock):
    world, _, message = reminder_world(rt)
    clock.set(DUE)
    claim_one(rt, message.id)
    with rt.db.begin() as conn:  # an edit that does not go through opt_out (e.g. a consent import)
        conn.execute(update(preferences).where(preferences.c.contact_id == message.contact_id)
                     .values(opted_in=False))
    assert dispatch.send_one(rt, message.id) == "cancelled"
    row = world.message(message.id)
    assert (row.status, row.skip_reason) == ("cancelled", "opted_out")
    assert world.events(message.id) == ["queued", "claimed", "cancelled"]
    assert world.sandbox() == []


def test_appointment_cancelled_after_claim_cancels(rt, clock):
    world, appointment, message = reminder_world(rt)
    clock.set(DUE)
    claim_one(rt, message.id)
    with rt.db.begin() as conn:
        assert appts.cancel(conn, world.org_id, appointment, source="clinic")
    assert dispatch.send_one(rt, message.id) == "cancelled"
    assert world.message(message.id).skip_reason == "appointment_cancelled"
    assert world.sandbox() == []


def test_appointment_moved_after_claim_cancels_and_moving_back_restores(rt, clock):
    world, appointment, message = reminder_world(rt)
    clock.set(DUE)
    claim_one(rt, message.id)
    with rt.db.begin() as conn:  # changed without the immediate re-populate
        assert appts.reschedule(conn, world.org_id, appointment, APPOINTMENT + timedelta(days=1))
    assert dispatch.send_one(rt, message.id) == "cancelled"
    assert world.message(message.id).skip_reason == "appointment_moved"
    with rt.db.begin() as conn:
        assert appts.reschedule(conn, world.org_id, appointment, APPOINTMENT)
        refresh_appointment(conn, world.org_id, appointment)
    [again] = world.messages(status="pending")
    assert again.appointment_starts_at == APPOINTMENT.astimezone(UTC)
    claim_one(rt, again.id)
    assert dispatch.send_one(rt, again.id) == "sent"
    assert len(world.sandbox()) == 1


def test_backlog_outside_the_window_is_deferred_to_the_next_allowed_instant(rt, clock):
    world, _, message = reminder_world(rt)
    clock.set(local(2026, 12, 2, 23, 0))  # nine hours late: the workers were down
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "deferred"
    row = world.message(message.id)
    morning = local(2026, 12, 3, 8, 0).astimezone(UTC)
    assert (row.status, row.next_attempt_at, row.attempts) == ("pending", morning, 0)
    assert world.events(message.id) == ["queued", "claimed", "deferred"]
    assert world.sandbox() == []
    clock.set(morning - timedelta(minutes=1))
    assert dispatch.claim_due(rt, limit=100) == []
    clock.set(morning)
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "sent"
    assert world.message(message.id).sent_at == morning


def test_backlog_with_no_allowed_instant_left_is_skipped(rt, clock):
    # 2 h reminder of Wednesday 21:00 is due at 19:00; the worker only gets to it at 20:30.
    world, _, message = reminder_world(rt, offset=120, starts=local(2026, 12, 2, 21, 0))
    clock.set(local(2026, 12, 2, 20, 30))
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "skipped"
    row = world.message(message.id)
    assert (row.status, row.skip_reason) == ("skipped", "no_allowed_instant")
    assert world.sandbox() == []


def test_backlog_after_the_appointment_expires(rt, clock):
    world, _, message = reminder_world(rt)
    clock.set(APPOINTMENT + timedelta(minutes=1))
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "expired"
    assert world.message(message.id).skip_reason == "expired_before_send"
    assert world.sandbox() == []


# --- leases ------------------------------------------------------------------------------------


def test_expired_claim_is_claimed_again_and_sent_once(rt, clock):
    world, _, message = reminder_world(rt)
    clock.set(DUE)
    claim_one(rt, message.id)
    assert dispatch.sweep_leases(rt) == (0, 0)  # lease still running
    clock.advance(rt.settings.lease + timedelta(seconds=1))
    assert dispatch.sweep_leases(rt) == (1, 0)
    row = world.message(message.id)
    assert (row.status, row.lease_until, row.claimed_by) == ("pending", None, None)
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "sent"
    assert dispatch.send_one(rt, message.id) == "not_claimed"  # the first worker waking up late
    assert len(world.sandbox()) == 1
    assert world.events(message.id) == ["queued", "claimed", "reclaimed", "claimed", "sending", "sent"]


def test_row_stuck_in_sending_becomes_unknown_and_is_never_resent(rt, clock):
    world, _, message = reminder_world(rt)  # the sandbox, like most providers, has no idempotency key
    clock.set(DUE)
    claim_one(rt, message.id)
    [prepared], _ = dispatch.prepare(rt, [message.id])  # marked `sending` …
    assert not isinstance(prepared, str)
    rt.providers.get(prepared.channel).send(prepared.rendered.outbound)  # … the call went out …
    assert world.message(message.id).status == "sending"                 # … and the worker died.
    assert dispatch.sweep_leases(rt) == (0, 0)  # lease still running
    clock.advance(rt.settings.lease + timedelta(seconds=1))
    assert dispatch.sweep_leases(rt) == (0, 1)

    row = world.message(message.id)
    assert (row.status, row.error_code) == ("unknown", "worker_lost")
    assert world.events(message.id) == ["queued", "claimed", "sending", "unknown"]
    [item] = world.inbox()
    assert (item.kind, item.message_id) == ("message_unknown", message.id)
    for _ in range(3):
        clock.advance(timedelta(hours=1))
        assert dispatch.sweep_leases(rt) == (0, 0)
        assert dispatch.claim_due(rt, limit=100) == []
    assert dispatch.send_one(rt, message.id) == "not_claimed"
    assert len(world.sandbox()) == 1
    assert world.message(message.id).status == "unknown"


class _IdempotentSandbox(SandboxProvider):
    """A sandbox that, like Resend, drops a repeated send with the same idempotency key."""

    honours_idempotency = True
    seen: dict[str, Any] = {}

    def send(self, message):  # type: ignore[no-untyped-def]
        if message.idempotency_key in self.seen:
            return self.seen[message.idempotency_key]
        result = super().send(message)
        self.seen[message.idempotency_key] = result
        return result


@pytest.fixture
def idempotent_provider():
    """Register the provider above under a real provider name for one test."""
    _IdempotentSandbox.seen = {}
    with provider_as("resend", _IdempotentSandbox):
        yield "resend"


def test_sending_row_of_an_idempotent_provider_is_retried_safely(rt, clock, idempotent_provider):
    world = World(rt)
    from engine.tenants.channels import REQUIRED_KEYS, create_channel

    with rt.db.begin() as conn:  # a real provider name needs its credential keys; the fake ignores them
        create_channel(conn, rt.keyring, org_id=world.org_id, kind="email", provider=idempotent_provider,
                       name="fake resend", credentials={k: "x@example.com" for k in REQUIRED_KEYS.get(idempotent_provider, ())})
    world.rule(1440, kinds=("email",))
    world.appointment(world.contact(), APPOINTMENT)
    [message] = world.messages()
    clock.set(DUE)
    claim_one(rt, message.id)
    [prepared], _ = dispatch.prepare(rt, [message.id])
    rt.providers.get(prepared.channel).send(prepared.rendered.outbound)  # the call went out, the worker died
    clock.advance(rt.settings.lease + timedelta(seconds=1))
    assert dispatch.sweep_leases(rt) == (1, 0)
    row = world.message(message.id)
    assert (row.status, row.error_code) == ("pending", "lease_expired")
    claim_one(rt, message.id)
    assert dispatch.send_one(rt, message.id) == "sent"
    [sent] = world.sandbox()
    assert world.message(message.id).provider_message_id == sent.provider_message_id
    assert world.inbox() == []


def test_claim_respects_max_in_flight(rt, clock):
    _many_due(rt, 3)
    clock.set(DUE)
    first = dispatch.claim_due(rt, limit=100, max_in_flight=2)
    assert len(first) == 2
    assert dispatch.claim_due(rt, limit=100, max_in_flight=2) == []
    for mid in first:
        assert dispatch.send_one(rt, mid) == "sent"
    assert len(dispatch.claim_due(rt, limit=100, max_in_flight=2)) == 1


@pytest.mark.skipif(not IS_POSTGRES, reason="a PostgreSQL planner setting")
def test_the_queue_is_read_by_index_scans_not_bitmap_scans(rt, clock):
    """A bitmap scan of `messages_leased` visits every entry left by a `claimed` or `sending`
    version since the last vacuum, on every tick; the in-flight count, the claim and the sweep
    read the queue by index scan, which skips an entry once it found it dead."""
    _, _, message = reminder_world(rt)
    clock.set(DUE)
    planned_with: dict[str, str] = {}

    def note_setting(conn, cursor, statement, parameters, context, executemany) -> None:
        if "FROM messages" not in statement:
            return
        kind = ("in_flight" if "count(" in statement else "claim" if "SKIP LOCKED" in statement
                else "sweep" if "lease_until <" in statement else None)
        if kind is not None:
            planned_with[kind] = cursor.connection.execute(
                "SELECT current_setting('enable_bitmapscan')").fetchone()[0]

    event.listen(rt.db.engine, "before_cursor_execute", note_setting)
    try:
        assert dispatch.sweep_leases(rt) == (0, 0)
        assert dispatch.claim_due(rt, limit=100, max_in_flight=10) == [message.id]
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", note_setting)
    assert planned_with == {"sweep": "off", "in_flight": "off", "claim": "off"}
    with rt.db.begin() as conn:  # local to the claim's transaction: nothing else planned without them
        assert conn.exec_driver_sql("SELECT current_setting('enable_bitmapscan')").scalar_one() == "on"


def test_a_claim_the_in_flight_cap_cuts_short_takes_whole_tasks(rt, clock):
    """Near the cap the workers free a few rows at a time; a task of two would cost a task's
    statements and commits for two messages, so the claim waits for a whole task's room."""
    world = _many_due(rt, 16)
    clock.set(DUE)

    def claim() -> list[int]:
        return dispatch.claim_due(rt, limit=100, max_in_flight=10, task=4)

    def send(ids: list[int]) -> None:
        assert {dispatch.send_one(rt, mid) for mid in ids} == {"sent"}

    first = claim()
    assert len(first) == 10, "nothing in flight: the cap's whole room, whatever the task"
    send(first[:3])
    assert claim() == [], "room for 3: less than a task"
    send(first[3:5])
    second = claim()
    assert len(second) == 4, "room for 5: one whole task"
    send(first[5:] + second)
    last = claim()
    assert len(last) == 2, "nothing in flight: what is left"
    send(last)
    assert len(world.sandbox()) == 16


def _many_due(rt: Runtime, n: int) -> World:
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    for i in range(n):
        world.appointment(world.contact(name=f"P{i}", phone=f"+5516999{i:06d}"), APPOINTMENT)
    return world


def test_claim_takes_at_most_limit_rows_even_when_due_times_tie(rt, clock):
    world = _many_due(rt, 30)  # every reminder due at the same instant
    clock.set(DUE)
    first = dispatch.claim_due(rt, limit=5)
    assert len(first) == 5
    assert first == sorted(first)  # due order, then id
    assert len(world.messages(status="claimed")) == 5
    assert len(world.messages(status="pending")) == 25


def test_concurrent_claimers_never_take_the_same_row(rt, clock):
    import threading

    world = _many_due(rt, 40)
    clock.set(DUE)
    barrier = threading.Barrier(3)
    claimed: list[list[int]] = []
    errors: list[Exception] = []

    def claimer() -> None:
        try:
            barrier.wait(timeout=30)
            claimed.append(dispatch.claim_due(rt, limit=15))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert all(len(batch) <= 15 for batch in claimed)
    # A claimer may skip a row another one holds at that moment; a later pass picks it up.
    claimed.append(dispatch.claim_due(rt, limit=100))
    ids = [mid for batch in claimed for mid in batch]
    assert len(ids) == len(set(ids)) == 40
    with rt.db.connect() as conn:
        counts = conn.execute(
            select(message_events.c.message_id).where(message_events.c.event == "claimed")
        ).scalars().all()
    assert sorted(counts) == sorted(ids)
    assert {m.status for m in world.messages()} == {"claimed"}
