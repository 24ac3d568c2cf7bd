"""Issue 4, acceptance 1: a clinic owner sets Lembra up in a real browser and a reminder goes
all the way round.

Headless Chromium (Debian's `chromium`, driven by Playwright through `executable_path`; Playwright
never downloads a browser of its own) signs in to the real app served on a loopback port, creates
a sandbox channel, a template override, a reminder rule, a contact and an appointment through the
console's forms, sees the reminder in the queue as scheduled, lets the engine send it (in-process,
with the test's clock moved forward), answers `CONFIRMAR` as the patient in the console's sandbox
inbox (a chat per contact) and sees the appointment confirmed. Every assertion is on text the user
sees. A screenshot of each step goes to `test-artifacts/e2e/` (gitignored);
`docs/screenshots/dashboard.png` is a copy of the last one (`NN-painel.png`, after a few weeks of
history were sent through the engine), made by hand.

Runs on both backends: `pytest tests/e2e` (SQLite) and with `LEMBRA_TEST_DATABASE_URL` (PostgreSQL).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

CHROMIUM = "/usr/bin/chromium"  # Debian's package; Playwright never downloads a browser here
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` (.ci/run does) to run the browser test",
                allow_module_level=True)

from playwright import sync_api
from sqlalchemy import select

from admin.app import create_app
from engine.messaging import dispatch
from engine.people.appointments import create_appointment
from engine.people.contacts import create_contact
from engine.messaging.inbound import receive
from engine.store.models import messages
from engine.tenants.orgs import create_org, create_user
from engine.reminders.populate import refresh_appointment
from gateway.contract import WebhookRequest
from tests.e2e.live import CHROMIUM_ARGS, serve
from tests.factories import sandbox_headers

pytestmark = pytest.mark.timeout(180)
expect = sync_api.expect
expect.set_options(timeout=15_000)  # generous on a loaded CI machine; a pass takes ~1 s per page

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "e2e"
TZ = ZoneInfo("America/Sao_Paulo")
CLINIC = "Clínica Bem Viver"
EMAIL, PASSWORD = "dona@bemviver.com.br", "senha-forte-e2e-1"
PATIENT = "Mariana Alves"
PROFESSIONAL = "Dr. Paulo Lima"
TEMPLATE_BODY = ("Olá {{ nome }}! Teste E2E: sua sessão com {{ profissional }} é {{ dia_semana }}, "
                 "{{ data }} às {{ hora }}. Responda CONFIRMAR ou CANCELAR.")


@pytest.fixture
def server(rt, clock) -> Iterator[str]:
    """The real app on a free loopback port, threaded, in a background thread."""
    # The browser shows real pages, so the engine clock starts at the real "now" (to the minute:
    # the appointment form is minute-precise) and only moves when this test moves it.
    clock.set(datetime.now(UTC).replace(second=0, microsecond=0))
    app = create_app(rt)
    with serve(app, "lembra-e2e-http") as url:
        yield url


@pytest.fixture
def page() -> Iterator[object]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 860}, locale="pt-BR",
                                      timezone_id="America/Sao_Paulo")
        context.set_default_timeout(15_000)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            yield page
        finally:
            try:  # what the browser showed last, for a failed run
                page.screenshot(path=str(ARTIFACTS / "zz-last-page.png"), full_page=True)
            except sync_api.Error:
                pass
            context.close()
            browser.close()
        assert not errors, f"JavaScript errors in the console pages: {errors}"


class Steps:
    """Numbered full-page screenshots, one per step."""

    def __init__(self, page: object) -> None:
        self.page, self.n = page, 0

    def shot(self, name: str) -> Path:
        self.n += 1
        path = ARTIFACTS / f"{self.n:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def _save(page) -> None:
    """Flask-Admin's primary "Salvar" button of the form on the page."""
    page.locator("form.admin-form input[type=submit].btn-primary").first.click()


def _row(page, *texts: str):
    rows = page.locator("table tbody tr")
    for text in texts:
        rows = rows.filter(has_text=text)
    return rows


def _dispatch_due(rt) -> list[str]:
    return [dispatch.send_one(rt, mid) for mid in dispatch.claim_due(rt, limit=50)]


