"""Issue 10, acceptance 1 (followup-spec §10.4): a clinic owner draws a follow-up flow in the visual
builder with the mouse, publishes it, sees the validator's error on the right step, fixes it,
publishes, reloads and finds the same graph; then a patient goes through it: she enters the flow
(as its trigger would enroll her), the wait passes (the test's clock), the message shows in the sandbox chat, the
follow-up queue shows the run waiting for a reply, a hand-off from the sandbox chat pauses it and
ending it resumes it, the patient's reply typed in the sandbox is classified and routed to the
right end, and the run's timeline shows each transition. A second test edits every step type in the
side panel (forms built from the engine's JSON Schema) and the flow's own settings, checks what was
stored, and opens the flow as an agent: read-only.

Headless Debian Chromium (`/usr/bin/chromium`, driven by Playwright through `executable_path`;
never `playwright install`) on the real app served on a loopback port; the engine's scheduler and
sender run in-process between the browser's steps (tests/flows/helpers.py `Flows.run`). Every
assertion is on what the user sees, plus the stored draft for the reload. Screenshots go to
`test-artifacts/e2e/flow-builder/<test>/`; `docs/screenshots/flow-builder.png` is a copy of the published
flow's, refreshed by a run with `LEMBRA_UPDATE_SCREENSHOTS=1`.

Runs on both backends: `pytest tests/e2e/test_flow_builder_browser.py` (SQLite) and with
`LEMBRA_TEST_DATABASE_URL` / `LEMBRA_TEST_BROKER_URL` (PostgreSQL + Redis).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"  # Debian's package; Playwright never downloads a browser here
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` (.ci/run does) to run the browser test",
                allow_module_level=True)

from playwright import sync_api
from sqlalchemy import insert, select

from admin.app import create_app
from engine.core import clock as engine_clock
from engine.flows.conversation.fields import create_field
from engine.flows import triggers, versions
from engine.store.models import flow_pointers, templates
from engine.tenants.orgs import create_user
from tests.e2e.live import CHROMIUM_ARGS, serve
from tests.factories import World
from tests.flows.helpers import Flows

pytestmark = pytest.mark.timeout(240)
expect = sync_api.expect
expect.set_options(timeout=15_000)

# The same browser switches as tests/e2e/test_console_browser.py (one Chromium setup for the suite).
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "e2e" / "flow-builder"
SCREENSHOT = ROOT / "docs" / "screenshots" / "flow-builder.png"
EMAIL, PASSWORD = "gestora@bemviver.com.br", "senha-forte-e2e-2"
PATIENT = "Mariana Alves"
FLOW = "Pós-consulta: como você está?"
TEMPLATE_BODY = "Olá {{ nome }}! Como você está depois da consulta? Se precisar, podemos remarcar o retorno."


@pytest.fixture
def server(rt, clock) -> Iterator[str]:
    """The real app on a free loopback port, threaded, in a background thread."""
    # The engine's clock is the test's: a Tuesday at 10:00 in São Paulo, so the follow-up goes out in
    # the clinic's sending hours whenever the suite runs (the browser's own time does not matter here).
    clock.set(datetime(2026, 12, 1, 13, 0, tzinfo=UTC))
    app = create_app(rt)
    with serve(app, "lembra-e2e-builder") as url:
        yield url


@pytest.fixture
def artifacts(request) -> Path:
    """This test's screenshot folder, emptied: test-artifacts/e2e/flow-builder/<test>/."""
    folder = ARTIFACTS / request.node.name.removeprefix("test_")[:60]
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    return folder


@pytest.fixture
def page(artifacts: Path) -> Iterator[object]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1800, "height": 1000}, locale="pt-BR",
                                      timezone_id="America/Sao_Paulo")
        context.set_default_timeout(15_000)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        def console(message: object) -> None:
            # A style or script the CSP refused, or React Flow saying the graph and the handles disagree.
            if "Content Security Policy" in message.text or message.text.startswith("[React Flow]"):
                errors.append(message.text)

        page.on("console", console)
        try:
            yield page
        finally:
            try:
                page.screenshot(path=str(artifacts / "zz-last-page.png"), full_page=True)
            except sync_api.Error:
                pass
            context.close()
            browser.close()
        assert not errors, f"JavaScript errors, CSP refusals or React Flow warnings: {errors}"


class Steps:
    """Numbered full-page screenshots, one per step."""

    def __init__(self, page: object, folder: Path) -> None:
        self.page, self.folder, self.n = page, folder, 0

    def shot(self, name: str) -> Path:
        self.n += 1
        path = self.folder / f"{self.n:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def _center(box: dict) -> tuple[float, float]:
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def _drop(page, node_type: str, left: int, top: int) -> None:
    """Drag a step from the palette and let go so that the step's top left corner lands at (left,
    top) of the canvas (the builder puts the pointer 90 px into the step and 30 px down)."""
    page.locator(f'[data-palette="{node_type}"]').drag_to(page.locator(".lf-canvas"),
                                                          target_position={"x": left + 90, "y": top + 30})


def _connect(page, source: str, handle: str, target: str) -> None:
    """Press on an output's handle, move to the next step's input and let go, as a person does."""
    out = page.locator(f'.react-flow__node[data-id="{source}"] .react-flow__handle.source[data-handleid="{handle}"]')
    into = page.locator(f'.react-flow__node[data-id="{target}"] .react-flow__handle.target')
    x1, y1 = _center(out.bounding_box())
    x2, y2 = _center(into.bounding_box())
    page.mouse.move(x1, y1)
    page.mouse.down()
    page.mouse.move((x1 + x2) / 2, (y1 + y2) / 2 + 10, steps=8)
    page.mouse.move(x2, y2, steps=8)
    page.mouse.up()


