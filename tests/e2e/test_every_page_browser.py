"""Issue 11, acceptance 2: every console page, in both languages, as a person reads it.

Headless Chromium signs in to the demo clinic after the engine has worked for it (reminders sent
and one refused, a patient's free-text reply, a follow-up run), opens every page of the menu and,
from each list, the first record's details and edit pages. It fails on:

- any answer of 500 or more;
- a raw code on screen: a snake_case token, or a table name as a whole cell; the codes that are
  not snake_case (a connection state "connecting", "starttls", "pt_BR", a provider's registry
  name alone in a cell or after its label, Flask-Admin's "Exportar EXCEL", React Flow's "Edge
  from …") and "[redacted]" where a person expects a value;
- a plural written as a form to fill in: "lembrete(s)", "mensagem(ns)", "vai(ão)";
- English in the Portuguese console (words of English prose), or Portuguese in the English console
  (in the console's own words: headings, labels, buttons, menus, notices; the clinic's data,
  patients' names and message bodies, stay Portuguese in both);
- a list's column that is blank on every row of three or more (scaffolding, or a value the page
  never fills);

and saves a screenshot of every page under `test-artifacts/e2e/pages/<language>/`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest

CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` to run the browser test", allow_module_level=True)

from playwright import sync_api
from sqlalchemy import update

from admin.app import create_app
from engine.messaging import dispatch
from engine.fleet.demo import DEMO_EMAIL, DEMO_PASSWORD, seed
from engine.flows.runtime import advance_claimed, claim_due
from engine.messaging.inbound import process_inbound, receive
from engine.store.models import Base, channels, webhook_deliveries
from engine.tenants.audit import audit
from engine.tenants.channels import create_channel
from engine.tenants.webhooks import endpoints, events
from gateway.contract import WebhookRequest
from tests.e2e.live import CHROMIUM_ARGS, serve
from tests.factories import sandbox_headers

pytestmark = pytest.mark.timeout(600)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "e2e" / "pages"

#: Tokens that look like code but are what a person types or reads: template variables between
#: braces, e-mail addresses, URLs and host names are removed before looking.
TYPED = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|[\w.+-]+@[\w.-]+|https?://\S+|\b[\w.-]+\.(?:png|csv|db)\b"
                   r"|\b(?:[a-z0-9-]+\.)+(?:com|br|net|org|io|local|invalid)\b")
SNAKE = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
TABLES = {table.name for table in Base.metadata.sorted_tables}
#: A plural left to the reader ("lembrete(s)", "mensagem(ns)", "vai(ão)"); "http(s)" is an address's spelling.
PLURAL = re.compile(r"(?<!\bhttp)(?<=\w)\((?:s|ns|es|is|ão|ões)\)", re.I)
#: Codes a person must not read that are not snake_case, matched whole and case-sensitively
#: (STARTTLS in capitals is the protocol's name; "starttls" the stored value).
RAW = re.compile(r"\b(?:connecting|starttls|pt_BR|en_US|EXCEL)\b|\bEdge from\b|\[redacted\]")
#: A label followed by nothing but a stored code ("Provedor: meta", "Resultado: failed"): the codes
#: listed, so that a value in words ("Resultado: falhou") is never taken for one.
LABELLED = re.compile(r"(?m)^[^\S\n]*(?:Provedor|Provider|Resultado|Result|Origem|Source|Modalidade|Mode|Idioma|"
                      r"Language|Modelo|Template|Situação|Status|Segurança|Security):[^\S\n]*"
                      r"(ok|failed|unsupported|created|online|none|ssl|sent|delivered|read|pending|"
                      r"sandbox|evolution|meta|smtp|resend|twilio|zenvia|open|close)[^\S\n]*$")
#: A provider's registry name alone in a cell.
PROVIDERS = {"sandbox", "evolution", "meta", "smtp", "resend", "twilio", "zenvia"}
#: Pages the menu does not link to that show a case the checks must see (a provider's choices).
EXTRA_PAGES = ("/admin/channels/new/?provider=smtp",)
#: Words of English prose that Portuguese never uses.
ENGLISH = re.compile(r"\b(?:the|and|with|failed|record|records|save|delete|edit|create|export|search|selected|"
                     r"details|none|true|false|please|error|not found|found|your|this|that|which|when|after|"
                     r"attempts|gave up|outcome|unknown|stopped|working|cancelled|list|view|filter|add|remove|"
                     r"previous|next|back|page|yes|home|sign in|log out|settings|queue|dashboard)\b", re.I)
#: Words of Portuguese prose that English never uses.
PORTUGUESE = re.compile(r"(?:\b(?:não|você|vocês|para|com|uma|está|estão|são|então|também|lembrete|lembretes|"
                        r"agendamento|agendamentos|mensagem|mensagens|paciente|pacientes|salvar|excluir|editar|"
                        r"criar|exportar|buscar|filtro|nenhum|nenhuma|sim|ainda|aqui|quando|depois|canal|canais|"
                        r"modelo|modelos|regra|regras|fila|pendência|pendências|conversa|conversas)\b)", re.I)
#: What the console itself says (not the clinic's data).
CHROME = ("h1, h2, h3, h4, h5, th, label, button, .btn, .nav-link, .dropdown-item, .alert, .lembra-empty, "
          ".help-block, .form-text, .badge, .breadcrumb, .card-header, legend, .lembra-hint")


@pytest.fixture
def demo(rt, clock) -> dict[str, int]:
    """The demo clinic after a few hours of work: reminders sent, one refused, a free-text reply."""
    start = datetime.now(UTC).replace(second=0, microsecond=0)
    clock.set(start)
    with rt.db.begin() as conn:
        seeded = seed(conn, rt.keyring)
        email_channel = conn.execute(update(channels).where(channels.c.org_id == seeded.org_id,
                                                            channels.c.kind == "email")
                                     .values(settings={"simulate": "permanent"}).returning(channels.c.id)).scalar()
    for hours in (1, 6, 30):
        clock.set(start + timedelta(hours=hours))
        for message_id in dispatch.claim_due(rt, limit=200):
            dispatch.send_one(rt, message_id)
        advance_claimed(rt, claim_due(rt, limit=200))
    with rt.db.connect() as conn:
        whatsapp = conn.execute(channels.select().where(channels.c.org_id == seeded.org_id,
                                                        channels.c.kind == "whatsapp")).first()
    body = ('{"type": "message", "id": "walk-1", "from": "+5516999990001", "timestamp": %d, '
            '"text": "Oi, posso remarcar para sexta?"}' % int(clock.now().timestamp())).encode()
    received = receive(rt, "sandbox", whatsapp.id, WebhookRequest(
        method="POST", url="/webhooks/sandbox", headers=sandbox_headers(rt, whatsapp.id), body=body))
    for inbound_id in received.inbound_ids:
        process_inbound(rt, inbound_id)
    _seed_codes_a_page_must_say_in_words(rt, seeded.org_id, clock.now())
    endpoint_id, delivery_id = _seed_a_webhook_answer(rt, seeded.org_id, clock.now())
    return {"org_id": seeded.org_id, "email_channel": int(email_channel or 0),
            "delivery_page": f"/admin/settings/webhooks/{endpoint_id}/deliveries/{delivery_id}/"}


def _seed_a_webhook_answer(rt, org_id: int, now: datetime) -> tuple[int, int]:
    """A webhook delivery the clinic's system refused with an answer in its own words (English,
    snake_case keys): shown as the receiver's text, not read as the console's."""
    with rt.db.begin() as conn:
        endpoint_id = endpoints.create_endpoint(conn, rt.keyring, org_id, url="https://93.184.216.34/lembra",
                                                event_types=["appointment.confirmed"], egress=None).endpoint_id
        [delivery_id] = events.enqueue(conn, org_id, [endpoint_id], events.APPOINTMENT_CONFIRMED,
                                       events.envelope(events.APPOINTMENT_CONFIRMED, {"appointment_id": 1}))
        conn.execute(update(webhook_deliveries).where(webhook_deliveries.c.id == delivery_id).values(
            status="dead", attempts=6, last_attempt_at=now, last_status_code=500, last_error="webhook_server_error",
            last_response_reason="Internal Server Error", last_duration_ms=42,
            last_response_body='{"error_code": "agenda_down", "message": "the agenda failed, please retry"}'))
    return endpoint_id, delivery_id


def _seed_codes_a_page_must_say_in_words(rt, org_id: int, now: datetime) -> None:
    """What the demo alone does not show: a phone link waiting for its QR code and one that failed,
    and audit rows whose values are codes (a check's result, where a change came from, an
    appointment's mode, a template's purpose and language, a provider, a flow's name)."""
    with rt.db.begin() as conn:
        for name, detail in (("WhatsApp do celular", "connecting"), ("WhatsApp antigo", "close:connection_error")):
            channel_id = create_channel(conn, rt.keyring, org_id=org_id, kind="whatsapp", provider="evolution",
                                        name=name, is_default=False,
                                        credentials={"base_url": "http://127.0.0.1:9", "api_key": "chave-de-teste",
                                                     "instance": "clinica", "webhook_secret": "segredo-de-teste"})
            conn.execute(update(channels).where(channels.c.id == channel_id).values(status_detail=detail))
        for entity, action, changes in (
                ("channels", "check", {"result": "failed"}),
                ("enrollments", "enroll", {"source": "console_bulk"}),
                ("appointments", "update", {"mode": "in_person"}),
                ("templates", "create", {"key": "session_reminder", "locale": "pt_BR", "channel_kind": "whatsapp"}),
                ("channels", "create", {"name": "Meta", "provider": "meta", "kind": "whatsapp"}),
                ("flows", "publish", {"name": "Retomar contato", "version": 2})):
            audit(conn, org_id=org_id, action=action, entity=entity, entity_id=1, changes=changes)


@pytest.fixture
def server(rt, demo) -> Iterator[str]:
    with serve(create_app(rt), "lembra-walk-http") as url:
        yield url


def _pages(page, server: str) -> list[str]:
    """The menu's pages, then the first details and edit page each list links to."""
    page.goto(f"{server}/admin/")
    menu = page.eval_on_selector_all(
        "nav a[href^='/admin/'], .navbar a[href^='/admin/']", "els => els.map(e => e.getAttribute('href'))")
    lists = list(dict.fromkeys(h for h in menu if h and "/export/" not in h and "logout" not in h))
    found = list(lists)
    for path in lists:
        page.goto(f"{server}{path}")
        links = page.eval_on_selector_all("table a[href]", "els => els.map(e => e.getAttribute('href'))")
        for kind in ("/details/", "/edit/"):
            first = next((h for h in links if h and kind in h and h.startswith("/admin/")), None)
            if first and first not in found:
                found.append(first)
        # Pages that are not a model's table (a conversation, a chat, a run) link to their own records.
        own = page.eval_on_selector_all(f"main a[href^='{path}'], .container-fluid a[href^='{path}']",
                                        "els => els.map(e => e.getAttribute('href'))")
        first = next((h for h in own if h and h != path and not any(
            skip in h for skip in ("/export/", "/new/", "/details/", "/edit/", "sort=", "page=", "flt"))), None)
        if first and first not in found:
            found.append(first)
        new = f"{path.rstrip('/')}/new/"
        if page.locator(f"a[href^='{new}']").count() and new not in found:
            found.append(new)
    return found + [path for path in EXTRA_PAGES if path not in found]


def _plural_words(text: str) -> list[str]:
    """Each "word(s)" of `text`, with its word, for the report."""
    return [text[max(0, m.start() - 20):m.end()].split()[-1] for m in PLURAL.finditer(text)]


#: Reads each list's columns: a named column whose every cell (of three rows or more) is blank.
EMPTY_COLUMNS = """() => [...document.querySelectorAll('table')].flatMap(t => {
  const heads = [...t.querySelectorAll('thead th')].map(th => th.innerText.trim());
  const rows = [...t.querySelectorAll('tbody tr')].filter(r => r.cells.length === heads.length);
  if (rows.length < 3) return [];
  return heads.filter((h, i) => h && rows.every(r => !r.cells[i].innerText.trim()));
})"""


def _empty_columns(page) -> list[str]:
    """Columns of a list that hold nothing on any row: scaffolding, or a value the page never fills."""
    return page.evaluate(EMPTY_COLUMNS)


def _problems(page, language: str) -> list[str]:
    empty = _empty_columns(page)
    # What a person types (a CSV column, a template variable) is shown as code: not a raw code.
    page.eval_on_selector_all("code, kbd, samp, pre", "els => els.forEach(e => e.remove())")
    body = TYPED.sub(" ", page.inner_text("body"))
    problems = [f"raw code {token!r}" for token in sorted(set(SNAKE.findall(body)))]
    problems += [f"raw code {token!r}" for token in sorted(set(RAW.findall(body)))]
    problems += [f"raw code after a label {token!r}" for token in sorted(set(LABELLED.findall(body)))]
    problems += [f"plural left to the reader {m!r}" for m in sorted(set(_plural_words(body)))]
    cells = page.eval_on_selector_all("td", "els => els.map(e => e.innerText.trim())")
    problems += [f"table name {cell!r} in a cell" for cell in set(cells) if cell in TABLES]
    problems += [f"provider code {cell!r} in a cell" for cell in set(cells) if cell in PROVIDERS]
    problems += [f"column {name!r} empty in every row" for name in empty]
    chrome = TYPED.sub(" ", " \n ".join(page.eval_on_selector_all(CHROME, "els => els.map(e => e.innerText)")))
    if language == "pt-BR":
        problems += [f"English {m!r}" for m in sorted({m.lower() for m in ENGLISH.findall(body)})]
    else:
        problems += [f"Portuguese {m!r}" for m in sorted({m.lower() for m in PORTUGUESE.findall(chrome)})]
    return problems


@pytest.mark.parametrize("language", ["pt-BR", "en"])
def test_every_console_page_speaks_one_language_and_shows_no_raw_code(rt, demo, server, language) -> None:
    failures: dict[str, list[str]] = {}
    errors: list[str] = []
    folder = ARTIFACTS / language
    folder.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1366, "height": 900}, locale=language)
        context.set_default_timeout(20_000)
        page = context.new_page()
        page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 500 else None)
        page.goto(f"{server}/login")
        page.fill("#email", DEMO_EMAIL)
        page.fill("#password", DEMO_PASSWORD)
        page.locator("button[type=submit]").click()
        page.wait_for_url(re.compile(r"/admin/$"))
        if language == "en":
            page.select_option("#lembra-locale", "en")
            page.wait_for_load_state("load")
        menu_height = page.locator(".navbar").first.bounding_box()["height"]
        pages = _pages(page, server) + [demo["delivery_page"]]
        for index, path in enumerate(pages):
            page.goto(f"{server}{path}")
            page.wait_for_load_state("load")
            record = re.search(r"\bid=(\d+)", urlsplit(path).query)
            name = re.sub(r"[^a-z0-9]+", "-", urlsplit(path).path.lower()).strip("-") + (
                f"-{record.group(1)}" if record else "")
            page.screenshot(path=str(folder / f"{index:02d}-{name or 'painel'}.png"), full_page=True)
            problems = _problems(page, language)
            if problems:
                failures[path] = problems
        context.close()
        browser.close()
    assert not errors, f"answers of 500 or more: {errors}"
    assert len(pages) > 20, pages
    report = "\n".join(f"{path}: {', '.join(found)}" for path, found in failures.items())
    assert not failures, f"{len(failures)} of {len(pages)} pages in {language}:\n{report}"
    assert menu_height < 80, f"the menu wraps to two lines at 1366 px ({menu_height:.0f} px high)"
