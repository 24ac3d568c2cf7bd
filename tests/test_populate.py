"""Populate (SPEC §4): appointments × active rules × the first usable channel kind, once."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select, update

from engine.people import appointments as appts
from engine.messaging import dispatch
from engine.people.contacts import opt_out
from engine.store.models import contacts, message_events, messages
from engine.reminders.populate import DEFAULT_HORIZON, populate, populate_org, refresh_appointment
from tests.conftest import IS_POSTGRES
from tests.factories import World, local

UTC = timezone.utc


def _key(appointment_id: int, rule_id: int, kind: str, starts_at: datetime) -> str:
    return f"appointment:{appointment_id}:{rule_id}:{kind}:{int(starts_at.timestamp())}"


def _snapshot(world: World) -> list[tuple]:
    return [(m.id, m.idempotency_key, m.status, m.due_at, m.channel_kind) for m in world.messages()]


def _event_count(rt) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(message_events)).scalar_one()


# --- idempotency -----------------------------------------------------------------------------


def test_populate_twice_creates_nothing_twice(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    r24, r2 = world.rule(1440), world.rule(120)
    contact = world.contact()
    starts = local(2026, 12, 3, 14, 0)
    appointment = world.appointment(contact, starts, refresh=False)

    first = world.populate()
    assert first.created == 2
    snapshot, events = _snapshot(world), _event_count(rt)
    assert sorted(m[1] for m in snapshot) == sorted(
        [_key(appointment, r24, "whatsapp", starts), _key(appointment, r2, "whatsapp", starts)])
    assert {m[2] for m in snapshot} == {"pending"}

    again = world.populate()
    assert (again.created, again.cancelled, again.planned) == (0, 0, 0)
    clock.advance(timedelta(minutes=3))
    populate(rt.db, horizon=DEFAULT_HORIZON)  # every org, a bit later
    assert _snapshot(world) == snapshot
    assert _event_count(rt) == events


def test_concurrent_populates_create_each_reminder_once(rt, clock):
    """Two schedulers populating at the same instant, on separate connections."""
    world = World(rt)
    world.channel("whatsapp")
    world.channel("email")
    world.rule(1440, kinds=("whatsapp", "email"))
    world.rule(120, kinds=("email",))
    for i in range(60):
        contact = world.contact(name=f"Paciente {i}", phone=f"+55169{i:08d}", email=f"p{i}@example.com")
        world.appointment(contact, local(2026, 12, 3 + i % 4, 9 + i % 9, 0), refresh=False)
    barrier = threading.Barrier(2)
    results, errors = [], []

    def run() -> None:
        try:
            barrier.wait(timeout=30)
            results.append(populate(rt.db, horizon=DEFAULT_HORIZON, org_id=world.org_id))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert sum(r.created for r in results) == 120
    rows = world.messages()
    assert len(rows) == 120
    assert len({m.idempotency_key for m in rows}) == 120
    assert {m.status for m in rows} == {"pending"}
    with rt.db.connect() as conn:
        queued = conn.execute(
            select(message_events.c.message_id, func.count()).where(message_events.c.event == "queued")
            .group_by(message_events.c.message_id)
        ).all()
    assert len(queued) == 120 and {n for _, n in queued} == {1}


def test_concurrent_populates_in_processes(rt, clock, database_url):
    """Same race with two processes, each its own engine, starting together."""
    if not IS_POSTGRES:
        pytest.skip("SQLite serialises writers; the thread test covers it")
    import multiprocessing

    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    for i in range(40):
        contact = world.contact(name=f"Paciente {i}", phone=f"+55169{i:08d}", email=None)
        world.appointment(contact, local(2026, 12, 3 + i % 4, 9 + i % 9, 0), refresh=False)
    # fork: a fresh interpreter per child (spawn) costs seconds of imports. The children open their
    # own engine and never touch the parent's pooled connections.
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_populate_in_process, args=(database_url, world.org_id, clock.now(), barrier, queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    outcomes = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(not isinstance(o, str) for o in outcomes), outcomes
    assert sum(outcomes) == 40
    rows = world.messages()
    assert len(rows) == 40 and {m.status for m in rows} == {"pending"}


def _populate_in_process(url, org_id, now, barrier, queue) -> None:  # pragma: no cover - runs in a child
    from engine.core import clock as engine_clock
    from engine.store.db import Database

    engine_clock.use(engine_clock.FrozenClock(now))
    db = Database(url)
    try:
        barrier.wait(timeout=60)
        queue.put(populate(db, horizon=DEFAULT_HORIZON, org_id=org_id).created)
    except Exception as exc:  # noqa: BLE001
        queue.put(f"{type(exc).__name__}: {exc}")
    finally:
        db.dispose()


# --- reschedule and cancel ---------------------------------------------------------------------


def test_reschedule_cancels_old_reminders_and_creates_new_ones(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    r24, r2 = world.rule(1440), world.rule(120)
    contact = world.contact()
    old = local(2026, 12, 3, 14, 0)
    new = local(2026, 12, 4, 16, 30)
    appointment = world.appointment(contact, old)
    old_rows = world.messages()
    assert len(old_rows) == 2

    with rt.db.begin() as conn:
        assert appts.reschedule(conn, world.org_id, appointment, new)
        result = refresh_appointment(conn, world.org_id, appointment)
    assert (result.cancelled, result.created) == (2, 2)

    for row in old_rows:
        row = world.message(row.id)
        assert row.status == "cancelled"
        assert row.skip_reason == "appointment_changed"
        assert world.events(row.id) == ["queued", "cancelled"]
    live = [m for m in world.messages() if m.status == "pending"]
    assert sorted(m.idempotency_key for m in live) == sorted(
        [_key(appointment, r24, "whatsapp", new), _key(appointment, r2, "whatsapp", new)])
    assert {m.appointment_starts_at for m in live} == {new.astimezone(UTC)}
    assert sorted(m.due_at for m in live) == [local(2026, 12, 3, 16, 30).astimezone(UTC),
                                              local(2026, 12, 4, 14, 30).astimezone(UTC)]
    # Nothing more on the next pass.
    assert world.populate().created == 0


def test_moving_an_appointment_back_restores_its_reminders(rt, clock):
    """A → B → A: the original time needs its reminders again."""
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    contact = world.contact()
    first, second = local(2026, 12, 3, 14, 0), local(2026, 12, 4, 14, 0)
    appointment = world.appointment(contact, first)
    for target in (second, first):
        with rt.db.begin() as conn:
            assert appts.reschedule(conn, world.org_id, appointment, target)
            refresh_appointment(conn, world.org_id, appointment)
    live = world.messages(status="pending")
    assert len(live) == 1
    assert live[0].appointment_starts_at == first.astimezone(UTC)
    assert live[0].due_at == local(2026, 12, 2, 14, 0).astimezone(UTC)
    assert [m.status for m in world.messages()].count("cancelled") == 2

    clock.set(local(2026, 12, 2, 14, 0))
    assert dispatch.claim_due(rt, limit=10) == [live[0].id]
    assert dispatch.send_one(rt, live[0].id) == "sent"
    assert len(world.sandbox()) == 1


def test_clinic_cancel_cancels_reminders_and_sends_the_notice(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    notice_rule = world.rule(0, trigger="on_cancel", purpose="session_cancellation")
    contact = world.contact()
    appointment = world.appointment(contact, local(2026, 12, 3, 14, 0))
    [reminder] = world.messages()

    clock.advance(timedelta(minutes=10))
    with rt.db.begin() as conn:
        assert appts.cancel(conn, world.org_id, appointment, source="clinic")
        refresh_appointment(conn, world.org_id, appointment)

    assert world.message(reminder.id).status == "cancelled"
    assert world.events(reminder.id) == ["queued", "cancelled"]
    [notice] = world.messages(purpose="session_cancellation")
    assert notice.rule_id == notice_rule
    assert notice.status == "pending"
    assert notice.due_at == clock.now()
    # Later passes neither cancel nor duplicate the notice.
    world.populate()
    world.populate()
    assert [m.id for m in world.messages(purpose="session_cancellation")] == [notice.id]
    assert world.message(notice.id).status == "pending"

    assert dispatch.claim_due(rt, limit=10) == [notice.id]
    assert dispatch.send_one(rt, notice.id) == "sent"
    [sent] = world.sandbox()
    assert "cancelada" in sent.body


def test_a_whole_org_pass_applies_each_rule_to_its_own_appointments_only(rt, clock):
    # One org, two triggers: the pass's condition is one part per trigger its rules have.
    world = World(rt)
    world.channel("whatsapp")
    reminder_rule = world.rule(1440)
    notice_rule = world.rule(0, trigger="on_cancel", purpose="session_cancellation")
    live = world.appointment(world.contact(), local(2026, 12, 3, 14, 0), refresh=False)
    cancelled = world.appointment(world.contact(), local(2026, 12, 3, 15, 0), refresh=False)
    with rt.db.begin() as conn:
        assert appts.cancel(conn, world.org_id, cancelled, source="clinic")

    assert world.populate().created == 2
    assert {(m.appointment_id, m.rule_id, m.status) for m in world.messages()} == {
        (live, reminder_rule, "pending"), (cancelled, notice_rule, "pending")}


@pytest.mark.skipif(not IS_POSTGRES, reason="a PostgreSQL planner setting")
def test_a_whole_org_pass_leaves_the_callers_planner_settings_as_they_were(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    world.appointment(world.contact(), local(2026, 12, 3, 14, 0), refresh=False)
    with rt.db.begin() as conn:
        conn.exec_driver_sql("SET LOCAL enable_nestloop = on")
        result = populate_org(conn, world.org_id, horizon=DEFAULT_HORIZON)
        assert result.created == 1
        assert conn.exec_driver_sql("SELECT current_setting('enable_nestloop')").scalar_one() == "on"


def test_patient_cancel_gets_no_clinic_notice(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    world.rule(0, trigger="on_cancel", purpose="session_cancellation")
    contact = world.contact()
    appointment = world.appointment(contact, local(2026, 12, 3, 14, 0))
    with rt.db.begin() as conn:
        assert appts.cancel(conn, world.org_id, appointment, source="patient")
        refresh_appointment(conn, world.org_id, appointment)
    world.populate()
    assert world.messages(purpose="session_cancellation") == []
    assert [m.status for m in world.messages()] == ["cancelled"]


def test_cancel_notice_not_sent_for_a_past_appointment(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(0, trigger="on_cancel", purpose="session_cancellation")
    contact = world.contact()
    appointment = world.appointment(contact, clock.now() + timedelta(hours=2))
    clock.advance(timedelta(hours=3))
    with rt.db.begin() as conn:
        assert appts.cancel(conn, world.org_id, appointment, source="clinic")
        refresh_appointment(conn, world.org_id, appointment)
    assert world.messages() == []


# --- consent, channel choice, erasure ----------------------------------------------------------


def test_opted_out_contact_gets_nothing(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.channel("email")
    world.rule(1440, kinds=("whatsapp", "email"))
    contact = world.contact()
    with rt.db.begin() as conn:
        opt_out(conn, world.org_id, contact, source="test")
    world.appointment(contact, local(2026, 12, 3, 14, 0))
    world.populate()
    assert world.messages() == []


def test_opt_out_of_one_kind_falls_to_the_next(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.channel("email")
    world.rule(1440, kinds=("whatsapp", "email"))
    contact = world.contact()
    with rt.db.begin() as conn:
        opt_out(conn, world.org_id, contact, kinds=("whatsapp",), source="test")
    world.appointment(contact, local(2026, 12, 3, 14, 0))
    assert [m.channel_kind for m in world.messages()] == ["email"]


def test_first_usable_kind_in_rule_order(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.channel("email")
    world.channel("sms")
    world.rule(1440, kinds=("sms", "whatsapp", "email"))
    both = world.contact(name="Ana", phone="+5516999887766", consent=("whatsapp", "email", "sms"))
    no_whatsapp = world.contact(name="Bia", phone="+5516999887700", email="bia@example.com", consent=("email",))
    no_email_address = world.contact(name="Caio", phone="+5516999887711", email=None, consent=("email",))
    no_consent = world.contact(name="Duda", phone="+5516999887722", email="duda@example.com", consent=())
    for c in (both, no_whatsapp, no_email_address, no_consent):
        world.appointment(c, local(2026, 12, 3, 14, 0))
    kinds = {m.contact_id: m.channel_kind for m in world.messages()}
    assert kinds == {both: "sms", no_whatsapp: "email"}


def test_kind_without_a_working_channel_is_passed_over(rt, clock):
    world = World(rt)
    world.channel("email")
    broken = world.channel("whatsapp")
    with rt.db.begin() as conn:
        from engine.store.models import channels
        conn.execute(update(channels).where(channels.c.id == broken).values(status="disabled"))
    world.rule(1440, kinds=("whatsapp", "email"))
    contact = world.contact()
    world.appointment(contact, local(2026, 12, 3, 14, 0))
    assert [m.channel_kind for m in world.messages()] == ["email"]


def test_inactive_rule_creates_nothing(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440, active=False)
    world.appointment(world.contact(), local(2026, 12, 3, 14, 0))
    assert world.messages() == []


def test_erased_contact_gets_nothing(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    contact = world.contact()
    with rt.db.begin() as conn:
        conn.execute(update(contacts).where(contacts.c.id == contact).values(erased_at=clock.now()))
    world.appointment(contact, local(2026, 12, 3, 14, 0))
    world.populate()
    assert world.messages() == []


def test_appointment_beyond_the_horizon_waits(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    appointment = world.appointment(world.contact(), clock.now() + DEFAULT_HORIZON + timedelta(days=2))
    assert world.messages() == []
    clock.advance(timedelta(days=3))
    world.populate()
    [row] = world.messages()
    assert row.appointment_id == appointment


# --- tenants -----------------------------------------------------------------------------------


def test_other_orgs_appointments_never_make_rows_for_this_org(rt, clock):
    a = World(rt, "clinica-a")
    a.channel("whatsapp")
    a.rule(1440)
    a.rule(0, trigger="on_cancel", purpose="session_cancellation")
    b = World(rt, "clinica-b")
    b_contact = b.contact()  # same phone as a's default contact would have
    b_appt = b.appointment(b_contact, local(2026, 12, 3, 14, 0))
    populate(rt.db, horizon=DEFAULT_HORIZON)
    with rt.db.begin() as conn:
        appts.cancel(conn, b.org_id, b_appt, source="clinic")
        refresh_appointment(conn, b.org_id, b_appt)
    populate(rt.db, horizon=DEFAULT_HORIZON)
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(messages)).scalar_one() == 0


def test_each_org_gets_only_its_own_rows(rt, clock):
    worlds = []
    for slug in ("clinica-a", "clinica-b"):
        w = World(rt, slug)
        w.channel("whatsapp")
        w.rule(1440)
        w.appointment(w.contact(), local(2026, 12, 3, 14, 0), refresh=False)
        w.appointment(w.contact(name="Outra", phone="+5516988776655"), local(2026, 12, 4, 10, 0), refresh=False)
        worlds.append(w)
    a, b = worlds
    a.populate()  # org A only
    assert len(a.messages()) == 2 and b.messages() == []
    populate(rt.db, horizon=DEFAULT_HORIZON)
    from engine.store.models import appointments
    with rt.db.connect() as conn:
        rows = conn.execute(
            select(messages.c.org_id, contacts.c.org_id.label("contact_org"), appointments.c.org_id.label("appt_org"))
            .join(contacts, contacts.c.id == messages.c.contact_id)
            .join(appointments, appointments.c.id == messages.c.appointment_id)
        ).all()
    assert len(rows) == 4
    assert all(r.org_id == r.contact_org == r.appt_org for r in rows)


# --- windows, through populate -----------------------------------------------------------------


def _due(world: World, rule_id: int) -> datetime | None:
    [row] = world.messages(rule_id=rule_id)
    return row.due_at


def test_sunday_reminder_moves_to_saturday_evening(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    r24 = world.rule(1440)
    # Monday 2026-12-07 10:00: the 24 h reminder would go on Sunday.
    world.appointment(world.contact(), local(2026, 12, 7, 10, 0))
    [row] = world.messages()
    assert row.nominal_due_at == local(2026, 12, 6, 10, 0).astimezone(UTC)
    assert _due(world, r24) == local(2026, 12, 5, 20, 0).astimezone(UTC)


def test_quiet_hours_are_local_not_utc(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    late, evening = world.rule(1440), world.rule(2 * 1440)
    # Thursday 23:40 local = Friday 02:40 UTC: the 24 h reminder (Wed 23:40 local) moves to Wed 20:00.
    world.appointment(world.contact(), local(2026, 12, 3, 23, 40))
    assert _due(world, late) == local(2026, 12, 2, 20, 0).astimezone(UTC)
    # 19:30 local is 22:30 UTC: allowed locally, so it stays (a UTC window would move it).
    world2 = World(rt, "clinica-2")
    world2.channel("whatsapp")
    r = world2.rule(1440)
    world2.appointment(world2.contact(), local(2026, 12, 4, 19, 30))
    assert _due(world2, r) == local(2026, 12, 3, 19, 30).astimezone(UTC)
    # Two days before Thursday 23:40 is Tuesday 23:40: moved to Tuesday 20:00, still after creation.
    assert _due(world, evening) == local(2026, 12, 1, 20, 0).astimezone(UTC)


def test_early_morning_reminder_moves_to_the_evening_before(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    r2 = world.rule(120)
    # Friday 09:00 appointment: the 2 h reminder at 07:00 moves to Thursday 20:00.
    world.appointment(world.contact(), local(2026, 12, 4, 9, 0))
    assert _due(world, r2) == local(2026, 12, 3, 20, 0).astimezone(UTC)


def test_national_holiday_is_skipped(rt, clock):
    clock.set(local(2026, 12, 20, 9, 0))
    world = World(rt)
    world.channel("whatsapp")
    r24 = world.rule(1440)
    # Saturday 2026-12-26 10:00: the reminder would fall on Christmas (Friday).
    world.appointment(world.contact(), local(2026, 12, 26, 10, 0))
    assert _due(world, r24) == local(2026, 12, 24, 20, 0).astimezone(UTC)


def test_state_holiday_counts_only_in_that_state(rt, clock):
    clock.set(local(2026, 7, 6, 9, 0))
    sp = World(rt, "clinica-sp", state="SP")
    rj = World(rt, "clinica-rj", state="RJ")
    dues = {}
    for world in (sp, rj):
        world.channel("whatsapp")
        rule = world.rule(1440)
        # Friday 2026-07-10 10:00: the reminder falls on 9 July, a São Paulo state holiday.
        world.appointment(world.contact(), local(2026, 7, 10, 10, 0))
        dues[world.org_id] = _due(world, rule)
    assert dues[sp.org_id] == local(2026, 7, 8, 20, 0).astimezone(UTC)
    assert dues[rj.org_id] == local(2026, 7, 9, 10, 0).astimezone(UTC)


def test_org_without_sunday_skipping_sends_on_sunday(rt, clock):
    world = World(rt, skip_sundays=False)
    world.channel("whatsapp")
    r24 = world.rule(1440)
    world.appointment(world.contact(), local(2026, 12, 7, 10, 0))
    assert _due(world, r24) == local(2026, 12, 6, 10, 0).astimezone(UTC)


def test_dst_end_keeps_the_wall_clock_for_day_offsets(rt, clock):
    ny = "America/New_York"
    clock.set(datetime(2026, 10, 28, 12, 0, tzinfo=UTC))
    world = World(rt, timezone=ny, state=None)
    world.channel("whatsapp")
    r24, r2 = world.rule(1440), world.rule(120)
    # Sunday 2026-11-01 14:00 EST (19:00 UTC); DST ended at 02:00 that morning.
    world.appointment(world.contact(), local(2026, 11, 1, 14, 0, tz=ny))
    # Saturday 14:00 EDT = 18:00 UTC, not 19:00 UTC (which 24 h of absolute time would give).
    assert _due(world, r24) == datetime(2026, 10, 31, 18, 0, tzinfo=UTC)
    # 2 h before is Sunday 12:00 EST: Sundays are skipped, so Saturday 20:00 EDT.
    assert _due(world, r2) == local(2026, 10, 31, 20, 0, tz=ny).astimezone(UTC)
    assert _due(world, r2) == datetime(2026, 11, 1, 0, 0, tzinfo=UTC)


def test_dst_start_keeps_the_wall_clock_for_day_offsets(rt, clock):
    ny = "America/New_York"
    clock.set(datetime(2026, 3, 4, 12, 0, tzinfo=UTC))
    world = World(rt, timezone=ny, state=None)
    world.channel("whatsapp")
    r24 = world.rule(1440)
    # Sunday 2026-03-08 14:00 EDT (18:00 UTC); DST started at 02:00 that morning.
    world.appointment(world.contact(), local(2026, 3, 8, 14, 0, tz=ny))
    assert _due(world, r24) == datetime(2026, 3, 7, 19, 0, tzinfo=UTC)  # Saturday 14:00 EST


def test_appointment_timezone_drives_the_nominal_time(rt, clock):
    ny = "America/New_York"
    clock.set(datetime(2026, 10, 28, 12, 0, tzinfo=UTC))
    world = World(rt)  # São Paulo org, appointment booked in New York time (online session)
    world.channel("whatsapp")
    r24 = world.rule(1440)
    world.appointment(world.contact(), local(2026, 11, 1, 14, 0, tz=ny), timezone=ny)
    [row] = world.messages()
    assert row.nominal_due_at == datetime(2026, 10, 31, 18, 0, tzinfo=UTC)  # 15:00 in São Paulo: allowed
    assert _due(world, r24) == datetime(2026, 10, 31, 18, 0, tzinfo=UTC)


def test_no_allowed_instant_is_skipped_with_a_reason(rt, clock):
    clock.set(local(2026, 12, 1, 20, 30))  # Tuesday, after hours
    world = World(rt)
    world.channel("whatsapp")
    world.rule(120)
    world.appointment(world.contact(), local(2026, 12, 1, 23, 0))  # 2 h reminder at 21:00: too late today
    [row] = world.messages()
    assert row.status == "skipped"
    assert row.skip_reason == "no_allowed_instant"
    assert row.due_at is None
    assert world.events(row.id) == ["skipped"]
    clock.advance(timedelta(hours=1))
    assert dispatch.claim_due(rt, limit=10) == []


def test_window_can_move_a_reminder_later_when_nothing_earlier_is_left(rt, clock):
    clock.set(local(2026, 12, 1, 21, 0))  # Tuesday night
    world = World(rt)
    world.channel("whatsapp")
    r24 = world.rule(1440)
    # Wednesday 12:00: the 24 h reminder (Tuesday 12:00) already passed more than 10 min ago.
    # Thursday 10:00: the 24 h reminder (Wednesday 10:00) is fine.
    # Wednesday 21:30: the nominal (Tuesday 21:30) is in quiet hours and nothing before is left
    # after creation, so the earliest allowed instant before the appointment: Wednesday 08:00.
    world.appointment(world.contact(), local(2026, 12, 2, 21, 30))
    [row] = world.messages(rule_id=r24)
    assert row.status == "pending"
    assert row.due_at == local(2026, 12, 2, 8, 0).astimezone(UTC)


def test_appointment_in_the_past_is_skipped_not_sent(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    world.rule(120)
    world.appointment(world.contact(), clock.now() - timedelta(hours=1))
    world.appointment(world.contact(name="Bia", phone="+5516999887700"), clock.now() + timedelta(hours=1))
    rows = world.messages()
    assert len(rows) == 4
    assert {(m.status, m.skip_reason) for m in rows} == {("skipped", "too_late")}
    for row in rows:
        assert world.events(row.id) == ["skipped"]
    world.populate()
    assert len(world.messages()) == 4
    clock.advance(timedelta(hours=2))
    assert dispatch.claim_due(rt, limit=10) == []
    assert world.sandbox() == []


def test_rule_without_window_sends_at_nominal_time(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    r2 = world.rule(120, respect_window=False)
    world.appointment(world.contact(), local(2026, 12, 4, 9, 0))
    assert _due(world, r2) == local(2026, 12, 4, 7, 0).astimezone(UTC)
