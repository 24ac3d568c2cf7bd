"""Issue 33, acceptance 1: the no-show rebook journey in a real browser, end to end.

The clinic's manager draws the flow in the builder with the mouse (palette → canvas, handles joined
by dragging, each step's form filled): a no-show starts it → Perguntar (the day and the period) →
Oferecer horários (the built-in agenda's free times) → Ação "book" (the picked time) → Fim. She plays
the patient in "Testar" (what was understood, the fields, the exit), publishes, lets the clinic's
assistant start it (Agentes: a trigger only starts flows an enabled agent may start), marks a sandbox
appointment as "Faltou" in the console as a receptionist would, answers as the patient in the
sandbox chat (the day, then one of the times offered): a new appointment is booked. Execuções shows
each step with the patient's reply and the fields taken from it.

Headless Debian Chromium, as the other browser tests; the engine's scheduler and sender run
in-process between the browser's steps (tests/flows/helpers.py `Flows.run`) on the test's clock.
Screenshots go to `test-artifacts/e2e/flow-builder/noshow.../`; with `LEMBRA_UPDATE_SCREENSHOTS=1`
(by hand, never in CI) the builder, the Testar panel and Execuções are copied to docs/screenshots/
(builder.png, testar.png, execucoes.png).
"""

from __future__ import annotations

