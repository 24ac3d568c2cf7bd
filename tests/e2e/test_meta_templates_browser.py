"""Issue 30, point 1, in a real browser: a clinic on Meta's official API maps its reminder in Modelos.

Headless Chromium signs in, presses "Personalizar" on the default WhatsApp reminder, picks one of
the WABA's approved templates (the loopback Graph fake's) with "Usar", types its variables and sees
the JSON Meta will receive change as it types; a pending template is refused with its sentence,
then the approved one is saved. No CSP violation, no JavaScript error on the way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` to run the browser test", allow_module_level=True)

from playwright import sync_api
from sqlalchemy import select

from admin.app import create_app
from engine.tenants.channels import create_channel
from engine.store.models import templates
from engine.tenants.orgs import create_user
from tests.e2e.live import CHROMIUM_ARGS, serve
from tests.e2e.test_csp_browser import RECORD_VIOLATIONS
from tests.factories import World
from tests.fakes.meta import FakeGraph

pytestmark = pytest.mark.timeout(180)
expect = sync_api.expect
expect.set_options(timeout=15_000)
EMAIL, PASSWORD = "dona@sorriso.com.br", "senha-forte-sorriso-1"


@pytest.fixture
def server(rt, clock) -> Iterator[str]:
    clock.set(datetime.now(UTC).replace(second=0, microsecond=0))
    with serve(create_app(rt), "lembra-meta-http") as url:
        yield url


@pytest.fixture
def graph() -> Iterator[FakeGraph]:
    with FakeGraph() as fake:
        yield fake


def test_a_clinic_picks_its_approved_template_and_sees_what_meta_receives(rt, server, graph) -> None:
    world = World(rt, slug="sorriso")
    with rt.db.begin() as conn:
        create_channel(conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="meta", name="WhatsApp oficial",
                       credentials={"phone_number_id": "1122334455667", "access_token": "EAAG-token",
                                    "app_secret": "s" * 32, "verify_token": "verifique-o-webhook",
                                    "base_url": graph.url, "waba_id": "102290129340398"})
        create_user(conn, org_id=world.org_id, email=EMAIL, role="owner", password=PASSWORD)

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1366, "height": 900}, locale="pt-BR")
        context.set_default_timeout(15_000)
        context.add_init_script(RECORD_VIOLATIONS)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            page.goto(f"{server}/admin/")
            page.fill("#email", EMAIL)
            page.fill("#password", PASSWORD)
            page.get_by_role("button", name="Entrar").click()
            expect(page).to_have_url(re.compile(r"/admin/$"))

            page.goto(f"{server}/admin/templates/")
            default = page.locator("table tbody tr").filter(has_text="Lembrete de sessão").filter(
                has_text="WhatsApp").filter(has_text="Padrão")
            expect(default).to_contain_text("session_reminder_v1")
            default.get_by_role("link", name="Personalizar").click()
            expect(page.locator("#meta_name")).to_have_value("session_reminder_v1")
            expect(page.locator("#lembra-meta-inherited")).to_be_visible()
            expect(page.locator("#lembra-meta-preview")).to_contain_text('"session_reminder_v1"')
            page.wait_for_load_state("load")  # the page's script binds its listeners from `load` on

            # Pick the clinic's own approved template and give its four variables in order.
            waba = page.locator("#lembra-waba")
            expect(waba).to_contain_text("volte_a_sorrir")  # pending: listed, not offered
            expect(waba.locator("tr", has_text="volte_a_sorrir").get_by_role("button")).to_have_count(0)
            expect(waba.locator("tr", has_text="lembrete_com_foto")).to_contain_text("cabeçalho com imagem")
            waba.locator("tr", has_text="lembrete_sorriso").get_by_role("button", name="Usar").click()
            expect(page.locator("#meta_name")).to_have_value("lembrete_sorriso")
            expect(page.locator("#meta_lang")).to_have_value("pt_BR")
            page.fill("#meta_params", "nome, profissional, data, hora")
            page.locator("#meta_params").dispatch_event("input")
            preview = page.locator("#lembra-meta-preview")
            expect(preview).to_contain_text('"lembrete_sorriso"')
            expect(page.locator("#lembra-meta-inherited")).to_be_hidden()  # the clinic's own now
            shown = json.loads(preview.inner_text())
            assert [p["text"] for p in shown["components"][0]["parameters"]] == \
                ["Ana", "Dra. Beatriz Costa", "21/03", "14:00"]
            assert [c["parameters"][0]["payload"] for c in shown["components"][1:]] == ["confirm:123", "cancel:123"]

            page.fill("#meta_params", "nome, cpf")
            page.locator("#meta_params").dispatch_event("input")
            expect(page.locator("#lembra-meta-error")).to_contain_text("A variável cpf não existe.")
            expect(preview).to_be_hidden()

            # A template Meta has not approved yet is refused at save, with the reason on the field.
            page.fill("#meta_name", "volte_a_sorrir")
            page.fill("#meta_params", "nome")
            page.select_option("#meta_button_layout", "")
            page.locator("form.admin-form input[type=submit].btn-primary").first.click()
            expect(page.locator("form.admin-form").get_by_text("está em análise na Meta")).to_be_visible()
            with rt.db.connect() as conn:
                assert conn.execute(select(templates).where(templates.c.org_id == world.org_id)).all() == []

            page.fill("#meta_name", "lembrete_sorriso")
            page.fill("#meta_params", "nome, profissional, data, hora")
            page.select_option("#meta_button_layout", "confirm,cancel")
            page.locator("form.admin-form input[type=submit].btn-primary").first.click()
            own = page.locator("table tbody tr").filter(has_text="Lembrete de sessão").filter(has_text="Da clínica")
            expect(own).to_contain_text("lembrete_sorriso")
            assert page.evaluate("window.__csp || []") == []
        finally:
            context.close()
            browser.close()
    assert not errors, f"JavaScript errors: {errors}"
    with rt.db.connect() as conn:
        row = conn.execute(select(templates).where(templates.c.org_id == world.org_id)).one()
    assert (row.meta_template_name, row.meta_parameters, row.meta_buttons) == \
        ("lembrete_sorriso", ["nome", "profissional", "data", "hora"], ["confirm", "cancel"])
