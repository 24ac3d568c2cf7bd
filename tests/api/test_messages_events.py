"""Messages (list, get, ad-hoc send with Idempotency-Key), events, authentication, the error
envelope and the audit trail."""

from __future__ import annotations

from sqlalchemy import select

from engine.tenants.apikeys import revoke
from engine.store.models import api_keys, audit_log, contact_events


def _contact(api, external_id="pac-1", **extra):
    return api.post("/contacts", {"external_id": external_id, "name": "Ana", "phone": "+5516999887766",
                                  "email": "ana@example.com", "consent": ["whatsapp", "email"], **extra}).get_json()


def test_adhoc_send_is_idempotent_per_key(rt, api):
    contact = _contact(api)
    body = {"contact_id": contact["id"], "channel_kind": "whatsapp", "text": "Sua receita está pronta."}
    first = api.post("/messages", body, headers={"Idempotency-Key": "rx-42"})
    assert first.status_code == 201, first.get_json()
    msg = first.get_json()
    assert msg["purpose"] == "adhoc" and msg["body"] == "Sua receita está pronta."
    assert msg["status"] == "pending" and msg["due_at"]  # placed in the org's window right away

    again = api.post("/messages", body, headers={"Idempotency-Key": "rx-42"})
    assert again.status_code == 200 and again.get_json()["id"] == msg["id"]
    conflict = api.post("/messages", {**body, "text": "Outra coisa"}, headers={"Idempotency-Key": "rx-42"})
    assert conflict.status_code == 409 and conflict.get_json()["error"]
    assert len(api.world.messages(purpose="adhoc")) == 1
    stored = api.world.message(msg["id"])
    assert stored.idempotency_key == "api:rx-42" and stored.respect_window is True

    now = api.post("/messages", {**body, "send_now": True, "subject": None},
                   headers={"Idempotency-Key": "rx-43"}).get_json()
    assert api.world.message(now["id"]).respect_window is False

    missing = api.post("/messages", {"channel_kind": "fax"})
    assert missing.status_code == 422
    assert set(missing.get_json()["details"]) == {"Idempotency-Key", "contact_id", "channel_kind", "text"}

    with rt.db.connect() as conn:
        sends = conn.execute(select(audit_log).where(audit_log.c.action == "send")).all()
    assert [(a.entity, a.entity_id, a.api_key_id) for a in sends] == [("message", msg["id"], api.key_id),
                                                                     ("message", now["id"], api.key_id)]
    assert sends[0].changes["text"] == "[redacted]" and sends[0].changes["idempotency_key"] == "rx-42"


def test_messages_list_and_get(api):
    contact = _contact(api)
    api.post("/appointments", {"external_id": "ag-1", "contact_external_id": "pac-1",
                               "starts_at": "2026-12-03T14:30:00-03:00"})
    sent = api.post("/messages", {"contact_id": contact["id"], "channel_kind": "email", "text": "Olá",
                                  "subject": "Aviso"}, headers={"Idempotency-Key": "k1"}).get_json()
    listed = api.get("/messages").get_json()["data"]
    assert [m["purpose"] for m in listed] == ["session_reminder", "adhoc"]
    assert [m["id"] for m in api.get("/messages?purpose=adhoc").get_json()["data"]] == [sent["id"]]
    assert len(api.get(f"/messages?contact_id={contact['id']}&status=pending").get_json()["data"]) == 2
    page = api.get("/messages?limit=1").get_json()
    assert len(page["data"]) == 1 and page["next_cursor"]
    rest = api.get("/messages", query_string={"limit": 1, "cursor": page["next_cursor"]}).get_json()
    assert [m["id"] for m in rest["data"]] == [sent["id"]] and rest["next_cursor"] is None
    detail = api.get(f"/messages/{sent['id']}").get_json()
    assert detail["subject"] == "Aviso" and detail["body"] == "Olá" and "payload" not in detail
    assert api.get("/messages?status=weird").status_code == 422


def test_events_are_recorded_for_the_follow_up_engine(rt, api):
    contact = _contact(api)
    started = api.post("/events", {"type": "handoff_started", "contact_id": contact["id"]})
    assert started.status_code == 201
    stage = api.post("/events", {"type": "stage_changed", "contact_id": contact["id"], "stage": "orcamento",
                                 "at": "2026-12-01T08:00:00-03:00"})
    assert stage.status_code == 201 and stage.get_json()["stage"] == "orcamento"
    no_stage = api.post("/events", {"type": "stage_changed", "contact_id": contact["id"], "at": "2026-12-01T08:00"})
    assert no_stage.status_code == 422 and set(no_stage.get_json()["details"]) == {"stage", "at"}
    with rt.db.connect() as conn:
        rows = conn.execute(select(contact_events).order_by(contact_events.c.id)).all()
        audits = conn.execute(select(audit_log.c.entity).where(audit_log.c.entity == "contact_event")).all()
    assert [(r.org_id, r.contact_id, r.type) for r in rows] == [
        (api.world.org_id, contact["id"], "handoff_started"), (api.world.org_id, contact["id"], "stage_changed")]
    assert rows[1].payload == {"at": "2026-12-01T08:00:00-03:00", "stage": "orcamento"}
    assert len(audits) == 2


