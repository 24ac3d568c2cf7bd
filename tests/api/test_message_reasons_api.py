"""A message in the REST API keeps its codes for machines and says them in words: `status_text`
and `reason_text` come from the one catalogue (engine/words/reasons.py), in pt-BR like an enrollment's
`reason_text`."""

from __future__ import annotations

from datetime import timezone

from engine.messaging import dispatch
from engine.store.models import channels
from engine.words.reasons import status_label
from tests.factories import local

#: Thursday 14:00 in São Paulo, and Wednesday 14:00 when its 24 h reminder is due.
APPOINTMENT = "2026-12-03T14:00:00-03:00"
DUE = local(2026, 12, 2, 14, 0).astimezone(timezone.utc)


def _contact(api, external_id="pac-1"):
    return api.post("/contacts", {"external_id": external_id, "name": "Ana", "phone": "+5516999887766",
                                  "consent": ["whatsapp"]}).get_json()


def _refusing_sandbox(rt, api) -> None:
    from sqlalchemy import update

    with rt.db.begin() as conn:
        conn.execute(update(channels).where(channels.c.id == api.world.channels["whatsapp"])
                     .values(settings={"simulate": "permanent"}))


def test_a_failed_message_keeps_its_code_and_says_it_in_words(rt, clock, api, other):
    _contact(api)
    api.post("/appointments", {"external_id": "ag-1", "contact_external_id": "pac-1", "starts_at": APPOINTMENT})
    _refusing_sandbox(rt, api)
    clock.set(DUE)
    [whatsapp] = api.world.messages(channel_kind="whatsapp")
    assert dispatch.claim_due(rt, limit=10) == [whatsapp.id]
    assert dispatch.send_one(rt, whatsapp.id) == "failed"

    got = api.get(f"/messages/{whatsapp.id}").get_json()
    assert got["error_code"] == "sandbox_permanent" and got["skip_reason"] is None
    assert got["status"] == "failed" and got["status_text"] == "Falhou"
    assert got["reason_text"].startswith("O sandbox recusou a mensagem de propósito")
    assert "sandbox_permanent" not in got["reason_text"]
    listed = {m["id"]: m for m in api.get("/messages?status=failed").get_json()["data"]}
    assert listed[whatsapp.id]["reason_text"] == got["reason_text"]

    # Another clinic's key sees neither the message nor its words.
    assert other.get(f"/messages/{whatsapp.id}").status_code == 404
    assert whatsapp.id not in {m["id"] for m in other.get("/messages").get_json()["data"]}
    assert api.get("/messages/999999").status_code == 404
    assert api.get("/messages?status=not_a_status").status_code == 422


def test_a_cancelled_reminder_says_why_and_a_pending_one_has_no_reason(api):
    contact = _contact(api)
    api.post("/appointments", {"external_id": "ag-1", "contact_external_id": "pac-1", "starts_at": APPOINTMENT})
    [pending] = api.get(f"/messages?contact_id={contact['id']}").get_json()["data"]
    assert pending["reason_text"] is None and pending["status_text"] == str(status_label("pending"))

    api.post("/appointments", {"external_id": "ag-1", "contact_external_id": "pac-1", "starts_at": APPOINTMENT,
                               "status": "cancelled"})
    cancelled = api.get(f"/messages/{pending['id']}").get_json()
    assert cancelled["status"] == "cancelled" and cancelled["skip_reason"] == "appointment_changed"
    assert cancelled["status_text"] == "Cancelada"
    assert cancelled["reason_text"].startswith("O agendamento mudou")