def _open_menu(page, server: str, name: str) -> None:
    """Open a console page by its menu entry (the menu says where each view lives)."""
    href = page.locator("nav a.dropdown-item, nav a.nav-link").filter(has_text=name).first.get_attribute("href")
    page.goto(f"{server}{href}" if href.startswith("/") else href)


def _node(page, node_id: str):
    return page.locator(f'.lf-node[data-node-id="{node_id}"]')


def _panel_field(page, name: str):
    return page.locator(f'[data-panel="node"] [data-field="{name}"]')


def _positions(page) -> list[tuple[str, str]]:
    return page.locator(".react-flow__node").evaluate_all(
        "nodes => nodes.map(n => [n.dataset.id, n.style.transform]).sort()")


def _draft(rt, flow_id: int) -> dict:
    with rt.db.connect() as conn:
        return conn.execute(select(flow_pointers.c.draft_graph).where(flow_pointers.c.id == flow_id)).scalar_one()


def test_owner_draws_publishes_and_runs_a_follow_up_flow(rt, clock, server, page, artifacts) -> None:
    steps = Steps(page, artifacts)
    world = World(rt, slug="bem-viver")
    world.channel("whatsapp")
    contact_id = world.contact(name=PATIENT, phone="+5516999887766", email=None, consent=("whatsapp",))
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email=EMAIL, role="owner", password=PASSWORD)
        conn.execute(insert(templates).values(org_id=world.org_id, key="checkin_pos_consulta", channel_kind="whatsapp",
                                              locale="pt_BR", body=TEMPLATE_BODY, updated_at=engine_clock.now()))

    # --- sign in, create the flow from the list ---------------------------------------------------
    page.goto(f"{server}/login")
    page.fill("input[name=email]", EMAIL)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    _open_menu(page, server, "Fluxos de follow-up")
    expect(page.get_by_text("Nenhum fluxo ainda.")).to_be_visible()
    page.fill("#lembra-flow-name", FLOW)
    page.get_by_role("button", name="Novo fluxo").click()
    expect(page.locator(".lf-builder")).to_be_visible()
    expect(page.locator(".lf-flow-name")).to_have_text(FLOW)
    flow_id = int(re.search(r"/admin/followup/builder/(\d+)/", page.url).group(1))
    for name in ("Gatilho", "Esperar", "Condição", "Classificar resposta (IA)", "Enviar mensagem", "Fim"):
        expect(page.locator(".lf-palette")).to_contain_text(name)

    # --- draw it with the mouse ---------------------------------------------------------------------
    _drop(page, "trigger", 20, 140)
    expect(_node(page, "gatilho_1")).to_be_visible()
    _drop(page, "wait", 250, 140)
    expect(_node(page, "espera_1")).to_be_visible()
    duration = _panel_field(page, "minutes")  # a new step opens in the side panel
    duration.locator('input[data-unit="days"]').fill("0")
    duration.locator('input[data-unit="hours"]').fill("3")
    expect(_node(page, "espera_1")).to_contain_text("3 horas")
    _drop(page, "action", 480, 140)
    expect(_node(page, "mensagem_1")).to_be_visible()  # its template is left unchosen for now
    _drop(page, "ai_classify", 740, 140)
    classes = _panel_field(page, "classes").locator("input")
    classes.fill("remarcar")
    classes.press("Enter")
    expect(_node(page, "classificar_1").locator('[data-output="class:remarcar"]')).to_have_text("remarcar")
    _drop(page, "end", 1000, 30)
    expect(_node(page, "fim_1").locator(".lf-node-label")).to_have_text("Fim 1")  # named in words; its id a slug
    _panel_field(page, "outcome").locator("select").select_option("converted")  # a new end has no outcome yet
    _drop(page, "end", 1000, 320)
    _panel_field(page, "outcome").locator("select").select_option("exhausted")
    expect(_node(page, "fim_2")).to_contain_text("Esgotado")

    _connect(page, "gatilho_1", "always", "espera_1")
    _connect(page, "espera_1", "always", "mensagem_1")
    _connect(page, "mensagem_1", "always", "classificar_1")
    _connect(page, "classificar_1", "class:remarcar", "fim_1")
    _connect(page, "classificar_1", "no_reply", "fim_2")
    _connect(page, "classificar_1", "always", "fim_2")
    expect(page.locator(".react-flow__edge")).to_have_count(6)
    labels = page.locator(".react-flow__edge-text")
    for text in ("Sempre", "remarcar", "Sem resposta", "Outra resposta"):
        expect(labels.filter(has_text=text).first).to_be_visible()
    expect(page.locator(".lf-save-state")).to_contain_text("Rascunho salvo às")  # auto-saved
    steps.shot("desenhado")

    # --- publish: the validator's error lands on the message step ---------------------------------
    page.get_by_role("button", name="Publicar").click()
    expect(page.locator(".lf-notice")).to_contain_text("O fluxo não foi publicado")
    expect(_node(page, "mensagem_1").locator(".lf-badge")).to_be_visible()
    expect(page.locator(".lf-badge")).to_have_count(1)  # only the step that is wrong
    expect(_node(page, "mensagem_1")).to_contain_text("campo obrigatório")
    issue = page.locator('.lf-issues [data-issue-node="mensagem_1"]')
    expect(issue).to_contain_text("template")
    steps.shot("erro-na-etapa")

    # --- fix it from the problem list, publish --------------------------------------------------------
    issue.locator("button").click()  # the list selects the step it is about
    expect(page.locator('.react-flow__node[data-id="mensagem_1"]')).to_have_class(re.compile(r"\bselected\b"))
    expect(page.locator('[data-panel="node"][data-node-id="mensagem_1"]')).to_be_visible()
    page.select_option("#lf-mensagem_1-template", "checkin_pos_consulta")
    expect(page.locator(".lf-preview")).to_contain_text("Olá Ana! Como você está depois da consulta?")
    page.get_by_role("button", name="Publicar").click()
    expect(page.locator(".lf-notice")).to_contain_text("Versão 1 publicada.")
    expect(page.locator(".lf-status")).to_have_text("Publicado · v1")
    expect(page.locator(".lf-badge")).to_have_count(0)
    page.locator("[data-tab=history]").click()
    expect(page.locator('.lf-history [data-version="1"]')).to_contain_text(EMAIL)
    page.locator("[data-tab=config]").click()
    page.locator(".react-flow__pane").click(position={"x": 20, "y": 20})  # nothing selected: the flow's settings
    expect(page.locator('[data-panel="settings"]')).to_be_visible()
    page.get_by_role("button", name="Ajustar à tela").click()
    page.wait_for_timeout(400)  # the fit's animation
    published = steps.shot("publicado")
    if os.environ.get("LEMBRA_UPDATE_SCREENSHOTS"):  # by hand, so a CI run never rewrites a tracked file
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(published, SCREENSHOT)

    # --- reload: the same graph -----------------------------------------------------------------------
    before_positions = _positions(page)
    saved = _draft(rt, flow_id)
    assert [n["id"] for n in saved["nodes"]] == ["gatilho_1", "espera_1", "mensagem_1", "classificar_1", "fim_1",
                                                 "fim_2"]
    assert all(set(n) <= {"id", "type", "label", "position", "config"} for n in saved["nodes"])
    page.reload()
    expect(page.locator(".react-flow__edge")).to_have_count(6)
    assert _positions(page) == before_positions
    expect(_node(page, "espera_1")).to_contain_text("3 horas")
    expect(_node(page, "classificar_1").locator('[data-output="class:remarcar"]')).to_be_visible()
    page.wait_for_timeout(2000)  # longer than the auto-save's delay: opening the page saves nothing
    expect(page.locator(".lf-builder")).to_have_attribute("data-dirty", "false")
    assert _draft(rt, flow_id) == saved
    steps.shot("recarregado")

    # --- the patient enters (as the flow's trigger would enroll her), the wait passes ------------------
    with rt.db.begin() as conn:
        enrollment_id = triggers.enroll(conn, world.org_id, flow_id, contact_id, trigger_kind="manual",
                                        trigger_key="e2e-1", automatic=False).enrollment_id
    assert enrollment_id is not None
    run_url = f"/admin/followup_runs/?enrollment={enrollment_id}"
    flows = Flows(world)
    flows.run()  # trigger → the 3 h wait
    clock.advance(timedelta(hours=3, minutes=1))
    flows.run()  # the wait is over: the message goes out, the run waits for the reply
    page.goto(f"{server}/admin/sandbox/?contact={contact_id}")
    expect(page.locator("#lembra-thread")).to_contain_text("Como você está depois da consulta?")
    steps.shot("mensagem-no-sandbox")

    # --- the queue shows it waiting; a hand-off pauses it and ending it resumes it ------------------------
    _open_menu(page, server, "Fila de follow-ups")
    row = page.locator("table tbody tr").filter(has_text=PATIENT)
    expect(row).to_contain_text("Aguardando resposta")
    expect(row).to_contain_text(FLOW)
    page.goto(f"{server}/admin/sandbox/?contact={contact_id}")
    page.get_by_role("button", name="Assumir a conversa (atendimento humano)").click()
    expect(page.get_by_text("Atendimento humano em andamento")).to_be_visible()
    _open_menu(page, server, "Fila de follow-ups")
    expect(page.locator("table tbody tr").filter(has_text=PATIENT)).to_contain_text("Pausado: atendimento humano")
    steps.shot("fila-pausado")
    page.goto(f"{server}/admin/sandbox/?contact={contact_id}")
    page.get_by_role("button", name="Encerrar atendimento humano").click()
    expect(page.get_by_role("button", name="Assumir a conversa (atendimento humano)")).to_be_visible()
    _open_menu(page, server, "Fila de follow-ups")  # back to waiting, its grace (30 min) not over yet
    expect(page.locator("table tbody tr").filter(has_text=PATIENT)).to_contain_text("Aguardando resposta")

    # --- the patient answers in the sandbox: classified, routed to the right end ---------------------------
    page.goto(f"{server}/admin/sandbox/?contact={contact_id}")
    page.fill("#lembra-reply", "Oi! Preciso remarcar para outro dia, pode ser?")
    page.get_by_role("button", name="Responder").click()
    flows.run()
    row = flows.enrollment(enrollment_id)
    assert (row.status, row.current_node_id, row.outcome) == ("completed", "fim_1", "converted")

    # --- the run's timeline shows each transition -----------------------------------------------------------
    page.goto(f"{server}{run_url}")
    expect(page.get_by_role("heading", name=re.compile(r"Execução #\d+"))).to_contain_text("Concluído")
    timeline = page.locator("#lembra-timeline")
    for sentence in ("O paciente entrou no fluxo.", "O fluxo começou.", "A espera terminou.",
                     "A mensagem foi para a fila de envio.", "Uma pessoa da equipe assumiu a conversa.", "Retomado",
                     "A resposta do paciente foi entendida como remarcar.", "segue para Fim 1"):
        expect(timeline).to_contain_text(sentence)
    steps.shot("execucao")


