"""Free times of the built-in agenda (engine/people/agenda/): weekly hours and breaks cut into
slots, minus booked appointments and the org's holidays, within the lead time and the horizon,
filtered by date, period, time and weekday, spread over days, in the org's timezone (DST included).
The clock starts at Tuesday 2026-12-01 09:00 in São Paulo (tests/conftest.py T0)."""

from __future__ import annotations

from datetime import date, datetime
from zoneinfo import ZoneInfo

import pytest

from engine.people.agenda import AgendaError, ProfessionalNotFound, SlotQuery, free_slots
from tests.agenda.helpers import hhmm, org_of, professional
from tests.factories import World, local

WED = date(2026, 12, 2)
WHOLE_DAY = [f"12-02 {h:02d}:{m:02d}" for h in range(8, 18) if h != 12 for m in (0, 30)]


def slots(rt, clock, world, day=None, **query):
    if day is not None:
        query.update(date_from=day, date_to=day)
    with rt.db.connect() as conn:
        return free_slots(conn, org_of(rt, world.org_id), SlotQuery(**query), clock.now())


@pytest.fixture
def world(rt, clock):
    world = World(rt)
    world.beatriz = professional(rt, world.org_id)
    return world


def test_a_day_is_its_hours_cut_into_slots_without_the_lunch_break(rt, clock, world):
    found = slots(rt, clock, world, day=WED, limit=20)
    assert hhmm(found) == WHOLE_DAY
    first = found[0]
    assert first.starts_at == local(2026, 12, 2, 8) and first.ends_at == local(2026, 12, 2, 8, 30)
    assert first.starts_at.tzinfo == ZoneInfo("America/Sao_Paulo")
    assert (first.professional, first.professional_id) == ("Dra. Beatriz Costa", world.beatriz.id)


def test_nothing_sooner_than_the_lead_time_nor_in_the_past(rt, clock, world):
    today = slots(rt, clock, world, day=date(2026, 12, 1), limit=20)  # now is 09:00: from 11:00
    assert hhmm(today)[0] == "12-01 11:00" and len(today) == 12
    assert slots(rt, clock, world, day=date(2026, 11, 30), limit=20) == []
    assert hhmm(slots(rt, clock, world, day=date(2026, 12, 1), limit=1, lead_minutes=0)) == ["12-01 09:00"]


def test_nothing_beyond_the_horizon(rt, clock, world):
    assert slots(rt, clock, world, date_from=date(2027, 2, 1)) == []  # 62 days ahead
    last = slots(rt, clock, world, date_from=date(2027, 1, 25), date_to=date(2027, 3, 1), limit=20)
    assert {s.starts_at.date() for s in last} <= {date(2027, 1, 25), date(2027, 1, 26), date(2027, 1, 27),
                                                   date(2027, 1, 28), date(2027, 1, 29)}
    assert max(s.starts_at for s in last) <= local(2027, 1, 30, 9)
    assert slots(rt, clock, world, date_from=date(2027, 1, 4), horizon_days=30) == []


def test_booked_appointments_take_their_slots_matched_by_id_or_by_name(rt, clock, world):
    contact = world.contact()
    world.appointment(contact, local(2026, 12, 2, 8), professional="dra. beatriz costa ")  # the name only
    world.appointment(contact, local(2026, 12, 2, 8, 30), status="cancelled")  # frees its time
    linked = world.appointment(contact, local(2026, 12, 2, 9, 10), professional="Beatriz")  # off the grid
    with rt.db.begin() as conn:
        from sqlalchemy import update

        from engine.store.models import appointments

        conn.execute(update(appointments).where(appointments.c.id == linked)
                     .values(professional_id=world.beatriz.id))
    world.appointment(contact, local(2026, 12, 2, 10), professional="Dr. Outro")  # someone else's
    other = World(rt, slug="outra")  # another clinic's appointment with a professional of the same name
    other.appointment(other.contact(), local(2026, 12, 2, 11))
    found = hhmm(slots(rt, clock, world, day=WED, limit=20))
    assert found == [t for t in WHOLE_DAY if t not in ("12-02 08:00", "12-02 09:00", "12-02 09:30")]


def test_the_orgs_holidays_have_no_slots(rt, clock, world):
    found = slots(rt, clock, world, date_from=date(2026, 12, 24), date_to=date(2026, 12, 28), limit=20)
    assert {s.starts_at.date() for s in found} == {date(2026, 12, 24), date(2026, 12, 28)}  # Christmas, a weekend


def test_a_period_keeps_the_slots_that_start_in_it(rt, clock, world):
    afternoon = slots(rt, clock, world, day=WED, period="afternoon", limit=20)
    assert hhmm(afternoon) == [t for t in WHOLE_DAY if t >= "12-02 12:00"]
    morning = slots(rt, clock, world, day=WED, period="morning", limit=20)
    assert hhmm(morning) == [t for t in WHOLE_DAY if t < "12-02 12:00"]
    assert slots(rt, clock, world, day=WED, period="evening") == []


