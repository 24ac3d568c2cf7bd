"""A change of a rule or of the org's sending window moves the reminders already queued
(engine.reminders.rules.reflect_rule_changes → engine.reminders.replan.replace_pending), in the caller's transaction:
a changed offset recomputes the time, a changed window re-places it, a switched-off kind cancels;
rows a worker holds, retries and other orgs' rows are left alone; the work is set-based."""

from __future__ import annotations

from datetime import timedelta, timezone

from sqlalchemy import event, func, select, update

from engine.messaging import dispatch
from engine.store.models import message_events, messages, orgs, reminder_rules
from engine.reminders.replan import REPLANNED
from engine.reminders.rules import RULE_CHANGED, reflect_rule_changes, write_rule_kinds
from tests.factories import World, local

UTC = timezone.utc


def _set_rule(world: World, rule_id: int, **values) -> None:
    with world.rt.db.begin() as conn:
        conn.execute(update(reminder_rules).where(reminder_rules.c.org_id == world.org_id,
                                                  reminder_rules.c.id == rule_id).values(**values))


def _set_window(world: World, **values) -> None:
    with world.rt.db.begin() as conn:
        conn.execute(update(orgs).where(orgs.c.id == world.org_id).values(**values))


def _reflect(world: World, rule_ids=(), *, window_changed: bool = False):
    with world.rt.db.begin() as conn:
        return reflect_rule_changes(conn, world.org_id, list(rule_ids), window_changed=window_changed)


def _queue(world: World) -> list[tuple]:
    return [(m.id, m.status, m.due_at, m.next_attempt_at, m.skip_reason) for m in world.messages()]


def _events(rt) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(message_events)).scalar_one()


def _clinic(rt, slug: str = "clinica") -> World:
    world = World(rt, slug=slug)
    world.channel("whatsapp")
    return world


# --- a changed offset --------------------------------------------------------------------------


def test_a_changed_offset_recomputes_the_time_of_queued_reminders(rt, clock):
    world = _clinic(rt)
    rule = world.rule(1440)
    world.appointment(world.contact(), local(2026, 12, 3, 14, 0))
    [before] = world.messages()
    assert before.due_at == local(2026, 12, 2, 14, 0).astimezone(UTC)

    _set_rule(world, rule, offset_minutes=120)
    change = _reflect(world, [rule])

    after = world.message(before.id)
    assert (after.status, after.due_at, after.next_attempt_at) == \
        ("pending", local(2026, 12, 3, 12, 0).astimezone(UTC), local(2026, 12, 3, 12, 0).astimezone(UTC))
    assert after.nominal_due_at == local(2026, 12, 3, 12, 0).astimezone(UTC)
    assert after.idempotency_key == before.idempotency_key  # the same reminder, not a new one
    assert world.events(before.id) == ["queued", "planned"]
    with rt.db.connect() as conn:
        detail = conn.execute(select(message_events.c.detail).where(
            message_events.c.message_id == before.id, message_events.c.event == "planned")).scalar_one()
    assert detail == {"reason": REPLANNED}
    assert (change.rescheduled, change.cancelled, change.created, change.skipped) == (1, 0, 0, 0)

    # running it again moves nothing and writes nothing
    queue, events = _queue(world), _events(rt)
    again = _reflect(world, [rule])
    assert not again.changed and _queue(world) == queue and _events(rt) == events


def test_an_offset_whose_time_has_gone_by_sends_at_the_first_allowed_instant(rt, clock):
    world = _clinic(rt)
    rule = world.rule(120)
    world.appointment(world.contact(), clock.now() + timedelta(hours=5))  # 14:00 local, today
    [row] = world.messages()
    _set_rule(world, rule, offset_minutes=1440)  # 24 h before: yesterday
    change = _reflect(world, [rule])
    assert world.message(row.id).due_at == clock.now()  # 09:00 local, allowed: now, not dropped
    assert change.rescheduled == 1 and change.skipped == 0