EVERY_STEP = {
    "nodes": [
        {"id": "inicio", "type": "trigger", "position": {"x": 0, "y": 120}, "config": {}},
        {"id": "espera", "type": "wait", "position": {"x": 230, "y": 120}, "config": {"mode": "fixed", "minutes": 60}},
        {"id": "confere", "type": "condition", "position": {"x": 460, "y": 120},
         "config": {"checks": [{"field": "enrollment.replies", "op": "eq", "value": 0}], "combinator": "all"}},
        {"id": "escreve", "type": "action", "position": {"x": 690, "y": 20},
         "config": {"mode": "template", "template": "checkin_pos_consulta"}},
        {"id": "entende", "type": "ai_classify", "position": {"x": 690, "y": 240},
         "config": {"classes": ["remarcar"], "grace_minutes": 60}},
        {"id": "fim", "type": "end", "position": {"x": 940, "y": 120}, "config": {"outcome": "converted"}},
    ],
    "edges": [
        {"id": "a", "source": "inicio", "target": "espera", "condition": {"type": "always"}},
        {"id": "b", "source": "espera", "target": "confere", "condition": {"type": "always"}},
        {"id": "c", "source": "confere", "target": "escreve", "condition": {"type": "cond_result", "value": True}},
        {"id": "d", "source": "confere", "target": "entende", "condition": {"type": "cond_result", "value": False}},
        {"id": "e", "source": "escreve", "target": "fim", "condition": {"type": "always"}},
        {"id": "f", "source": "entende", "target": "fim", "condition": {"type": "class_match", "value": "remarcar"}},
    ],
}


