"""The console in English: every string wrapped for translation (in admin/, found the way babel.cfg says) has an
English translation with the same placeholders, and every page of the admin menu speaks the reader's language
(English when the user chose it, Portuguese by default)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from babel.messages.catalog import Catalog
from babel.messages.extract import DEFAULT_KEYWORDS, extract_from_dir
from babel.messages.frontend import parse_mapping_cfg
from babel.messages.pofile import read_po
from flask import Flask
from sqlalchemy import update

from engine.store.models import users
from engine.messaging.optout_links import OptOutTarget, make_token
from tests.admin.conftest import csrf

ROOT = Path(__file__).resolve().parents[2]
PO = ROOT / "admin" / "translations" / "en" / "LC_MESSAGES" / "messages.po"
#: babel's own keywords (_, gettext, ngettext, lazy_gettext …) plus admin.i18n's lazy `_l` and engine.words.texts'
#: `N_` and `Np_` (a sentence with a count: singular and plural).
KEYWORDS = {**DEFAULT_KEYWORDS, "_l": None, "N_": None, "Np_": (1, 2)}
#: printf conversions, `%%` included: a msgstr must use exactly the msgid's.
CONVERSION = re.compile(r"%(?:\(\w+\))?[-#0 +]*\d*(?:\.\d+)?[diouxXeEfFgGcrs%]")

#: Words of the console's own chrome and menu; the tenants' data (names, template bodies) contains none of them.
PORTUGUESE = ("Agendamentos", "Contatos", "Canais", "Modelos", "Configuração", "Regras de lembrete", "Registros",
              "Auditoria", "Painel", "Caixa do sandbox", "Nenhum", "Nada por aqui", "Sair", "proprietário")
ENGLISH = ("Appointments", "Contacts", "Channels", "Templates", "Settings", "Reminder rules", "Queue", "Logs",
           "Audit log", "Dashboard", "Sign out")
#: Pages with this branch's own templates, beyond the menu's lists: (path, English text, Portuguese text).
EXTRA_PAGES = (
    ("/admin/channels/details/?id={channel_id}", "Send test", "Enviar teste"),
    ("/admin/queue/details/?id={message_id}", "History", "Histórico"),
    ("/admin/templates/new/", "Preview", "Pré-visualização"),
    ("/admin/appointments/import/", "Import appointments from a spreadsheet", "Importar agendamentos de uma planilha"),
)
ISO_DATETIME = re.compile(r"\b\d{4}-\d{2}-\d{2} \d{2}:\d{2}\b")
BR_DATETIME = re.compile(r"\b\d{2}/\d{2}/\d{4} \d{2}:\d{2}\b")


def extracted() -> dict[Any, list[str]]:
    """Every msgid in admin/ and engine/ (Python and templates, as babel.cfg maps them) and where it is used."""
    with (ROOT / "babel.cfg").open() as fh:
        method_map, options_map = parse_mapping_cfg(fh)
    found: dict[Any, list[str]] = {}
    for filename, lineno, message, _comments, _context in extract_from_dir(
            ROOT, method_map, options_map, keywords=KEYWORDS,
            directory_filter=lambda path: Path(path).relative_to(ROOT).parts[0] in ("admin", "engine", "providers")):
        found.setdefault(message, []).append(f"{filename}:{lineno}")
    return found


def english() -> Catalog:
    with PO.open("rb") as fh:
        return read_po(fh, locale="en")


def _conversions(text: str) -> list[str]:
    return sorted(CONVERSION.findall(text))


def test_every_console_string_has_an_english_translation_with_the_same_placeholders() -> None:
    found = extracted()
    assert len(found) > 100, "babel.cfg found almost nothing in admin/"
    catalog = english()
    problems: list[str] = []
    for msgid, where in sorted(found.items(), key=lambda item: str(item[0])):
        entry = catalog.get(msgid)
        singular, plural = (msgid, msgid) if isinstance(msgid, str) else msgid[:2]
        if entry is None or not entry.string or (isinstance(entry.string, tuple) and not all(entry.string)):
            problems.append(f"no English for {singular!r} ({where[0]})")
            continue
        if entry.fuzzy:
            problems.append(f"fuzzy translation of {singular!r}")
        translations = (entry.string,) if isinstance(entry.string, str) else entry.string
        for source, translation in zip((singular, plural), translations):
            if _conversions(source) != _conversions(translation):
                problems.append(f"placeholders differ: {source!r} -> {translation!r}")
    assert not problems, "\n".join(problems)


def test_the_catalog_holds_only_strings_the_code_still_uses() -> None:
    # Stale entries would hide a string that changed; locations would make the file churn on every edit.
    sources = {msgid if isinstance(msgid, str) else msgid[0] for msgid in extracted()}
    catalog = english()
    stale = [m.id for m in catalog if m.id and (m.id if isinstance(m.id, str) else m.id[0]) not in sources]
    assert not stale, f"in the catalog but not in admin/ or engine/ (update it as babel.cfg says): {stale}"
    assert not catalog.obsolete
    assert not [m.id for m in catalog if m.locations], "write the catalog with --no-location"


# --- pages --------------------------------------------------------------------------------------------------
class _VisibleText(HTMLParser):
    """A page's visible text (and the titles, placeholders and labels a reader sees), one chunk per node."""

    ATTRIBUTES = ("title", "placeholder", "aria-label", "alt")

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._hidden += 1
        self.chunks += [value.strip() for name, value in attrs if name in self.ATTRIBUTES and value]

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        text = data.strip()
        if self._hidden or not text:
            return
        if text.startswith("{"):  # Flask-Admin's filter labels and options travel as JSON in a hidden div
            try:
                self.chunks += list(_strings(json.loads(text)))
                return
            except ValueError:
                pass
        self.chunks += [part.strip() for part in text.split("·") if part.strip()]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def visible(html: str) -> list[str]:
    parser = _VisibleText()
    parser.feed(html)
    return parser.chunks