def test_a_rule_that_stops_respecting_the_window_goes_at_its_nominal_time(rt, clock):
    world = _clinic(rt)
    rule = world.rule(120)
    world.appointment(world.contact(), local(2026, 12, 4, 9, 0))  # 07:00 nominal → Thursday 20:00
    [row] = world.messages()
    assert row.due_at == local(2026, 12, 3, 20, 0).astimezone(UTC)
    _set_rule(world, rule, respect_window=False)
    assert _reflect(world, [rule]).rescheduled == 1
    after = world.message(row.id)
    assert after.due_at == local(2026, 12, 4, 7, 0).astimezone(UTC) and after.respect_window is False


# --- a changed window --------------------------------------------------------------------------


def test_a_changed_window_re_places_queued_reminders(rt, clock):
    world = _clinic(rt)
    world.rule(1440)
    world.appointment(world.contact(), local(2026, 12, 3, 19, 30))
    world.appointment(world.contact(name="Bia"), local(2026, 12, 3, 10, 0))
    late, early = world.messages()
    assert late.due_at == local(2026, 12, 2, 19, 30).astimezone(UTC)
    assert early.due_at == local(2026, 12, 2, 10, 0).astimezone(UTC)

    _set_window(world, quiet_end="18:00")
    change = _reflect(world, window_changed=True)
    # 19:30 is now outside: the latest allowed instant before it; 10:00 still fits and stays
    assert world.message(late.id).due_at == local(2026, 12, 2, 18, 0).astimezone(UTC)
    assert world.message(early.id).due_at == early.due_at and world.events(early.id) == ["queued"]
    assert (change.rescheduled, change.cancelled, change.created) == (1, 0, 0)


def test_a_window_change_that_leaves_no_allowed_instant_skips_with_the_reason(rt, clock):
    world = _clinic(rt)
    world.rule(120)
    world.appointment(world.contact(), clock.now() + timedelta(hours=5))  # 14:00 local, due 12:00
    [row] = world.messages()
    _set_window(world, quiet_start="15:00", quiet_end="20:00")  # nothing between now and 14:00
    change = _reflect(world, window_changed=True)
    after = world.message(row.id)
    assert (after.status, after.skip_reason) == ("skipped", "no_allowed_instant")
    assert world.events(row.id) == ["queued", "skipped"]
    assert change.skipped == 1 and change.rescheduled == 0


def test_sundays_switched_on_moves_a_sunday_reminder(rt, clock):
    world = World(rt, slug="clinica", skip_sundays=False)
    world.channel("whatsapp")
    world.rule(1440)
    world.appointment(world.contact(), local(2026, 12, 7, 10, 0))  # Monday: reminder on Sunday 10:00
    [row] = world.messages()
    assert row.due_at == local(2026, 12, 6, 10, 0).astimezone(UTC)
    _set_window(world, skip_sundays=True)
    assert _reflect(world, window_changed=True).rescheduled == 1
    assert world.message(row.id).due_at == local(2026, 12, 5, 20, 0).astimezone(UTC)


# --- a switched-off kind or rule ---------------------------------------------------------------


def test_a_kind_switched_off_cancels_and_the_next_kind_is_queued(rt, clock):
    world = _clinic(rt)
    world.channel("sms")
    rule = world.rule(1440, ("whatsapp", "sms"))
    world.appointment(world.contact(), local(2026, 12, 3, 14, 0))
    [row] = world.messages()
    with rt.db.begin() as conn:
        write_rule_kinds(conn, world.org_id, rule, ["sms"])
        change = reflect_rule_changes(conn, world.org_id, [rule])
    old = world.message(row.id)
    assert (old.status, old.skip_reason) == ("cancelled", RULE_CHANGED)
    assert world.events(row.id) == ["queued", "cancelled"]
    [live] = world.messages(status="pending")
    assert live.channel_kind == "sms" and live.due_at == row.due_at
    assert (change.rescheduled, change.cancelled, change.created) == (0, 1, 1)


# --- what is left alone ------------------------------------------------------------------------


