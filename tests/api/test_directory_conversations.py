"""Agents and channels (read-only, never a secret), and conversations: list the replies waiting
for a person, answer one through the console's outbox path (once per Idempotency-Key), mark one
handled; another org's ids are 404."""

from __future__ import annotations

import json

from sqlalchemy import func, select

from engine.flows.agents import create_agent
from engine.store.models import audit_log, channels, inbound_messages, messages
from tests.factories import sandbox_headers

PHONE = "+5516999887766"


def _agent(rt, world, **extra) -> int:
    with rt.db.begin() as conn:
        return create_agent(conn, rt.keyring, world.org_id, name="Assistente", persona="Simpática",
                            llm_base_url="http://llm.local/v1", llm_model="modelo",
                            llm_api_key="sk-segredo-123", **extra)


def test_agents_list_and_get_without_secrets(rt, api, other, clinic):
    agent_id = _agent(rt, clinic)
    theirs = _agent(rt, other.world)
    page = api.get("/agents")
    assert page.status_code == 200
    [agent] = page.get_json()["data"]
    assert agent["id"] == agent_id and agent["name"] == "Assistente" and agent["llm_model"] == "modelo"
    assert agent["llm_api_key_set"] is True and page.get_json()["next_cursor"] is None
    assert api.get(f"/agents/{agent_id}").get_json() == agent
    for raw in (page.text, api.get(f"/agents/{agent_id}").text):
        assert "sk-segredo-123" not in raw and "llm_base_url" not in raw
    assert api.get(f"/agents/{theirs}").status_code == 404
    assert api.get("/agents?limit=0").status_code == 422
    assert api.get("/agents?surprise=1").status_code == 422


def test_channels_list_and_get_never_show_a_credential(rt, api, other, clinic):
    with rt.db.connect() as conn:
        rows = conn.execute(select(channels).where(channels.c.org_id == clinic.org_id)).all()
        secrets = [str(v) for row in rows for v in rt.providers.get(row).config.values() if v]
    assert secrets  # the sandbox channels hold a webhook secret
    page = api.get("/channels")
    assert page.status_code == 200
    listed = page.get_json()["data"]
    assert {(c["kind"], c["provider"]) for c in listed} == {("whatsapp", "sandbox"), ("email", "sandbox")}
    assert set(listed[0]) == {"id", "kind", "provider", "name", "status", "is_default", "min_interval_ms",
                              "daily_cap", "created_at", "updated_at"}
    one = api.get(f"/channels/{clinic.channels['whatsapp']}")
    assert one.status_code == 200 and one.get_json()["kind"] == "whatsapp"
    for raw in (page.text, one.text):
        assert not any(secret in raw for secret in secrets)
    assert [c["kind"] for c in api.get("/channels?kind=email").get_json()["data"]] == ["email"]
    first = api.get("/channels?limit=1").get_json()
    rest = api.get(f"/channels?limit=1&cursor={first['next_cursor']}").get_json()
    assert [c["id"] for c in first["data"] + rest["data"]] == sorted(c["id"] for c in listed)
    assert api.get(f"/channels/{other.world.channels['whatsapp']}").status_code == 404
    assert api.get("/channels?kind=fax").status_code == 422


def _reply_from_patient(rt, client, world, text: str, mid: str) -> int:
    channel_id = world.channels["whatsapp"]
    body = {"type": "message", "id": mid, "from": PHONE, "text": text}
    response = client.post(f"/webhooks/sandbox/{channel_id}", data=json.dumps(body),
                           headers={"Content-Type": "application/json", **sandbox_headers(rt, channel_id)})
    assert response.status_code == 200, response.text
    with rt.db.connect() as conn:
        return conn.execute(select(inbound_messages.c.id).where(
            inbound_messages.c.org_id == world.org_id, inbound_messages.c.provider_message_id == mid)).scalar_one()


def _replies(rt, org_id: int) -> list:
    with rt.db.connect() as conn:
        return conn.execute(select(messages).where(messages.c.org_id == org_id,
                                                   messages.c.purpose == "conversation_reply")).all()


