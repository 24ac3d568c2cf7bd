"""Two tenants: a key of org A never sees, reads, filters on or attaches to org B's rows, and
B's ids answer exactly like ids that do not exist (404, or the same 422 for a body reference)."""

from __future__ import annotations

from engine.store.models import audit_log, contact_events
from sqlalchemy import func, select


def _seed(api, tag):
    contact = api.post("/contacts", {"external_id": "shared-ext", "name": f"Paciente {tag}",
                                     "phone": "+5516999887766", "consent": ["whatsapp"]}).get_json()
    appointment = api.post("/appointments", {"external_id": "shared-appt", "contact_external_id": "shared-ext",
                                             "starts_at": "2026-12-03T14:30:00-03:00"}).get_json()
    message = api.post("/messages", {"contact_id": contact["id"], "channel_kind": "whatsapp", "text": f"oi {tag}"},
                       headers={"Idempotency-Key": "same-key"}).get_json()
    return contact, appointment, message


def test_every_endpoint_is_scoped_to_the_keys_org(rt, api, other):
    a_contact, a_appt, a_msg = _seed(api, "A")
    b_contact, b_appt, b_msg = _seed(other, "B")
    # The same external ids and idempotency key live independently in each org.
    assert a_contact["id"] != b_contact["id"] and a_msg["id"] != b_msg["id"] and a_msg["body"] == "oi A"

    missing_id = 10**9
    for path in (f"/contacts/{b_contact['id']}", f"/appointments/{b_appt['id']}", f"/messages/{b_msg['id']}"):
        response = api.get(path)
        assert response.status_code == 404, path
        assert response.get_json() == api.get(path.rsplit("/", 1)[0] + f"/{missing_id}").get_json()

    lists = {
        "/contacts": [a_contact["id"]],
        "/contacts?external_id=shared-ext": [a_contact["id"]],
        "/contacts?phone=%2B5516999887766": [a_contact["id"]],
        "/appointments": [a_appt["id"]],
        "/appointments?status=scheduled&from=2026-12-01T00:00:00Z": [a_appt["id"]],
        f"/appointments?contact_id={b_contact['id']}": [],
        "/messages?purpose=adhoc": [a_msg["id"]],
        f"/messages?contact_id={b_contact['id']}": [],
        "/messages?status=pending&purpose=session_reminder": [m.id for m in api.world.messages(
            purpose="session_reminder")],
    }
    for path, ids in lists.items():
        assert [row["id"] for row in api.get(path).get_json()["data"]] == ids, path
    everything = api.get("/messages").get_json()["data"]
    assert {m["contact_id"] for m in everything} == {a_contact["id"]}

    # Bodies that name B's rows: refused exactly like unknown ids, and nothing is written.
    attach = api.post("/appointments", {"external_id": "x", "contact_external_id": "only-in-b",
                                        "starts_at": "2026-12-03T14:30:00-03:00"})
    other.post("/contacts", {"external_id": "only-in-b"})
    attach_b = api.post("/appointments", {"external_id": "x", "contact_external_id": "only-in-b",
                                          "starts_at": "2026-12-03T14:30:00-03:00"})
    assert attach.status_code == attach_b.status_code == 422 and attach.get_json() == attach_b.get_json()
    send = api.post("/messages", {"contact_id": b_contact["id"], "channel_kind": "whatsapp", "text": "x"},
                    headers={"Idempotency-Key": "other"})
    not_found = {"contact_id": [{"code": "api_contact_not_found", "field": "contact_id",
                                 "message": "Este paciente não existe nesta clínica.",
                                 "message_en": "This patient does not exist in this clinic."}]}
    assert send.status_code == 422 and send.get_json()["details"] == not_found
    event = api.post("/events", {"type": "handoff_started", "contact_id": b_contact["id"]})
    assert event.status_code == 422 and event.get_json()["details"] == not_found
    # Upserting A's "shared-ext" again touches A's row only.
    api.post("/contacts", {"external_id": "shared-ext", "name": "Renamed by A"})
    assert other.get(f"/contacts/{b_contact['id']}").get_json()["name"] == "Paciente B"
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(contact_events)).scalar_one() == 0
        by_org = dict(conn.execute(select(audit_log.c.api_key_id, audit_log.c.org_id).distinct()).all())
    assert by_org == {api.key_id: api.world.org_id, other.key_id: other.world.org_id}
