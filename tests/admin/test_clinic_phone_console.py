"""The clinic's own phone on the console (issue 34): a hand-off its message started is the same
hand-off as "Assumir a conversa", and "Encerrar atendimento humano" ends it (CSRF, other org 404)."""

from __future__ import annotations

import json

from sqlalchemy import select

from engine.flows import facts
from engine.messaging.inbound import process_inbound, receive
from engine.store.models import contact_events
from engine.tenants.channels import create_channel
from gateway.contract import WebhookRequest
from tests.admin.conftest import csrf
from tests.fakes import evolution as evo
from tests.fixtures import fixture_json

EVOLUTION_SECRET = "a-long-enough-webhook-secret-for-hs256!"


def test_encerrar_ends_the_hand_off_the_clinic_phone_started(agent, rt, tenants):
    a, b = tenants
    with rt.db.begin() as conn:
        channel_id = create_channel(conn, rt.keyring, org_id=a.world.org_id, kind="whatsapp", provider="evolution",
                                    name="Celular da recepção",
                                    credentials={"base_url": "http://127.0.0.1:9", "api_key": "k", "instance": "clinica",
                                                 "webhook_secret": EVOLUTION_SECRET})
    request = WebhookRequest(method="POST", url=f"/webhooks/evolution/{channel_id}",
                             headers={"Authorization": f"Bearer {evo.mint_token(EVOLUTION_SECRET)}"},
                             body=json.dumps(fixture_json("evolution/webhook_upsert_from_me_text.json")).encode())
    [inbound_id] = receive(rt, "evolution", channel_id, request).inbound_ids
    assert process_inbound(rt, inbound_id) == "staff_message"

    def holds(tenant) -> bool:
        with rt.db.connect() as conn:
            return facts.human_holds(conn, tenant.world.org_id, tenant.contact_id)

    assert holds(a) and not holds(b)  # B's contact has the same number: untouched
    page = agent.get(f"/admin/contacts/details/?id={a.contact_id}").text
    assert 'data-handoff="on"' in page
    url = f"/admin/contacts/handoff/{a.contact_id}/"
    assert agent.post(url, data={"op": "end"}).status_code == 400  # no CSRF token
    assert holds(a)
    assert agent.post(f"/admin/contacts/handoff/{b.contact_id}/",
                      data={"csrf_token": csrf(page), "op": "end"}).status_code == 404
    assert agent.post(url, data={"csrf_token": csrf(page), "op": "end"}).status_code == 302
    assert not holds(a)
    with rt.db.connect() as conn:
        kinds = conn.execute(select(contact_events.c.type).where(contact_events.c.org_id == a.world.org_id)
                             .order_by(contact_events.c.id)).scalars().all()
    assert kinds == ["handoff_started", "handoff_ended"]