def test_conversations_list_reply_once_and_mark_handled(rt, client, api, other, clinic):
    contact = api.post("/contacts", {"external_id": "pac-1", "phone": PHONE, "consent": ["whatsapp"]}).get_json()
    first = _reply_from_patient(rt, client, clinic, "Oi, posso remarcar?", "wamid-1")
    second = _reply_from_patient(rt, client, clinic, "Alguém aí?", "wamid-2")
    page = api.get("/conversations")
    assert page.status_code == 200
    listed = page.get_json()["data"]
    assert [c["id"] for c in listed] == [first, second]
    assert listed[0]["state"] == "open" and listed[0]["contact_id"] == contact["id"]
    assert listed[0]["text"] == "Oi, posso remarcar?" and listed[0]["channel_kind"] == "whatsapp"
    assert "from_address" not in listed[0]
    one = api.get("/conversations?limit=1").get_json()
    assert [c["id"] for c in one["data"]] == [first] and one["next_cursor"]

    # Bad input: nothing written.
    assert api.post(f"/conversations/{first}/reply", {"text": "Pode sim"}).status_code == 422
    blank = api.post(f"/conversations/{first}/reply", {"text": "   "}, headers={"Idempotency-Key": "r-0"})
    assert blank.status_code == 422 and blank.get_json()["details"]["text"][0]["code"] == "conversation_text_required"
    assert _replies(rt, clinic.org_id) == []

    sent = api.post(f"/conversations/{first}/reply", {"text": "Pode sim, qual dia?"},
                    headers={"Idempotency-Key": "r-1"})
    assert sent.status_code == 201, sent.get_json()
    body = sent.get_json()
    assert body["message"]["purpose"] == "conversation_reply" and body["message"]["body"] == "Pode sim, qual dia?"
    assert body["message"]["contact_id"] == contact["id"] and body["conversation"]["state"] == "handled"
    again = api.post(f"/conversations/{first}/reply", {"text": "Pode sim, qual dia?"},
                     headers={"Idempotency-Key": "r-1"})
    assert again.status_code == 200 and again.get_json()["message"]["id"] == body["message"]["id"]
    reused = api.post(f"/conversations/{first}/reply", {"text": "Outra coisa"}, headers={"Idempotency-Key": "r-1"})
    assert reused.status_code == 409
    [row] = _replies(rt, clinic.org_id)
    assert row.payload["inbound_id"] == first and row.idempotency_key.startswith(f"conversation:{first}:")
    # The answer handled the sender's other open reply too, as in the console.
    assert api.get("/conversations").get_json()["data"] == []
    assert {c["id"] for c in api.get("/conversations?state=handled").get_json()["data"]} == {first, second}

    third = _reply_from_patient(rt, client, clinic, "Obrigada!", "wamid-3")
    handled = api.post(f"/conversations/{third}/handled")
    assert handled.status_code == 200 and handled.get_json()["state"] == "handled"
    assert api.post(f"/conversations/{third}/handled").get_json() == handled.get_json()  # idempotent
    with rt.db.connect() as conn:
        audits = conn.execute(select(audit_log.c.action, func.count()).where(
            audit_log.c.org_id == clinic.org_id, audit_log.c.entity == "inbound_messages")
            .group_by(audit_log.c.action)).all()
    assert dict(audits) == {"reply": 1, "handle": 1}

    # Another org's key sees none of it.
    assert other.get("/conversations?state=all").get_json()["data"] == []
    assert other.post(f"/conversations/{third}/handled").status_code == 404
    assert other.post(f"/conversations/{first}/reply", {"text": "x"},
                      headers={"Idempotency-Key": "r-2"}).status_code == 404
    assert api.get("/conversations?state=maybe").status_code == 422


def test_a_reply_from_an_unknown_number_cannot_be_answered(rt, client, api, clinic):
    unknown = _reply_from_patient(rt, client, clinic, "Quem é?", "wamid-9")
    refused = api.post(f"/conversations/{unknown}/reply", {"text": "Olá"}, headers={"Idempotency-Key": "u-1"})
    assert refused.status_code == 422
    [detail] = refused.get_json()["details"]
    assert detail["code"] == "conversation_unknown_contact" and detail["message"] and detail["message_en"]
    assert _replies(rt, clinic.org_id) == []


