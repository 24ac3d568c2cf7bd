"""Contacts and appointments pushed by a clinic's software: upsert by external_id, answers with
the id, and appointment changes re-plan the reminders in the same request."""

from __future__ import annotations

from sqlalchemy import select

from engine.store.models import audit_log, preferences
from engine.people.contacts import opt_out

ANA = {"external_id": "pac-1", "name": "Ana Clara", "phone": "(16) 99988-7766", "email": "Ana@Example.com",
       "locale": "pt_BR", "consent": ["whatsapp", "email"]}


def _audit(rt, org_id):
    with rt.db.connect() as conn:
        return list(conn.execute(select(audit_log).where(audit_log.c.org_id == org_id).order_by(audit_log.c.id)))


def test_contact_upsert_creates_then_updates(rt, api):
    created = api.post("/contacts", ANA)
    assert created.status_code == 201, created.get_json()
    body = created.get_json()
    assert body["id"] > 0 and body["phone"] == "+5516999887766" and body["email"] == "ana@example.com"
    assert body["consent"] == ["email", "whatsapp"] and body["opted_out"] == []

    updated = api.post("/contacts", {"external_id": "pac-1", "name": "Ana Clara Souza"})
    assert updated.status_code == 200
    assert updated.get_json()["id"] == body["id"]
    assert updated.get_json()["name"] == "Ana Clara Souza"
    assert updated.get_json()["phone"] == "+5516999887766"  # absent fields are left alone

    assert api.get(f"/contacts/{body['id']}").get_json()["name"] == "Ana Clara Souza"
    rows = _audit(rt, api.world.org_id)
    assert [(r.action, r.entity, r.entity_id, r.api_key_id) for r in rows] == [
        ("create", "contact", body["id"], api.key_id), ("update", "contact", body["id"], api.key_id)]
    assert rows[1].changes == {"name": "[redacted]"}
    assert "99988" not in str(rows[0].changes) and "Ana" not in str(rows[0].changes)

    unchanged = api.post("/contacts", {"external_id": "pac-1", "name": "Ana Clara Souza"})
    assert unchanged.status_code == 200 and len(_audit(rt, api.world.org_id)) == 2  # no write, no audit row


def test_api_consent_never_overrides_a_patients_opt_out(rt, api):
    contact_id = api.post("/contacts", ANA).get_json()["id"]
    with rt.db.begin() as conn:
        opt_out(conn, api.world.org_id, contact_id, kinds=("whatsapp",), source="patient")
    again = api.post("/contacts", {**ANA, "consent": ["whatsapp", "sms"]}).get_json()
    assert again["opted_out"] == ["whatsapp"]
    assert again["consent"] == ["email", "sms"]
    with rt.db.connect() as conn:
        sources = dict(conn.execute(select(preferences.c.kind, preferences.c.source)
                                    .where(preferences.c.contact_id == contact_id)).all())
    assert sources == {"whatsapp": "patient", "email": "api", "sms": "api"}