def test_owner_sets_up_a_reminder_and_the_patient_confirms(rt, clock, server, page) -> None:
    steps = Steps(page)
    with rt.db.begin() as conn:
        org_id = create_org(conn, slug="bem-viver", name=CLINIC, state="SP")
        create_user(conn, org_id=org_id, email=EMAIL, role="owner", password=PASSWORD)

    # --- sign in ----------------------------------------------------------------------------
    page.goto(f"{server}/admin/")
    expect(page).to_have_url(re.compile(r"/login"))
    expect(page.get_by_role("heading", name="Entrar no Lembra")).to_be_visible()
    page.fill("#email", EMAIL)
    page.fill("#password", "senha-errada")
    page.get_by_role("button", name="Entrar").click()
    expect(page.get_by_text("E-mail ou senha incorretos.")).to_be_visible()
    page.fill("#email", EMAIL)
    page.fill("#password", PASSWORD)
    steps.shot("login")
    page.get_by_role("button", name="Entrar").click()
    expect(page).to_have_url(re.compile(r"/admin/$"))  # ?next= brought the owner back to the Painel
    expect(page.get_by_text(f"Painel da {CLINIC}")).to_be_visible()
    expect(page.get_by_role("heading", name=re.compile("Painel"))).to_have_count(1)  # one title, not two
    expect(page.get_by_text("Nenhuma mensagem enviada nos últimos 30 dias")).to_be_visible()
    expect(page.get_by_text(f"{EMAIL} (proprietário)")).to_be_visible()
    steps.shot("painel-vazio")

    # --- Canais: a sandbox WhatsApp channel, reached through the menu -----------------------
    page.get_by_role("link", name="Configuração").click()
    page.get_by_role("link", name="Canais").click()
    expect(page.get_by_text("Nenhum canal.")).to_be_visible()
    page.goto(f"{server}/admin/channels/new/")
    page.fill("#name", "WhatsApp de teste")
    page.select_option("#kind", "whatsapp")
    page.select_option("#provider", "sandbox")
    steps.shot("canal-novo")
    _save(page)
    channel_row = _row(page, "WhatsApp de teste")
    expect(channel_row).to_have_count(1)
    expect(channel_row).to_contain_text("Sandbox (testes: não envia nada)")
    expect(channel_row).to_contain_text("Ativo")
    steps.shot("canais")

    # --- Modelos: personalise the default WhatsApp reminder, with the live preview ----------
    page.goto(f"{server}/admin/templates/")
    default = _row(page, "Lembrete de sessão", "WhatsApp", "Português", "Padrão")
    expect(default).to_have_count(1)
    default.get_by_role("link", name="Personalizar").click()
    expect(page.locator("#key")).to_have_value("session_reminder")
    expect(page.locator("#channel_kind")).to_have_value("whatsapp")
    page.wait_for_load_state("load")  # the preview script listens from `load` on
    page.fill("#body", TEMPLATE_BODY)  # fires `input`: the preview is fetched live, with sample data
    page.locator("#body").dispatch_event("input")  # again, in case the first came before the listener
    expect(page.locator("#lembra-preview")).to_contain_text("Teste E2E: sua sessão com Dra. Beatriz Costa")
    expect(page.locator("#lembra-preview-error")).to_be_hidden()
    steps.shot("modelo-previa")
    _save(page)
    own = _row(page, "Lembrete de sessão", "WhatsApp", "Da clínica")
    expect(own).to_have_count(1)
    expect(own).to_contain_text("Teste E2E")
    steps.shot("modelos")

    # --- Regras de lembrete: 60 minutes before, WhatsApp, at any hour -----------------------
    # Through the create form only: the rules list page is a grid of its own (tested elsewhere).
    # The rule is proven below, when the appointment queues its reminder.
    page.goto(f"{server}/admin/rules/new/")
    page.fill("#name", "Lembrete 1 h antes")
    page.select_option("#purpose", "session_reminder")
    page.select_option("#template_key", "session_reminder")
    page.select_option("#trigger", "before_start")
    page.fill("#offset_minutes", "60")
    page.fill("#kinds", "whatsapp")
    # The test runs at any hour of the real day: the rule must not wait for 08:00–20:00.
    page.uncheck("#respect_window")
    steps.shot("regra-nova")
    _save(page)
    expect(page).not_to_have_url(re.compile(r"/admin/rules/new/"))  # saved: the form did not come back
    steps.shot("regras")

    # --- Contatos: the patient, with WhatsApp consent ----------------------------------------
    page.goto(f"{server}/admin/contacts/new/")
    page.fill("#name", PATIENT)
    page.fill("#phone", "(11) 98765-4321")
    expect(page.locator("input[name=consent]:checked")).to_have_count(0)  # consent is a deliberate act
    page.check("#consent-0")  # WhatsApp
    page.check("#consent-2")  # SMS
    page.select_option("#consent_method", "reception_verbal")
    _save(page)
    contact_row = _row(page, PATIENT)
    expect(contact_row).to_have_count(1)
    expect(contact_row).to_contain_text("WhatsApp")
    steps.shot("contatos")

    # --- Agendamentos: two hours from now; the reminder is queued at once --------------------
    starts = (clock.now() + timedelta(hours=2)).astimezone(TZ)
    due = starts - timedelta(minutes=60)
    page.goto(f"{server}/admin/appointments/new/")
    page.fill("#contact_id", PATIENT.split()[0])  # the patient search box (AJAX, org-scoped)
    page.locator("#contact_id-results button", has_text=PATIENT).click()
    expect(page.locator("#contact_id-value")).not_to_have_value("")
    page.fill("#starts_at", starts.strftime("%Y-%m-%dT%H:%M"))
    page.fill("#professional", PROFESSIONAL)
    page.select_option("#mode", "in_person")
    steps.shot("agendamento-novo")
    _save(page)
    expect(page.get_by_text("Agendamento criado; 1 lembrete na fila.")).to_be_visible()
    appt_row = _row(page, PATIENT)
    expect(appt_row).to_have_count(1)
    expect(appt_row).to_contain_text(starts.strftime("%d/%m/%Y %H:%M"))
    expect(appt_row).to_contain_text(PROFESSIONAL)
    expect(appt_row).to_contain_text("Agendado")
    steps.shot("agendamentos")

    # --- Fila: the reminder waits for its time -------------------------------------------------
    page.goto(f"{server}/admin/queue/")
    queued = _row(page, PATIENT, "Lembrete de sessão")
    expect(queued).to_have_count(1)
    expect(queued).to_contain_text("WhatsApp")
    expect(queued).to_contain_text("Agendada")
    expect(queued).to_contain_text(due.strftime("%d/%m/%Y %H:%M"))
    steps.shot("fila-agendada")

    # --- its time comes: the engine sends it (in-process, as the scheduler + worker would) ----
    clock.set(due + timedelta(minutes=1))
    assert _dispatch_due(rt) == ["sent"]
    page.reload()
    expect(_row(page, PATIENT, "Lembrete de sessão")).to_contain_text("Enviada")
    steps.shot("fila-enviada")

    # --- Caixa do sandbox: the patient's conversation; answer CONFIRMAR as the patient ----------
    sent_at = clock.now().astimezone(TZ).strftime("%d/%m/%Y %H:%M")
    page.get_by_role("link", name="Mensagens").click()
    page.get_by_role("link", name="Caixa do sandbox").click()
    expect(page).to_have_url(re.compile(r"/admin/sandbox/$"))
    expect(page.get_by_role("heading", name="Caixa do sandbox")).to_be_visible()
    conversation = page.locator(".lembra-contacts .list-group-item").filter(has_text=PATIENT)
    expect(conversation).to_have_count(1)
    expect(conversation).to_have_class(re.compile(r"\bactive\b"))  # the latest conversation opens by itself
    expect(page.locator(".card-header")).to_contain_text("+5511987654321")
    reminder = page.locator(".lembra-msg.out").filter(has_text="Teste E2E")
    expect(reminder).to_have_count(1)
    expect(reminder).to_contain_text(f"Olá Mariana! Teste E2E: sua sessão com {PROFESSIONAL}")
    expect(reminder).to_contain_text(f"{starts.strftime('%d/%m')}")
    expect(reminder).to_contain_text(f"às {starts.strftime('%H:%M')}")
    expect(reminder).to_contain_text(sent_at)  # when it went out, in the clinic's time zone
    expect(reminder.locator(".badge")).to_have_text("Enviada")
    page.get_by_label("Resposta do paciente").fill("CONFIRMAR")
    steps.shot("sandbox-resposta")
    page.get_by_role("button", name="Responder").click()
    expect(page.get_by_text("Resposta enviada como o paciente.")).to_be_visible()
    patient = page.locator(".lembra-msg.in")
    expect(patient).to_have_count(1)
    expect(patient).to_contain_text("CONFIRMAR")
    expect(patient).to_contain_text("O paciente confirmou o agendamento.")

    # the acknowledgement goes out on the next dispatch and lands in the same conversation, after the reply
    assert _dispatch_due(rt) == ["sent"]
    page.reload()
    clinic = page.locator(".lembra-msg.out")
    expect(clinic).to_have_count(2)
    expect(clinic.last).to_contain_text("Resposta: confirmado")
    expect(page.locator(".lembra-msg").last).to_contain_text("Resposta: confirmado")
    steps.shot("sandbox-confirmado")

    # --- Agendamentos: confirmed ---------------------------------------------------------------
    page.goto(f"{server}/admin/appointments/")
    appt_row = _row(page, PATIENT)
    expect(appt_row).to_contain_text("Confirmado")
    expect(appt_row).not_to_contain_text("Agendado")
    steps.shot("agendamento-confirmado")

    # --- Registros: both messages went out ------------------------------------------------------
    page.goto(f"{server}/admin/logs/")
    expect(_row(page, PATIENT, "Lembrete de sessão")).to_contain_text("Enviada")
    expect(_row(page, PATIENT, "Resposta: confirmado")).to_contain_text("Enviada")
    steps.shot("registros")

    # --- Painel: with a few weeks of history (sent, delivered, read, failed) for the screenshot --
    now = clock.now()
    _history(rt, clock, org_id, now)
    clock.set(now)
    page.goto(f"{server}/admin/")
    expect(page.get_by_role("heading", name="Últimos 30 dias")).to_be_visible()
    expect(page.locator(".lembra-bars")).to_be_visible()
    by_kind = _row(page, "WhatsApp")
    expect(by_kind).to_have_count(1)
    page.set_viewport_size({"width": 1280, "height": 720})
    steps.shot("painel")


