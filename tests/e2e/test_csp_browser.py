"""Issue 9, point 6, in a real browser: the console's pages under their Content-Security-Policy.

Headless Chromium visits the console's pages and records every `securitypolicyviolation`; then it
uses what the policy could break: the language menu (bound by a nonce'd script, no inline handler),
a list action and the filter menu of Flask-Admin (inline handlers allowed by hash), a form that
asks first (`data-lembra-confirm`) and the live template preview (a nonce'd script that fetches). None may be refused, and a page may not be framed by another origin.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` to run the browser test", allow_module_level=True)

from playwright import sync_api

from admin.app import create_app
from engine.tenants.apikeys import create_key
from engine.tenants.orgs import create_user
from tests.e2e.live import CHROMIUM_ARGS, serve
from tests.factories import World

pytestmark = pytest.mark.timeout(180)
expect = sync_api.expect
expect.set_options(timeout=15_000)
EMAIL, PASSWORD = "dona@csp.com.br", "senha-forte-csp-1"
#: Collects the page's CSP violations where the test can read them.
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', function (e) {
  window.__csp.push(e.violatedDirective + ' ' + (e.blockedURI || '') + ' ' + (e.sample || '') + ' @' + (e.sourceFile || '') + ':' + e.lineNumber);
});
"""


@pytest.fixture
def server(rt, clock) -> Iterator[str]:
    clock.set(datetime.now(UTC).replace(second=0, microsecond=0))
    with serve(create_app(rt), "lembra-csp-http") as url:
        yield url


@pytest.fixture
def browser_page() -> Iterator[object]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 860}, locale="pt-BR")
        context.set_default_timeout(15_000)
        context.add_init_script(RECORD_VIOLATIONS)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            yield page
        finally:
            context.close()
            browser.close()
        assert not errors, f"JavaScript errors in the console pages: {errors}"


def _violations(page) -> list[str]:
    return page.evaluate("window.__csp || []")


def test_the_console_runs_under_its_policy(rt, server, browser_page) -> None:
    page = browser_page
    world = World(rt, slug="clinica-csp")
    channel_id = world.channel("whatsapp")
    world.rule(120)
    contact = world.contact(name="Paciente CSP")
    world.appointment(contact, datetime.now(UTC) + timedelta(days=2))
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email=EMAIL, role="owner", password=PASSWORD)
        create_key(conn, org_id=world.org_id, name="Chave da lista")
        detail_key = create_key(conn, org_id=world.org_id, name="Chave do detalhe")

    page.goto(f"{server}/admin/")
    page.fill("#email", EMAIL)
    page.fill("#password", PASSWORD)
    page.get_by_role("button", name="Entrar").click()
    expect(page).to_have_url(re.compile(r"/admin/$"))

    for path in ("/admin/", "/admin/appointments/", "/admin/appointments/new/", "/admin/contacts/",
                 "/admin/rules/", "/admin/templates/", "/admin/templates/new/", "/admin/channels/",
                 f"/admin/channels/details/?id={channel_id}", "/admin/apikeys/", "/admin/users/",
                 "/admin/queue/", "/admin/logs/", "/admin/inbox/", "/admin/sandbox/", "/admin/audit/",
                 "/admin/appointments/import/"):
        page.goto(f"{server}{path}")
        page.wait_for_load_state("load")
        assert _violations(page) == [], path

    # The live preview: a nonce'd script that posts to the app.
    page.goto(f"{server}/admin/templates/new/")
    page.wait_for_load_state("load")
    page.fill("#body", "Olá {{ nome }}!")
    page.locator("#body").dispatch_event("input")
    expect(page.locator("#lembra-preview")).to_contain_text("Olá Ana!")
    assert _violations(page) == []

    # Flask-Admin's list action, an inline onclick the policy allows by its hash.
    page.goto(f"{server}/admin/apikeys/")
    page.locator("tr", has_text="Chave da lista").locator("input.action-checkbox").check()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Com selecionado").click()
    page.locator(".dropdown-menu a", has_text="Revogar").click()
    expect(page.get_by_text("1 chave revogada")).to_be_visible()
    assert _violations(page) == []

    # A form that asks first: dismissing keeps the key, accepting revokes it.
    page.goto(f"{server}/admin/apikeys/details/?id={detail_key.id}")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Revogar").click()
    expect(page.get_by_role("button", name="Revogar")).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Revogar").click()
    expect(page.get_by_text("1 chave revogada")).to_be_visible()
    assert _violations(page) == []

    # A key shown once (admin/_shown_once.html, shared with the webhook secret): its Copiar button's
    # nonce'd script runs.
    page.goto(f"{server}/admin/apikeys/new/")
    page.fill("#name", "Chave copiada")
    page.locator("form.admin-form input[type=submit].btn-primary").first.click()
    page.locator("#lembra-new-key-copy").click()
    expect(page.locator("#lembra-new-key-copied")).to_be_visible()
    assert page.input_value("#lembra-new-key").startswith("lembra_")
    assert _violations(page) == []

    # Flask-Admin's filter menu (its items carry an inline "return false;", allowed by hash).
    page.goto(f"{server}/admin/appointments/")
    page.get_by_role("link", name="Adicionar Filtro").click()
    page.locator(".field-filters a.filter", has_text="Status").click()
    expect(page.locator("tr.form-horizontal select.filter-op")).to_have_count(1)
    assert _violations(page) == []

    # The language menu submits on change, from a nonce'd script.
    page.goto(f"{server}/admin/")
    page.select_option("#lembra-locale", "en")
    expect(page.get_by_role("link", name="Appointments")).to_be_visible()
    assert _violations(page) == []

    # Another origin cannot frame the console (frame-ancestors 'none'), not even its sign-in page.
    page.set_content(f'<iframe id="f" src="{server}/login"></iframe>')
    page.wait_for_timeout(1000)
    expect(page.frame_locator("#f").locator("#password")).to_have_count(0)