import os
import re
import shutil
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` to run the browser test", allow_module_level=True)

from playwright import sync_api
from sqlalchemy import insert, select

from engine.flows.conversation.fields import create_field
from engine.people.agenda import create_professional
from engine.core import clock as engine_clock
from engine.store.models import agents, appointments, enrollments
from engine.tenants.orgs import create_user
from tests.e2e.test_flow_builder_browser import (  # noqa: F401 (fixtures)
    _connect, _drop, _node, _panel_field, _sign_in, artifacts, page, server)
from tests.factories import World
from tests.flows.helpers import DEBOUNCE, Flows

pytestmark = pytest.mark.timeout(240)
expect = sync_api.expect
DOCS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
EMAIL, PASSWORD = "gestora@bemviver.com.br", "senha-forte-e2e-2"
PATIENT, PHONE = "Mariana Alves", "+5516999887766"
SAO_PAULO = ZoneInfo("America/Sao_Paulo")


def _shot(tab, folder: Path, name: str) -> None:
    """The window (the builder at 1800x1000, the rest at 1280x800) to the artifacts; to
    docs/screenshots/ too on a run asked to refresh them."""
    path = folder / f"{name}.png"
    tab.screenshot(path=str(path))
    if os.environ.get("LEMBRA_UPDATE_SCREENSHOTS"):  # by hand, so a CI run never rewrites a tracked file
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS / path.name)


def _patient_says(tab, base: str, contact_id: int, flows: Flows, clock, text: str) -> None:
    """Type as the patient in the sandbox chat; the engine reads the turn once the debounce is over."""
    tab.goto(f"{base}/admin/sandbox/?contact={contact_id}")
    tab.fill("#lembra-reply", text)
    tab.get_by_role("button", name="Responder").click()
    expect(tab.locator("#lembra-thread")).to_contain_text(text)
    clock.advance(DEBOUNCE)
    flows.run()


def test_the_manager_builds_tests_publishes_and_a_no_show_is_rebooked(  # noqa: F811 (fixtures)
        rt, clock, server, page, artifacts) -> None:  # noqa: F811
    world = World(rt, slug="bem-viver", quiet_start="00:00", quiet_end="23:59", skip_sundays=False,
                  skip_holidays=False)
    world.channel("whatsapp")
    contact_id = world.contact(name=PATIENT, phone=PHONE, email=None, consent=("whatsapp",))
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email=EMAIL, role="manager", password=PASSWORD)
        create_field(conn, world.org_id, {"slug": "data", "label": "Data", "type": "date",
                                          "question": "Qual dia fica melhor para você?"})
        create_field(conn, world.org_id, {"slug": "periodo", "label": "Período", "type": "period",
                                          "question": "De manhã ou à tarde?"})
        professional = create_professional(conn, world.org_id, name="Dra. Beatriz Costa", slot_minutes=30,
                                           hours=[{"weekday": d, "starts": "08:00", "ends": "12:00"}
                                                  for d in range(5)]).id
    # This morning's 08:00 (the clock is Tuesday 01/12/2026 10:00 in São Paulo): the patient did not come.
    missed = world.appointment(contact_id, datetime(2026, 12, 1, 8, 0, tzinfo=SAO_PAULO),
                               professional_id=professional, refresh=False)
    flows = Flows(world)
    with rt.db.begin() as conn:  # the clinic's assistant, not yet allowed to start any flow
        agent_id = int(conn.execute(insert(agents).values(
            org_id=world.org_id, name="Assistente", handoff_policy="pause", followup_enabled=True,
            flow_pointer_ids=[], created_at=engine_clock.now(), updated_at=engine_clock.now(),
        ).returning(agents.c.id)).scalar_one())

    # --- 1. the manager draws the flow with the mouse -------------------------------------------------
    _sign_in(page, server, EMAIL, PASSWORD)
    page.goto(f"{server}/admin/followup/flows/")
    page.fill("#lembra-flow-name", "Remarcar quem faltou")
    page.get_by_role("button", name="Novo fluxo").click()
    expect(page.locator(".lf-builder")).to_be_visible()
    flow_id = int(re.search(r"/admin/followup/builder/(\d+)/", page.url).group(1))

    # Drawn on the fixture's wide window (1800x1000); the screenshots are taken at 1280x800.
    _drop(page, "trigger", 10, 20)
    expect(_node(page, "gatilho_1")).to_be_visible()
    _drop(page, "ask", 290, 20)
    for slug in ("data", "periodo"):
        _panel_field(page, "fields").locator(f'[data-add-chip="{slug}"]').click()
    expect(_node(page, "pergunta_1")).to_contain_text("Data, Período")
    _drop(page, "offer_slots", 570, 20)
    _panel_field(page, "date_field").locator("select").select_option("data")
    _panel_field(page, "period_field").locator("select").select_option("periodo")
    _drop(page, "do", 850, 20)
    page.locator("#lf-acao_2-action").select_option("book")
    _drop(page, "end", 850, 330)
    _panel_field(page, "outcome").locator("select").select_option("converted")
    _drop(page, "end", 290, 330)
    _panel_field(page, "outcome").locator("select").select_option("exhausted")

    _connect(page, "gatilho_1", "always", "pergunta_1")
    _connect(page, "pergunta_1", "complete", "acao_1")
    for exit_ in ("gave_up", "no_reply"):
        _connect(page, "pergunta_1", exit_, "fim_2")
    _connect(page, "acao_1", "ok", "acao_2")
    for exit_ in ("unavailable", "failed", "no_reply"):
        _connect(page, "acao_1", exit_, "fim_2")
    _connect(page, "acao_2", "ok", "fim_1")
    for exit_ in ("unavailable", "failed"):
        _connect(page, "acao_2", exit_, "fim_2")
    expect(page.locator(".react-flow__edge")).to_have_count(11)

    # The trigger: an appointment marked as a no-show (the flow's own settings, on the empty canvas).
    page.locator("[data-tab=config]").click()
    page.locator(".react-flow__pane").click(position={"x": 700, "y": 700})
    page.locator("#lf-trigger-kind").select_option("appointment")
    page.locator("#lf-trigger-appointment_event").select_option("no_show")
    expect(page.locator(".lf-builder")).to_have_attribute("data-dirty", "false")
    _shot(page, artifacts, "builder")  # the wide window: the whole flow beside its settings
    page.set_viewport_size({"width": 1280, "height": 800})

    # --- 2. Testar: the patient's replies, what was understood, the fields, the exit -------------------
    page.get_by_role("button", name="Testar", exact=True).click()
    panel = page.locator(".lf-rehearse")
    expect(panel.locator('[data-version="draft"]')).to_have_attribute("aria-pressed", "true")
    expect(panel.locator(".lf-bubble-bot")).to_have_text(["Qual dia fica melhor para você?"])
    box = panel.get_by_placeholder("Escreva como o paciente…")
    box.fill("pode ser quinta de manhã")
    box.press("Enter")
    expect(panel.locator(".lf-understood").first).to_have_text(
        re.compile(r"Data=03/12/2026 · Período=de manhã → saída Completo"))
    expect(panel.locator(".lf-bubble-bot").nth(1)).to_contain_text("Tenho estes horários livres:")
    box.fill("2")
    box.press("Enter")
    expect(panel.locator(".lf-understood").nth(1)).to_have_text(
        re.compile(r"horário=03/12/2026 \d\d:\d\d \(Dra. Beatriz Costa\) → saída Feito"))
    expect(panel.locator(".lf-rehearse-state")).to_have_text("Fim do fluxo: Convertido")
    _shot(page, artifacts, "testar")

    # --- 3. publish -----------------------------------------------------------------------------------
    page.get_by_role("button", name="Publicar").click()
    expect(page.locator(".lf-notice")).to_contain_text("Versão 1 publicada.")
    # The assistant may start it (Acompanhamento → Agentes: "Fluxos que pode iniciar").
    page.goto(f"{server}/admin/followup_agents/edit/?id={agent_id}")
    page.locator(f'#flow_ids input[value="{flow_id}"]').check()
    page.locator("form.admin-form input[type=submit].btn-primary").first.click()
    expect(page.locator("table tbody tr").filter(has_text="Assistente")).to_contain_text("Remarcar quem faltou")

    # --- 4. the receptionist marks the appointment as a no-show in the console --------------------------
    page.goto(f"{server}/admin/appointments/edit/?id={missed}")
    page.locator("select#status").select_option("no_show")
    page.locator("form.admin-form input[type=submit].btn-primary").first.click()
    expect(page.locator("table tbody tr").filter(has_text=PATIENT).first).to_contain_text("Faltou")
    with rt.db.connect() as conn:
        enrollment_id = conn.execute(select(enrollments.c.id).where(
            enrollments.c.org_id == world.org_id, enrollments.c.pointer_id == flow_id)).scalar_one()
    flows.run()  # the run starts: the question goes to the patient

    # --- 5. the patient answers in the sandbox chat and picks a time -------------------------------------
    page.goto(f"{server}/admin/sandbox/?contact={contact_id}")
    expect(page.locator("#lembra-thread")).to_contain_text("Qual dia fica melhor para você?")
    _patient_says(page, server, contact_id, flows, clock, "pode ser quinta de manhã")
    page.reload()
    expect(page.locator("#lembra-thread")).to_contain_text("Tenho estes horários livres:")
    _patient_says(page, server, contact_id, flows, clock, "2")
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.outcome) == ("completed", "converted")
    with rt.db.connect() as conn:
        booked = conn.execute(select(appointments).where(
            appointments.c.org_id == world.org_id, appointments.c.contact_id == contact_id,
            appointments.c.id != missed)).one()
    starts = booked.starts_at.astimezone(SAO_PAULO)
    assert (booked.status, booked.professional_id, starts.date().isoformat()) == (
        "scheduled", professional, "2026-12-03")
    assert 8 <= starts.hour < 12

    # --- 6. Execuções: each step with the patient's reply and the fields taken --------------------------
    page.goto(f"{server}/admin/followup_runs/?enrollment={enrollment_id}")
    expect(page.get_by_role("heading", name=re.compile(r"Execução #\d+"))).to_contain_text("Concluído")
    first, second = page.locator("#lembra-run-replies tbody tr").all()
    expect(first.locator("[data-reply-text]")).to_have_text("pode ser quinta de manhã")
    expect(first.locator("[data-reply-fields]")).to_have_text(re.compile(r"Data: 03/12/2026\s*Período: de manhã"))
    expect(second.locator("[data-reply-text]")).to_have_text("2")
    expect(second.locator("[data-reply-fields]")).to_have_text(f"horário: {starts:%d/%m/%Y %H:%M} (Dra. Beatriz Costa)")
    expect(second).to_contain_text(f"O paciente escolheu o horário {starts:%d/%m/%Y %H:%M}.")
    expect(page.locator("[data-collected]")).to_contain_text(f"horário: {starts:%d/%m/%Y %H:%M} (Dra. Beatriz Costa)")
    timeline = page.locator("#lembra-timeline")
    for node_name in ("Gatilho 1", "Perguntar 1", "Oferecer horários 1", "Ação 1"):
        step = timeline.locator("tr").filter(has_text="Etapa executada").filter(has_text=node_name)
        expect(step.first).to_be_visible()
    expect(timeline).to_contain_text("segue para Fim 1")
    _shot(page, artifacts, "execucoes")