def test_contact_list_filters_and_cursor(api):
    ids = [api.post("/contacts", {"external_id": f"p{i}", "name": f"P {i}",
                                   "phone": f"+55169999900{i:02d}"}).get_json()["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        page = api.get("/contacts", query_string={"limit": 2, **({"cursor": cursor} if cursor else {})}).get_json()
        seen += [c["id"] for c in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    assert [c["id"] for c in api.get("/contacts?external_id=p3").get_json()["data"]] == [ids[3]]
    assert [c["id"] for c in api.get("/contacts", query_string={"phone": "(16) 99999-0004"}).get_json()["data"]] == [ids[4]]
    bad = api.get("/contacts?cursor=not-a-cursor&limit=0")
    assert bad.status_code == 422 and set(bad.get_json()["details"]) == {"cursor", "limit"}


def _appointment(**overrides):
    return {"external_id": "ag-1", "contact_external_id": "pac-1", "starts_at": "2026-12-03T14:30:00-03:00",
            "professional": "Dra. Beatriz", "mode": "in_person", "location": "Sala 2", **overrides}


def test_appointment_upsert_reschedule_and_cancel_replan_reminders_at_once(rt, api):
    api.post("/contacts", ANA)
    created = api.post("/appointments", _appointment())
    assert created.status_code == 201, created.get_json()
    appt = created.get_json()
    assert appt["status"] == "scheduled" and appt["contact_external_id"] == "pac-1"
    assert appt["starts_at"].startswith("2026-12-03T17:30:00")
    first = api.world.messages(appointment_id=appt["id"])
    assert [(m.channel_kind, m.status) for m in first] == [("whatsapp", "pending")]  # no populate pass needed

    same = api.post("/appointments", _appointment())
    assert same.status_code == 200 and len(api.world.messages(appointment_id=appt["id"])) == 1

    moved = api.post("/appointments", _appointment(starts_at="2026-12-04T10:00:00-03:00"))
    assert moved.status_code == 200 and moved.get_json()["id"] == appt["id"]
    rows = api.world.messages(appointment_id=appt["id"])
    assert [(m.id, m.status, m.skip_reason) for m in rows[:1]] == [(first[0].id, "cancelled", "appointment_changed")]
    assert len(rows) == 2 and rows[1].status == "pending"
    assert rows[1].appointment_starts_at.isoformat() == moved.get_json()["starts_at"]

    cancelled = api.post("/appointments", _appointment(starts_at="2026-12-04T10:00:00-03:00", status="cancelled"))
    assert cancelled.status_code == 200
    body = cancelled.get_json()
    assert body["status"] == "cancelled" and body["cancel_source"] == "clinic" and body["cancelled_at"]
    assert [m.status for m in api.world.messages(appointment_id=appt["id"])] == ["cancelled", "cancelled"]

    actions = [(r.action, r.entity, sorted(r.changes or {})) for r in _audit(rt, api.world.org_id)
               if r.entity == "appointment"]
    assert actions[1:] == [("update", "appointment", ["starts_at"]), ("update", "appointment", ["status"])]


def test_scheduled_does_not_undo_a_confirmation(rt, api):
    api.post("/contacts", ANA)
    appt = api.post("/appointments", _appointment(status="confirmed")).get_json()
    assert appt["status"] == "confirmed"
    assert api.post("/appointments", _appointment(status="scheduled")).get_json()["status"] == "confirmed"
    assert api.post("/appointments", _appointment(status="completed")).get_json()["status"] == "completed"


def test_appointment_validation_lists_every_error_and_refuses_naive_times(api):
    response = api.post("/appointments", {"starts_at": "2026-12-03T14:30:00", "status": "maybe", "surprise": 1,
                                          "timezone": "Mars/Olympus"})
    assert response.status_code == 422
    details = response.get_json()["details"]
    assert response.get_json()["error"] == "validation failed"
    # Naming no contact is one error on `contact_id` (give it or `contact_external_id`).
    assert set(details) == {"external_id", "contact_id", "starts_at", "status", "surprise", "timezone"}
    assert details["contact_id"][0]["code"] == "api_contact_ref_one"
    assert "aware" in details["starts_at"][0].lower()

    naive = api.post("/appointments", _appointment(starts_at="2026-12-03 14:30"))
    assert naive.status_code == 422 and set(naive.get_json()["details"]) == {"starts_at"}
    unknown = api.post("/appointments", _appointment(contact_external_id="nobody"))
    assert unknown.status_code == 422 and "contact_external_id" in unknown.get_json()["details"]

    contact = api.post("/contacts", {"external_id": 7, "phone": "12", "email": "nope", "consent": ["fax"],
                                     "locale": "portuguese"})
    assert contact.status_code == 422
    assert set(contact.get_json()["details"]) == {"external_id", "phone", "email", "consent", "locale"}


def test_appointment_list_filters_and_get(api):
    api.post("/contacts", ANA)
    a = api.post("/appointments", _appointment()).get_json()
    b = api.post("/appointments", _appointment(external_id="ag-2", starts_at="2026-12-10T09:00:00-03:00",
                                               status="cancelled")).get_json()
    assert [x["id"] for x in api.get("/appointments").get_json()["data"]] == [a["id"], b["id"]]
    assert [x["id"] for x in api.get("/appointments?status=cancelled").get_json()["data"]] == [b["id"]]
    window = api.get("/appointments", query_string={"from": "2026-12-05T00:00:00-03:00",
                                                     "to": "2026-12-31T00:00:00-03:00"}).get_json()
    assert [x["id"] for x in window["data"]] == [b["id"]]
    assert api.get("/appointments?from=2026-12-05T00:00:00").status_code == 422  # naive
    assert api.get(f"/appointments/{a['id']}").get_json()["external_id"] == "ag-1"
