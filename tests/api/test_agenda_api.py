"""The agenda's API: professionals with their hours, and free times, scoped to the key's org
(another org's professional answers 404; its appointments and professionals never show)."""

from __future__ import annotations

from tests.agenda.helpers import WEEK
from tests.factories import local
from tests.fakes.server import Reply

BEATRIZ = {"name": "Dra. Beatriz Costa", "slot_minutes": 30, "hours": WEEK}


def test_professionals_are_created_read_changed_and_removed(api):
    made = api.post("/professionals", BEATRIZ)
    assert made.status_code == 201, made.get_json()
    body = made.get_json()
    assert body["name"] == "Dra. Beatriz Costa" and body["active"] is True and len(body["hours"]) == 10
    assert api.get(f"/professionals/{body['id']}").get_json() == body
    assert api.get("/professionals").get_json() == {"data": [body]}
    saturday = [{"weekday": 5, "starts": "08:00", "ends": "12:00"}]
    changed = api.patch(f"/professionals/{body['id']}", {"slot_minutes": 60, "hours": saturday})
    assert changed.status_code == 200
    assert changed.get_json()["hours"] == [{"weekday": 5, "starts": "08:00", "ends": "12:00"}]
    gone = api.client.delete(f"/api/v1/professionals/{body['id']}", headers={"Authorization": f"Bearer {api.key}"})
    assert gone.status_code == 200 and gone.get_json()["slot_minutes"] == 60
    assert api.get(f"/professionals/{body['id']}").status_code == 404


def test_a_refusal_is_422_in_the_catalogues_words_and_writes_nothing(api):
    overlap = api.post("/professionals", {**BEATRIZ, "hours": [{"weekday": 0, "starts": "08:00", "ends": "12:00"},
                                                               {"weekday": 0, "starts": "11:00", "ends": "13:00"}]})
    assert overlap.status_code == 422
    detail = overlap.get_json()["details"][0]
    assert (detail["code"], detail["field"]) == ("agenda_overlap", "hours")
    assert "sobrepõem" in detail["message"] and "overlap" in detail["message_en"]
    assert api.post("/professionals", {**BEATRIZ, "slot_minutes": 3}).status_code == 422
    assert api.post("/professionals", {**BEATRIZ, "nickname": "x"}).status_code == 422
    assert api.get("/professionals").get_json() == {"data": []}
    api.post("/professionals", BEATRIZ)
    taken = api.post("/professionals", BEATRIZ)
    assert taken.status_code == 409 and taken.get_json()["details"][0]["code"] == "agenda_name_taken"
    backwards = api.get("/slots?date_from=2026-12-05&date_to=2026-12-04")
    assert backwards.status_code == 422 and backwards.get_json()["details"][0]["code"] == "agenda_date_order"
    assert api.get("/slots?period=night").status_code == 422
    assert api.get("/slots?exclude_weekdays=7").status_code == 422


def test_slots_answer_the_query(api):
    api.post("/professionals", BEATRIZ)
    api.world.appointment(api.world.contact(), local(2026, 12, 2, 15))
    answer = api.get("/slots?date=2026-12-02&time=15:00")
    assert answer.status_code == 200
    body = answer.get_json()
    assert body["source"] == "builtin"
    assert [s["starts_at"] for s in body["data"]] == ["2026-12-02T14:00:00-03:00", "2026-12-02T14:30:00-03:00",
                                                      "2026-12-02T15:30:00-03:00"]
    spread = api.get("/slots?exclude_weekdays=1,2&period=afternoon&limit=2").get_json()["data"]
    assert [s["starts_at"] for s in spread] == ["2026-12-03T13:00:00-03:00", "2026-12-04T13:00:00-03:00"]


def test_another_orgs_professionals_answer_404_and_never_show(api, other):
    mine = api.post("/professionals", BEATRIZ).get_json()
    theirs = other.post("/professionals", {"name": "Dr. Deles", "hours": [
        {"weekday": d, "starts": "06:00", "ends": "08:00"} for d in range(7)]}).get_json()
    # The other clinic books every one of my professional's Wednesday mornings, by the same name.
    for hour in range(8, 12):
        other.world.appointment(other.world.contact(), local(2026, 12, 2, hour), professional="Dra. Beatriz Costa")
    for call in (lambda: api.get(f"/professionals/{theirs['id']}"),
                 lambda: api.patch(f"/professionals/{theirs['id']}", {"name": "x"}),
                 lambda: api.client.delete(f"/api/v1/professionals/{theirs['id']}",
                                           headers={"Authorization": f"Bearer {api.key}"}),
                 lambda: api.get(f"/slots?professional_id={theirs['id']}")):
        assert call().status_code == 404
    assert other.get(f"/professionals/{theirs['id']}").get_json()["name"] == "Dr. Deles"
    assert [p["id"] for p in api.get("/professionals").get_json()["data"]] == [mine["id"]]
    found = api.get("/slots?date=2026-12-02&period=morning&limit=20").get_json()["data"]
    assert {s["professional_id"] for s in found} == {mine["id"]}
    assert found[0]["starts_at"] == "2026-12-02T08:00:00-03:00" and len(found) == 8


def test_slots_from_the_clinics_system_and_its_failure(rt, api, serve):
    from engine.people.agenda import set_availability_url

    carlos = api.post("/professionals", {**BEATRIZ, "name": "Dr. Carlos Nunes"}).get_json()
    answer = {"slots": [{"starts_at": "2026-12-04T14:00:00-03:00", "ends_at": "2026-12-04T14:30:00-03:00",
                         "professional": "Dr. Carlos Nunes"}]}
    with serve(lambda req: Reply(200, answer)) as server:
        with rt.db.begin() as conn:
            set_availability_url(conn, api.world.org_id, server.url + "/slots", egress=rt.settings.egress)
        body = api.get(f"/slots?professional_id={carlos['id']}").get_json()
        assert server.requests[0].query["professional"] == ["Dr. Carlos Nunes"]
    assert body == {"source": "webhook", "data": [{"starts_at": "2026-12-04T14:00:00-03:00",
                                                   "ends_at": "2026-12-04T14:30:00-03:00",
                                                   "professional": "Dr. Carlos Nunes", "professional_id": None}]}
    with serve(lambda req: Reply(503)):
        failed = api.get("/slots")
    assert failed.status_code == 502
    detail = failed.get_json()["details"][0]
    assert (detail["code"], detail["transient"]) == ("availability_http", True) and "HTTP 503" in detail["message_en"]