def test_keys_missing_bad_and_revoked_are_401_and_use_is_noted(rt, client, api, clock):
    assert client.get("/api/v1/contacts").status_code == 401
    for header in ("Bearer", "Basic abc", f"Bearer {api.key}x", "Bearer lembra_x_y", f"Token {api.key}"):
        response = client.get("/api/v1/contacts", headers={"Authorization": header})
        assert response.status_code == 401 and response.get_json()["error"], header
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert api.get("/contacts").status_code == 200
    with rt.db.connect() as conn:
        used = conn.execute(select(api_keys).where(api_keys.c.id == api.key_id)).one()
    assert used.last_used_at == clock.now() and api.key not in str(tuple(used))
    assert used.key_hash != api.key and api.key.startswith(f"lembra_{used.prefix}_")
    with rt.db.begin() as conn:
        assert revoke(conn, api.world.org_id, api.key_id)
    revoked = api.get("/contacts")
    assert revoked.status_code == 401 and revoked.get_json() == {
        "error": "missing, invalid or revoked API key", "details": None}


def test_errors_are_json_envelopes(api, client):
    malformed = api.post("/contacts", data=b'{"external_id": ', headers={"Content-Type": "application/json"})
    assert malformed.status_code == 400 and malformed.get_json()["error"] == "the body is not valid JSON"
    not_object = api.post("/contacts", [1, 2])
    assert not_object.status_code == 422 and "_schema" in not_object.get_json()["details"]
    wrong_method = client.delete("/api/v1/contacts", headers={"Authorization": f"Bearer {api.key}"})
    assert wrong_method.status_code == 405 and wrong_method.get_json()["error"] == "method not allowed"
    assert "POST" in wrong_method.headers["Allow"]
    nowhere = api.get("/nowhere")
    assert nowhere.status_code == 404 and nowhere.get_json() == {"error": "not found", "details": None}
    assert api.get("/contacts/abc").status_code == 404
    assert api.get(f"/contacts/{2**63}").status_code == 404
    huge = api.post("/contacts", data=b'{"name": "' + b"x" * (2 * 1024 * 1024) + b'"}',
                    headers={"Content-Type": "application/json"})
    assert huge.status_code == 413 and huge.get_json()["error"]
    nul = api.post("/contacts", {"external_id": "a\x00b"})
    assert nul.status_code == 422


def test_openapi_document_is_generated_from_the_schemas(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    assert doc["openapi"].startswith("3.")
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": "lembra_<prefix>_<secret>"}
    assert doc["security"] == [{"bearerAuth": []}]
    contact_in = doc["components"]["schemas"]["ContactIn"]
    assert contact_in["required"] == ["external_id"] and "consent" in contact_in["properties"]
    assert doc["components"]["schemas"]["AppointmentIn"]["properties"]["starts_at"]["format"] == "date-time"
    post_messages = doc["paths"]["/api/v1/messages"]["post"]
    assert {p["name"]: p["required"] for p in post_messages["parameters"]} == {"Idempotency-Key": True}
    assert {"200", "201", "401", "409", "422"} <= set(post_messages["responses"])
    expected = {"/api/v1/contacts", "/api/v1/contacts/{contact_id}", "/api/v1/contacts/{contact_id}/consent", "/api/v1/appointments",
                "/api/v1/appointments/{appointment_id}", "/api/v1/messages", "/api/v1/messages/{message_id}",
                "/api/v1/events", "/api/v1/openapi.json",
                "/api/v1/flows", "/api/v1/flows/schema", "/api/v1/flows/{flow_id}", "/api/v1/flows/{flow_id}/publish",
                "/api/v1/flows/{flow_id}/disable", "/api/v1/flows/{flow_id}/rollback",
                "/api/v1/flows/{flow_id}/versions", "/api/v1/enrollments", "/api/v1/enrollments/{enrollment_id}",
                "/api/v1/enrollments/{enrollment_id}/cancel", "/api/v1/templates", "/api/v1/templates/{template_id}",
                "/api/v1/templates/waba", "/api/v1/understand", "/api/v1/professionals", "/api/v1/professionals/{professional_id}", "/api/v1/slots", "/api/v1/fields", "/api/v1/fields/{field_id}", "/api/v1/webhook-endpoints",
                "/api/v1/webhook-endpoints/{endpoint_id}", "/api/v1/webhook-endpoints/{endpoint_id}/rotate-secret",
                "/api/v1/webhook-endpoints/{endpoint_id}/test", "/api/v1/webhook-endpoints/{endpoint_id}/deliveries",
                "/api/v1/agents", "/api/v1/agents/{agent_id}", "/api/v1/channels", "/api/v1/channels/{channel_id}",
                "/api/v1/conversations", "/api/v1/conversations/{inbound_id}/reply",
                "/api/v1/conversations/{inbound_id}/handled"}
    assert set(doc["paths"]) == expected