def _sign_in(page, server: str, email: str, password: str) -> None:
    page.goto(f"{server}/login")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    expect(page.locator("nav")).to_contain_text(email)


def _saved(rt, flow_id: int, page) -> dict:
    """The flow as stored once the builder's auto-save has caught up with the last change."""
    expect(page.locator(".lf-builder")).to_have_attribute("data-dirty", "false")
    expect(page.locator(".lf-save-state")).to_contain_text("Rascunho salvo às")
    with rt.db.connect() as conn:
        return conn.execute(select(flow_pointers).where(flow_pointers.c.id == flow_id)).one()


def _select(page, node_id: str) -> None:
    page.locator(f'.react-flow__node[data-id="{node_id}"] .lf-node-label').click()
    expect(page.locator(f'[data-panel="node"][data-node-id="{node_id}"]')).to_be_visible()


def test_the_side_panel_edits_each_step_with_real_controls_and_an_agent_only_reads(rt, clock, server, page,
                                                                                   artifacts) -> None:
    steps = Steps(page, artifacts)
    world = World(rt, slug="bem-viver")
    world.channel("whatsapp")
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email=EMAIL, role="owner", password=PASSWORD)
        create_user(conn, org_id=world.org_id, email="recepcao@bemviver.com.br", role="agent", password=PASSWORD)
        conn.execute(insert(templates).values(org_id=world.org_id, key="checkin_pos_consulta", channel_kind="whatsapp",
                                              locale="pt_BR", body=TEMPLATE_BODY, updated_at=engine_clock.now()))
    flow_id = Flows(world).flow(EVERY_STEP, name=FLOW, publish=False, agent=False)

    _sign_in(page, server, EMAIL, PASSWORD)
    page.goto(f"{server}/admin/followup/builder/{flow_id}/")
    expect(page.locator(".react-flow__edge")).to_have_count(6)
    for text in ("Sim", "Não", "remarcar", "Sempre"):
        expect(page.locator(".react-flow__edge-text").filter(has_text=text).first).to_be_visible()

    # A condition: field, operation and value are selects and inputs of the engine's check schema.
    _select(page, "confere")
    check = page.locator('[data-panel="node"] [data-check="0"]')
    check.locator("select").nth(0).select_option("contact.stage")
    expect(check.locator("select").nth(1).locator("option")).to_contain_text(["é igual a", "é diferente de",
                                                                               "é um destes"])
    check.locator("input").fill("lead")
    # A wait switched to the AI's plan: minimum and maximum in days, hours and minutes.
    _select(page, "espera")
    _panel_field(page, "mode").locator("select").select_option("smart")
    for name, days in (("min_minutes", "1"), ("max_minutes", "3")):
        field = _panel_field(page, name)
        field.locator('input[data-unit="days"]').fill(days)
        field.locator('input[data-unit="hours"]').fill("0")
        field.locator('input[data-unit="minutes"]').fill("0")
    expect(_node(page, "espera")).to_contain_text("1 dia – 3 dias")
    # A message written by the AI, with a fallback template from the picker and its preview.
    _select(page, "escreve")
    _panel_field(page, "mode").locator("select").select_option("ai_message")
    _panel_field(page, "prompt_hint").locator("textarea").fill("Pergunte com carinho como o paciente está.")
    page.select_option("#lf-escreve-fallback_template", "checkin_pos_consulta")
    expect(_panel_field(page, "fallback_template").locator(".lf-preview")).to_contain_text("Como você está")
    _panel_field(page, "channel_kinds").locator('input[data-kind="email"]').uncheck()
    # Classes and their keywords as tags: a class named in words gets a slug the person never reads,
    # and a list of keywords typed or pasted with commas becomes one tag each.
    _select(page, "entende")
    classes = _panel_field(page, "classes").locator("input")
    classes.fill("Não quer")
    classes.press("Enter")
    expect(_panel_field(page, "classes").locator('[data-tag="nao_quer"]')).to_have_text("Não quer×")
    expect(_node(page, "entende").locator('[data-output="class:nao_quer"]')).to_have_text("Não quer")
    keyword = page.locator("#lf-entende-kw-remarcar")
    keyword.fill("outra data")
    keyword.press("Enter")
    expect(_panel_field(page, "keywords").locator('[data-tag="outra data"]')).to_be_visible()
    page.locator("#lf-entende-kw-nao_quer").fill("não quero, sem interesse; pare")
    page.locator("#lf-entende-kw-nao_quer").press("Enter")
    expect(_panel_field(page, "keywords").locator(".lf-keyword-class").nth(1).locator("[data-tag]")).to_have_count(3)
    expect(_panel_field(page, "keywords")).to_contain_text("vírgula")  # the field says how it splits
    steps.shot("painel-da-etapa")

    saved = _saved(rt, flow_id, page)
    configs = {n["id"]: n["config"] for n in saved.draft_graph["nodes"]}
    assert configs["confere"] == {"checks": [{"field": "contact.stage", "op": "eq", "value": "lead"}], "combinator": "all"}
    assert configs["espera"] == {"mode": "smart", "min_minutes": 1440, "max_minutes": 4320}
    assert configs["escreve"] == {"mode": "ai_message", "prompt_hint": "Pergunte com carinho como o paciente está.",
                                  "fallback_template": "checkin_pos_consulta", "channel_kinds": ["whatsapp", "sms"]}
    assert configs["entende"] == {"classes": ["remarcar", "nao_quer"], "grace_minutes": 60,
                                  "labels": {"nao_quer": "Não quer"},
                                  "keywords": {"remarcar": ["outra data"],
                                               "nao_quer": ["não quero", "sem interesse", "pare"]}}

    # The flow itself: trigger, repeat policy with its interval, cancel on reply, hand-off policy.
    page.locator(".react-flow__pane").click(position={"x": 10, "y": 10})
    settings = page.locator('[data-panel="settings"]')
    settings.locator('[data-field="kind"] select').select_option("appointment")
    settings.locator('[data-field="appointment_event"] select').select_option("completed")
    settings.locator('[data-field="repeat"] select').select_option("cooldown")
    expect(settings.locator('[data-field="cooldown_minutes"] input[data-unit="days"]')).to_have_value("7")
    settings.locator('[data-field="cancel_on_reply"] input').check()
    settings.locator('[data-field="handoff_policy"] select').select_option("cancel")
    steps.shot("configuracoes-do-fluxo")
    saved = _saved(rt, flow_id, page)
    assert saved.trigger_config == {"kind": "appointment", "appointment_event": "completed", "repeat": "cooldown",
                                    "cooldown_minutes": 10080}
    assert (saved.cancel_on_reply, saved.handoff_policy) == (True, "cancel")
    settings.locator('[data-field="repeat"] select').select_option("once")
    expect(settings.locator('[data-field="cooldown_minutes"]')).to_have_count(0)
    assert "cooldown_minutes" not in _saved(rt, flow_id, page).trigger_config
    stored = _saved(rt, flow_id, page).draft_graph

    # An agent opens the same flow read-only: no palette, no buttons, every control disabled.
    page.locator("nav").get_by_role("button", name="Sair").click()
    _sign_in(page, server, "recepcao@bemviver.com.br", PASSWORD)
    page.goto(f"{server}/admin/followup/builder/{flow_id}/")
    expect(page.locator(".lf-save-state")).to_have_text("Somente leitura: apenas proprietários e gestores alteram fluxos.")
    expect(page.locator(".lf-palette")).to_have_count(0)
    expect(page.get_by_role("button", name="Publicar")).to_have_count(0)
    _select(page, "confere")
    expect(page.locator('[data-panel="node"] select').first).to_be_disabled()
    expect(page.get_by_role("button", name="Excluir etapa")).to_have_count(0)
    page.keyboard.press("Delete")  # deleting is off too
    expect(page.locator(".react-flow__node")).to_have_count(6)
    steps.shot("somente-leitura")
    assert _draft(rt, flow_id) == stored


