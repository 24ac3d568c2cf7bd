"""Finding 8 in a real browser: the appointment form's patient search box asks the app as one
types (a nonce'd script and fetch, under the Content-Security-Policy), offers only the signed-in
org's patients, and the chosen one is booked. No CSP violation, no JavaScript error."""

from __future__ import annotations

import re
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest

from engine.core import clock as engine_clock
from engine.tenants.orgs import create_user
from tests.e2e.test_csp_browser import CHROMIUM, _violations, browser_page, expect, server  # noqa: F401
from tests.factories import World

pytestmark = pytest.mark.timeout(180)
EMAIL, PASSWORD = "dona@busca.com.br", "senha-forte-busca-1"


def test_the_patient_search_box_finds_and_books_only_the_orgs_patients(rt, server, browser_page) -> None:  # noqa: F811
    page = browser_page
    mine = World(rt, slug="clinica-busca")
    mine.channel("whatsapp")
    mine.rule(60, respect_window=False)
    mine.contact(name="Joana Prado", phone="+5516991112222")
    mine.contact(name="Joana Lima", phone="+5516993334444")
    other = World(rt, slug="clinica-vizinha")
    other.contact(name="Joana Vizinha", phone="+5516991112222")
    with rt.db.begin() as conn:
        create_user(conn, org_id=mine.org_id, email=EMAIL, role="owner", password=PASSWORD)

    page.goto(f"{server}/admin/")
    page.fill("#email", EMAIL)
    page.fill("#password", PASSWORD)
    page.get_by_role("button", name="Entrar").click()
    expect(page).to_have_url(re.compile(r"/admin/$"))

    page.goto(f"{server}/admin/appointments/new/")
    page.fill("#contact_id", "Joana")
    options = page.locator("#contact_id-results button")
    expect(options).to_have_count(2)
    expect(page.locator("#contact_id-results")).not_to_contain_text("Vizinha")
    page.fill("#contact_id", "(16) 99111-2222")  # by phone, typed as people type it
    expect(options).to_have_count(1)
    expect(options.first).to_contain_text("Joana Prado")
    options.first.click()
    expect(page.locator("#contact_id")).to_have_value("Joana Prado")
    starts = (engine_clock.now() + timedelta(days=2)).astimezone(ZoneInfo("America/Sao_Paulo"))
    page.fill("#starts_at", starts.strftime("%Y-%m-%dT%H:%M"))
    page.locator("form.admin-form input[type=submit], form.admin-form button[type=submit]").first.click()
    expect(page.get_by_text("Agendamento criado; 1 lembrete na fila.")).to_be_visible()
    page.fill("input[name=search]", "99111")
    page.keyboard.press("Enter")
    expect(page.locator("table.model-list tbody tr")).to_have_count(1)
    expect(page.locator("table.model-list tbody")).to_contain_text("Joana Prado")
    assert _violations(page) == []
