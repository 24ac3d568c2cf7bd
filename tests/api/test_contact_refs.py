"""Naming a contact the same way everywhere (`contact_id` or `contact_external_id`, exactly one),
refusing a send to a patient who opted out or never consented (nothing written), `mode` as an
enum with labels, a missing Idempotency-Key said plainly, and the runs an event started."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from engine.people.contacts import opt_out
from engine.store.models import audit_log, contact_events, messages
from tests.flows.helpers import Flows, linear, node

STARTS = "2026-12-03T14:30:00-03:00"


def _contact(api, external_id="pac-1", consent=("whatsapp",)):
    return api.post("/contacts", {"external_id": external_id, "phone": "+5516999887766",
                                  "consent": list(consent)}).get_json()


def _count(rt, table, org_id) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(table.c.org_id == org_id)).scalar_one()


@pytest.mark.parametrize("path, body, key", [
    ("/appointments", {"external_id": "ag-1", "starts_at": STARTS}, False),
    ("/messages", {"channel_kind": "whatsapp", "text": "oi"}, True),
    ("/events", {"type": "handoff_started"}, False),
])
def test_each_write_takes_the_contact_by_either_id_and_refuses_both_none_and_unknown(api, other, path, body, key):
    contact = _contact(api)
    theirs = _contact(other, "pac-b")
    headers = {"Idempotency-Key": "k-ext"} if key else None
    by_external = api.post(path, {**body, "contact_external_id": "pac-1"}, headers=headers)
    assert by_external.status_code == 201, by_external.get_json()
    assert by_external.get_json()["contact_id"] == contact["id"]
    by_id = api.post(path, {**body, "contact_id": contact["id"]},
                     headers={"Idempotency-Key": "k-id"} if key else None)
    assert by_id.status_code in (200, 201) and by_id.get_json()["contact_id"] == contact["id"]

    for wrong in ({}, {"contact_id": contact["id"], "contact_external_id": "pac-1"}):
        refused = api.post(path, {**body, **wrong}, headers={"Idempotency-Key": "k-bad"} if key else None)
        assert refused.status_code == 422
        assert refused.get_json()["details"]["contact_id"][0]["code"] == "api_contact_ref_one"
        assert refused.get_json()["details"]["contact_id"][0]["message_en"].startswith("Name the patient")

    # Unknown, and another org's (by either id): the same 422, so nothing leaks.
    answers = []
    for field, value in (("contact_external_id", "nobody"), ("contact_external_id", "pac-b"),
                         ("contact_id", 10**9), ("contact_id", theirs["id"])):
        refused = api.post(path, {**body, field: value}, headers={"Idempotency-Key": f"k-{value}"} if key else None)
        assert refused.status_code == 422
        details = refused.get_json()["details"]
        assert details == {field: [{"code": "api_contact_not_found", "field": field,
                                    "message": "Este paciente não existe nesta clínica.",
                                    "message_en": "This patient does not exist in this clinic."}]}
        answers.append(refused.get_json())
    assert answers[0] == answers[1] and answers[2] == answers[3]


def test_enrollment_takes_the_contact_by_external_id(rt, api, clinic):
    _contact(api)
    graph = linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                   node("fim", "end", outcome="exhausted"))
    flow = api.post("/flows", {"name": "Retorno", "draft_graph": graph}).get_json()
    api.post(f"/flows/{flow['id']}/publish")
    body = {"flow_id": flow["id"], "contact_external_id": "pac-1"}
    first = api.post("/enrollments", body, headers={"Idempotency-Key": "e-1"})
    assert first.status_code == 201, first.get_json()
    again = api.post("/enrollments", body, headers={"Idempotency-Key": "e-1"})
    assert again.status_code == 200 and again.get_json()["id"] == first.get_json()["id"]
    unknown = api.post("/enrollments", {**body, "contact_external_id": "nobody"}, headers={"Idempotency-Key": "e-2"})
    assert unknown.status_code == 422 and set(unknown.get_json()["details"]) == {"contact_external_id"}


@pytest.mark.parametrize("setup, code", [
    ({"consent": ()}, "api_message_no_consent"),
    ({"consent": ("email",)}, "api_message_no_consent"),
    ({"opt_out": True}, "api_message_opted_out"),
])
def test_a_send_the_patient_did_not_allow_is_refused_and_writes_nothing(rt, api, setup, code):
    contact = _contact(api, consent=setup.get("consent", ("whatsapp",)))
    if setup.get("opt_out"):
        with rt.db.begin() as conn:
            opt_out(conn, api.world.org_id, contact["id"], kinds=("whatsapp",), source="patient")
    before = (_count(rt, messages, api.world.org_id), _count(rt, audit_log, api.world.org_id))
    refused = api.post("/messages", {"contact_id": contact["id"], "channel_kind": "whatsapp", "text": "oi"},
                       headers={"Idempotency-Key": "no"})
    assert refused.status_code == 422
    [detail] = refused.get_json()["details"]
    assert detail["code"] == code and detail["field"] == "channel_kind" and detail["message"] and detail["message_en"]
    assert (_count(rt, messages, api.world.org_id), _count(rt, audit_log, api.world.org_id)) == before


def test_a_send_to_an_address_someone_refused_is_refused(rt, api):
    sibling = _contact(api, "pac-irma")
    contact = _contact(api)  # the same phone, consent given
    with rt.db.begin() as conn:
        opt_out(conn, api.world.org_id, sibling["id"], kinds=("whatsapp",), source="patient")
    refused = api.post("/messages", {"contact_external_id": "pac-1", "channel_kind": "whatsapp", "text": "oi"},
                       headers={"Idempotency-Key": "addr"})
    assert refused.status_code == 422, refused.get_json()
    assert refused.get_json()["details"][0]["code"] == "api_message_address_opted_out"
    assert api.get(f"/messages?contact_id={contact['id']}&purpose=adhoc").get_json()["data"] == []


def test_mode_is_an_enum_with_labels_in_the_document(api):
    _contact(api)
    ok = api.post("/appointments", {"external_id": "ag-1", "contact_external_id": "pac-1", "starts_at": STARTS,
                                    "mode": "phone"})
    assert ok.status_code == 201 and ok.get_json()["mode"] == "phone"
    bad = api.post("/appointments", {"external_id": "ag-2", "contact_external_id": "pac-1", "starts_at": STARTS,
                                     "mode": "presencial"})
    assert bad.status_code == 422 and set(bad.get_json()["details"]) == {"mode"}
    mode = api.get("/openapi.json").get_json()["components"]["schemas"]["AppointmentIn"]["properties"]["mode"]
    assert [v for v in mode["enum"] if v] == ["in_person", "online", "phone"]
    assert mode["x-enum-labels"]["in_person"] == {"pt_BR": "Presencial", "en": "In person"}
    assert mode["x-enum-labels"]["phone"] == {"pt_BR": "Por telefone", "en": "By phone"}


@pytest.mark.parametrize("path", ["/messages", "/enrollments"])
def test_a_missing_idempotency_key_is_said_plainly(api, path):
    missing = api.post(path, {})
    assert missing.status_code == 422
    [detail] = missing.get_json()["details"]["Idempotency-Key"]
    assert detail["code"] == "api_idempotency_key_required"
    assert "Idempotency-Key" in detail["message"] and detail["message_en"].startswith("Send the Idempotency-Key")
    blank = api.post(path, {}, headers={"Idempotency-Key": " "})
    assert blank.get_json()["details"]["Idempotency-Key"] == [detail]


def test_an_event_answers_the_runs_it_started(rt, api, other, clinic):
    contact = _contact(api)
    flows = Flows(clinic)
    graph = linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                   node("fim", "end", outcome="exhausted"))
    flow = flows.flow(graph, trigger={"kind": "event", "event": "stage_changed", "stage": "orcamento"},
                      name="Orçamento")
    quiet = api.post("/events", {"type": "stage_changed", "stage": "lead", "contact_external_id": "pac-1"})
    assert quiet.status_code == 201 and quiet.get_json()["started"] == []
    event = api.post("/events", {"type": "stage_changed", "stage": "orcamento", "contact_id": contact["id"]})
    assert event.status_code == 201
    [run] = event.get_json()["started"]
    assert run["flow_id"] == flow and run["flow_name"] == "Orçamento"
    assert api.get(f"/enrollments/{run['enrollment_id']}").get_json()["contact_id"] == contact["id"]
    assert other.get(f"/enrollments/{run['enrollment_id']}").status_code == 404
    before = _count(rt, contact_events, clinic.org_id)
    bad = api.post("/events", {"type": "stage_changed", "contact_external_id": "pac-1"})
    assert bad.status_code == 422 and set(bad.get_json()["details"]) == {"stage"}
    assert _count(rt, contact_events, clinic.org_id) == before