def menu_urls(app: Flask) -> list[str]:
    """Every page the console's menu links to (views and links, inside categories too)."""
    admin = app.extensions["admin"][0]

    def walk(items: list[Any]) -> Iterator[str]:
        for item in items:
            if item.is_category():
                yield from walk(item._children)  # get_children() hides what the anonymous request may not see
            elif item.get_url():
                yield item.get_url()

    with app.test_request_context():
        return list(dict.fromkeys(walk(admin.menu())))


def pages(app: Flask, tenants: Any) -> list[str]:
    a, _ = tenants
    return menu_urls(app) + [path.format(channel_id=a.channel_id, message_id=a.message_id)
                             for path, _en, _pt in EXTRA_PAGES]


def _set_locale(rt: Any, email: str, locale: str | None) -> None:
    with rt.db.begin() as conn:
        conn.execute(update(users).where(users.c.email == email).values(locale=locale))


def _untranslated_sources() -> set[str]:
    """Portuguese strings whose English differs; none of them may show on an English page."""
    out = set()
    for m in english():
        if isinstance(m.id, str) and m.id and m.string and m.string != m.id and not CONVERSION.search(m.id):
            out.add(m.id)
    return out


def test_the_menu_reaches_every_console_list(app: Flask) -> None:
    urls = menu_urls(app)
    for path in ("/admin/", "/admin/appointments/", "/admin/channels/", "/admin/templates/", "/admin/queue/",
                 "/admin/logs/", "/admin/audit/"):
        assert path in urls


def test_every_menu_entry_has_an_english_name(app: Flask) -> None:
    admin = app.extensions["admin"][0]

    def names(language: str) -> list[str]:
        with app.test_request_context(headers={"Accept-Language": language}):
            out = []
            for item in admin.menu():
                out.append(str(item.name))
                out += [str(child.name) for child in (item._children if item.is_category() else [])]
            return out

    same = [pt for pt, en in zip(names("pt-BR"), names("en")) if pt == en]
    assert not same, f"menu entries without an English name (wrapped in _l and in the catalog?): {same}"


def test_every_console_page_speaks_english_to_a_user_who_chose_it(app, owner, tenants, rt) -> None:
    _set_locale(rt, "owner@a.com.br", "en")
    leaks = _untranslated_sources()
    menu = menu_urls(app)
    for path in pages(app, tenants):
        response = owner.get(path)
        assert response.status_code == 200, path
        chunks = visible(response.text)
        text = "\n".join(chunks)
        for word in PORTUGUESE:
            assert word not in text, f"{path}: Portuguese {word!r} on an English page"
        for word in ENGLISH:
            assert word in text, f"{path}: no {word!r}"
        leaked = sorted(set(chunks) & leaks)
        assert not leaked, f"{path}: untranslated {leaked}"
        # (The CSV import page's example line is data in an accepted input format, so only the menu's pages.)
        assert path not in menu or not BR_DATETIME.search(text), f"{path}: a dd/mm/yyyy date on an English page"
    for path, en, pt in EXTRA_PAGES:
        a, _ = tenants
        html = owner.get(path.format(channel_id=a.channel_id, message_id=a.message_id)).text
        assert en in html and pt not in html, path
    assert ISO_DATETIME.search("\n".join(visible(owner.get("/admin/queue/").text)))


def test_every_console_page_speaks_portuguese_by_default(app, owner, tenants) -> None:
    for path in pages(app, tenants):
        response = owner.get(path)
        assert response.status_code == 200, path
        text = "\n".join(visible(response.text))
        for word in ("Agendamentos", "Canais", "Modelos", "Configuração", "Sair"):
            assert word in text, f"{path}: no {word!r}"
        for word in ("Appointments", "Templates", "Settings", "Dashboard", "Sign out"):
            assert word not in text, f"{path}: English {word!r} on a Portuguese page"
    for path, en, pt in EXTRA_PAGES:
        a, _ = tenants
        html = owner.get(path.format(channel_id=a.channel_id, message_id=a.message_id)).text
        assert pt in html and en not in html, path
    queue = "\n".join(visible(owner.get("/admin/queue/").text))
    assert BR_DATETIME.search(queue) and not ISO_DATETIME.search(queue)


@pytest.mark.parametrize(("locale", "expected"), [("en", "1 message cancelled."), (None, "1 mensagem cancelada.")])
def test_flash_messages_follow_the_language(owner, tenants, rt, locale, expected) -> None:
    a, _ = tenants
    _set_locale(rt, "owner@a.com.br", locale)
    token = csrf(owner.get("/admin/queue/").text)
    response = owner.post("/admin/queue/action/", data={"csrf_token": token, "action": "cancel",
                                                        "rowid": [a.message_id]}, follow_redirects=True)
    assert expected in response.text


def test_the_public_opt_out_page_follows_the_browser_language(app, tenants, rt) -> None:
    a, _ = tenants
    token = make_token(rt.keyring, OptOutTarget(a.world.org_id, a.contact_id, "email"))
    client = app.test_client()
    english_page = client.get(f"/optout/{token}", headers={"Accept-Language": "en-US,en;q=0.9"}).text
    assert "Stop receiving emails" in english_page and "Parar de receber" not in english_page
    assert "Parar de receber e-mails" in client.get(f"/optout/{token}").text
