"""Issue 9, points 11 and 13 through `/api/v1`: a new contact on a refused phone says so in the
response (and gets no reminders), contacts that share a phone are named, `DELETE /contacts/<id>`
erases, `GET /contacts/<id>/consent` exports the evidence; another org's ids answer like ids that
do not exist."""

from __future__ import annotations

from sqlalchemy import insert, select

import admin.api.privacy  # noqa: F401  (registers the privacy routes; admin/api/__init__.py does it too)
from engine.core import clock
from engine.messaging.inbound import process_inbound
from engine.store.models import audit_log, contacts, inbound_messages

PHONE = "+5516999887766"


def delete(api, path: str):
    return api.client.delete(f"/api/v1{path}", headers=api._headers(None))


def sair(rt, world) -> str | None:
    with rt.db.begin() as conn:
        inbound_id = conn.execute(insert(inbound_messages).values(
            org_id=world.org_id, channel_id=world.channels["whatsapp"], provider_message_id="in-sair",
            from_address=PHONE, text="SAIR", received_at=clock.now()).returning(inbound_messages.c.id)).scalar_one()
    return process_inbound(rt, inbound_id)


def test_a_new_contact_on_a_refused_phone_says_so_and_gets_no_reminders(rt, api, other):
    first = api.post("/contacts", {"external_id": "pac-1", "name": "Ana", "phone": PHONE,
                                   "consent": ["whatsapp", "email"]}).get_json()
    assert first["address_opted_out"] == [] and first["shares_phone_with"] == []
    assert sair(rt, api.world) == "opted_out"

    again = api.post("/contacts", {"external_id": "pac-77", "name": "Ana C.", "phone": "(16) 99988-7766",
                                   "email": "ana@example.com", "consent": ["whatsapp", "email"]})
    assert again.status_code == 201
    body = again.get_json()
    assert body["address_opted_out"] == ["email", "sms", "whatsapp"]
    assert body["consent"] == ["email", "whatsapp"]  # what the clinic says it has; the address refusal wins
    assert body["shares_phone_with"] == [first["id"]]
    appointment = api.post("/appointments", {"external_id": "ag-9", "contact_external_id": "pac-77",
                                             "starts_at": "2026-12-03T14:30:00-03:00"})
    assert appointment.status_code == 201
    assert api.world.messages(contact_id=body["id"]) == []
    # Org B's contact on the same phone refused nothing.
    in_b = other.post("/contacts", {"external_id": "pac-77", "phone": PHONE, "consent": ["whatsapp"]}).get_json()
    assert in_b["address_opted_out"] == [] and in_b["shares_phone_with"] == []


def test_delete_erases_and_consent_exports_within_the_keys_org(rt, api, other):
    mine = api.post("/contacts", {"external_id": "pac-1", "name": "Ana Clara", "phone": PHONE,
                                  "email": "ana@example.com", "consent": ["whatsapp"]}).get_json()
    theirs = other.post("/contacts", {"external_id": "pac-1", "name": "Ana na B", "phone": PHONE,
                                      "consent": ["whatsapp"]}).get_json()
    api.post("/appointments", {"external_id": "ag-1", "contact_external_id": "pac-1",
                               "starts_at": "2026-12-03T14:30:00-03:00"})

    evidence = api.get(f"/contacts/{mine['id']}/consent")
    assert evidence.status_code == 200
    document = evidence.get_json()
    assert document["contact"]["id"] == mine["id"] and document["contact"]["phone"] == PHONE
    assert next(c for c in document["consent"] if c["channel_kind"] == "whatsapp")["source"] == "api"
    assert document["opt_outs"] == [] and document["refused_now"] == []
    missing = api.get("/contacts/999999/consent")
    assert missing.status_code == 404
    assert api.get(f"/contacts/{theirs['id']}/consent").get_json() == missing.get_json()
    assert delete(api, f"/contacts/{theirs['id']}").status_code == 404
    assert delete(api, "/contacts/999999").get_json() == delete(api, f"/contacts/{theirs['id']}").get_json()

    erased = delete(api, f"/contacts/{mine['id']}")
    assert erased.status_code == 200, erased.get_json()
    out = erased.get_json()
    assert out["id"] == mine["id"] and out["erased_by"] == f"api_key:{api.key_id}"
    assert out["messages_cancelled"] == 1 and out["messages_anonymised"] == 1
    assert api.get(f"/contacts/{mine['id']}").status_code == 404
    assert api.get(f"/contacts/{mine['id']}/consent").status_code == 404
    assert delete(api, f"/contacts/{mine['id']}").status_code == 404
    # The external id stays reserved; B's contact is untouched.
    assert api.post("/contacts", {"external_id": "pac-1", "name": "Ana"}).status_code == 409
    assert other.get(f"/contacts/{theirs['id']}").get_json()["name"] == "Ana na B"
    with rt.db.connect() as conn:
        row = conn.execute(select(contacts).where(contacts.c.id == mine["id"])).one()
        entry = conn.execute(select(audit_log).where(audit_log.c.action == "erase")).one()
    assert (row.name, row.phone, row.email, row.erased_by) == (None, None, None, f"api_key:{api.key_id}")
    assert (entry.api_key_id, entry.entity, entry.entity_id) == (api.key_id, "contact", mine["id"])


def test_the_privacy_routes_are_in_the_openapi_document(client):
    paths = client.get("/api/v1/openapi.json").get_json()["paths"]
    assert "delete" in paths["/api/v1/contacts/{contact_id}"]
    assert paths["/api/v1/contacts/{contact_id}/consent"]["get"]["responses"]["200"]
