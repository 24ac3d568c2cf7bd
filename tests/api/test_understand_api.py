"""POST /api/v1/understand: a patient's reply read in the caller's org (timezone, keywords,
appointments), with readable refusals and no way into another org's appointments."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select, update

from engine.store.models import audit_log, orgs
from engine.words.understanding import MAX_CHARS
from tests.api.conftest import api_for
from tests.factories import World

#: The corpus's fixed clock (docs/understanding.md): a Monday morning in São Paulo.
NOW = "2026-12-07T10:00:00-03:00"
APPOINTMENT_AT = datetime(2026, 12, 9, 17, 0, tzinfo=UTC)  # Wednesday 14:00 in São Paulo


def _issues(response) -> dict[str, dict]:
    assert response.status_code == 422, response.get_json()
    body = response.get_json()
    assert body["error"] and isinstance(body["details"], list)
    for issue in body["details"]:
        # Every problem is a catalogue sentence in both languages, never a bare code.
        assert set(issue) == {"code", "field", "message", "message_en"}
        assert issue["message"] and issue["message_en"] and issue["message"] != issue["code"]
    return {issue["field"]: issue for issue in body["details"]}


def test_an_offer_of_another_day_is_a_reschedule_with_its_date_and_period(api):
    response = api.post("/understand", {"text": "dá pra ser sexta de manhã?", "now": NOW})
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert body["intent"] == "reschedule"
    assert body["fields"]["date"] == "2026-12-11" and body["fields"]["period"] == "morning"
    assert body["engine"] == "builtin" and body["llm_calls"] == 0
    assert 0 <= body["confidence"] <= 1


def test_a_plain_yes_confirms_and_the_server_clock_is_the_default(api):
    body = api.post("/understand", {"text": "Sim, confirmo"}).get_json()
    assert body["intent"] == "confirm"
    assert set(body["fields"]) >= {"date", "time", "period"}


def test_declared_intents_and_pending_fields_shape_the_reading(api):
    body = api.post("/understand", {"text": "quero cancelar", "now": NOW, "intents": ["confirm", "reschedule"]})
    assert body.get_json()["intent"] == "other"
    choice = api.post("/understand", {"text": "2", "now": NOW, "pending": ["choice"]}).get_json()
    assert choice["fields"]["choice"] == 2


def test_the_appointment_s_own_day_only_confirms_it(api, clinic):
    contact = clinic.contact()
    appointment_id = clinic.appointment(contact, APPOINTMENT_AT)
    by_id = api.post("/understand", {"text": "sim, quarta às 14h", "now": NOW, "appointment_id": appointment_id})
    assert by_id.status_code == 200 and by_id.get_json()["intent"] == "confirm"
    by_at = api.post("/understand", {"text": "sim, quarta às 14h", "now": NOW,
                                     "appointment_at": "2026-12-09T14:00:00-03:00"})
    assert by_at.get_json() == by_id.get_json()


def test_another_org_s_appointment_answers_404_and_reveals_nothing(api, other, rt):
    theirs = other.world.appointment(other.world.contact(), APPOINTMENT_AT)
    response = api.post("/understand", {"text": "sim, quarta às 14h", "now": NOW, "appointment_id": theirs})
    assert response.status_code == 404
    missing = api.post("/understand", {"text": "sim, quarta às 14h", "now": NOW, "appointment_id": theirs + 999})
    # Exactly like an id that does not exist: same status, same body.
    assert missing.status_code == 404 and missing.get_json() == response.get_json()
    assert "2026" not in response.get_data(as_text=True)
    assert other.post("/understand", {"text": "sim", "now": NOW, "appointment_id": theirs}).status_code == 200


def test_without_a_key_it_answers_401(client):
    response = client.post("/api/v1/understand", json={"text": "sim"})
    assert response.status_code == 401 and response.get_json()["error"]
    bad = client.post("/api/v1/understand", json={"text": "sim"}, headers={"Authorization": "Bearer lembra_x_y"})
    assert bad.status_code == 401


@pytest.mark.parametrize("body, field, code", [
    ({}, "text", "understand_text"),
    ({"text": ""}, "text", "understand_text"),
    ({"text": "   "}, "text", "understand_text"),
    ({"text": "x" * (MAX_CHARS + 1)}, "text", "understand_text"),
    ({"text": 12}, "text", "understand_text"),
    ({"text": "sim", "now": "2026-12-07T10:00:00"}, "now", "understand_instant"),
    ({"text": "sim", "now": "amanhã"}, "now", "understand_instant"),
    ({"text": "sim", "appointment_id": 1, "appointment_at": NOW}, "appointment_at", "understand_appointment_both"),
    ({"text": "sim", "appointment_id": "1"}, "appointment_id", "detail_integer_range"),
    ({"text": "sim", "intents": ["confirm", "pay"]}, "intents", "understand_intents"),
    ({"text": "sim", "intents": []}, "intents", "understand_intents"),
    ({"text": "sim", "pending": ["weekday"]}, "pending", "understand_pending"),
    ({"text": "sim", "language": "pt"}, "language", "detail_unknown_field"),
    (["sim"], "", "understand_body"),
])
def test_a_request_it_cannot_read_is_a_422_in_the_catalogue_s_words(api, body, field, code):
    issues = _issues(api.post("/understand", body))
    assert issues[field]["code"] == code


def test_the_refusals_speak_both_languages(api):
    issue = _issues(api.post("/understand", {"text": "x" * (MAX_CHARS + 1)}))["text"]
    assert str(MAX_CHARS) in issue["message"] and "caracteres" in issue["message"]
    assert str(MAX_CHARS) in issue["message_en"] and "characters" in issue["message_en"]


def test_hostile_bodies_are_refused_before_reading(api):
    nan = api.post("/understand", data='{"text": "sim", "now": NaN}', headers={"Content-Type": "application/json"})
    assert nan.status_code in (400, 422) and nan.get_json()["details"]["message_en"]
    deep = api.post("/understand", data='{"text": ' + "[" * 500 + "]" * 500 + "}",
                    headers={"Content-Type": "application/json"})
    assert 400 <= deep.status_code < 500
    many = api.post("/understand", {"text": "sim", **{f"x{i}": 1 for i in range(200)}})
    issues = many.get_json()["details"]
    assert many.status_code == 422 and len(issues) <= 51 and issues[-1]["code"] == "more_issues"


def test_tomorrow_is_the_org_s_tomorrow(rt, client, api):
    # 00:30 in São Paulo is still 23:30 the day before in Manaus.
    manaus = api_for(rt, client, World(rt, slug="clinica-manaus", timezone="America/Manaus", state="AM"))
    now = "2026-12-08T03:30:00+00:00"
    sao_paulo = api.post("/understand", {"text": "pode ser amanhã?", "now": now}).get_json()
    amazonas = manaus.post("/understand", {"text": "pode ser amanhã?", "now": now}).get_json()
    assert sao_paulo["fields"]["date"] == "2026-12-09"
    assert amazonas["fields"]["date"] == "2026-12-08"


def test_the_org_s_own_keywords_extend_the_built_in_ones(rt, api, clinic):
    before = api.post("/understand", {"text": "combinadíssimo", "now": NOW}).get_json()
    assert before["intent"] != "confirm"
    with rt.db.begin() as conn:
        conn.execute(update(orgs).where(orgs.c.id == clinic.org_id).values(confirm_keywords="combinadíssimo"))
    assert api.post("/understand", {"text": "combinadíssimo", "now": NOW}).get_json()["intent"] == "confirm"


def test_a_reading_writes_nothing(rt, api):
    with rt.db.connect() as conn:
        before = conn.execute(select(func.count()).select_from(audit_log)).scalar_one()
    api.post("/understand", {"text": "quero remarcar", "now": NOW})
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(audit_log)).scalar_one() == before
