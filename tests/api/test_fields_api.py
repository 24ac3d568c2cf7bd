"""/api/v1/fields: an org declares what its flows may ask a patient for; a save is checked whole
and refused with readable sentences, nothing half-written; another org's fields answer 404."""

from __future__ import annotations

from sqlalchemy import func, select

from engine.store.models import audit_log, conversation_fields

DATE = {"slug": "data_preferida", "label": "Data", "type": "date", "question": "Qual dia fica melhor para você?"}
PERIOD = {"slug": "periodo", "label": "Período", "type": "period", "question": "De manhã ou à tarde?"}
UNIT = {"slug": "unidade", "label": "Unidade", "type": "choice", "question": "Em qual unidade?",
        "options": [{"value": "centro", "label": "Centro"}, {"value": "Zona Sul"}]}


def _details(response, status: int = 422) -> dict[str, dict]:
    assert response.status_code == status, response.get_json()
    details = response.get_json()["details"]
    for item in details:
        assert set(item) == {"code", "field", "message", "message_en"}
        assert item["message"] and item["message_en"] and item["message"] != item["code"]
    return {item["field"]: item for item in details}


def _count(rt) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(conversation_fields)).scalar_one()


def test_a_field_is_declared_with_the_harvest_its_type_implies_and_listed(api):
    created = api.post("/fields", DATE)
    assert created.status_code == 201, created.get_json()
    body = created.get_json()
    assert body["harvest"] == "any_reply" and body["options"] == [] and body["maps_to"] is None
    unit = api.post("/fields", UNIT).get_json()
    assert unit["harvest"] == "when_asked"
    assert unit["options"] == [{"value": "centro", "label": "Centro"}, {"value": "Zona Sul", "label": "Zona Sul"}]
    listed = api.get("/fields").get_json()["data"]
    assert [f["slug"] for f in listed] == ["data_preferida", "unidade"]
    assert api.get(f"/fields/{body['id']}").get_json() == body


def test_a_save_lists_every_problem_at_once_and_writes_nothing(api, rt):
    wrong = {"slug": "Data Preferida", "label": "Sim ou não", "type": "boolean", "question": "Confirma?",
             "harvest": "any_reply", "options": [{"value": "a"}, {"value": "b"}], "template_key": "no_such_template",
             "maps_to": "contact.email"}
    details = _details(api.post("/fields", wrong))
    assert details["slug"]["code"] == "detail_slug"
    assert details["harvest"]["code"] == "field_boolean_when_asked"
    assert details["options"]["code"] == "field_options_only_choice"
    assert details["template_key"]["code"] == "unknown_template"
    assert details["maps_to"]["code"] == "field_maps_to_type"
    assert "sim" in details["harvest"]["message"] and "yes" in details["harvest"]["message_en"]
    assert _count(rt) == 0


def test_shapes_are_refused_by_the_schema_and_a_choice_needs_two_options(api, rt):
    assert api.post("/fields", {**DATE, "type": "colour"}).status_code == 422
    assert api.post("/fields", {**DATE, "extra": 1}).status_code == 422
    details = _details(api.post("/fields", {**UNIT, "options": [{"value": "só uma"}]}))
    assert details["options"]["code"] == "detail_list"
    details = _details(api.post("/fields", {**UNIT, "options": [{"value": "Centro"}, {"value": "centro"}]}))
    assert details["options"]["code"] == "detail_repeated"
    assert _count(rt) == 0


def test_a_slug_is_the_orgs_once_but_another_org_may_use_it(api, other):
    assert api.post("/fields", DATE).status_code == 201
    details = _details(api.post("/fields", {**DATE, "label": "Outra"}), 409)
    assert details["slug"]["code"] == "field_slug_taken"
    assert other.post("/fields", DATE).status_code == 201


def test_a_change_is_checked_whole_and_a_new_type_brings_its_own_defaults(api, rt):
    field = api.post("/fields", UNIT).get_json()
    changed = api.patch(f"/fields/{field['id']}", {"type": "period"})
    assert changed.status_code == 200, changed.get_json()
    assert changed.get_json()["options"] == [] and changed.get_json()["harvest"] == "any_reply"
    details = _details(api.patch(f"/fields/{field['id']}", {"type": "boolean", "harvest": "any_reply"}))
    assert details["harvest"]["code"] == "field_boolean_when_asked"
    assert api.get(f"/fields/{field['id']}").get_json()["type"] == "period", "a refused change wrote nothing"
    period = api.post("/fields", PERIOD).get_json()
    details = _details(api.patch(f"/fields/{period['id']}", {"slug": "unidade"}), 409)
    assert details["slug"]["code"] == "field_slug_taken"


def test_a_delete_removes_the_field_and_is_audited(api, rt):
    field = api.post("/fields", DATE).get_json()
    assert api.delete(f"/fields/{field['id']}").status_code == 204
    assert api.get(f"/fields/{field['id']}").status_code == 404
    assert api.delete(f"/fields/{field['id']}").status_code == 404
    with rt.db.connect() as conn:
        actions = conn.execute(select(audit_log.c.action).where(audit_log.c.entity == "conversation_fields")
                               .order_by(audit_log.c.id)).scalars().all()
    assert actions == ["create", "delete"]


def test_another_orgs_field_answers_404_to_every_verb(api, other):
    theirs = other.post("/fields", DATE).get_json()
    assert api.get(f"/fields/{theirs['id']}").status_code == 404
    assert api.patch(f"/fields/{theirs['id']}", {"label": "Minha"}).status_code == 404
    assert api.delete(f"/fields/{theirs['id']}").status_code == 404
    assert api.get("/fields").get_json()["data"] == []
    assert other.get(f"/fields/{theirs['id']}").get_json()["label"] == "Data"


def test_the_list_filters_by_type_and_refuses_an_unknown_filter(api):
    api.post("/fields", DATE)
    api.post("/fields", PERIOD)
    assert [f["slug"] for f in api.get("/fields?type=period").get_json()["data"]] == ["periodo"]
    assert api.get("/fields?tipo=period").status_code == 422
