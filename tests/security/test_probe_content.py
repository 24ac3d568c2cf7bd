"""Stored and reflected XSS, and CSV exports (issue 9, acceptance).

Org A's free-text fields hold `XSS` (tests/security/conftest.py): typed by the clinic (channel,
template, appointment's professional and place, flow name and node labels, agent name and persona,
pendência text, audit details) or by a patient (contact name through the API, an inbound reply
through the webhook). Every console page that can show them, for every role, is walked from the
url_map: none may carry the payload unescaped. Exports: no cell a spreadsheet would evaluate, no
row of org B.
"""

from __future__ import annotations

import csv
import io
import pytest

from admin.views.base import FORMULA_PREFIXES
from tests.security.conftest import B_MARKERS, FORMULA, XSS, XSS_RAW, Probe
from tests.security.routes import EXTRA_ID_PARAMS, QUERY_ID_PARAMS, Route, classify
from tests.security.walk import Findings, header_problems

ESCAPED = "alert(&#39;lx1&#39;)"  # how the first payload reads once escaped


@pytest.fixture(scope="module")
def routes(probe: Probe) -> list[Route]:
    found, errors = classify(probe.app)
    assert not errors, "routes the probe cannot classify:\n" + "\n".join(errors)
    return found


def _own_pages(probe: Probe, routes: list[Route]) -> list[str]:
    """Every console GET page that shows org A's rows: lists, details and edit pages of A's ids,
    new-forms, custom pages with A's ids in the path and in every query-string id name."""
    a = probe.a
    urls: list[str] = []
    for route in routes:
        if "GET" not in route.methods or route.kind in ("static", "public", "session", "webhook", "optout", "api",
                                                         "export"):
            continue
        base = route.url(**{n: a.ids[t] for n, t in route.args.items()}) if route.args else route.rule
        if route.kind == "qid":
            urls.append(f"{base}?id={a.ids[route.table]}")
            continue
        urls.append(base)
        for method, param, table in EXTRA_ID_PARAMS.get(route.endpoint, []):
            if method == "GET":
                urls.append(f"{base}?{param}={a.ids[table]}")
        if route.table is None:  # a page whose own code reads the query string
            joiner = "&" if "?" in base else "?"
            urls += [f"{base}{joiner}{param}={a.ids[table]}" for param, table in QUERY_ID_PARAMS.items()]
    return urls


@pytest.mark.parametrize("role", ["owner", "agent"])
def test_stored_payloads_never_render_unescaped(probe: Probe, routes: list[Route], role: str) -> None:
    findings = Findings()
    client = probe.a.clients[role]
    shown = 0
    for url in _own_pages(probe, routes):
        response = client.get(url)
        if response.status_code >= 500:
            findings.add(f"GET {url} as {role}: {response.status_code}")
        text = response.get_data(as_text=True)
        if "html" in response.content_type:
            for raw in XSS_RAW:
                if raw in text:
                    findings.add(f"GET {url} as {role}: payload unescaped: {raw!r}")
        elif any(raw in text for raw in XSS_RAW) and "json" not in response.content_type:
            findings.add(f"GET {url} as {role}: payload in a {response.content_type} response")
        shown += ESCAPED in text
    # The payloads are on the pages (escaped): the walk looked where they are.
    assert shown >= 8, shown
    for url in ("/admin/contacts/", "/admin/channels/", "/admin/templates/", "/admin/inbox/", "/admin/sandbox/"):
        assert ESCAPED in client.get(url).text, url
    findings.check()


def test_reflected_payloads_never_render_unescaped(probe: Probe, routes: list[Route]) -> None:
    """The query string echoed back (search box, the "Filtro ignorado" message, ids, `next`)."""
    findings = Findings()
    client = probe.a.clients["owner"]
    payload = XSS.replace("#", "%23").replace("&", "%26")
    urls = [f"/login?next={payload}", f"/admin/?next={payload}"]
    for route in routes:
        if route.kind == "list":
            urls.append(f"{route.rule}?search={payload}")
            urls += [f"{route.rule}?flt0_{key}={payload}" for key in (route.view._filter_args or {})]
        elif route.kind in ("custom", "path_id", "create") and "GET" in route.methods:
            base = route.url(**{n: probe.a.ids[t] for n, t in route.args.items()}) if route.args else route.rule
            urls += [f"{base}?{param}={payload}" for param in QUERY_ID_PARAMS]
    anonymous = probe.client()
    for url in urls:
        # Signed out, every console page is a redirect: only the sign-in page can reflect anything.
        for who, browser in (("owner", client), ("anonymous", anonymous)) if url.startswith("/login") \
                else (("owner", client),):
            response = browser.get(url)
            if response.status_code >= 500:
                findings.add(f"GET {url} ({who}): {response.status_code}")
            if "html" not in response.content_type:
                continue  # a JSON download holds the stored name as data (test_json_downloads_are_not_html)
            text = response.get_data(as_text=True)
            for raw in XSS_RAW:
                if raw in text:
                    findings.add(f"GET {url} ({who}): reflected unescaped: {raw!r}")
    findings.check()


def test_exports_neutralise_formulas_and_hold_only_the_orgs_rows(probe: Probe, routes: list[Route]) -> None:
    findings = Findings()
    exports = [r for r in routes if r.kind == "export"]
    assert len(exports) >= 10
    guarded = 0
    for role in ("owner", "manager", "agent"):
        client = probe.a.clients[role]
        for route in exports:
            url = route.url(export_type="csv")
            response = client.get(url)
            if response.status_code in (403,) and role != "owner":
                continue
            if response.status_code != 200:
                findings.add(f"GET {url} as {role}: {response.status_code}")
                continue
            for problem in header_problems(response):
                findings.add(f"GET {url}: {problem}")
            text = response.get_data(as_text=True)
            if "text/csv" not in response.content_type:
                findings.add(f"GET {url}: served as {response.content_type}")
            for marker in B_MARKERS:
                if marker in text:
                    findings.add(f"GET {url} as {role}: org B's {marker!r}")
            for row_no, row in enumerate(csv.reader(io.StringIO(text))):
                for cell in row:
                    if cell.startswith(FORMULA_PREFIXES):
                        findings.add(f"GET {url} as {role}, row {row_no}: a formula cell {cell[:30]!r}")
                    guarded += cell.startswith("'" + FORMULA[:4])
    assert guarded >= 2, "the formula payloads (contact, API key) were not in any export"
    findings.check()


def test_json_downloads_are_not_html(probe: Probe) -> None:
    """The consent evidence download carries a patient's name: JSON, nosniff, never a page."""
    client = probe.a.clients["owner"]
    response = client.get(f"/admin/contacts/consent/{probe.a.ids['contacts']}/")
    assert response.status_code == 200
    assert response.content_type.startswith("application/json")
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "attachment" in response.headers["Content-Disposition"]
    assert not header_problems(response)
