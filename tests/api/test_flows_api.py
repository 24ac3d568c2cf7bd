"""Follow-up flows and their runs through `/api/v1`: a flow's life (create, draft errors, update,
publish errors per node in both languages, publish, versions, rollback, disable), manual
enrolment with an Idempotency-Key, refusals, lists with filters and cursors, a run's timeline
after the runtime has moved it, cancelling, and the audit trail."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from admin.i18n import translate_to
from engine.words.catalogue import describe
from engine.people.contacts import opt_out
from engine.flows import runtime
from engine.flows.schema import json_schema
from engine.store.models import audit_log, enrollments, flow_versions, messages
from engine.words.texts import Text
from tests.flows.helpers import edge, linear, node

NAME, PHONE, EMAIL = "Ana Clara Souza", "+5516999887766", "ana.clara@example.com"


def patch(api: Any, path: str, body: Any) -> Any:
    """PATCH with the key (the shared `Api` client has get and post only)."""
    return api.client.patch(f"/api/v1{path}", json=body, headers={"Authorization": f"Bearer {api.key}"})


def classify_graph(*, with_no_reply: bool) -> dict[str, Any]:
    """Ask, then wait for the answer: confirm ends converted, anything else custom, and (when
    complete) silence ends exhausted."""
    graph = {
        "nodes": [
            node("inicio", "trigger"),
            node("pergunta", "action", mode="template", template="followup_checkin"),
            node("resposta", "ai_classify", classes=["confirm"], grace_minutes=60),
            node("confirmou", "end", outcome="converted"),
            node("outro", "end", outcome="custom"),
        ],
        "edges": [
            edge("inicio", "pergunta"), edge("pergunta", "resposta"),
            edge("resposta", "confirmou", "class_match", "confirm"), edge("resposta", "outro"),
        ],
    }
    if with_no_reply:
        graph["nodes"].append(node("calado", "end", outcome="exhausted"))
        graph["edges"].append(edge("resposta", "calado", "no_reply"))
    return graph


def waiting_graph(minutes: int = 60) -> dict[str, Any]:
    return linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=minutes),
                  node("fim", "end", outcome="exhausted"))


@pytest.fixture
def contact(api) -> dict[str, Any]:
    return api.post("/contacts", {"external_id": "pac-1", "name": NAME, "phone": PHONE, "email": EMAIL,
                                  "consent": ["whatsapp", "email"]}).get_json()


def _published(api, name: str = "Espera", graph: dict[str, Any] | None = None) -> int:
    flow = api.post("/flows", {"name": name, "draft_graph": graph or waiting_graph()}).get_json()
    assert api.post(f"/flows/{flow['id']}/publish").status_code == 200
    return flow["id"]


def _tick(rt) -> int:
    """One scheduler pass over enrollments, in-process."""
    return runtime.advance_claimed(rt, runtime.claim_due(rt, limit=100))


def test_a_flows_life_from_draft_to_disabled(rt, api):
    created = api.post("/flows", {"name": "Confirmação", "draft_graph": classify_graph(with_no_reply=False),
                                  "trigger_config": {"kind": "manual"}, "handoff_policy": "cancel", "max_steps": 20})
    assert created.status_code == 201, created.get_json()
    flow = created.get_json()
    assert (flow["status"], flow["active_version"], flow["live_enrollments"]) == ("draft", None, 0)
    assert flow["handoff_policy"] == "cancel" and flow["max_steps"] == 20 and flow["resume_grace_minutes"] == 30
    assert flow["draft_graph"]["nodes"][0]["id"] == "inicio"
    flow_id = flow["id"]

    taken = api.post("/flows", {"name": "Confirmação"})
    assert taken.status_code == 409
    assert api.post("/flows", {"name": "  "}).status_code == 422
    bad_field = api.post("/flows", {"name": "X", "max_steps": 0, "handoff_policy": "ask", "cancel_on_reply": 1})
    assert bad_field.status_code == 422
    assert set(bad_field.get_json()["details"]) == {"max_steps", "handoff_policy", "cancel_on_reply"}
    # A draft whose shape is broken: one issue per problem, on the node when its id is readable.
    bad_draft = api.post("/flows", {"name": "X", "draft_graph": {
        "nodes": [{"id": "inicio", "type": "teleport", "config": {}}], "edges": []}})
    assert bad_draft.status_code == 422
    [issue] = bad_draft.get_json()["details"]
    assert (issue["node_id"], issue["code"]) == ("inicio", "invalid_node")
    assert set(issue) == {"node_id", "code", "message", "message_en"} and "teleport" not in issue["message"]
    assert api.get("/flows").get_json()["data"] == [{k: v for k, v in flow.items() if k != "draft_graph"}]

    renamed = patch(api, f"/flows/{flow_id}", {"name": "Confirmação de consulta", "cancel_on_reply": True})
    assert renamed.status_code == 200
    assert renamed.get_json()["name"] == "Confirmação de consulta" and renamed.get_json()["cancel_on_reply"] is True
    assert renamed.get_json()["max_steps"] == 20  # only the fields given change
    assert patch(api, f"/flows/{flow_id}", {"draft_graph": []}).status_code == 422
    assert patch(api, f"/flows/{flow_id}", {"status": "active"}).status_code == 422  # not a writable field

    rejected = api.post(f"/flows/{flow_id}/publish")
    assert rejected.status_code == 422
    details = rejected.get_json()["details"]
    assert [(i["node_id"], i["code"]) for i in details] == [("resposta", "missing_no_reply")]
    assert details[0]["message"] == str(describe("missing_no_reply"))
    assert details[0]["message_en"] == translate_to(describe("missing_no_reply"), "en")
    assert api.get(f"/flows/{flow_id}").get_json()["status"] == "draft"

    assert patch(api, f"/flows/{flow_id}", {"draft_graph": classify_graph(with_no_reply=True)}).status_code == 200
    first = api.post(f"/flows/{flow_id}/publish")
    assert first.status_code == 200, first.get_json()
    v1 = first.get_json()
    assert v1["version"] == 1 and v1["graph"]["nodes"][-1]["config"] == {"outcome": "exhausted", "note": ""}
    again = api.post(f"/flows/{flow_id}/publish").get_json()
    assert again["id"] == v1["id"]  # the same draft re-activates the same version

    patch(api, f"/flows/{flow_id}", {"draft_graph": waiting_graph()})
    v2 = api.post(f"/flows/{flow_id}/publish").get_json()
    assert v2["version"] == 2
    listed = api.get(f"/flows/{flow_id}/versions").get_json()["data"]
    assert [(v["version"], v["created_by"]) for v in listed] == [(2, None), (1, None)]
    with rt.db.connect() as conn:  # no user published them: the versions say the API did
        assert set(conn.execute(select(flow_versions.c.published_by).where(
            flow_versions.c.pointer_id == flow_id)).scalars()) == {"api"}
    assert api.get(f"/flows/{flow_id}").get_json()["active_version"] == 2

    assert api.post(f"/flows/{flow_id}/rollback", {"version": 7}).status_code == 404
    back = api.post(f"/flows/{flow_id}/rollback", {"version": 1})
    assert back.status_code == 200 and back.get_json()["id"] == v1["id"]
    assert api.get(f"/flows/{flow_id}").get_json()["active_version"] == 1

    assert api.post(f"/flows/{flow_id}/disable", {"live": "later"}).status_code == 422
    disabled = api.post(f"/flows/{flow_id}/disable", {})
    assert disabled.status_code == 200
    assert disabled.get_json()["cancelled"] == 0 and disabled.get_json()["flow"]["status"] == "disabled"
    assert [f["status"] for f in api.get("/flows?status=disabled").get_json()["data"]] == ["disabled"]
    assert api.get("/flows?status=active").get_json()["data"] == []

    with rt.db.connect() as conn:
        trail = conn.execute(select(audit_log.c.action, audit_log.c.entity_id, audit_log.c.api_key_id)
                             .where(audit_log.c.entity == "flow").order_by(audit_log.c.id)).all()
    assert [a.action for a in trail] == ["create", "update", "update", "publish", "publish", "update", "publish",
                                         "rollback", "disable"]
    assert {(a.entity_id, a.api_key_id) for a in trail} == {(flow_id, api.key_id)}


def test_issue_sentences_are_translated_outside_a_request():
    nested = describe("invalid_node", field="nodes.0.type", detail=describe("detail_choice", choices="a, b"))
    english = translate_to(nested, "en")
    assert english != str(nested) and "nodes.0.type" in english and "a, b" in english
    assert translate_to(nested, "pt_BR") == str(nested)
    assert translate_to(Text("Frase que o catálogo ainda não tem: %(n)s", {"n": 3}), "en") == \
        "Frase que o catálogo ainda não tem: 3"


def test_a_flow_without_a_trigger_config_is_manual(api):
    flow = api.post("/flows", {"name": "Sem gatilho", "draft_graph": waiting_graph()}).get_json()
    assert flow["trigger_config"] == {"kind": "manual"}
    assert api.post(f"/flows/{flow['id']}/publish").status_code == 200


def test_manual_enrolment_is_idempotent_per_key_and_refusals_say_why(rt, api, contact):
    flow_id = _published(api)
    body = {"flow_id": flow_id, "contact_id": contact["id"]}
    first = api.post("/enrollments", body, headers={"Idempotency-Key": "crm-1"})
    assert first.status_code == 201, first.get_json()
    run = first.get_json()
    assert (run["flow_id"], run["version"], run["status"], run["current_node"]) == (flow_id, 1, "active", "inicio")
    again = api.post("/enrollments", body, headers={"Idempotency-Key": "crm-1"})
    assert again.status_code == 200 and again.get_json()["id"] == run["id"]
    assert api.get(f"/flows/{flow_id}").get_json()["live_enrollments"] == 1

    other = api.post("/contacts", {"external_id": "pac-2", "consent": ["whatsapp"]}).get_json()
    reused = api.post("/enrollments", {"flow_id": flow_id, "contact_id": other["id"]},
                      headers={"Idempotency-Key": "crm-1"})
    assert reused.status_code == 409 and "Idempotency-Key" in reused.get_json()["error"]

    live = api.post("/enrollments", body, headers={"Idempotency-Key": "crm-2"})
    assert live.status_code == 409
    assert live.get_json()["details"] == {"reason": "already_live", "message": str(describe("already_live"))}

    draft = api.post("/flows", {"name": "Rascunho", "draft_graph": waiting_graph()}).get_json()
    not_active = api.post("/enrollments", {**body, "flow_id": draft["id"]}, headers={"Idempotency-Key": "crm-3"})
    assert not_active.status_code == 409 and not_active.get_json()["details"]["reason"] == "flow_not_active"

    no_key = api.post("/enrollments", {"flow_id": "1"})
    assert no_key.status_code == 422 and set(no_key.get_json()["details"]) == {"Idempotency-Key", "flow_id",
                                                                               "contact_id"}
    missing = api.post("/enrollments", {"flow_id": 10**9, "contact_id": 10**9}, headers={"Idempotency-Key": "x"})
    assert missing.status_code == 422
    assert missing.get_json()["details"]["flow_id"] == ["No such flow."]
    assert missing.get_json()["details"]["contact_id"][0]["code"] == "api_contact_not_found"
    appointment = api.post("/appointments", {"external_id": "ag-2", "contact_external_id": "pac-2",
                                             "starts_at": "2026-12-03T14:30:00-03:00"}).get_json()
    foreign = api.post("/enrollments", {**body, "appointment_id": appointment["id"]},
                       headers={"Idempotency-Key": "crm-4"})
    assert foreign.status_code == 422 and set(foreign.get_json()["details"]) == {"appointment_id"}

    with rt.db.connect() as conn:
        assert conn.execute(select(enrollments.c.id)).scalars().all() == [run["id"]]
        trail = conn.execute(select(audit_log).where(audit_log.c.entity == "enrollment")).all()
    assert [(a.action, a.entity_id) for a in trail] == [("enroll", run["id"])]
    assert trail[0].changes == {"flow_id": flow_id, "contact_id": contact["id"], "appointment_id": None,
                                "idempotency_key": "crm-1"}


def test_an_opted_out_contact_is_refused(rt, api, clinic):
    flow_id = _published(api)
    contact_id = clinic.contact(consent=())
    with rt.db.begin() as conn:
        opt_out(conn, clinic.org_id, contact_id, source="patient")
    refused = api.post("/enrollments", {"flow_id": flow_id, "contact_id": contact_id},
                       headers={"Idempotency-Key": "k"})
    assert refused.status_code == 409 and refused.get_json()["details"]["reason"] == "contact_opted_out"


def test_enrollment_lists_filter_and_page(api, contact):
    first_flow = _published(api, "Primeiro")
    second_flow = _published(api, "Segundo")
    other = api.post("/contacts", {"external_id": "pac-2", "consent": ["whatsapp"]}).get_json()
    ids = []
    for flow_id, contact_id in ((first_flow, contact["id"]), (second_flow, contact["id"]), (first_flow, other["id"])):
        ids.append(api.post("/enrollments", {"flow_id": flow_id, "contact_id": contact_id},
                            headers={"Idempotency-Key": f"{flow_id}-{contact_id}"}).get_json()["id"])
    assert api.post(f"/enrollments/{ids[1]}/cancel").status_code == 200

    def listed(query: str) -> list[int]:
        return [e["id"] for e in api.get(f"/enrollments{query}").get_json()["data"]]

    assert listed("") == ids
    assert listed(f"?flow_id={first_flow}") == [ids[0], ids[2]]
    assert listed(f"?contact_id={contact['id']}") == ids[:2]
    assert listed("?status=cancelled") == [ids[1]]
    assert listed(f"?status=active&flow_id={first_flow}&contact_id={other['id']}") == [ids[2]]
    page = api.get("/enrollments?limit=2").get_json()
    assert [e["id"] for e in page["data"]] == ids[:2] and page["next_cursor"]
    rest = api.get("/enrollments", query_string={"limit": 2, "cursor": page["next_cursor"]}).get_json()
    assert [e["id"] for e in rest["data"]] == ids[2:] and rest["next_cursor"] is None
    assert api.get("/enrollments?status=asleep").status_code == 422
    assert api.get("/enrollments?cursor=nope").status_code == 422
    assert api.get("/enrollments?flow=1").status_code == 422  # a misspelt filter is not ignored

    flows_page = api.get("/flows?limit=1").get_json()
    assert [f["name"] for f in flows_page["data"]] == ["Primeiro"] and flows_page["data"][0]["live_enrollments"] == 2
    second = api.get("/flows", query_string={"limit": 1, "cursor": flows_page["next_cursor"]}).get_json()
    assert [(f["name"], f["live_enrollments"]) for f in second["data"]] == [("Segundo", 0)]


def test_a_runs_timeline_after_the_runtime_moved_it(rt, api, contact, clock):
    flow_id = _published(api, graph=linear(
        node("inicio", "trigger"), node("msg", "action", mode="template", template="followup_checkin"),
        node("espera", "wait", mode="fixed", minutes=60), node("fim", "end", outcome="exhausted")))
    run = api.post("/enrollments", {"flow_id": flow_id, "contact_id": contact["id"]},
                   headers={"Idempotency-Key": "t-1"}).get_json()
    while _tick(rt):
        pass
    detail = api.get(f"/enrollments/{run['id']}").get_json()
    assert (detail["current_node"], detail["status"], detail["steps"], detail["messages_sent"]) == (
        "espera", "active", 2, 1)
    assert detail["next_eval_at"] == (clock.now() + timedelta(minutes=60)).isoformat()
    timeline = detail["timeline"]
    assert [(s["event"], s["node_id"], s["status"], s["reason"], s["next"]) for s in timeline] == [
        ("enrolled", "inicio", None, None, None),
        ("step", "inicio", "ok", "trigger_fired", "msg"),
        ("step", "msg", "ok", "message_queued", "espera"),
    ]
    assert timeline[-1]["until"] == detail["next_eval_at"]
    assert [s["reason_text"] for s in timeline] == [str(describe(code)) for code in
                                                    ("enrolled", "trigger_fired", "message_queued")]
    assert all(set(s) == {"at", "node_id", "event", "status", "reason", "reason_text", "next", "until", "llm_calls"}
               for s in timeline)

    clock.advance(timedelta(minutes=60))
    _tick(rt)
    ended = api.get(f"/enrollments/{run['id']}").get_json()
    assert (ended["status"], ended["outcome"], ended["reason"]) == ("completed", "exhausted", None)
    assert ended["ended_at"] is not None
    # Nothing the patient is or wrote reaches the run's view.
    with rt.db.connect() as conn:
        body = conn.execute(select(messages.c.body).where(messages.c.enrollment_id == run["id"])).scalar()
    shown = str(ended)
    for private in (NAME, PHONE, EMAIL, *([body] if body else [])):
        assert private not in shown


def test_cancel_ends_a_live_run_once(rt, api, contact):
    flow_id = _published(api)
    run = api.post("/enrollments", {"flow_id": flow_id, "contact_id": contact["id"]},
                   headers={"Idempotency-Key": "c-1"}).get_json()
    cancelled = api.post(f"/enrollments/{run['id']}/cancel")
    assert cancelled.status_code == 200
    out = cancelled.get_json()
    assert (out["status"], out["reason"], out["outcome"], out["next_eval_at"]) == (
        "cancelled", "cancelled_by_clinic", None, None)
    assert out["reason_text"] == str(describe("cancelled_by_clinic"))
    again = api.post(f"/enrollments/{run['id']}/cancel")
    assert again.status_code == 409 and again.get_json()["details"] == {"status": "cancelled"}
    assert api.post(f"/enrollments/{10**9}/cancel").status_code == 404
    timeline = api.get(f"/enrollments/{run['id']}").get_json()["timeline"]
    assert (timeline[-1]["event"], timeline[-1]["status"], timeline[-1]["reason"]) == (
        "ended", "cancelled", "cancelled_by_clinic")
    # The same contact can be enrolled again once the run has ended.
    assert api.post("/enrollments", {"flow_id": flow_id, "contact_id": contact["id"]},
                    headers={"Idempotency-Key": "c-2"}).status_code == 201

    disabled = api.post(f"/flows/{flow_id}/disable", {"live": "cancel"}).get_json()
    assert disabled["cancelled"] == 1 and disabled["flow"]["live_enrollments"] == 0
    with rt.db.connect() as conn:
        trail = conn.execute(select(audit_log).order_by(audit_log.c.id)).all()
    assert ("cancel", "enrollment", run["id"]) in [(a.action, a.entity, a.entity_id) for a in trail]
    for row in trail:
        for private in (NAME, PHONE, EMAIL):
            assert private not in str(row.changes)


def test_the_graph_json_schema_is_served_to_builders(client, api):
    served = api.get("/flows/schema")
    assert served.status_code == 200 and served.get_json() == json_schema()
    assert client.get("/api/v1/flows/schema").status_code == 401


def test_the_events_endpoint_documents_what_the_engine_does(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    description = doc["paths"]["/api/v1/events"]["post"]["description"]
    assert "handoff_started" in description and "resume" in description and "starts flows" in description
    for name in ("Flow", "FlowDetail", "FlowIssue", "Enrollment", "EnrollmentDetail", "Step", "Version"):
        assert name in doc["components"]["schemas"], name