def test_three_slots_spread_over_the_first_days_and_excluded_weekdays(rt, clock, world):
    assert hhmm(slots(rt, clock, world)) == ["12-01 11:00", "12-02 08:00", "12-03 08:00"]
    assert hhmm(slots(rt, clock, world, exclude_weekdays=(1, 2))) == ["12-03 08:00", "12-04 08:00", "12-07 08:00"]
    # One day: the first, the last, then the one farthest from both (not 08:00, 08:30, 09:00).
    assert hhmm(slots(rt, clock, world, day=WED)) == ["12-02 08:00", "12-02 13:00", "12-02 17:30"]
    assert hhmm(slots(rt, clock, world, date_from=WED, date_to=date(2026, 12, 3), limit=4)) == [
        "12-02 08:00", "12-02 17:30", "12-03 08:00", "12-03 17:30"]


def test_a_time_gives_that_slot_or_the_nearest(rt, clock, world):
    assert hhmm(slots(rt, clock, world, day=WED, time="15:00")) == ["12-02 14:30", "12-02 15:00", "12-02 15:30"]
    world.appointment(world.contact(), local(2026, 12, 2, 15))
    assert hhmm(slots(rt, clock, world, day=WED, time="15:00")) == ["12-02 14:00", "12-02 14:30", "12-02 15:30"]
    # Several days: that time on each of the first days.
    assert hhmm(slots(rt, clock, world, time="16:00", exclude_weekdays=(1,))) == [
        "12-02 16:00", "12-03 16:00", "12-04 16:00"]


def test_a_professional_of_choice_and_two_free_at_once_count_as_one_time(rt, clock, world):
    carlos = professional(rt, world.org_id, "Dr. Carlos Nunes", slot_minutes=60,
                          hours=[{"weekday": 2, "starts": "07:00", "ends": "09:00"}])
    both = slots(rt, clock, world, day=WED, limit=20)
    assert hhmm(both)[:3] == ["12-02 07:00", "12-02 08:00", "12-02 08:30"]
    assert [s.professional for s in both[:2]] == ["Dr. Carlos Nunes", "Dr. Carlos Nunes"]
    assert len(both) == len(WHOLE_DAY) + 1
    only = slots(rt, clock, world, day=WED, professional_id=carlos.id, limit=20)
    assert hhmm(only) == ["12-02 07:00", "12-02 08:00"] and only[0].ends_at == local(2026, 12, 2, 8)
    assert hhmm(slots(rt, clock, world, day=WED, professional="dr. carlos nunes")) == hhmm(only)
    with rt.db.begin() as conn:
        from engine.people.agenda import update_professional

        update_professional(conn, world.org_id, carlos.id, active=False)
    assert slots(rt, clock, world, day=WED, professional_id=carlos.id) == []


def test_another_orgs_professional_is_not_found(rt, clock, world):
    other = World(rt, slug="outra")
    theirs = professional(rt, other.org_id, "Dr. Deles")
    with pytest.raises(ProfessionalNotFound):
        slots(rt, clock, world, professional_id=theirs.id)
    with pytest.raises(ProfessionalNotFound):
        slots(rt, clock, world, professional="Dr. Deles")
    assert all(s.professional_id == world.beatriz.id for s in slots(rt, clock, world, limit=20))


@pytest.mark.parametrize("query, code", [
    ({"date_from": date(2026, 12, 5), "date_to": date(2026, 12, 4)}, "agenda_date_order"),
    ({"period": "night"}, "agenda_period"),
    ({"time": "25:00"}, "agenda_time"),
    ({"exclude_weekdays": (7,)}, "agenda_exclude_weekdays"),
    ({"limit": 0}, "agenda_limit"),
])
def test_a_query_that_cannot_be_asked_is_refused(rt, clock, world, query, code):
    with pytest.raises(AgendaError) as caught:
        slots(rt, clock, world, **query)
    assert caught.value.code == code and str(caught.value)


def test_slots_follow_the_orgs_wall_clock_across_a_dst_change(rt, clock):
    clock.set(datetime(2027, 3, 10, 12, tzinfo=ZoneInfo("UTC")))
    world = World(rt, slug="nova-york", timezone="America/New_York")
    professional(rt, world.org_id, "Dr. Night", slot_minutes=60, hours=[
        {"weekday": 6, "starts": "00:00", "ends": "05:00"}, {"weekday": 6, "starts": "23:00", "ends": "24:00"}])
    sunday = slots(rt, clock, world, day=date(2027, 3, 14), limit=20)
    # 02:00 never is that night.
    assert hhmm(sunday) == ["03-14 00:00", "03-14 01:00", "03-14 03:00", "03-14 04:00", "03-14 23:00"]
    assert [s.starts_at.utcoffset().total_seconds() / 3600 for s in sunday] == [-5, -5, -4, -4, -4]
    assert sunday[1].ends_at == sunday[2].starts_at  # 01:00 EST + 1 h is 03:00 EDT
    assert sunday[-1].ends_at.isoformat() == "2027-03-15T00:00:00-04:00"
