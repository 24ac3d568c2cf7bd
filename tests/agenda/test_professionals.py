"""Professionals and their weekly hours: validated before anything is written, scoped to the org."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from engine.people.agenda import (
    AgendaError,
    ProfessionalNotFound,
    create_professional,
    delete_professional,
    get_professional,
    link_appointments,
    list_professionals,
    update_professional,
)
from engine.store.models import appointments, professional_hours, professionals
from tests.agenda.helpers import WEEK, professional
from tests.factories import World, local


def _counts(rt):
    with rt.db.connect() as conn:
        return (conn.execute(select(func.count()).select_from(professionals)).scalar(),
                conn.execute(select(func.count()).select_from(professional_hours)).scalar())


def test_a_professional_keeps_their_week_in_order(rt, clock):
    world = World(rt)
    made = professional(rt, world.org_id, "  Dra. Beatriz Costa ", hours=list(reversed(WEEK)), slot_minutes=45)
    assert (made.name, made.slot_minutes, made.active) == ("Dra. Beatriz Costa", 45, True)
    assert [i.as_json() for i in made.hours[:2]] == [{"weekday": 0, "starts": "08:00", "ends": "12:00"},
                                                     {"weekday": 0, "starts": "13:00", "ends": "18:00"}]
    assert len(made.hours) == 10
    with rt.db.connect() as conn:
        assert get_professional(conn, world.org_id, made.id) == made
        assert [p.name for p in list_professionals(conn, world.org_id)] == ["Dra. Beatriz Costa"]


@pytest.mark.parametrize("kwargs, code, field", [
    ({"name": " "}, "agenda_name", "name"),
    ({"name": "x" * 121}, "agenda_name", "name"),
    ({"slot_minutes": 4}, "agenda_slot_minutes", "slot_minutes"),
    ({"slot_minutes": 481}, "agenda_slot_minutes", "slot_minutes"),
    ({"slot_minutes": True}, "agenda_slot_minutes", "slot_minutes"),
    ({"hours": [{"weekday": 7, "starts": "08:00", "ends": "12:00"}]}, "agenda_weekday", "hours.0.weekday"),
    ({"hours": [{"weekday": 0, "starts": "8:00", "ends": "12:00"}]}, "agenda_time", "hours.0.starts"),
    ({"hours": [{"weekday": 0, "starts": "08:00", "ends": "24:01"}]}, "agenda_time", "hours.0.ends"),
    ({"hours": [{"weekday": 0, "starts": "12:00", "ends": "08:00"}]}, "agenda_interval_order", "hours.0.ends"),
    ({"hours": [{"weekday": 0, "starts": "08:00", "ends": "12:00"},
                {"weekday": 0, "starts": "11:30", "ends": "13:00"}]}, "agenda_overlap", "hours"),
])
def test_a_refused_professional_writes_nothing(rt, clock, kwargs, code, field):
    world = World(rt)
    args = {"name": "Dra. Beatriz Costa", "hours": WEEK, **kwargs}
    with pytest.raises(AgendaError) as caught, rt.db.begin() as conn:
        create_professional(conn, world.org_id, **args)
    assert (caught.value.code, caught.value.field) == (code, field)
    assert str(caught.value) == str(caught.value.text) and "%(" not in str(caught.value)
    assert _counts(rt) == (0, 0)


def test_a_refused_change_leaves_the_professional_as_it_was(rt, clock):
    world = World(rt)
    made = professional(rt, world.org_id)
    professional(rt, world.org_id, "Dr. Carlos Nunes")
    for changes, code in (({"name": "Dr. Carlos Nunes", "slot_minutes": 60}, "agenda_name_taken"),
                          ({"slot_minutes": 60, "hours": [{"weekday": 0, "starts": "09:00", "ends": "10:00"},
                                                          {"weekday": 0, "starts": "09:30", "ends": "11:00"}]},
                           "agenda_overlap")):
        with pytest.raises(AgendaError) as caught, rt.db.begin() as conn:
            update_professional(conn, world.org_id, made.id, **changes)
        assert caught.value.code == code
    with rt.db.connect() as conn:
        assert get_professional(conn, world.org_id, made.id) == made
    with rt.db.begin() as conn:
        changed = update_professional(conn, world.org_id, made.id, slot_minutes=20,
                                      hours=[{"weekday": 5, "starts": "08:00", "ends": "12:00"}])
    assert changed.slot_minutes == 20 and [i.weekday for i in changed.hours] == [5]
    with pytest.raises(AgendaError, match="nome"), rt.db.begin() as conn:
        create_professional(conn, world.org_id, name="Dra. Beatriz Costa")


def test_another_orgs_professional_is_not_found_for_anything(rt, clock):
    mine, theirs = World(rt, slug="clinica-a"), World(rt, slug="clinica-b")
    other = professional(rt, theirs.org_id)
    professional(rt, mine.org_id)  # the same name in another org is fine
    for action in (lambda c: get_professional(c, mine.org_id, other.id),
                   lambda c: update_professional(c, mine.org_id, other.id, name="x"),
                   lambda c: delete_professional(c, mine.org_id, other.id)):
        with pytest.raises(ProfessionalNotFound), rt.db.begin() as conn:
            action(conn)
    with rt.db.connect() as conn:
        assert get_professional(conn, theirs.org_id, other.id).name == "Dra. Beatriz Costa"


def test_appointments_naming_a_professional_are_linked_and_unlinked_when_they_go(rt, clock):
    world = World(rt)
    made = professional(rt, world.org_id)
    contact = world.contact()
    named = world.appointment(contact, local(2026, 12, 2, 8), professional="DRA. Beatriz Costa")
    other = world.appointment(contact, local(2026, 12, 2, 9), professional="Dr. Ninguém")
    with rt.db.begin() as conn:
        assert link_appointments(conn, world.org_id) == 1
    with rt.db.connect() as conn:
        links = dict(conn.execute(select(appointments.c.id, appointments.c.professional_id)).all())
    assert links == {named: made.id, other: None}
    with rt.db.begin() as conn:
        delete_professional(conn, world.org_id, made.id)
    with rt.db.connect() as conn:
        row = conn.execute(select(appointments).where(appointments.c.id == named)).one()
    assert (row.professional_id, row.professional) == (None, "DRA. Beatriz Costa")
    assert _counts(rt) == (0, 0)