#: A published flow with `ask` and `do` steps (made through the API, not the palette): every exit of
#: each, a node stored without a position, an edge without an id and one with a priority and a null
#: value, configs with defaults spelled out and keys set to null. The builder must draw it whole
#: and write it back key for key.
ASK_AND_DO = {
    "nodes": [
        {"id": "inicio", "type": "trigger", "position": {"x": 0, "y": 200}, "config": {}},
        {"id": "quando", "type": "ask", "label": "Dia e período", "position": {"x": 230, "y": 200},
         "config": {"fields": ["data", "periodo"], "max_asks": 2, "grace_minutes": 120, "phrasing": "question",
                    "channel_kinds": ["whatsapp"]}},
        {"id": "oferta", "type": "do", "position": {"x": 480, "y": 120},
         "config": {"action": "offer_slots", "limit": 4, "date_field": "data", "period_field": "periodo",
                    "time_field": None, "same_professional": False, "intro": "Tenho estes horários:",
                    "max_asks": 2, "grace_minutes": 240}},
        {"id": "remarca", "type": "do", "position": {"x": 730, "y": 40.5},
         "config": {"action": "move", "date_field": None}},
        {"id": "confirma", "type": "do", "position": {"x": 980, "y": 0}, "config": {"action": "confirm"}},
        {"id": "avisa", "type": "do", "label": "Avisar a recepção", "position": {"x": 980, "y": 380},
         "config": {"action": "notify_staff", "note": "Paciente não conseguiu remarcar."}},
        {"id": "pessoa", "type": "do", "config": {"action": "handoff"}},
        {"id": "fim_ok", "type": "end", "position": {"x": 1230, "y": 0}, "config": {"outcome": "converted"}},
        {"id": "fim_sem", "type": "end", "position": {"x": 1230, "y": 380},
         "config": {"outcome": "exhausted", "note": ""}},
    ],
    "edges": [
        {"id": "a", "source": "inicio", "target": "quando", "condition": {"type": "always"}},
        {"id": "b", "source": "quando", "target": "oferta", "condition": {"type": "complete"}},
        {"id": "c", "source": "quando", "target": "avisa", "condition": {"type": "gave_up"}},
        {"id": "d", "source": "quando", "target": "fim_sem", "condition": {"type": "no_reply"}},
        {"id": "e", "source": "oferta", "target": "remarca", "condition": {"type": "ok", "value": None}},
        {"id": "f", "source": "oferta", "target": "pessoa", "condition": {"type": "unavailable"}},
        {"id": "g", "source": "oferta", "target": "avisa", "condition": {"type": "failed"}},
        {"id": "h", "source": "oferta", "target": "fim_sem", "condition": {"type": "no_reply"}},
        {"id": "i", "source": "remarca", "target": "confirma", "condition": {"type": "ok"}, "priority": 1},
        {"id": "j", "source": "remarca", "target": "pessoa", "condition": {"type": "unavailable"}},
        {"id": "k", "source": "remarca", "target": "avisa", "condition": {"type": "failed"}},
        {"source": "confirma", "target": "fim_ok", "condition": {"type": "ok"}},
        {"id": "m", "source": "confirma", "target": "avisa", "condition": {"type": "failed"}},
        {"id": "n", "source": "avisa", "target": "fim_sem", "condition": {"type": "ok"}},
        {"id": "o", "source": "pessoa", "target": "fim_sem", "condition": {"type": "ok"}},
    ],
}
#: What each exit reads on the canvas (pt-BR).
EXIT_WORDS = {"always": "Sempre", "complete": "Completo", "gave_up": "Desistiu", "no_reply": "Sem resposta",
              "ok": "Feito", "failed": "Falhou", "unavailable": "Sem horário"}


