"""The front desk writes first and watches conversations live (issue 33, desk).

From the contact's page a receptionist (agent role) writes to a patient: free text inside Meta's
24 h window (one outbox message, an audit row), the approved template outside it (with the
sentence saying why; free text refused), nothing to a patient who opted out or never consented.
"Assumir a conversa" lands on the composer. Conversas, a conversation and the sandbox chat poll
fragment endpoints that answer only the rows or bubbles, with the pages' org scope: another
org's ids answer 404; every POST needs the CSRF token.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import select

from admin.app import create_app
from engine.people.contacts import opt_out
from engine.store.models import audit_log, messages
from engine.tenants.orgs import create_user
from tests.admin.conftest import csrf, login
from tests.admin.test_conversations import FREE_TEXT, inbound_id, replies, sandbox_reply, send_due
from tests.test_meta_flow import PHONE, Graph, meta_world, post, text_body


@pytest.fixture
def webhooks(app):
    return app.test_client()


def compose_key(html: str) -> str:
    match = re.search(r'id="lembra-compose".*?name="key" value="([0-9a-f]{32})"', html, re.S)
    assert match, "no composer on the page"
    return match.group(1)


def audit_actions(rt, org_id: int, entity: str) -> list[str]:
    with rt.db.connect() as conn:
        return list(conn.execute(select(audit_log.c.action).where(
            audit_log.c.org_id == org_id, audit_log.c.entity == entity).order_by(audit_log.c.id)).scalars())


def test_a_receptionist_writes_first_from_the_contact_page(agent, rt, tenants, clock):
    a, _ = tenants
    url = f"/admin/contacts/details/?id={a.contact_id}"
    page = agent.get(url).text
    assert "Escrever ao paciente" in page and 'id="lembra-compose-text"' in page
    assert "lembra-compose-reason" not in page  # the sandbox has no 24 h window
    data = {"csrf_token": csrf(page), "key": compose_key(page), "text": "  Olá! Podemos falar sobre o retorno?  "}
    response = agent.post(f"/admin/contacts/compose/{a.contact_id}/", data=data)
    assert response.status_code == 302 and response.headers["Location"].endswith("#lembra-compose")
    assert "A resposta foi para a fila de envio" in agent.get(response.headers["Location"]).text
    agent.post(f"/admin/contacts/compose/{a.contact_id}/", data=data)  # a double submit sends once
    [sent] = replies(rt, a.world.org_id)
    assert (sent.contact_id, sent.channel_kind, sent.status, sent.template_key) == (a.contact_id, "whatsapp",
                                                                                     "pending", None)
    assert sent.payload == {"text": "Olá! Podemos falar sobre o retorno?"}
    assert audit_actions(rt, a.world.org_id, "contacts") == ["write"]
    assert send_due(rt) == ["sent"]  # through the one outbox, out on the sandbox channel
    assert a.world.events(sent.id) == ["queued", "claimed", "sending", "sent"]
    assert a.world.sandbox()[-1].body == "Olá! Podemos falar sobre o retorno?"

    # Bad input is refused with a sentence; nothing else is queued.
    page = agent.get(url).text
    empty = agent.post(f"/admin/contacts/compose/{a.contact_id}/",
                       data={"csrf_token": csrf(page), "key": compose_key(page), "text": "   "})
    assert "Escreva a resposta antes de enviar" in agent.get(empty.headers["Location"]).text
    assert agent.post(f"/admin/contacts/compose/{a.contact_id}/",
                      data={"csrf_token": csrf(page), "key": "nope", "text": "Oi"}).status_code == 400
    assert len(replies(rt, a.world.org_id)) == 1


def test_taking_over_the_conversation_opens_the_composer(agent, tenants):
    a, _ = tenants
    page = agent.get(f"/admin/contacts/details/?id={a.contact_id}").text
    response = agent.post(f"/admin/contacts/handoff/{a.contact_id}/", data={"csrf_token": csrf(page), "op": "start"})
    assert response.status_code == 302
    assert response.headers["Location"].endswith(f"id={a.contact_id}#lembra-compose")
    ended = agent.post(f"/admin/contacts/handoff/{a.contact_id}/", data={"csrf_token": csrf(page), "op": "end"})
    assert not ended.headers["Location"].endswith("#lembra-compose")


def test_taking_over_from_a_conversation_opens_its_answer(agent, webhooks, rt, tenants):
    a, _ = tenants
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-1")
    row_id = inbound_id(rt, a.world.org_id, "in-a-1")
    page = agent.get(f"/admin/conversations/{row_id}/").text
    assert "Assumir a conversa (atendimento humano)" in page and 'name="inbound" value="%d"' % row_id in page
    response = agent.post(f"/admin/contacts/handoff/{a.contact_id}/",
                          data={"csrf_token": csrf(page), "op": "start", "back": "conversation", "inbound": row_id})
    assert response.headers["Location"].endswith(f"/admin/conversations/{row_id}/#lembra-compose")
    page = agent.get(response.headers["Location"]).text
    assert "Atendimento humano em andamento" in page and 'id="lembra-reply-text"' in page
    forged = agent.post(f"/admin/contacts/handoff/{a.contact_id}/",
                        data={"csrf_token": csrf(page), "op": "end", "back": "conversation", "inbound": "x/../y"})
    assert forged.headers["Location"].endswith(f"/admin/contacts/details/?id={a.contact_id}")


def test_outside_metas_window_only_the_approved_template_goes(rt, clock):
    with Graph() as graph:
        world, channel_id = meta_world(rt, graph, slug="clinica-meta")
        with rt.db.begin() as conn:
            create_user(conn, org_id=world.org_id, email="recepcao@meta.com.br", role="agent", password="senha-forte-a")
        app = create_app(rt)
        app.config["TESTING"] = True
        client = login(app.test_client(), "recepcao@meta.com.br")
        contact = world.contact(phone=PHONE)
        url, action = f"/admin/contacts/details/?id={contact}", f"/admin/contacts/compose/{contact}/"

        # The patient never wrote: no free text, the template instead, and why.
        page = client.get(url).text
        assert "não escreveu por este canal nas últimas 24 horas" in page
        assert 'id="lembra-compose-text"' not in page and "Enviar o modelo aprovado" in page
        refused = client.post(action, data={"csrf_token": csrf(page), "key": compose_key(page), "text": "Oi"})
        assert "não escreveu por este canal nas últimas 24 horas" in client.get(refused.headers["Location"]).text
        assert replies(rt, world.org_id) == [], "no free text is queued outside the window"
        client.post(action, data={"csrf_token": csrf(page), "key": compose_key(page), "template": "1"})
        [template] = replies(rt, world.org_id)
        assert template.template_key == "conversation_reopen"
        assert send_due(rt) == ["sent"]
        assert graph.sends()[-1]["template"]["name"] == "conversation_reopen_v1"

        # The patient answers: the window is open, free text goes.
        now_ts = int(clock.now().timestamp())
        assert post(app.test_client(), channel_id, text_body("wamid.C1", FREE_TEXT, now_ts)).status_code == 200
        clock.advance(timedelta(seconds=6))  # Meta's spacing between two messages to one person
        page = client.get(url).text
        assert 'id="lembra-compose-text"' in page and "lembra-compose-reason" not in page
        client.post(action, data={"csrf_token": csrf(page), "key": compose_key(page), "text": "Claro, sexta às 9h."})
        assert replies(rt, world.org_id)[-1].payload == {"text": "Claro, sexta às 9h."}
        assert send_due(rt) == ["sent"]
        assert graph.sends()[-1]["text"]["body"] == "Claro, sexta às 9h."

        # A day later the window closed again: the sentence says the patient wrote long ago.
        clock.advance(timedelta(hours=25))
        page = client.get(url).text
        assert "escreveu há mais de 24 horas" in page and 'id="lembra-compose-text"' not in page


def test_a_patient_who_opted_out_or_never_consented_gets_nothing(agent, webhooks, rt, tenants):
    a, _ = tenants
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-1")
    row_id = inbound_id(rt, a.world.org_id, "in-a-1")
    with rt.db.begin() as conn:
        opt_out(conn, a.world.org_id, a.contact_id, source="test")
    for url in (f"/admin/contacts/details/?id={a.contact_id}", f"/admin/conversations/{row_id}/"):
        page = agent.get(url).text
        assert "não consentiu em receber mensagens por este canal, ou pediu" in page, url
        assert 'id="lembra-compose-text"' not in page and 'id="lembra-reply-text"' not in page
        assert "Enviar o modelo aprovado" not in page
    page = agent.get(f"/admin/contacts/details/?id={a.contact_id}").text
    refused = agent.post(f"/admin/contacts/compose/{a.contact_id}/",
                         data={"csrf_token": csrf(page), "key": "a" * 32, "text": "Oi"})  # no form: a forged post
    assert "não consentiu" in agent.get(refused.headers["Location"]).text
    agent.post(f"/admin/conversations/{row_id}/reply/", data={"csrf_token": csrf(page), "key": "b" * 32, "text": "Oi"})

    never = a.world.contact(name="Sem Consentimento", phone="+5516988776655", consent=())
    page = agent.get(f"/admin/contacts/details/?id={never}").text
    assert "não consentiu em receber mensagens" in page and 'id="lembra-compose-text"' not in page
    agent.post(f"/admin/contacts/compose/{never}/", data={"csrf_token": csrf(page), "key": "c" * 32, "text": "Oi"})
    assert replies(rt, a.world.org_id) == []


def test_another_orgs_contact_and_conversation_answer_404_and_posts_need_csrf(agent, webhooks, rt, tenants):
    a, b = tenants
    sandbox_reply(webhooks, b, "segredo-da-b", "in-b-1")
    other = inbound_id(rt, b.world.org_id, "in-b-1")
    token = csrf(agent.get(f"/admin/contacts/details/?id={a.contact_id}").text)
    assert agent.post(f"/admin/contacts/compose/{b.contact_id}/",
                      data={"csrf_token": token, "key": "a" * 32, "text": "Oi"}).status_code == 404
    assert agent.get(f"/admin/conversations/{other}/thread/").status_code == 404
    assert agent.get(f"/admin/sandbox/thread/?contact={b.contact_id}").status_code == 404
    for bad in ("x", "0", "99999999999999999999"):
        assert agent.get(f"/admin/conversations/{bad}/thread/").status_code == 404
        assert agent.get(f"/admin/sandbox/thread/?contact={bad}").status_code == 404
    assert agent.get("/admin/sandbox/thread/").status_code == 404
    assert "segredo-da-b" not in agent.get("/admin/conversations/rows/?state=all").text
    assert agent.post(f"/admin/contacts/compose/{a.contact_id}/",
                      data={"key": "a" * 32, "text": "Oi"}).status_code == 400
    with rt.db.connect() as conn:
        assert conn.execute(select(messages.c.id).where(messages.c.purpose == "conversation_reply")).first() is None


def test_the_live_fragments_bring_a_new_message(agent, app, webhooks, rt, tenants):
    a, _ = tenants
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-1")
    row_id = inbound_id(rt, a.world.org_id, "in-a-1")
    page = agent.get(f"/admin/conversations/{row_id}/").text
    assert f'hx-get="/admin/conversations/{row_id}/thread/"' in page and 'hx-trigger="every 3s"' in page
    assert "vendor/htmx-2.0.11.min.js" in page and "desk/live.js" in page
    thread = agent.get(f"/admin/conversations/{row_id}/thread/")
    assert thread.status_code == 200 and FREE_TEXT in thread.text and "<html" not in thread.text
    rows = agent.get("/admin/conversations/rows/").text
    sandbox = agent.get(f"/admin/sandbox/thread/?contact={a.contact_id}").text
    assert "Tem estacionamento?" not in thread.text + rows + sandbox

    sandbox_reply(webhooks, a, "Tem estacionamento?", "in-a-2")
    assert "Tem estacionamento?" in agent.get(f"/admin/conversations/{row_id}/thread/").text
    rows = agent.get("/admin/conversations/rows/").text
    assert "Tem estacionamento?" in rows and FREE_TEXT in rows and "<html" not in rows
    sandbox = agent.get(f"/admin/sandbox/thread/?contact={a.contact_id}").text
    assert "Tem estacionamento?" in sandbox and "<html" not in sandbox
    assert 'hx-get="/admin/sandbox/thread/?contact=' in agent.get(f"/admin/sandbox/?contact={a.contact_id}").text
    assert 'hx-get="/admin/conversations/rows/' in agent.get("/admin/conversations/").text

    # Signed out, a fragment is the login, like its page.
    response = app.test_client().get(f"/admin/conversations/{row_id}/thread/")
    assert response.status_code == 302 and "/login" in response.headers["Location"]


def test_static_files_carry_the_vendored_htmx_and_the_live_script(app):
    client = app.test_client()
    for path, marker in (("vendor/htmx-2.0.11.min.js", b"htmx"), ("desk/live.js", b"htmx:beforeSwap")):
        response = client.get(f"/static/{path}")
        try:
            assert response.status_code == 200 and marker in response.get_data(), path
        finally:
            response.close()
