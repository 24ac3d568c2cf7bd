"""Conversas and a follow-up flow that reads the patient's reply (issue 30, point 5), as the
receptionist sees it: a reply the flow classified and answered is never "Para responder" (not
before the worker's step, not after), it is under Resolvidas with what the flow understood and
did, on the run's appointment; a reply the flow did not understand, or that no flow waits for,
is "Para responder"; the other clinic sees none of it.

Replies come through the sandbox webhook (verify, store, act in the request, as in production
with the inbound actor); the flow's steps run in-process (tests/flows/helpers.py)."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from engine.flows import triggers
from engine.store.models import appointments, enrollments
from engine.tenants.orgs import create_user
from tests.admin.conftest import csrf, login
from tests.admin.test_conversations import FREE_TEXT, inbound_id, sandbox_reply
from tests.flows.helpers import Flows, edge, node

FLOW = "Retorno pós-consulta"
STEP = "Mandar o link para remarcar"
FREE_TEXT_NOTE = "O paciente escreveu sem usar uma palavra-chave"


def graph() -> dict:
    remarcar = node("remarcar", "action", mode="template", template="followup_rebook")
    remarcar["label"] = STEP
    return {
        "nodes": [
            node("inicio", "trigger"),
            node("pergunta", "action", mode="template", template="followup_checkin"),
            node("resposta", "ai_classify", classes=["confirm", "reschedule"], grace_minutes=1440),
            node("confirmou", "end", outcome="converted"), remarcar, node("remarcou", "end", outcome="custom"),
            node("calado", "end", outcome="exhausted"), node("outro", "end", outcome="custom"),
        ],
        "edges": [
            edge("inicio", "pergunta"), edge("pergunta", "resposta"),
            edge("resposta", "confirmou", "class_match", "confirm"),
            edge("resposta", "remarcar", "class_match", "reschedule"), edge("remarcar", "remarcou"),
            edge("resposta", "calado", "no_reply"), edge("resposta", "outro"),
        ],
    }


def text_of(response) -> str:
    return html.unescape(response.get_data(as_text=True))


@pytest.fixture
def asked(rt, tenants, clock):
    """A's patient is in the flow, about A's appointment, and was asked the question; their
    past appointment was cancelled (a reply must not be filed under it)."""
    a, _ = tenants
    flows = Flows(a.world)
    pointer = flows.flow(graph(), name=FLOW)
    with rt.db.begin() as conn:
        run = triggers.enroll(conn, a.world.org_id, pointer, a.contact_id, trigger_kind="manual",
                              trigger_key="manual:1", appointment_id=a.appointment_id, automatic=False).enrollment_id
    past = a.world.appointment(a.contact_id, clock.now() - timedelta(days=1), refresh=False)
    with rt.db.begin() as conn:
        conn.execute(update(appointments).where(appointments.c.id == past).values(status="cancelled"))
    flows.run()
    with rt.db.connect() as conn:
        assert conn.execute(select(enrollments.c.status).where(enrollments.c.id == run)).scalar_one() == "waiting_reply"
    return flows, run


@pytest.fixture
def webhooks(app):
    return app.test_client()


def test_a_reply_the_flow_classified_and_answered_is_never_para_responder(agent, webhooks, rt, tenants, asked,
                                                                        clock):
    a, _ = tenants
    flows, run = asked
    clock.advance(timedelta(minutes=5))
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-flow")
    reply = inbound_id(rt, a.world.org_id, "in-a-flow")

    # Stored and processed, not yet read by the worker: nobody is told to answer it.
    page = text_of(agent.get("/admin/conversations/"))
    assert FREE_TEXT not in page and "Conversas (" not in page
    row = text_of(agent.get("/admin/conversations/?state=all"))
    assert FREE_TEXT in row and "Com o fluxo" in row and f"O fluxo {FLOW} está lendo esta resposta" in row
    assert FREE_TEXT_NOTE not in row

    clock.advance(timedelta(seconds=2))
    flows.run()  # the worker reads it: reschedule → the rebooking message goes out
    page = text_of(agent.get("/admin/conversations/"))
    assert FREE_TEXT not in page and "Conversas (" not in page
    handled = text_of(agent.get("/admin/conversations/?state=handled"))
    understood = f"O fluxo {FLOW} entendeu a resposta como “reschedule” e seguiu para a etapa “{STEP}”."
    assert FREE_TEXT in handled and "Resolvida pelo fluxo" in handled and understood in handled
    assert FREE_TEXT_NOTE not in handled
    assert f'href="/admin/appointments/details/?id={a.appointment_id}"' in handled  # the run's appointment

    details = text_of(agent.get(f"/admin/conversations/{reply}/"))
    assert "Resolvida pelo fluxo" in details and "Para responder" not in details
    assert understood in details and FREE_TEXT_NOTE not in details
    assert f"o fluxo {FLOW}" in details and f"/admin/followup_runs/?enrollment={run}" in details
    assert f'href="/admin/appointments/details/?id={a.appointment_id}"' in details
    thread = details[details.index('id="lembra-thread"'):]
    question, answer = thread.index("ficou alguma dúvida"), thread.index("Sentimos sua falta na consulta")
    assert question < thread.index(FREE_TEXT) < thread.index(understood) < answer  # what the flow did, in order
    assert "Marcar como resolvida" not in details
    assert 'class="lembra-msg in waiting"' not in details


def test_a_reply_the_flow_did_not_understand_is_para_responder_with_what_the_flow_did(agent, webhooks, rt, tenants,
                                                                                    asked):
    a, _ = tenants
    flows, _run = asked
    sandbox_reply(webhooks, a, "Quem está falando?", "in-a-odd")
    reply = inbound_id(rt, a.world.org_id, "in-a-odd")
    assert "Quem está falando?" not in text_of(agent.get("/admin/conversations/"))
    flows.run()  # no class fits: the fallback edge, and the reply is left to a person
    page = text_of(agent.get("/admin/conversations/"))
    assert "Quem está falando?" in page and "Conversas (1)" in page and "Para responder" in page
    assert f"O fluxo {FLOW} não entendeu esta resposta e seguiu pela saída “Outra resposta”" in page
    details = text_of(agent.get(f"/admin/conversations/{reply}/"))
    assert "Marcar como resolvida" in details and 'class="lembra-msg in waiting"' in details
    assert 'id="lembra-reply-text"' in details


def test_a_reply_no_flow_waits_for_is_para_responder_as_before(agent, webhooks, rt, tenants):
    a, _ = tenants
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-plain")
    page = text_of(agent.get("/admin/conversations/"))
    assert FREE_TEXT in page and "Conversas (1)" in page and FREE_TEXT_NOTE in page and "Para responder" in page
    assert "O fluxo " not in page


def test_the_other_clinic_sees_none_of_it(app, webhooks, rt, tenants, asked):
    a, b = tenants
    flows, _run = asked
    with rt.db.begin() as conn:
        create_user(conn, org_id=b.world.org_id, email="agent@b.com.br", role="agent", password="senha-forte-a")
    b_agent = login(app.test_client(), "agent@b.com.br")
    sandbox_reply(webhooks, a, FREE_TEXT, "in-a-flow")
    sandbox_reply(webhooks, b, "mensagem-so-da-b", "in-b-1")
    flows.run()
    reply = inbound_id(rt, a.world.org_id, "in-a-flow")
    for state in ("open", "handled", "all"):
        page = text_of(b_agent.get(f"/admin/conversations/?state={state}"))
        assert FREE_TEXT not in page and FLOW not in page and "Paciente Da A" not in page
    assert "Conversas (1)" in text_of(b_agent.get("/admin/conversations/"))  # B's own reply only
    assert b_agent.get(f"/admin/conversations/{reply}/").status_code == 404
    token = csrf(text_of(b_agent.get("/admin/conversations/")))
    assert b_agent.post(f"/admin/conversations/{reply}/handled/", data={"csrf_token": token}).status_code == 404
