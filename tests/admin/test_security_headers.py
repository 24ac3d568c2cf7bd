"""Security headers on every response (issue 9, point 6): a Content-Security-Policy the console's own
pages satisfy (every inline script and style carries the response's nonce, every inline event
handler is one the policy allows by hash), no framing, nosniff, a referrer policy, and `no-store`
on signed-in pages and exports but not on static files."""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

from sqlalchemy import update

from engine.store.models import users
from engine.messaging.optout_links import OptOutTarget, make_token
from tests.admin.conftest import csrf, login

HANDLER = re.compile(r"^on[a-z]+$")


def _policy(response) -> dict[str, list[str]]:
    header = response.headers.get("Content-Security-Policy")
    assert header, f"no CSP on {response.request.path}"
    out: dict[str, list[str]] = {}
    for part in header.split(";"):
        name, *values = part.split()
        out[name] = values
    return out


def _nonce(policy: dict[str, list[str]]) -> str:
    [nonce] = [v[len("'nonce-"):-1] for v in policy["script-src"] if v.startswith("'nonce-")]
    assert f"'nonce-{nonce}'" in policy["style-src"]
    return nonce


def _sha256(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


class _Inline(HTMLParser):
    """What a page asks the CSP to allow: inline scripts and styles, handlers, links, resources."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[tuple[str | None, str | None]] = []  # (nonce, src)
        self.styles: list[str | None] = []
        self.handlers: list[str] = []
        self.links: list[str] = []
        self.resources: list[str] = []
        self.js_urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script":
            self.scripts.append((a.get("nonce"), a.get("src")))
        elif tag == "style":
            self.styles.append(a.get("nonce"))
        elif tag == "link" and a.get("href"):
            self.resources.append(a["href"])
        elif tag in ("img", "iframe", "embed", "object") and a.get("src"):
            self.resources.append(a["src"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        self.handlers += [value or "" for name, value in attrs if HANDLER.match(name)]
        self.js_urls += [value for name, value in attrs
                         if name in ("href", "src", "action") and value and value.strip().lower().startswith("javascript:")]


def _check_page(response, path: str) -> _Inline:
    policy = _policy(response)
    nonce = _nonce(policy)
    page = _Inline()
    page.feed(response.get_data(as_text=True))
    for script_nonce, src in page.scripts:
        if src is None:
            assert script_nonce == nonce, f"{path}: an inline <script> without this response's nonce"
        else:
            assert not urlsplit(src).netloc, f"{path}: a script from elsewhere: {src}"
    assert all(n == nonce for n in page.styles), f"{path}: a <style> without this response's nonce"
    allowed = set(policy["script-src"])
    for handler in page.handlers:
        assert _sha256(handler) in allowed, f"{path}: inline handler {handler!r} is not allowed by the CSP"
    for resource in page.resources:
        assert not urlsplit(resource).netloc or resource.startswith("data:"), f"{path}: loads {resource}"
    # Flask-Admin's inert "javascript:void(0)" placeholders (allowed by hash too); nothing else.
    assert set(page.js_urls) <= {"javascript:void(0)"}, f"{path}: {page.js_urls}"
    assert not page.js_urls or _sha256("javascript:void(0)") in allowed, path
    return page


def _crawl(client, start: list[str], limit: int = 160) -> list[str]:
    """Console pages reachable from `start` by plain links (GET only, no exports, no sign-out)."""
    seen: list[str] = []
    queue = list(start)
    while queue and len(seen) < limit:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.append(path)
        response = client.get(path)
        page = _check_page(response, path)
        if response.status_code != 200:  # (a global default template's edit link answers 404: not ours)
            continue
        for href in page.links:
            url = urlsplit(urljoin(path, href))
            if url.netloc or not url.path.startswith("/admin/") or "/export/" in url.path or "static" in url.path:
                continue
            target = url.path + (f"?{url.query}" if url.query else "")
            if target not in seen and target not in queue:
                queue.append(target)
    return seen


def test_every_console_page_satisfies_its_own_policy(app, owner, tenants):
    a, _ = tenants
    # Rows so every page kind renders: a details, an edit and a create form of each view, the
    # sandbox chat, the key list with its "Revogar" action, the templates list with its delete buttons.
    owner.post("/admin/apikeys/new/", data={"csrf_token": csrf(owner.get("/admin/apikeys/new/").text),
                                            "name": "Agenda"})
    seen = _crawl(owner, ["/admin/", "/admin/templates/", "/admin/apikeys/", "/admin/sandbox/",
                          f"/admin/channels/details/?id={a.channel_id}", f"/admin/queue/details/?id={a.message_id}"])
    kinds = {urlsplit(p).path.rstrip("/").rsplit("/", 1)[-1] for p in seen}
    assert {"new", "edit", "details", "sandbox", "import"} <= kinds, kinds
    assert len(seen) > 30, seen


def test_flask_admins_inline_handlers_are_allowed_by_hash_and_nothing_else_inline(owner, tenants, rt):
    apikeys = owner.get("/admin/apikeys/")
    page = _check_page(apikeys, "/admin/apikeys/")
    assert "return modelActions.execute('revoke');" in page.handlers
    templates = owner.get("/admin/templates/")
    assert any("safeConfirm" in h for h in _check_page(templates, "/admin/templates/").handlers)
    with rt.db.begin() as conn:  # the delete confirmation is translated: its English hash is allowed too
        conn.execute(update(users).where(users.c.email == "owner@a.com.br").values(locale="en"))
    english = _check_page(owner.get("/admin/templates/"), "/admin/templates/")
    assert "return faHelpers.safeConfirm('Are you sure you want to delete this record?');" in english.handlers
    policy = _policy(apikeys)
    assert "'unsafe-inline'" not in policy["script-src"] and "'unsafe-eval'" not in policy["script-src"]
    assert "'unsafe-inline'" not in policy["style-src"]
    assert _sha256("alert(1)") not in policy["script-src"]


def test_the_policy_frames_nothing_and_loads_only_from_here(app, owner):
    policy = _policy(owner.get("/admin/"))
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["default-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["base-uri"] == ["'none'"]
    assert policy["form-action"] == ["'self'"]


def test_every_response_carries_the_headers(app, owner, tenants, rt):
    a, _ = tenants
    anonymous = app.test_client()
    token = make_token(rt.keyring, OptOutTarget(a.world.org_id, a.contact_id, "email"))
    responses = {
        "login": anonymous.get("/login"),
        "redirect to login": anonymous.get("/admin/"),
        "not found": anonymous.get("/nao-existe"),
        "opt-out page": anonymous.get(f"/optout/{token}"),
        "webhook refusal": anonymous.post(f"/webhooks/sandbox/{a.channel_id}", data=b"{}"),
        "health": anonymous.get("/healthz"),
        "api": anonymous.get("/api/v1/contacts"),
        "static": anonymous.get("/admin/static/admin/js/helpers.js?v=1.0.0"),
        "console": owner.get("/admin/"),
        "export": owner.get("/admin/appointments/export/csv/"),
    }
    for name, response in responses.items():
        response.get_data()  # (an export streams: read it to the end)
        response.close()  # (the static file's response holds the file open until closed)
        headers = response.headers
        assert "frame-ancestors 'none'" in headers.get("Content-Security-Policy", ""), name
        assert headers.get("X-Frame-Options") == "DENY", name
        assert headers.get("X-Content-Type-Options") == "nosniff", name
        assert headers.get("Referrer-Policy") == "same-origin", name
    assert responses["static"].status_code == 200


def test_signed_in_pages_and_exports_are_never_stored_but_static_files_may_be(app, owner, tenants):
    a, _ = tenants
    for path in ("/admin/", "/admin/appointments/", f"/admin/contacts/details/?id={a.contact_id}",
                 "/admin/sandbox/", "/admin/appointments/export/csv/", "/admin/users/export/csv/"):
        response = owner.get(path)
        response.get_data()
        assert response.status_code == 200, path
        assert response.headers.get("Cache-Control") == "no-store", path
    export = owner.get("/admin/appointments/export/csv/")
    assert export.mimetype == "text/csv" and "Paciente Da A" in export.get_data(as_text=True)
    with app.test_client().get("/admin/static/admin/js/helpers.js?v=1.0.0") as static:  # closed: it holds the file
        assert static.status_code == 200
        assert "no-store" not in (static.headers.get("Cache-Control") or "")


def test_each_response_gets_its_own_nonce(owner):
    first, second = owner.get("/admin/"), owner.get("/admin/")
    assert _nonce(_policy(first)) != _nonce(_policy(second))
    assert f'nonce="{_nonce(_policy(first))}"' in first.text


def test_the_sign_in_page_satisfies_the_policy_too(app, tenants):
    client = app.test_client()
    _check_page(client.get("/login"), "/login")
    login(client, "agent@a.com.br")
    _check_page(client.get("/admin/sandbox/"), "/admin/sandbox/")