def _history(rt, clock, org_id: int, now: datetime) -> None:
    """Three weeks of real traffic through the engine, in the past, so the dashboard has a shape:
    appointments for a handful of patients, reminders claimed and sent by the engine at their
    hour, then delivered / read / failed through the sandbox's own status webhook."""
    with rt.db.connect() as conn:
        channel_id = conn.execute(select(messages.c.channel_id).where(messages.c.org_id == org_id)).scalars().first()
    secret = sandbox_headers(rt, channel_id)  # the channel's webhook requires it
    with rt.db.begin() as conn:
        patients = [create_contact(conn, org_id=org_id, name=name, phone=f"+55119870010{i:02d}", consent=["whatsapp"])
                    for i, name in enumerate(["Ana Souza", "Bruno Lima", "Carla Dias", "Diego Rocha", "Elisa Melo",
                                              "Fábio Nunes", "Gabi Prado"])]
    for days_ago in range(21, 0, -1):
        day = now - timedelta(days=days_ago)
        if day.astimezone(TZ).weekday() == 6:
            continue
        count = 3 + (days_ago * 7) % 5
        with rt.db.begin() as conn:
            clock.set(day)
            for i in range(count):
                appt = create_appointment(conn, org_id=org_id, contact_id=patients[(days_ago + i) % len(patients)],
                                          starts_at=day + timedelta(hours=2, minutes=5 * i),
                                          professional="Dra. Beatriz Costa")
                refresh_appointment(conn, org_id, appt)
        clock.set(day + timedelta(hours=1, minutes=5 * (count - 1) + 1))  # all due, none started
        sent = dispatch.claim_due(rt, limit=50)
        assert [dispatch.send_one(rt, mid) for mid in sent] == ["sent"] * count
        with rt.db.connect() as conn:
            rows = conn.execute(select(messages.c.id, messages.c.provider_message_id)
                                .where(messages.c.id.in_(sent))).all()
        clock.set(day + timedelta(hours=1, minutes=5 * (count - 1) + 3))
        for n, row in enumerate(rows):
            statuses = ["failed"] if (days_ago + n) % 11 == 0 else \
                ["delivered", "read"] if n % 3 else ["delivered"]
            for status in statuses:
                body = {"type": "status", "id": row.provider_message_id, "status": status,
                        "timestamp": clock.now().timestamp()}
                if status == "failed":
                    body["error_code"] = "131026"
                receive(rt, "sandbox", channel_id, WebhookRequest(
                    method="POST", url="http://e2e.invalid/",
                    headers={"Content-Type": "application/json", **secret},
                    body=json.dumps(body).encode()))

