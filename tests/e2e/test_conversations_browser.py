"""Conversas in a real browser: a patient's free-text reply through the sandbox shows in the menu's
count and in the inbox; the receptionist opens it, sees the appointment it is about, answers, the
engine sends the answer once and the thread shows it sent; another reply is marked handled.

Headless Debian chromium through Playwright, with the server and page fixtures (and helpers) of
tests/e2e/test_console_browser.py. Every assertion is on text the user sees.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from engine.people.appointments import create_appointment
from engine.tenants.channels import create_channel
from engine.people.contacts import create_contact
from engine.messaging.inbound import process_inbound, receive
from engine.tenants.orgs import create_org, create_user
from gateway.contract import WebhookRequest
from tests.e2e.test_console_browser import Steps, _dispatch_due, expect, page, server  # noqa: F401  (fixtures)
from tests.factories import sandbox_headers

pytestmark = pytest.mark.timeout(180)
EMAIL, PASSWORD = "recepcao@bemviver.com.br", "senha-forte-e2e-2"
PATIENT, PHONE = "Mariana Alves", "+5516999887766"
FREE_TEXT = "Oi, posso remarcar para sexta?"


def _patient_writes(rt, channel_id: int, mid: str, text: str) -> None:
    """The patient's message, through the sandbox provider's webhook path (verify, store, act)."""
    body = json.dumps({"type": "message", "id": mid, "from": PHONE, "text": text}).encode()
    received = receive(rt, "sandbox", channel_id, WebhookRequest(
        method="POST", url="/webhooks/sandbox", headers=sandbox_headers(rt, channel_id), body=body))
    for inbound_id in received.inbound_ids:
        process_inbound(rt, inbound_id)


def test_a_receptionist_answers_a_free_text_reply(rt, clock, server, page) -> None:  # noqa: F811
    steps = Steps(page)
    with rt.db.begin() as conn:
        org_id = create_org(conn, slug="bem-viver", name="Clínica Bem Viver", state="SP")
        create_user(conn, org_id=org_id, email=EMAIL, role="agent", password=PASSWORD)
        channel_id = create_channel(conn, rt.keyring, org_id=org_id, kind="whatsapp", provider="sandbox",
                                    name="WhatsApp da recepção", is_default=True)
        contact_id = create_contact(conn, org_id=org_id, name=PATIENT, phone=PHONE, email=None,
                                    consent=("whatsapp",))
        create_appointment(conn, org_id=org_id, contact_id=contact_id, starts_at=clock.now() + timedelta(days=2),
                           professional="Dr. Paulo Lima")
    _patient_writes(rt, channel_id, "sbx-in-1", FREE_TEXT)
    _patient_writes(rt, channel_id, "sbx-in-2", "Vocês têm estacionamento?")

    page.goto(f"{server}/admin/")
    page.fill("#email", EMAIL)
    page.fill("#password", PASSWORD)
    page.get_by_role("button", name="Entrar").click()
    menu = page.get_by_role("link", name="Conversas (2)")
    expect(menu).to_be_visible()
    menu.click()
    row = page.locator("table tbody tr").filter(has_text=FREE_TEXT)
    expect(row).to_contain_text(PATIENT)
    expect(row).to_contain_text("Dr. Paulo Lima")
    expect(row).to_contain_text("WhatsApp da recepção")
    steps.shot("conversas")

    row.get_by_role("link", name=PATIENT).click()
    expect(page.locator("#lembra-appointment")).to_contain_text("Dr. Paulo Lima")
    expect(page.locator("#lembra-thread")).to_contain_text(FREE_TEXT)
    page.get_by_label(re.compile("Sua resposta")).fill("Pode sim, Mariana! Sexta às 10h serve?")
    page.get_by_role("button", name="Enviar resposta").click()
    expect(page.get_by_text("A resposta foi para a fila de envio")).to_be_visible()
    assert _dispatch_due(rt) == ["sent"]
    page.reload()
    bubble = page.locator(".lembra-msg.out").filter(has_text="Sexta às 10h serve?")
    expect(bubble).to_contain_text("Resposta da clínica")
    expect(bubble).to_contain_text("Enviada")
    expect(page.get_by_role("link", name=re.compile(r"^Conversas$"))).to_be_visible()  # both replies handled
    steps.shot("conversa-respondida")

    # A later question the clinic answers by phone: marked handled without replying here.
    _patient_writes(rt, channel_id, "sbx-in-3", "Obrigada! Levo os exames?")
    page.goto(f"{server}/admin/conversations/")
    expect(page.get_by_role("link", name="Conversas (1)")).to_be_visible()
    page.locator("table tbody tr").filter(has_text="Levo os exames").get_by_role("link", name=PATIENT).click()
    page.get_by_role("button", name="Marcar como resolvida").click()
    expect(page.get_by_text("1 conversa marcada como resolvida.")).to_be_visible()
    expect(page.get_by_role("link", name=re.compile(r"^Conversas$"))).to_be_visible()
    assert _dispatch_due(rt) == []  # nothing else went to the patient


def test_a_reply_the_flow_answered_is_not_left_for_the_receptionist(rt, clock, server, page) -> None:  # noqa: F811
    """Issue 30, point 5: a follow-up flow asks, the patient answers, the flow understands and
    answers. The receptionist is never told to answer it: it is under Resolvidas, resolved by
    the flow, with what the flow understood and did, on the run's appointment."""
    from engine.flows import triggers
    from tests.admin.test_conversations_flows import FLOW, STEP, graph
    from tests.factories import World
    from tests.flows.helpers import Flows

    steps = Steps(page)
    world = World(rt, slug="bem-viver", quiet_start="00:00", quiet_end="23:59", skip_sundays=False,
                  skip_holidays=False)
    channel_id = world.channel("whatsapp")
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email=EMAIL, role="agent", password=PASSWORD)
    contact_id = world.contact(name=PATIENT, phone=PHONE, email=None, consent=("whatsapp",))
    appointment_id = world.appointment(contact_id, clock.now() + timedelta(days=2), professional="Dr. Paulo Lima")
    flows = Flows(world)
    pointer = flows.flow(graph(), name=FLOW)
    with rt.db.begin() as conn:
        triggers.enroll(conn, world.org_id, pointer, contact_id, trigger_kind="manual", trigger_key="manual:e2e",
                        appointment_id=appointment_id, automatic=False)
    flows.run()  # the flow asks its question
    clock.advance(timedelta(minutes=1))
    _patient_writes(rt, channel_id, "sbx-flow-1", FREE_TEXT)  # stored; the flow has not read it yet

    page.goto(f"{server}/admin/")
    page.fill("#email", EMAIL)
    page.fill("#password", PASSWORD)
    page.get_by_role("button", name="Entrar").click()
    conversas = page.get_by_role("link", name=re.compile(r"^Conversas$"))
    expect(conversas).to_be_visible()  # no count: nothing waits for the receptionist
    conversas.click()
    expect(page.get_by_text("Nenhuma conversa esperando resposta.")).to_be_visible()

    clock.advance(timedelta(seconds=2))
    flows.run()  # the worker reads it: reschedule → the rebooking message goes out
    page.get_by_role("link", name="Resolvidas").click()
    row = page.locator("table tbody tr").filter(has_text=FREE_TEXT)
    expect(row).to_contain_text("Resolvida pelo fluxo")
    expect(row).to_contain_text(f"O fluxo {FLOW} entendeu a resposta como “reschedule”")
    expect(row).to_contain_text("Dr. Paulo Lima")
    expect(row).not_to_contain_text("sem usar uma palavra-chave")
    steps.shot("conversas-resolvida-pelo-fluxo")

    row.get_by_role("link", name=PATIENT).click()
    expect(page.locator("#lembra-sender")).to_contain_text("Resolvida pelo fluxo")
    expect(page.locator("#lembra-flow")).to_contain_text(f"seguiu para a etapa “{STEP}”")
    expect(page.locator("#lembra-appointment")).to_contain_text("Dr. Paulo Lima")
    expect(page.locator(".lembra-msg.out").filter(has_text="Sentimos sua falta na consulta")).to_contain_text(
        "Enviada")
    expect(page.get_by_role("button", name="Marcar como resolvida")).to_have_count(0)
    page.get_by_role("link", name=re.compile(f"Ver a execução de {FLOW}")).click()
    expect(page.locator("#lembra-timeline")).to_contain_text("A resposta do paciente foi entendida como reschedule.")
    steps.shot("execucao-do-fluxo")


