"""Conversas: a patient's free-text reply (through the sandbox and through the Meta fake) waits in
the inbox with an unread count in the menu; a receptionist answers inside the window (one outbox
message, with its events, out through the same channel) or, outside Meta's 24 h window, is told
why and sends the approved template; marking handled; bad input, another org's ids and CSRF."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from sqlalchemy import select

from admin.app import create_app
from engine.messaging import dispatch
from engine.store.models import audit_log, inbound_messages, messages
from engine.tenants.orgs import create_user
from providers.sandbox.provider import SECRET_HEADER
from tests.admin.conftest import SECRET, csrf, login
from tests.test_meta_flow import PHONE, Graph, meta_world, post, text_body

FREE_TEXT = "Oi, posso remarcar para sexta?"


def sandbox_reply(client, tenant, text: str, mid: str, sender: str = "+5516999887766"):
    body = {"type": "message", "id": mid, "from": sender, "text": text}
    response = client.post(f"/webhooks/sandbox/{tenant.channel_id}", data=json.dumps(body),
                           headers={"Content-Type": "application/json", SECRET_HEADER: SECRET})
    assert response.status_code == 200, response.text
    return response


def inbound_id(rt, org_id: int, mid: str) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(inbound_messages.c.id).where(
            inbound_messages.c.org_id == org_id, inbound_messages.c.provider_message_id == mid)).scalar_one()


def inbound_row(rt, row_id: int):
    with rt.db.connect() as conn:
        return conn.execute(select(inbound_messages).where(inbound_messages.c.id == row_id)).one()


def replies(rt, org_id: int) -> list:
    with rt.db.connect() as conn:
        return list(conn.execute(select(messages).where(messages.c.org_id == org_id,
                                                        messages.c.purpose == "conversation_reply")
                                 .order_by(messages.c.id)))


def form_key(html: str) -> str:
    match = re.search(r'name="key" value="([0-9a-f]{32})"', html)
    assert match, "no reply form on the page"
    return match.group(1)


def send_due(rt) -> list[str]:
    return [dispatch.send_one(rt, mid) for mid in dispatch.claim_due(rt, limit=50)]


@pytest.fixture
def webhooks(app):
    return app.test_client()


def test_a_sandbox_free_text_reply_waits_in_the_inbox_with_a_count(agent, webhooks, rt, tenants):
    a, b = tenants
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-1")
    sandbox_reply(webhooks, a, "ok", "in-a-2")  # a keyword: the engine confirmed, no person needed
    sandbox_reply(webhooks, b, "mensagem-so-da-b", "in-b-1")
    page = agent.get("/admin/conversations/").text
    assert FREE_TEXT in page and "Paciente Da A" in page
    assert "Conversas (1)" in page  # B's reply is not counted
    assert "mensagem-so-da-b" not in page and "Paciente Só Da B" not in page
    assert f'href="/admin/appointments/details/?id={a.appointment_id}"' in page  # the appointment it is about
    assert "Canal clinica-a" in page and "O paciente escreveu sem usar uma palavra-chave" in page

    details = agent.get(f"/admin/conversations/{inbound_id(rt, a.world.org_id, 'in-a-1')}/").text
    assert FREE_TEXT in details and "ok" in details  # the thread holds the earlier keyword reply too
    assert 'id="lembra-reply-text"' in details and "lembra-reply-reason" not in details


def test_the_receptionist_answers_inside_the_window_once_through_the_outbox(agent, webhooks, rt, tenants, clock):
    a, _ = tenants
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-1")
    row_id = inbound_id(rt, a.world.org_id, "in-a-1")
    details = agent.get(f"/admin/conversations/{row_id}/").text
    data = {"csrf_token": csrf(details), "key": form_key(details), "text": "  Pode sim! Sexta às 10h?  "}
    response = agent.post(f"/admin/conversations/{row_id}/reply/", data=data)
    assert response.status_code == 302
    assert "A resposta foi para a fila" in agent.get(response.headers["Location"]).text
    assert agent.post(f"/admin/conversations/{row_id}/reply/", data=data).status_code == 302  # double submit
    [reply] = replies(rt, a.world.org_id)
    assert reply.payload == {"inbound_id": row_id, "text": "Pode sim! Sexta às 10h?"}
    assert (reply.status, reply.appointment_id, reply.template_key) == ("pending", a.appointment_id, None)

    assert send_due(rt) == ["sent"]
    assert a.world.events(reply.id) == ["queued", "claimed", "sending", "sent"]
    sent = a.world.sandbox()[-1]
    assert (sent.channel_id, sent.body) == (a.channel_id, "Pode sim! Sexta às 10h?")

    row = inbound_row(rt, row_id)
    assert row.handled_at is not None and row.handled_by is not None  # answering handles the reply
    page = agent.get("/admin/conversations/").text
    assert "Conversas (" not in page and FREE_TEXT not in page
    assert FREE_TEXT in agent.get("/admin/conversations/?state=handled").text
    thread = agent.get(f"/admin/conversations/{row_id}/").text
    assert "Resposta da clínica" in thread and "agent@a.com.br" in thread
    with rt.db.connect() as conn:
        audit = conn.execute(select(audit_log.c.action).where(audit_log.c.org_id == a.world.org_id,
                                                              audit_log.c.entity == "inbound_messages")).scalars().all()
    assert audit == ["reply"]


def test_through_meta_inside_then_outside_the_window(rt, clock):
    with Graph() as graph:
        world, channel_id = meta_world(rt, graph, slug="clinica-meta")
        with rt.db.begin() as conn:
            create_user(conn, org_id=world.org_id, email="recepcao@meta.com.br", role="agent", password="senha-forte-a")
        app = create_app(rt)
        app.config["TESTING"] = True
        client = login(app.test_client(), "recepcao@meta.com.br")
        contact = world.contact(phone=PHONE)
        world.appointment(contact, clock.now() + timedelta(days=3))
        now_ts = int(clock.now().timestamp())
        assert post(app.test_client(), channel_id, text_body("wamid.FREE1", FREE_TEXT, now_ts)).status_code == 200
        page = client.get("/admin/conversations/").text
        assert FREE_TEXT in page and "Conversas (1)" in page and "WhatsApp oficial" in page
        row_id = inbound_id(rt, world.org_id, "wamid.FREE1")

        details = client.get(f"/admin/conversations/{row_id}/").text
        client.post(f"/admin/conversations/{row_id}/reply/",
                    data={"csrf_token": csrf(details), "key": form_key(details), "text": "Pode, sim."})
        assert send_due(rt) == ["sent"]
        free = graph.sends()[-1]
        assert free["type"] == "text" and free["text"]["body"] == "Pode, sim."

        # A day and more later the patient writes nothing new: Meta only takes an approved template.
        late = text_body("wamid.FREE2", "e sábado?", now_ts + 60)
        assert post(app.test_client(), channel_id, late).status_code == 200
        second = inbound_id(rt, world.org_id, "wamid.FREE2")
        clock.advance(timedelta(hours=25))
        details = client.get(f"/admin/conversations/{second}/").text
        assert "mais de 24 horas" in details and 'id="lembra-reply-text"' not in details
        assert "Enviar o modelo aprovado" in details
        refused = client.post(f"/admin/conversations/{second}/reply/",
                              data={"csrf_token": csrf(details), "key": form_key(details), "text": "Pode."})
        assert "mais de 24 horas" in client.get(refused.headers["Location"]).text
        assert len(replies(rt, world.org_id)) == 1, "no free text is queued outside the window"
        client.post(f"/admin/conversations/{second}/reply/",
                    data={"csrf_token": csrf(details), "key": form_key(details), "template": "1"})
        template_reply = replies(rt, world.org_id)[-1]
        assert template_reply.template_key == "conversation_reopen"
        assert send_due(rt) == ["sent"]
        sent = graph.sends()[-1]
        assert sent["type"] == "template" and sent["template"]["name"] == "conversation_reopen_v1"
        assert world.events(template_reply.id) == ["queued", "claimed", "sending", "sent"]


def test_mark_handled_from_the_list_and_from_details(agent, webhooks, rt, tenants, clock):
    a, b = tenants
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-1")
    sandbox_reply(webhooks, a, "Tem estacionamento?", "in-a-2")
    sandbox_reply(webhooks, a, "Quem é?", "in-a-3", sender="+5511988887777")  # no contact has this number
    sandbox_reply(webhooks, b, "da B", "in-b-1")
    first, second, stranger = (inbound_id(rt, a.world.org_id, m) for m in ("in-a-1", "in-a-2", "in-a-3"))
    other = inbound_id(rt, b.world.org_id, "in-b-1")
    page = agent.get("/admin/conversations/").text
    assert "Conversas (3)" in page and "+5511988887777" in page and "sem contato cadastrado" in page
    response = agent.post("/admin/conversations/handled/",
                          data={"csrf_token": csrf(page), "ids": [first, other, "x", "99999999999999999999"]})
    assert response.status_code == 302
    assert inbound_row(rt, first).handled_at is not None
    assert inbound_row(rt, other).handled_at is None, "another org's reply is left alone"
    details = agent.get(f"/admin/conversations/{second}/").text
    assert agent.post(f"/admin/conversations/{second}/handled/",
                      data={"csrf_token": csrf(details)}).status_code == 302
    assert inbound_row(rt, second).handled_at is not None
    assert "Conversas (1)" in agent.get("/admin/conversations/").text

    # A number no contact carries: read and mark handled, but the page says why it cannot be answered.
    details = agent.get(f"/admin/conversations/{stranger}/").text
    assert "não é de nenhum contato cadastrado" in details and 'id="lembra-reply-text"' not in details
    response = agent.post(f"/admin/conversations/{stranger}/reply/",
                          data={"csrf_token": csrf(details), "key": "0" * 32, "text": "Oi"})
    assert response.status_code == 302 and replies(rt, a.world.org_id) == []


def test_bad_input_is_refused_plainly(agent, webhooks, rt, tenants):
    a, _ = tenants
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-1")
    row_id = inbound_id(rt, a.world.org_id, "in-a-1")
    details = agent.get(f"/admin/conversations/{row_id}/").text
    token, key = csrf(details), form_key(details)
    url = f"/admin/conversations/{row_id}/reply/"
    empty = agent.post(url, data={"csrf_token": token, "key": key, "text": "  \x00 "})
    assert "Escreva a resposta antes de enviar" in agent.get(empty.headers["Location"]).text
    long = agent.post(url, data={"csrf_token": token, "key": key, "text": "a" * 1001})
    assert "passa de 1000 caracteres" in agent.get(long.headers["Location"]).text
    assert agent.post(url, data={"csrf_token": token, "key": "not-a-key", "text": "Oi"}).status_code == 400
    template = agent.post(url, data={"csrf_token": token, "key": key, "template": "1"})
    assert "sem precisar do modelo" in agent.get(template.headers["Location"]).text
    assert replies(rt, a.world.org_id) == []
    for bad in ("abc", "0", "-1", "99999999999999999999", str(row_id + 1000)):
        assert agent.get(f"/admin/conversations/{bad}/").status_code == 404, bad
    assert agent.get("/admin/conversations/?state=nada&page=zz").status_code == 200
    # A reply the engine handled (a keyword) is not a conversation item.
    sandbox_reply(webhooks, a, "ok", "in-a-ok")
    assert agent.get(f"/admin/conversations/{inbound_id(rt, a.world.org_id, 'in-a-ok')}/").status_code == 404


def test_another_orgs_reply_answers_404_everywhere(agent, webhooks, rt, tenants):
    a, b = tenants
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-1")
    sandbox_reply(webhooks, b, "segredo-da-b", "in-b-1")
    other = inbound_id(rt, b.world.org_id, "in-b-1")
    token = csrf(agent.get("/admin/conversations/").text)
    assert agent.get(f"/admin/conversations/{other}/").status_code == 404
    assert agent.post(f"/admin/conversations/{other}/reply/",
                      data={"csrf_token": token, "key": "a" * 32, "text": "Oi"}).status_code == 404
    assert agent.post(f"/admin/conversations/{other}/handled/", data={"csrf_token": token}).status_code == 404
    assert replies(rt, b.world.org_id) == [] and inbound_row(rt, other).handled_at is None
    for state in ("open", "handled", "all"):
        assert "segredo-da-b" not in agent.get(f"/admin/conversations/?state={state}").text


def test_every_post_needs_the_csrf_token(agent, webhooks, rt, tenants):
    a, _ = tenants
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-1")
    row_id = inbound_id(rt, a.world.org_id, "in-a-1")
    details = agent.get(f"/admin/conversations/{row_id}/").text
    key = form_key(details)
    assert agent.post(f"/admin/conversations/{row_id}/reply/", data={"key": key, "text": "Oi"}).status_code == 400
    assert agent.post(f"/admin/conversations/{row_id}/handled/", data={}).status_code == 400
    assert agent.post("/admin/conversations/handled/", data={"ids": [row_id]}).status_code == 400
    assert replies(rt, a.world.org_id) == [] and inbound_row(rt, row_id).handled_at is None


def test_signed_out_visitors_go_to_the_login(app, tenants):
    client = app.test_client()
    response = client.get("/admin/conversations/")
    assert response.status_code == 302 and "/login" in response.headers["Location"]