def test_claimed_and_retried_reminders_are_left_alone(rt, clock):
    world = _clinic(rt)
    rule = world.rule(120)
    soon = world.appointment(world.contact(), clock.now() + timedelta(hours=2, minutes=30))  # due in 30 min
    world.appointment(world.contact(name="Bia"), local(2026, 12, 3, 14, 0))
    world.appointment(world.contact(name="Caio"), local(2026, 12, 4, 14, 0))
    claimed_row, retry_row, free_row = world.messages()
    assert claimed_row.appointment_id == soon
    clock.advance(timedelta(minutes=31))
    assert dispatch.claim_due(rt, limit=10) == [claimed_row.id]
    # a retry keeps its backoff schedule (written as dispatch writes it after a transient error)
    with rt.db.begin() as conn:
        conn.execute(update(messages).where(messages.c.id == retry_row.id).values(attempts=1))
    before = {m.id: m for m in world.messages()}

    _set_rule(world, rule, offset_minutes=180)
    change = _reflect(world, [rule])
    claimed, retry, free = (world.message(m) for m in (claimed_row.id, retry_row.id, free_row.id))
    assert (claimed.status, claimed.due_at) == ("claimed", before[claimed_row.id].due_at)
    assert (retry.status, retry.due_at) == ("pending", before[retry_row.id].due_at)
    assert free.due_at == local(2026, 12, 4, 11, 0).astimezone(UTC)
    assert change.rescheduled == 1


def test_reminders_of_a_moved_or_past_appointment_are_not_re_placed(rt, clock):
    world = _clinic(rt)
    rule = world.rule(120)
    world.appointment(world.contact(), clock.now() + timedelta(hours=3))  # due in 1 h
    [row] = world.messages()
    clock.advance(timedelta(hours=4))  # the session has started; the reminder was never claimed
    _set_rule(world, rule, offset_minutes=60)
    assert _reflect(world, [rule]).rescheduled == 0
    assert world.message(row.id).due_at == row.due_at


# --- tenants and scale -------------------------------------------------------------------------


def test_a_change_in_one_org_never_touches_another_orgs_queue(rt, clock):
    a, b = _clinic(rt, "clinica-a"), _clinic(rt, "clinica-b")
    rule_a, rule_b = a.rule(1440), b.rule(1440)
    a.appointment(a.contact(), local(2026, 12, 3, 19, 30))
    b.appointment(b.contact(), local(2026, 12, 3, 19, 30))
    b_before = _queue(b)
    with rt.db.connect() as conn:
        b_events = conn.execute(select(func.count()).select_from(message_events)
                                .where(message_events.c.org_id == b.org_id)).scalar_one()

    _set_rule(a, rule_a, offset_minutes=120)
    _set_window(a, quiet_end="18:00")
    # B's rule id given to A's org: not A's, so nothing of B's moves
    assert _reflect(a, [rule_a, rule_b], window_changed=True).rescheduled == 1
    assert _queue(b) == b_before
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(message_events)
                            .where(message_events.c.org_id == b.org_id)).scalar_one() == b_events
    # B's rule switched off by hand in the database, then A's org reflects it: still untouched
    _set_rule(b, rule_b, active=False)
    _reflect(a, [rule_b])
    assert _queue(b) == b_before


def _statements_during(rt, action) -> int:
    count = 0

    def seen(*_args) -> None:
        nonlocal count
        count += 1

    event.listen(rt.db.engine, "before_cursor_execute", seen)
    try:
        action()
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", seen)
    return count


def test_the_replan_is_set_based_not_one_query_per_appointment(rt, clock):
    """Queries do not grow with the number of appointments (an org may have 50,000)."""
    counts = []
    for n, slug in ((3, "pequena"), (40, "grande")):
        world = _clinic(rt, slug)
        rule = world.rule(1440)
        for i in range(n):
            contact = world.contact(name=f"Paciente {i}", phone=f"+55169{i:08d}", email=f"p{i}@example.com")
            world.appointment(contact, local(2026, 12, 3 + i % 4, 9 + i % 9, 0), refresh=False)
        world.populate()
        _set_rule(world, rule, offset_minutes=1440 + 30)
        _set_window(world, quiet_end="19:00")
        counts.append(_statements_during(rt, lambda: _reflect(world, [rule], window_changed=True)))
        assert len([m for m in world.messages() if m.due_at.minute == 30]) >= n // 2  # they did move
    assert counts[0] == counts[1]
