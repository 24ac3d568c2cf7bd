"""`professional_id` on the appointments API: an appointment linked to one of the org's professionals
carries their name too, another org's professional is refused with nothing written, and a booked
appointment makes that professional's slot busy in GET /slots."""

from __future__ import annotations

from sqlalchemy import func, select

from engine.store.models import appointments, audit_log
from tests.agenda.helpers import WEEK

BEATRIZ = {"name": "Dra. Beatriz Costa", "slot_minutes": 30, "hours": WEEK}
CARLOS = {"name": "Dr. Carlos Nunes", "slot_minutes": 30, "hours": WEEK}
WEDNESDAY_9 = "2026-12-02T09:00:00-03:00"


def _contact(api, external_id: str = "p-1") -> None:
    made = api.post("/contacts", {"external_id": external_id, "name": "Ana Clara", "phone": "+5516999887766",
                                  "consent": ["whatsapp"]})
    assert made.status_code in (200, 201), made.get_json()


def _morning(api, professional_id: int) -> list[str]:
    found = api.get(f"/slots?date=2026-12-02&period=morning&limit=20&professional_id={professional_id}")
    assert found.status_code == 200, found.get_json()
    return [s["starts_at"] for s in found.get_json()["data"]]


def _count(rt, table) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def test_an_appointment_with_a_professional_is_read_back_and_makes_the_slot_busy(api):
    beatriz = api.post("/professionals", BEATRIZ).get_json()
    carlos = api.post("/professionals", CARLOS).get_json()
    _contact(api)
    assert WEDNESDAY_9 in _morning(api, beatriz["id"])
    made = api.post("/appointments", {"external_id": "a-1", "contact_external_id": "p-1", "starts_at": WEDNESDAY_9,
                                      "professional_id": beatriz["id"]})
    assert made.status_code == 201, made.get_json()
    body = made.get_json()
    assert body["professional_id"] == beatriz["id"] and body["professional"] == "Dra. Beatriz Costa"
    assert api.get(f"/appointments/{body['id']}").get_json() == body
    [listed] = api.get("/appointments").get_json()["data"]
    assert listed["professional_id"] == beatriz["id"]
    # Her 09:00 is taken; his is not (the busy time is the linked professional's).
    assert WEDNESDAY_9 not in _morning(api, beatriz["id"])
    assert "2026-12-02T09:30:00-03:00" in _morning(api, beatriz["id"])
    assert WEDNESDAY_9 in _morning(api, carlos["id"])


def test_the_id_wins_over_a_name_given_with_it_and_an_update_moves_the_busy_time(api):
    beatriz = api.post("/professionals", BEATRIZ).get_json()
    carlos = api.post("/professionals", CARLOS).get_json()
    _contact(api)
    made = api.post("/appointments", {"external_id": "a-1", "contact_external_id": "p-1", "starts_at": WEDNESDAY_9,
                                      "professional_id": carlos["id"], "professional": "Dra. Beatriz Costa"})
    assert made.status_code == 201 and made.get_json()["professional"] == "Dr. Carlos Nunes"
    assert WEDNESDAY_9 not in _morning(api, carlos["id"]) and WEDNESDAY_9 in _morning(api, beatriz["id"])
    moved = api.post("/appointments", {"external_id": "a-1", "contact_external_id": "p-1", "starts_at": WEDNESDAY_9,
                                       "professional_id": beatriz["id"]})
    assert moved.status_code == 200
    assert (moved.get_json()["professional_id"], moved.get_json()["professional"]) == (beatriz["id"],
                                                                                      "Dra. Beatriz Costa")
    assert WEDNESDAY_9 not in _morning(api, beatriz["id"]) and WEDNESDAY_9 in _morning(api, carlos["id"])
    # A new name without an id names someone else: the link goes, the name counts.
    renamed = api.post("/appointments", {"external_id": "a-1", "contact_external_id": "p-1",
                                         "starts_at": WEDNESDAY_9, "professional": "Dr. Carlos Nunes"})
    assert (renamed.get_json()["professional_id"], renamed.get_json()["professional"]) == (None, "Dr. Carlos Nunes")
    assert WEDNESDAY_9 not in _morning(api, carlos["id"]) and WEDNESDAY_9 in _morning(api, beatriz["id"])
    unlinked = api.post("/appointments", {"external_id": "a-1", "contact_external_id": "p-1",
                                          "starts_at": WEDNESDAY_9, "professional_id": None})
    assert unlinked.status_code == 200 and unlinked.get_json()["professional_id"] is None


def test_another_orgs_professional_is_refused_and_nothing_is_written(rt, api, other):
    theirs = other.post("/professionals", {**BEATRIZ, "name": "Dr. Deles"}).get_json()
    _contact(api)
    written = (_count(rt, appointments), _count(rt, audit_log))
    for professional_id in (theirs["id"], 999_999):
        refused = api.post("/appointments", {"external_id": "a-1", "contact_external_id": "p-1",
                                             "starts_at": WEDNESDAY_9, "professional_id": professional_id})
        assert refused.status_code == 422, refused.get_json()
        [detail] = refused.get_json()["details"]
        assert (detail["code"], detail["field"]) == ("agenda_no_professional", "professional_id")
        assert detail["message"] == "Este profissional não existe nesta clínica."
        assert detail["message_en"] == "This professional does not exist in this clinic."
    assert (_count(rt, appointments), _count(rt, audit_log)) == written
    assert api.get("/appointments").get_json()["data"] == []
    # An existing appointment is left as it was, too.
    mine = api.post("/professionals", BEATRIZ).get_json()
    made = api.post("/appointments", {"external_id": "a-1", "contact_external_id": "p-1", "starts_at": WEDNESDAY_9,
                                      "professional_id": mine["id"]}).get_json()
    refused = api.post("/appointments", {"external_id": "a-1", "contact_external_id": "p-1",
                                         "starts_at": "2026-12-03T09:00:00-03:00", "professional_id": theirs["id"]})
    assert refused.status_code == 422
    assert api.get(f"/appointments/{made['id']}").get_json() == made


def test_a_professional_id_must_be_an_id(api):
    _contact(api)
    for bad in ("1", 0, -3, 1.5, True):
        answer = api.post("/appointments", {"external_id": "a-1", "contact_external_id": "p-1",
                                            "starts_at": WEDNESDAY_9, "professional_id": bad})
        assert answer.status_code == 422 and "professional_id" in answer.get_json()["details"], bad
    assert api.get("/appointments").get_json()["data"] == []
