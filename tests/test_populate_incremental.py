"""The periodic populate pass (`populate_changed`): only what changed since an instant, the
appointments that entered the horizon since then, and a full pass of an org whose rules or
channels changed; plus the plan join (each reminder written once, with its event)."""

from __future__ import annotations

from datetime import timedelta, timezone

from sqlalchemy import func, select, update

from engine.people import appointments as appts
from engine.store.models import appointments, message_events, reminder_rules
from engine.reminders.populate import DEFAULT_HORIZON, populate, populate_changed
from tests.factories import World, local

UTC = timezone.utc


def _changed(rt, since):
    return populate_changed(rt.db, horizon=DEFAULT_HORIZON, since=since)


def _bare_update(rt, appointment_id, **values):
    """Change an appointment the way an outside writer would: no inline refresh."""
    with rt.db.begin() as conn:
        conn.execute(update(appointments).where(appointments.c.id == appointment_id).values(**values))


def test_incremental_pass_creates_for_new_appointment_and_leaves_the_rest(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    old = world.appointment(world.contact(), local(2026, 12, 3, 14, 0), refresh=False)
    # Not changed since `since` and never populated: the incremental pass does not look at it.
    clock.advance(timedelta(minutes=5))
    since = clock.now()
    clock.advance(timedelta(minutes=1))
    fresh = world.appointment(world.contact(name="Bia", phone="+5516999887700"), local(2026, 12, 3, 15, 0),
                              refresh=False)
    result = _changed(rt, since)
    assert result.created == result.planned == 1
    assert [m.appointment_id for m in world.messages()] == [fresh]
    [row] = world.messages()
    assert row.status == "pending" and world.events(row.id) == ["queued"]
    # The full pass (the scheduler's safety net) finds the other one.
    assert populate(rt.db, horizon=DEFAULT_HORIZON).created == 1
    assert sorted(m.appointment_id for m in world.messages()) == sorted([old, fresh])


def test_incremental_pass_cancels_and_recreates_a_moved_appointment(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    appointment = world.appointment(world.contact(), local(2026, 12, 3, 14, 0))
    [before] = world.messages()
    clock.advance(timedelta(minutes=3))
    since = clock.now()
    clock.advance(timedelta(minutes=1))
    new_time = local(2026, 12, 4, 16, 30)
    _bare_update(rt, appointment, starts_at=new_time, updated_at=clock.now())
    result = _changed(rt, since)
    assert (result.cancelled, result.created, result.planned) == (1, 1, 1)
    assert world.message(before.id).status == "cancelled"
    assert world.message(before.id).skip_reason == "appointment_changed"
    [live] = world.messages(status="pending")
    assert live.appointment_starts_at == new_time.astimezone(UTC)
    assert live.due_at == local(2026, 12, 3, 16, 30).astimezone(UTC)
    assert world.events(live.id) == ["queued"]
    # Again: nothing more.
    assert _changed(rt, since).created == 0


def test_incremental_pass_cancels_a_cancelled_appointment(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    appointment = world.appointment(world.contact(), local(2026, 12, 3, 14, 0))
    [reminder] = world.messages()
    clock.advance(timedelta(minutes=3))
    since = clock.now()
    clock.advance(timedelta(minutes=1))
    _bare_update(rt, appointment, status="cancelled", cancelled_at=clock.now(), cancel_source="clinic",
                 updated_at=clock.now())
    assert _changed(rt, since).cancelled == 1
    assert world.message(reminder.id).status == "cancelled"
    assert world.events(reminder.id) == ["queued", "cancelled"]


def test_incremental_pass_picks_up_the_horizon_edge(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    # Booked long ago (not changed since), beyond the horizon today.
    starts = clock.now() + DEFAULT_HORIZON + timedelta(hours=2)
    appointment = world.appointment(world.contact(), starts, refresh=False)
    clock.advance(timedelta(hours=1))
    populate(rt.db, horizon=DEFAULT_HORIZON)
    assert world.messages() == []
    since = clock.now()
    clock.advance(timedelta(hours=1, minutes=30))  # now + horizon passes `starts`
    result = _changed(rt, since)
    assert result.created == 1
    [row] = world.messages()
    assert row.appointment_id == appointment and row.status == "pending"


def test_incremental_pass_sees_a_consent_given_since(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    contact = world.contact(consent=())
    world.appointment(contact, local(2026, 12, 3, 14, 0))
    assert world.messages() == []
    clock.advance(timedelta(minutes=3))
    since = clock.now()
    clock.advance(timedelta(minutes=1))
    from engine.people.contacts import set_consent

    with rt.db.begin() as conn:
        set_consent(conn, world.org_id, contact, "whatsapp", source="test")
    assert _changed(rt, since).created == 1


def test_rule_change_makes_the_incremental_pass_a_full_one_for_that_org(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    rule = world.rule(1440, active=False)
    world.appointment(world.contact(), local(2026, 12, 3, 14, 0), refresh=False)
    clock.advance(timedelta(minutes=3))
    since = clock.now()
    clock.advance(timedelta(minutes=1))
    with rt.db.begin() as conn:  # switched on by an outside writer, without reflect_rule_changes
        conn.execute(update(reminder_rules).where(reminder_rules.c.id == rule)
                     .values(active=True, updated_at=clock.now()))
    assert _changed(rt, since).created == 1


def test_every_written_reminder_has_exactly_one_event(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    world.rule(120)
    for i in range(12):
        contact = world.contact(name=f"P{i}", phone=f"+55169{i:08d}")
        # Some too soon for the 24 h reminder (skipped too_late), some at night (moved).
        world.appointment(contact, clock.now() + timedelta(hours=3 + 7 * i), refresh=False)
    result = populate(rt.db, horizon=DEFAULT_HORIZON)
    assert result.created == 24 and result.planned + result.skipped == 24 and result.skipped > 0
    with rt.db.connect() as conn:
        counts = conn.execute(select(message_events.c.message_id, func.count())
                              .group_by(message_events.c.message_id)).all()
    assert len(counts) == 24 and {n for _, n in counts} == {1}
    for row in world.messages():
        assert world.events(row.id) == (["queued"] if row.status == "pending" else ["skipped"])
        if row.status == "skipped":
            assert row.skip_reason == "too_late" and row.due_at is None
        else:
            assert row.due_at is not None and row.next_attempt_at == row.due_at


def test_reschedule_inside_a_pass_uses_the_appointment_scope(rt, clock):
    """refresh_appointment (the inline path) only writes that appointment's reminders."""
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    other = world.appointment(world.contact(name="Bia", phone="+5516999887700"), local(2026, 12, 3, 9, 0),
                              refresh=False)
    mine = world.appointment(world.contact(), local(2026, 12, 3, 14, 0))
    assert [m.appointment_id for m in world.messages()] == [mine]
    with rt.db.begin() as conn:
        assert appts.reschedule(conn, world.org_id, mine, local(2026, 12, 4, 14, 0))
    assert other not in [m.appointment_id for m in world.messages()]
