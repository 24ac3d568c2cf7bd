"""The builder's "Testar" chat (admin/frontend/src/TestPanel.jsx), in a real browser: the owner opens
the panel beside the canvas, plays the patient against the published version of a rescheduling flow
(the question, the free times, the pick), reads under each reply what was understood and the exit
taken, starts over, and nothing of it stays in the database. One lean test; the full builder journey
is tests/e2e/test_flow_builder_browser.py's.

Headless Debian Chromium, as the other browser tests (never `playwright install`); screenshots in
`test-artifacts/e2e/flow-builder/rehearse.../`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` to run the browser test", allow_module_level=True)

from playwright import sync_api
from sqlalchemy import func, select

from engine.flows.conversation.fields import create_field
from engine.people.agenda import create_professional
from engine.store import models
from engine.tenants.orgs import create_user
from tests.e2e.test_flow_builder_browser import _sign_in, artifacts, page, server  # noqa: F401 (fixtures)
from tests.factories import World
from tests.flows.helpers import Flows, edge, node

pytestmark = pytest.mark.timeout(240)
expect = sync_api.expect
EMAIL, PASSWORD = "gestora@bemviver.com.br", "senha-forte-e2e-2"
GRAPH = {"nodes": [node("inicio", "trigger"), node("quando", "ask", fields=["data", "periodo"]),
                   node("oferta", "do", action="offer_slots", date_field="data", period_field="periodo"),
                   node("remarca", "do", action="move"), node("feito", "end", outcome="converted"),
                   node("falhou", "end", outcome="exhausted")],
         "edges": [edge("inicio", "quando"), edge("quando", "oferta", "complete"), edge("quando", "falhou", "gave_up"),
                   edge("quando", "falhou", "no_reply"), edge("oferta", "remarca", "ok"),
                   edge("oferta", "falhou", "unavailable"), edge("oferta", "falhou", "failed"),
                   edge("oferta", "falhou", "no_reply"), edge("remarca", "feito", "ok"),
                   edge("remarca", "falhou", "unavailable"), edge("remarca", "falhou", "failed")]}
TABLES = ("messages", "enrollments", "appointments", "contacts", "inbound_messages", "flow_versions")


def _counts(rt) -> dict[str, int]:
    with rt.db.connect() as conn:
        return {name: conn.execute(select(func.count()).select_from(getattr(models, name))).scalar_one()
                for name in TABLES}


def test_the_owner_plays_the_patient_in_the_testar_panel(rt, clock, server, page, artifacts) -> None:  # noqa: F811
    world = World(rt, slug="bem-viver", quiet_start="00:00", quiet_end="23:59", skip_sundays=False,
                  skip_holidays=False)
    world.channel("whatsapp")
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email=EMAIL, role="owner", password=PASSWORD)
        create_field(conn, world.org_id, {"slug": "data", "label": "Data", "type": "date",
                                          "question": "Qual dia fica melhor para você?"})
        create_field(conn, world.org_id, {"slug": "periodo", "label": "Período", "type": "period",
                                          "question": "De manhã ou à tarde?"})
        create_professional(conn, world.org_id, name="Dra. Beatriz Costa", slot_minutes=30,
                            hours=[{"weekday": d, "starts": "08:00", "ends": "12:00"} for d in range(5)])
    flow_id = Flows(world).flow(GRAPH, name="Remarcar", publish=True, agent=False)
    before = _counts(rt)

    _sign_in(page, server, EMAIL, PASSWORD)
    page.goto(f"{server}/admin/followup/builder/{flow_id}/")
    page.get_by_role("button", name="Testar", exact=True).click()
    panel = page.locator(".lf-rehearse")
    expect(panel.locator('[data-version="published"]')).to_have_attribute("aria-pressed", "true")
    expect(panel.locator(".lf-bubble-bot")).to_have_text(["Qual dia fica melhor para você?"])
    expect(panel.locator(".lf-rehearse-state")).to_have_text("O fluxo espera a resposta do paciente.")

    box = panel.get_by_placeholder("Escreva como o paciente…")
    box.fill("posso remarcar pra quinta de manhã?")
    box.press("Enter")
    expect(panel.locator(".lf-bubble-bot")).to_have_count(2)
    expect(panel.locator(".lf-bubble-bot").nth(1)).to_contain_text("Tenho estes horários livres:")
    expect(panel.locator(".lf-understood").first).to_have_text(
        re.compile(r"^Entendido: Quer remarcar · Data=03/12/2026 · Período=de manhã → saída Completo"))
    box.fill("2")
    panel.get_by_role("button", name="Enviar").click()
    expect(panel.locator(".lf-understood").nth(1)).to_have_text(
        re.compile(r"^Entendido: horário=03/12/2026 09:30 \(Dra. Beatriz Costa\) → saída Feito"))
    expect(panel.locator(".lf-rehearse-state")).to_have_text("Fim do fluxo: Convertido")
    expect(box).to_be_disabled()
    page.screenshot(path=str(artifacts / "rehearse.png"), full_page=True)

    panel.get_by_role("button", name="Recomeçar").click()
    expect(panel.locator(".lf-bubble-patient")).to_have_count(0)
    expect(panel.locator(".lf-bubble-bot")).to_have_text(["Qual dia fica melhor para você?"])
    assert _counts(rt) == before, "the rehearsal left rows behind"