def _outputs(page, node_id: str) -> list[str]:
    return _node(page, node_id).locator("[data-output]").evaluate_all("outs => outs.map(o => o.dataset.output)")


def test_ask_and_do_steps_open_with_every_exit_and_save_back_unchanged(rt, clock, server, page, artifacts) -> None:
    steps = Steps(page, artifacts)
    world = World(rt, slug="bem-viver")
    world.channel("whatsapp")
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email=EMAIL, role="owner", password=PASSWORD)
        create_field(conn, world.org_id, {"slug": "data", "label": "Data", "type": "date",
                                          "question": "Qual dia fica melhor para você?"})
        create_field(conn, world.org_id, {"slug": "periodo", "label": "Período", "type": "period",
                                          "question": "De manhã ou à tarde?"})
    flow_id = Flows(world).flow(ASK_AND_DO, name=FLOW, publish=True, agent=False)  # the engine takes it whole
    assert _draft(rt, flow_id) == ASK_AND_DO

    _sign_in(page, server, EMAIL, PASSWORD)
    page.goto(f"{server}/admin/followup/builder/{flow_id}/")
    expect(page.locator(".lf-status")).to_have_text("Publicado · v1")

    # Every edge is drawn from its exit, labelled with the exit's meaning.
    expect(page.locator(".react-flow__edge")).to_have_count(len(ASK_AND_DO["edges"]))
    for edge in ASK_AND_DO["edges"]:
        drawn = page.locator(f'[data-testid="rf__edge-{edge.get("id", "ligacao_1")}"]')
        expect(drawn.locator(".react-flow__edge-path")).to_have_count(1)
        expect(drawn.locator(".react-flow__edge-text")).to_have_text(EXIT_WORDS[edge["condition"]["type"]])

    # Each step shows its type, a summary and one labelled output per exit its action has.
    expect(_node(page, "quando").locator(".lf-node-type")).to_have_text("Perguntar")
    expect(_node(page, "quando").locator(".lf-node-summary")).to_have_text("Data, Período")  # the fields' labels
    assert _outputs(page, "quando") == ["complete", "gave_up", "no_reply"]
    expect(_node(page, "quando").locator(".lf-outputs")).to_have_text(re.compile("Completo.*Desistiu.*Sem resposta"))
    summaries = {"oferta": "Oferecer horários", "remarca": "Remarcar", "confirma": "Confirmar",
                 "avisa": "Avisar a equipe", "pessoa": "Passar para uma pessoa"}
    exits = {"oferta": ["ok", "failed", "unavailable", "no_reply"], "remarca": ["ok", "failed", "unavailable"],
             "confirma": ["ok", "failed"], "avisa": ["ok"], "pessoa": ["ok"]}
    for node_id, text in summaries.items():
        expect(_node(page, node_id).locator(".lf-node-type")).to_have_text("Ação")
        expect(_node(page, node_id).locator(".lf-node-summary")).to_have_text(text)
        assert _outputs(page, node_id) == exits[node_id], node_id
    expect(_node(page, "oferta").locator(".lf-outputs")).to_have_text(
        re.compile("Feito.*Falhou.*Sem horário.*Sem resposta"))
    expect(page.locator('[data-palette="ask"], [data-palette="do"], [data-palette="offer_slots"]')).to_have_count(3)
    page.get_by_role("button", name="Ajustar à tela").click()
    page.wait_for_timeout(400)  # the fit's animation
    steps.shot("aberto")

    # Their forms show the config as stored (opening one changes nothing).
    _select(page, "quando")
    panel = page.locator('[data-panel="node"]')
    expect(panel.locator('[data-field="fields"] [data-chip]')).to_have_text(["Data×", "Período×"])
    expect(panel.locator('[data-field="max_asks"] input')).to_have_value("2")
    _select(page, "oferta")
    expect(panel.locator('[data-field="action"] select')).to_have_value("offer_slots")
    expect(panel.locator('[data-field="limit"] input')).to_have_value("4")
    expect(panel.locator('[data-field="period_field"] select')).to_have_value("periodo")
    steps.shot("paineis")
    page.wait_for_timeout(2000)  # longer than the auto-save's delay: opening and selecting save nothing
    expect(page.locator(".lf-builder")).to_have_attribute("data-dirty", "false")
    assert _draft(rt, flow_id) == ASK_AND_DO

    # A save that changes only the flow's name writes the graph back key for key.
    page.locator(".react-flow__pane").click(position={"x": 10, "y": 10})
    with page.expect_request(lambda r: r.url.endswith(f"/builder/{flow_id}/draft")) as sent:
        page.locator('[data-panel="settings"] #lf-flow-name').fill("Remarcar pelo WhatsApp")
    assert sent.value.post_data_json["draft_graph"] == ASK_AND_DO
    saved = _saved(rt, flow_id, page)
    assert saved.name == "Remarcar pelo WhatsApp"
    assert json.dumps(saved.draft_graph, sort_keys=True) == json.dumps(ASK_AND_DO, sort_keys=True)

    # Moving a step changes its position and nothing else.
    label = _node(page, "avisa").locator(".lf-node-label")
    x, y = _center(label.bounding_box())
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + 40, y + 30, steps=8)
    page.mouse.up()
    expect(page.locator(".lf-builder")).to_have_attribute("data-dirty", "true")
    moved = _saved(rt, flow_id, page).draft_graph
    assert moved["edges"] == ASK_AND_DO["edges"]
    for before, after in zip(ASK_AND_DO["nodes"], moved["nodes"], strict=True):
        if before["id"] == "avisa":
            assert after["position"] != before["position"]
            assert {k: v for k, v in after.items() if k != "position"} == \
                {k: v for k, v in before.items() if k != "position"}
        else:
            assert after == before, before["id"]  # "pessoa" still has no position
    steps.shot("movido")

    # It still publishes, and a reload draws the same graph.
    page.get_by_role("button", name="Publicar").click()
    expect(page.locator(".lf-notice")).to_contain_text("Versão 2 publicada.")
    page.reload()
    expect(page.locator(".react-flow__edge")).to_have_count(len(ASK_AND_DO["edges"]))
    expect(page.locator(".react-flow__edge-text").filter(has_text="Sem horário")).to_have_count(2)
    assert _draft(rt, flow_id) == moved


