"""Free times from the clinic's own system (engine/people/agenda/webhook.py), against a loopback
fake: the request's constraints, a good answer filtered to them, and every way it fails (timeout,
bad JSON, naive instants, HTTP 500 and 404, an address the egress guard refuses)."""

from __future__ import annotations

from datetime import date

import pytest

from engine.people.agenda import (
    AgendaError,
    AvailabilityUnavailable,
    SlotQuery,
    free_slots,
    set_availability_url,
)
from gateway.egress import STRICT
from tests.agenda.helpers import hhmm, org_of, professional
from tests.factories import World
from tests.fakes.server import Reply, Streamed


def _slot(starts: str, ends: str, who: str | None = "Dra. Beatriz Costa") -> dict[str, object]:
    return {"starts_at": starts, "ends_at": ends, "professional": who}


GOOD = {"slots": [
    _slot("2026-12-01T09:30:00-03:00", "2026-12-01T10:00:00-03:00"),  # within the lead time
    _slot("2026-12-04T14:00:00-03:00", "2026-12-04T14:30:00-03:00"),
    _slot("2026-12-04T17:00:00Z", "2026-12-04T17:30:00Z"),  # 14:00 São Paulo: the same time again
    _slot("2026-12-04T09:00:00-03:00", "2026-12-04T09:30:00-03:00"),  # a morning: not asked
    _slot("2026-12-07T15:00:00-03:00", "2026-12-07T15:30:00-03:00", "Dr. Carlos Nunes"),
    _slot("2026-12-08T13:00:00-03:00", "2026-12-08T13:30:00-03:00", None),
    _slot("2027-03-01T13:00:00-03:00", "2027-03-01T13:30:00-03:00"),  # beyond the horizon
]}


@pytest.fixture
def world(rt, clock, serve):
    return World(rt)


def _ask(rt, clock, world, url, egress=None, timeout=2.0, **query):
    with rt.db.begin() as conn:
        set_availability_url(conn, world.org_id, url, egress=rt.settings.egress)
    with rt.db.connect() as conn:
        return free_slots(conn, org_of(rt, world.org_id), SlotQuery(**query), clock.now(),
                          egress=egress or rt.settings.egress, timeout=timeout)


def test_the_clinics_system_is_asked_with_the_constraints_and_its_slots_kept_to_them(rt, clock, world, serve):
    with serve(lambda req: Reply(200, GOOD)) as server:
        found = _ask(rt, clock, world, server.url + "/livres?token=abc", period="afternoon", time="14:00",
                     exclude_weekdays=(2, 0), limit=5)
    assert server.requests[0].method == "GET" and server.requests[0].path == "/livres"
    assert server.requests[0].query == {"token": ["abc"], "date_from": ["2026-12-01"], "date_to": ["2027-01-30"],
                                        "period": ["afternoon"], "time": ["14:00"], "exclude_weekdays": ["0,2"],
                                        "limit": ["5"]}
    assert hhmm(found) == ["12-04 14:00", "12-08 13:00"]  # Monday 7 excluded
    assert found[0].starts_at.isoformat() == "2026-12-04T14:00:00-03:00"
    assert [(s.professional, s.professional_id) for s in found] == [("Dra. Beatriz Costa", None), (None, None)]


def test_a_professional_asked_for_is_sent_by_name_and_others_dropped(rt, clock, world, serve):
    carlos = professional(rt, world.org_id, "Dr. Carlos Nunes")
    with serve(lambda req: Reply(200, GOOD)) as server:
        found = _ask(rt, clock, world, server.url, professional_id=carlos.id, date_from=date(2026, 12, 7),
                     date_to=date(2026, 12, 8))
    assert server.requests[0].query["professional"] == ["Dr. Carlos Nunes"]
    assert (server.requests[0].query["date_from"], server.requests[0].query["date_to"]) == (["2026-12-07"],
                                                                                            ["2026-12-08"])
    assert hhmm(found) == ["12-07 15:00", "12-08 13:00"]  # a slot of no one in particular is kept


@pytest.mark.parametrize("reply, code, permanent", [
    (Reply(200, "{not json"), "availability_bad_answer", True),
    (Reply(200, {"free": []}), "availability_bad_answer", True),
    (Reply(200, {"slots": [{"starts_at": "2026-12-04T14:00:00", "ends_at": "2026-12-04T14:30:00",
                            "professional": None}]}), "availability_bad_answer", True),
    (Reply(200, {"slots": [{"starts_at": "2026-12-04T14:00:00-03:00", "professional": None}]}),
     "availability_bad_answer", True),
    (Reply(200, {"slots": [_slot("2026-12-04T14:00:00-03:00", "2026-12-04T13:00:00-03:00")]}),
     "availability_bad_answer", True),
    (Reply(500, {"error": "down"}), "availability_http", False),
    (Reply(429, {}), "availability_http", False),
    (Reply(404, {}), "availability_http", True),
    (Reply(200, Streamed.trickle(b"{\"slots\": []}", 0.1)), "availability_timeout", False),
])
def test_a_failing_clinic_system_is_a_typed_error_with_a_sentence(rt, clock, world, serve, reply, code, permanent):
    with serve(lambda req: reply) as server, pytest.raises(AvailabilityUnavailable) as caught:
        _ask(rt, clock, world, server.url, timeout=0.3)
    assert (caught.value.code, caught.value.permanent) == (code, permanent)
    assert "%(" not in str(caught.value) and str(caught.value) == str(caught.value.text)


def test_an_internal_address_is_refused_by_the_egress_guard(rt, clock, world, serve):
    with serve(lambda req: Reply(200, GOOD)) as server:
        with pytest.raises(AvailabilityUnavailable) as caught:
            _ask(rt, clock, world, server.url, egress=STRICT)
        assert server.requests == []  # refused before any connection
        assert (caught.value.code, caught.value.permanent) == ("availability_refused", True)
        with pytest.raises(AgendaError) as saved, rt.db.begin() as conn:
            set_availability_url(conn, world.org_id, server.url, egress=STRICT)
        assert saved.value.code == "agenda_url_refused"
    for bad in ("ftp://clinic.example/slots", "https://user:pw@clinic.example/slots"):
        with pytest.raises(AgendaError) as caught, rt.db.begin() as conn:
            set_availability_url(conn, world.org_id, bad, egress=STRICT)
        assert caught.value.code == "agenda_url"


def test_a_cleared_url_brings_back_the_built_in_agenda(rt, clock, world, serve):
    professional(rt, world.org_id)
    with serve(lambda req: Reply(500)) as server:
        with pytest.raises(AvailabilityUnavailable):
            _ask(rt, clock, world, server.url)
        assert hhmm(_ask(rt, clock, world, "")) == ["12-01 11:00", "12-02 08:00", "12-03 08:00"]