def test_a_conversation_shows_a_new_message_by_itself_at_the_bottom(rt, clock, server, page) -> None:  # noqa: F811
    """Issue 33 (desk): the conversation page polls its thread (htmx, a static script: the CSP
    allows no inline one). It opens at the newest message; a message the patient sends while it
    is open (through the engine's inbound path) appears without a reload, still at the bottom."""
    refused: list[str] = []
    page.on("console", lambda msg: refused.append(msg.text) if "Content Security Policy" in msg.text else None)
    with rt.db.begin() as conn:
        org_id = create_org(conn, slug="bem-viver", name="Clínica Bem Viver", state="SP")
        create_user(conn, org_id=org_id, email=EMAIL, role="agent", password=PASSWORD)
        channel_id = create_channel(conn, rt.keyring, org_id=org_id, kind="whatsapp", provider="sandbox",
                                    name="WhatsApp da recepção", is_default=True)
        create_contact(conn, org_id=org_id, name=PATIENT, phone=PHONE, email=None, consent=("whatsapp",))
    for n in range(6):  # enough bubbles for the thread to scroll
        _patient_writes(rt, channel_id, f"sbx-live-{n}", f"Mensagem {n}\nsegunda linha\nterceira linha")

    page.goto(f"{server}/admin/")
    page.fill("#email", EMAIL)
    page.fill("#password", PASSWORD)
    page.get_by_role("button", name="Entrar").click()
    page.get_by_role("link", name="Conversas (6)").click()
    page.locator("table tbody tr").filter(has_text="Mensagem 5").get_by_role("link", name=PATIENT).click()
    thread = page.locator("#lembra-thread")
    expect(thread).to_contain_text("Mensagem 5")
    at_bottom = "t => t.scrollHeight > t.clientHeight && t.scrollHeight - t.scrollTop - t.clientHeight < 4"
    # The page's script scrolls the thread once it has run, which on a busy machine can come after
    # the text shows: wait for it (a page that never scrolls down still fails, after the timeout).
    page.wait_for_function(f"() => ({at_bottom})(document.getElementById('lembra-thread'))")
    assert thread.evaluate(at_bottom), "the conversation opens at its newest message"
    page.evaluate("window.lembraNoReload = true")

    _patient_writes(rt, channel_id, "sbx-live-new", "Chegou agora: posso levar meu filho?")
    expect(thread.locator(".lembra-msg").last).to_contain_text("Chegou agora")
    page.wait_for_function(f"() => ({at_bottom})(document.getElementById('lembra-thread'))")
    assert page.evaluate("window.lembraNoReload === true"), "the page was not reloaded"
    assert refused == [], refused