def _boxes(page) -> dict[str, dict]:
    """Each step's box on the screen, by id."""
    return {node: page.locator(f'.react-flow__node[data-id="{node}"]').bounding_box()
            for node in page.locator(".react-flow__node").evaluate_all("ns => ns.map(n => n.dataset.id)")}


def _overlap(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


def test_perguntar_and_oferecer_horarios_from_the_palette_then_organizar(rt, clock, server, page, tmp_path) -> None:
    """Issue 33: a Perguntar step (the org's fields as chips, "insistir até N vezes"), an "Oferecer
    horários" step and an Ação step added with the mouse, their forms filled (each refusing what the
    server would, in the catalogue's words), their exits connected, saved and published; then
    "Organizar" lays the steps out left to right without overlaps, with text readable at the view."""
    world = World(rt, slug="bem-viver")
    world.channel("whatsapp")
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email=EMAIL, role="owner", password=PASSWORD)
        create_field(conn, world.org_id, {"slug": "data", "label": "Data", "type": "date",
                                          "question": "Qual dia fica melhor para você?"})
        create_field(conn, world.org_id, {"slug": "periodo", "label": "Período", "type": "period",
                                          "question": "De manhã ou à tarde?"})
        flow_id = versions.create_flow(conn, world.org_id, name=FLOW)
    _sign_in(page, server, EMAIL, PASSWORD)
    page.goto(f"{server}/admin/followup/builder/{flow_id}/")
    for name in ("Perguntar", "Ação", "Oferecer horários"):
        expect(page.locator(".lf-palette")).to_contain_text(name)

    _drop(page, "trigger", 20, 140)
    _drop(page, "ask", 260, 140)
    ask = _node(page, "pergunta_1")
    expect(ask.locator(".lf-node-label")).to_have_text("Perguntar 1")  # a name in words; the id stays a slug
    fields = _panel_field(page, "fields")
    expect(fields.locator(".lf-problem")).to_have_text("use uma lista de 1 a 10 itens")  # as the validator says
    fields.locator('[data-add-chip="data"]').click()
    fields.locator('[data-add-chip="periodo"]').click()
    expect(fields.locator(".lf-problem")).to_have_count(0)
    _panel_field(page, "max_asks").locator("input").fill("2")
    expect(ask.locator(".lf-node-summary")).to_have_text("Data, Período")
    assert _outputs(page, "pergunta_1") == ["complete", "gave_up", "no_reply"]

    _drop(page, "offer_slots", 520, 40)
    offer = _node(page, "acao_1")
    expect(offer.locator(".lf-node-label")).to_have_text("Oferecer horários 1")
    assert _outputs(page, "acao_1") == ["ok", "failed", "unavailable", "no_reply"]
    expect(offer.locator(".lf-outputs")).to_have_text(re.compile("Feito.*Falhou.*Sem horário.*Sem resposta"))
    _panel_field(page, "limit").locator("input").fill("4")
    _panel_field(page, "date_field").locator("select").select_option("data")
    _panel_field(page, "period_field").locator("select").select_option("periodo")

    _drop(page, "do", 520, 320)
    act = _node(page, "acao_2")
    expect(act.locator(".lf-node-label")).to_have_text("Ação 1")
    _panel_field(page, "action").locator("select").select_option("notify_staff")
    expect(_panel_field(page, "note").locator(".lf-problem")).to_have_text("campo obrigatório; preencha-o")
    _panel_field(page, "note").locator("input").fill("Paciente quer falar com a recepção.")
    expect(_panel_field(page, "note").locator(".lf-problem")).to_have_count(0)
    assert _outputs(page, "acao_2") == ["ok"]

    _drop(page, "end", 800, 140)
    expect(_panel_field(page, "outcome").locator("select")).to_have_value("")  # no outcome chosen for the person
    _panel_field(page, "outcome").locator("select").select_option("custom")

    for source, handle, target in (("gatilho_1", "always", "pergunta_1"), ("pergunta_1", "complete", "acao_1"),
                                   ("pergunta_1", "gave_up", "acao_2"), ("pergunta_1", "no_reply", "fim_1"),
                                   ("acao_1", "ok", "fim_1"), ("acao_1", "failed", "acao_2"),
                                   ("acao_1", "unavailable", "acao_2"), ("acao_1", "no_reply", "fim_1"),
                                   ("acao_2", "ok", "fim_1")):
        _connect(page, source, handle, target)
    expect(page.locator(".react-flow__edge")).to_have_count(9)

    saved = _saved(rt, flow_id, page).draft_graph
    nodes = {n["id"]: n for n in saved["nodes"]}
    assert {k: (n["label"], n["config"]) for k, n in nodes.items()} == {
        "gatilho_1": ("Gatilho 1", {}),
        "pergunta_1": ("Perguntar 1", {"fields": ["data", "periodo"], "max_asks": 2}),
        "acao_1": ("Oferecer horários 1", {"action": "offer_slots", "limit": 4, "same_professional": True,
                                           "max_asks": 2, "date_field": "data", "period_field": "periodo"}),
        "acao_2": ("Ação 1", {"action": "notify_staff", "note": "Paciente quer falar com a recepção."}),
        "fim_1": ("Fim 1", {"outcome": "custom"}),
    }
    assert sorted((e["source"], e["condition"]["type"], e["target"]) for e in saved["edges"]) == sorted([
        ("gatilho_1", "always", "pergunta_1"), ("pergunta_1", "complete", "acao_1"),
        ("pergunta_1", "gave_up", "acao_2"), ("pergunta_1", "no_reply", "fim_1"), ("acao_1", "ok", "fim_1"),
        ("acao_1", "failed", "acao_2"), ("acao_1", "unavailable", "acao_2"), ("acao_1", "no_reply", "fim_1"),
        ("acao_2", "ok", "fim_1")])
    page.get_by_role("button", name="Publicar").click()
    expect(page.locator(".lf-notice")).to_contain_text("Versão 1 publicada.")

    # "Organizar": no two steps overlap, every edge runs left to right, the text reads at ≥ 12 px.
    page.locator('[data-action="organize"]').click()
    expect(page.locator(".lf-builder")).to_have_attribute("data-dirty", "true")
    positions = _saved(rt, flow_id, page).draft_graph
    page.wait_for_timeout(300)  # the view's 200 ms move
    boxes = _boxes(page)
    assert len(boxes) == 5
    pairs = [(a, b) for a in boxes for b in boxes if a < b and _overlap(boxes[a], boxes[b])]
    assert not pairs, pairs
    for edge in saved["edges"]:
        assert boxes[edge["source"]]["x"] + boxes[edge["source"]]["width"] < boxes[edge["target"]]["x"], edge
    zoom = page.locator(".react-flow__viewport").evaluate("v => new DOMMatrix(getComputedStyle(v).transform).a")
    smallest = page.locator(".lf-node *").evaluate_all(
        "els => Math.min(...els.filter(e => e.textContent.trim()).map(e => parseFloat(getComputedStyle(e).fontSize)))")
    assert smallest * zoom >= 12, (smallest, zoom)
    assert {n["id"] for n in positions["nodes"]} == set(nodes)  # the new positions are saved, nothing else moved
    assert [(n["label"], n["config"]) for n in positions["nodes"]] == [(n["label"], n["config"]) for n in saved["nodes"]]
    folder = ROOT / "docs" / "screenshots" if os.environ.get("LEMBRA_SCREENSHOTS") else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / "builder.png"))
