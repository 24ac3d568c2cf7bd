"""The attacker's route walk (issue 9, acceptance): every rule of `app.url_map`, for every role.

- anonymous: no console page, no API answer, nothing changes;
- another org's ids (Flask-Admin's `?id=` / `id=`, list actions' `rowid`, ids in a path, the REST
  API's path and list filters, the extra ids a page takes) answer 404 (or 403) for every role of
  org A, org B's rows never show and never change;
- ids no row can have (text, negative, past bigint, NUL, non-ASCII digits) never answer 500;
- (garbage list parameters and ids in Flask-Admin's own model endpoints: tests/admin/test_bad_input.py
  walks every model view already);
- an agent (and a manager, on owner-only views) changes nothing with the POSTs editors make;
- every console POST without the session's CSRF token (or with another session's) is refused;
- every response carries the security headers (checked on each response of every walk).

Routes come from `tests/security/routes.py`, which sorts `app.url_map`; a new route is walked
without anyone listing it.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import insert

from engine.core import clock
from engine.store.models import contacts
from tests.security.conftest import PHONE, Probe, csrf, diff
from tests.security.routes import ARG_TABLES, EXTRA_ID_PARAMS, QUERY_ID_PARAMS, Route, classify
from tests.security.walk import (
    GARBAGE_IDS,
    Findings,
    b_leaks,
    filled,
    form_posting_to,
    header_problems,
    main_form,
)

#: What an agent may change with a POST, and why (SPEC §8: agents read the queue; the inbox and the
#: sandbox say agents resolve pendências and answer as the patient).
AGENT_MAY_CHANGE = {
    "inbox.resolve_view": "agents resolve pendências (admin/views/desk/inbox.py)",
    "inbox.action_view": "the list's Resolver action, the same as above",
    "sandbox.reply": "agents answer as the patient in the sandbox (admin/views/messages/sandbox.py)",
    "auth.set_locale": "the user's own console language",
    "contacts.handoff_view": "every role starts and ends a hand-off: the front desk's job "
                             "(admin/views/followup/handoff.py)",
    "conversations.reply": "agents answer patients' free-text replies (admin/views/desk/conversations.py)",
    "conversations.handled_one": "agents mark a patient's reply handled, the same page",
    "conversations.handled": "the list's bulk mark-handled, the same as above",
    "contacts.compose_view": "agents write first to a patient from the contact's page "
                             "(admin/views/desk/composer.py)",
}
#: Never posted by the walks: it ends the walking client's session (tests/security/test_probe_auth.py).
NOT_WALKED = {"auth.logout": "ends the walker's own session; probed in test_probe_auth.py"}
#: Owner-only pages that are not a whole role-gated view.
OWNER_ONLY = {"contacts.erase_view"}
CROSS_ORG_OK = (403, 404)


def _send(findings: Findings, client: Any, method: str, url: str, *, data: Any = None, json: Any = None,
          headers: dict[str, str] | None = None, expect: tuple[int, ...] | None = None, label: str = "",
          leaks: bool = True) -> Any:
    """One probe request, with the checks every response gets (no 500, headers, no org B data)."""
    try:
        response = client.open(url, method=method, data=data, json=json, headers=headers)
    except Exception as exc:  # the app raised (TESTING propagates it): a 500 in production
        findings.add(f"{method} {url} [{label}]: raised {type(exc).__name__}: {str(exc)[:200]}")
        return None
    where = f"{method} {url} [{label}] -> {response.status_code}"
    if response.status_code >= 500:
        findings.add(f"{where}: server error")
    if expect is not None and response.status_code not in expect:
        findings.add(f"{where}: expected {expect}")
    for problem in header_problems(response, static="/static/" in url):
        findings.add(f"{where}: {problem}")
    if leaks:
        for marker in b_leaks(response):
            findings.add(f"{where}: shows org B's {marker!r}")
    return response


@pytest.fixture(scope="module")
def routes(probe: Probe) -> list[Route]:
    found, errors = classify(probe.app)
    assert not errors, "routes the probe cannot classify:\n" + "\n".join(errors)
    return found


def _ids(route: Route, org: Any, value: Any = None) -> dict[str, Any]:
    """The route's path arguments filled with `org`'s ids (or with `value` for all of them)."""
    out: dict[str, Any] = {}
    for name, table in route.args.items():
        out[name] = value if value is not None else org.ids[table]
    if "export_type" in route.rule:
        out["export_type"] = "csv"
    return out


#: JSON bodies a page that takes JSON (the flow builder) is sent besides its form: an empty one, and
#: ones an editor's save, disable and rollback would send.
JSON_BODIES = ({}, {"name": "probe-was-here"}, {"live": "cancel"}, {"version": 1})
#: An id no row has: another org's id must answer exactly as this one does.
MISSING = 10**12

Request = tuple[str, str, dict[str, Any], Any]  # method, url, form, JSON body (None: a form post)


def _id_requests(route: Route, org: Any, value: Any = None) -> list[Request]:
    """Every request that names an id of `org` (or `value`) on this route."""
    own = (lambda table: org.ids[table]) if value is None else (lambda table: value)
    reqs: list[Request] = []
    table = route.table
    if route.kind == "qid":
        for method in route.methods:
            reqs.append((method, f"{route.rule}?id={own(table)}", {}, None))
    elif route.kind == "form_id":
        reqs.append(("POST", route.rule, {"id": own(table)}, None))
    elif route.kind == "ajax":
        reqs.append(("POST", route.rule, {"list_form_pk": own(table), "name": "x"}, None))
    elif route.kind == "action":
        for name, _text in route.view._actions or ():
            reqs.append(("POST", route.rule, {"action": name, "rowid": own(table)}, None))
    elif route.kind in ("path_id", "api") and route.args:
        url = route.url(**_ids(route, org, value))
        for method in route.methods:
            if method == "GET":
                reqs.append((method, url, {}, None))
                continue
            if route.kind == "path_id" and method == "POST":
                reqs.append((method, url, {"confirm": "yes", "to": PHONE, "text": "x"}, None))
            for body in JSON_BODIES if route.kind == "path_id" else ({},):
                reqs.append((method, url, {}, body))
    for method, param, param_table in EXTRA_ID_PARAMS.get(route.endpoint, []):
        if method in route.methods:
            if method == "GET":
                reqs.append((method, f"{route.rule}?{param}={own(param_table)}", {}, None))
            else:
                reqs.append((method, route.rule, {param: own(param_table), "text": "x"}, None))
    return reqs


def _console(findings: Findings, client: Any, token: str, req: Request, label: str,
             expect: tuple[int, ...] | None = None) -> Any:
    """A console request with the session's CSRF token (in the form, or the header for JSON)."""
    method, url, form, body = req
    if method == "GET":
        return _send(findings, client, method, url, expect=expect, label=label)
    if body is not None:
        return _send(findings, client, method, url, json=body, headers={"X-CSRFToken": token}, expect=expect,
                     label=label)
    return _send(findings, client, method, url, data={**form, "csrf_token": token}, expect=expect, label=label)


def test_every_route_is_classified(probe: Probe) -> None:
    routes, errors = classify(probe.app)
    assert not errors, "routes the probe cannot classify:\n" + "\n".join(errors)
    kinds = {r.kind for r in routes}
    # The walk reaches every kind the console has today (a classifier that lost one would walk less).
    assert {"list", "qid", "form_id", "action", "export", "create", "path_id", "custom", "api"} <= kinds


def test_anonymous_callers_get_no_page_no_api_and_change_nothing(probe: Probe, routes: list[Route]) -> None:
    findings = Findings()
    client = probe.client()
    before = probe.snapshot_all()
    for route in routes:
        if route.kind in ("static", "webhook", "optout"):
            continue
        url = route.url(**_ids(route, probe.a)) if "<" in route.rule else route.rule
        for method in route.methods:
            if route.kind == "public":
                expect: tuple[int, ...] = (200, 302, 400)
            elif route.kind == "api":
                expect = (401,)
            elif method == "GET":
                expect = (302, 401)  # a page redirects to the sign-in; the flow builder's JSON answers 401
            else:
                expect = (302, 400, 401, 403)  # the CSRF check answers before the login check
            data = {"id": probe.a.ids.get(route.table or "", 1)} if method == "POST" else None
            response = _send(findings, client, method, url, data=data, expect=expect,
                             label=f"anonymous {route.kind}")
            if response is not None and response.status_code == 302 and route.kind != "public":
                if not response.headers["Location"].startswith("/login"):
                    findings.add(f"{method} {url}: anonymous redirect to {response.headers['Location']}")
    assert probe.snapshot_all() == before
    findings.check()


def test_a_session_cookie_does_not_open_the_api(probe: Probe, routes: list[Route]) -> None:
    """The API is CSRF-exempt because it authenticates by bearer key only: a signed-in browser's
    cookie (which another site can make it send) must open nothing there."""
    findings = Findings()
    owner = probe.a.clients["owner"]
    for route in routes:
        if route.kind != "api":
            continue
        url = route.url(**_ids(route, probe.a))
        for method in route.methods:
            _send(findings, owner, method, url, json={}, expect=(401,), label="session cookie, no key")
    findings.check()


@pytest.mark.parametrize("role", ["owner", "manager", "agent"])
def test_the_other_orgs_ids_answer_as_ids_no_row_has_for_every_role(probe: Probe, routes: list[Route],
                                                                      role: str) -> None:
    """Org B's id answers exactly as an id no row has (404 on a page of one row; a redirect where
    the role may not edit at all; a list action that skips it), never 200 with a row, never a
    change to org B."""
    findings = Findings()
    client = probe.a.clients[role]
    token = csrf(client.get("/admin/").text)
    api = {"Authorization": f"Bearer {probe.a.api_key}"}
    before = probe.snapshot(probe.b.org_id)
    walked = 0
    for route in routes:
        for theirs, nobodys in zip(_id_requests(route, probe.b), _id_requests(route, probe.a, MISSING)):
            walked += 1
            label = f"{role}, B's id"
            if route.kind == "api":
                method, url, _form, body = theirs
                answer = _send(findings, client, method, url, json=body, headers=api, expect=(404, 405, 422),
                               label="A's key, B's id")
                method, url, _form, body = nobodys
                control = _send(findings, client, method, url, json=body, headers=api, label="A's key, no such id")
            else:
                answer = _console(findings, client, token, theirs, label)
                control = _console(findings, client, token, nobodys, f"{role}, no such id")
            if answer is None or control is None:
                continue
            if answer.status_code != control.status_code:
                findings.add(f"{theirs[0]} {theirs[1]} [{label}] -> {answer.status_code}, but an id no row has "
                             f"-> {control.status_code}: B's ids can be told apart")
            elif answer.status_code == 200 and route.kind in ("qid", "path_id", "api") and theirs[0] == "GET":
                findings.add(f"GET {theirs[1]} [{label}] -> 200")
    for table in diff(before, probe.snapshot(probe.b.org_id)):
        findings.add(f"org B changed after {role}'s walk: {table}")
    assert walked > 50, walked
    findings.check()


def test_query_string_ids_of_the_other_org_or_garbage_show_nothing(probe: Probe, routes: list[Route]) -> None:
    """Every console GET page with the query-string id names the probe knows (QUERY_ID_PARAMS) set to
    org B's ids (a page that reads one must not show B's row) and to ids no row can have (never a
    500). Flask-Admin model views get them all at once (only their own code reads extra arguments);
    other pages one by one, as one argument read first could hide a later one."""
    findings = Findings()
    client = probe.a.clients["owner"]
    pages = 0
    for route in routes:
        if "GET" not in route.methods or route.kind in ("static", "public", "session", "webhook", "optout", "api"):
            continue
        base = route.url(**_ids(route, probe.a)) if "<" in route.rule else route.rule
        if route.kind == "qid":
            base += f"?id={probe.a.ids[route.table]}"
        joiner = "&" if "?" in base else "?"
        pages += 1
        theirs = {param: probe.b.ids[table] for param, table in QUERY_ID_PARAMS.items()}
        if route.table is not None and route.kind != "create":
            for values in (theirs, dict.fromkeys(theirs, str(2**63)), dict.fromkeys(theirs, "%C2%B2")):
                query = "&".join(f"{k}={v}" for k, v in values.items())
                _send(findings, client, "GET", f"{base}{joiner}{query}", label="every id argument at once")
            continue
        for param, value in theirs.items():
            for given in (value, str(2**63)):
                _send(findings, client, "GET", f"{base}{joiner}{param}={given}", label=f"{param}")
        query = "&".join(f"{k}=%C2%B2" for k in theirs)  # "²": a digit to str.isdigit, no id to the database
        _send(findings, client, "GET", f"{base}{joiner}{query}", label="every id argument at once")
    assert pages > 20, pages
    findings.check()


def test_list_filters_of_the_api_never_reach_the_other_org(probe: Probe, routes: list[Route]) -> None:
    findings = Findings()
    client = probe.client()
    headers = {"Authorization": f"Bearer {probe.a.api_key}"}
    for route in routes:
        if route.kind != "api" or "GET" not in route.methods or route.args:
            continue
        for param, table in ARG_TABLES.items():
            if table in probe.b.ids:
                response = _send(findings, client, "GET", f"{route.rule}?{param}={probe.b.ids[table]}",
                                 headers=headers, label="A's key, B's id as a filter")
                if response is not None and response.status_code == 200 and response.get_json().get("data"):
                    findings.add(f"GET {route.rule}?{param}=<B's>: answers {len(response.get_json()['data'])} rows")
        for query in ("external_id=ext-clinica-b", f"phone={PHONE}"):
            _send(findings, client, "GET", f"{route.rule}?{query}", headers=headers, label="B's values")
    findings.check()


def test_api_bodies_naming_the_other_orgs_rows_change_nothing_there(probe: Probe) -> None:
    findings = Findings()
    client = probe.client()
    a, b = probe.a, probe.b
    headers = {"Authorization": f"Bearer {a.api_key}", "Idempotency-Key": "probe-cross-org"}
    before = probe.snapshot(b.org_id)
    bodies = [
        ("/messages", {"contact_id": b.ids["contacts"], "channel_kind": "whatsapp", "text": "x", "send_now": True}),
        ("/enrollments", {"flow_id": b.ids["flow_pointers"], "contact_id": a.ids["contacts"]}),
        ("/enrollments", {"flow_id": a.ids["flow_pointers"], "contact_id": b.ids["contacts"]}),
        ("/enrollments", {"flow_id": a.ids["flow_pointers"], "contact_id": a.ids["contacts"],
                          "appointment_id": b.ids["appointments"]}),
        ("/events", {"contact_id": b.ids["contacts"], "type": "handoff_started"}),
        ("/appointments", {"external_id": "apt-clinica-b", "contact_external_id": "ext-clinica-b",
                           "starts_at": "2026-12-10T12:00:00+00:00"}),
    ]
    for path, body in bodies:
        _send(findings, client, "POST", f"/api/v1{path}", json=body, headers=headers, expect=(404, 409, 422),
              label="B's ids in the body")
    for table in diff(before, probe.snapshot(b.org_id)):
        findings.add(f"org B changed: {table}")
    findings.check()


def test_ids_no_row_can_have_never_answer_500(probe: Probe, routes: list[Route]) -> None:
    findings = Findings()
    client = probe.a.clients["owner"]
    token = csrf(client.get("/admin/").text)
    before = probe.snapshot_all()
    for route in routes:
        if route.kind in ("qid", "form_id", "action"):
            continue  # every model view's details / edit / delete / actions: tests/admin/test_bad_input.py
        for value in GARBAGE_IDS:
            for req in _id_requests(route, probe.a, value):
                method, url, _form, body = req
                if route.kind == "api":
                    _send(findings, client, method, url, json=body,
                          headers={"Authorization": f"Bearer {probe.a.api_key}"}, expect=(404, 405, 422),
                          label=f"id {value!r}")
                    continue
                expect = None if route.endpoint == "templates.create_view" else (302, 400, 403, 404, 405)
                _console(findings, client, token, req, f"id {value!r}", expect)
    after = probe.snapshot_all()
    for org in ("a", "b"):
        for table in diff(before[org], after[org]):
            findings.add(f"org {org} changed: {table}")
    findings.check()


_FORMS: dict[str, dict[str, Any]] = {}


def _post_data(probe: Probe, route: Route, owner: Any, url: str) -> dict[str, Any]:
    """What an editor would post to this route: the form the owner's page shows, filled in."""
    if url not in _FORMS:
        _FORMS[url] = _read_post_data(route, owner, url)
    return dict(_FORMS[url])


def _read_post_data(route: Route, owner: Any, url: str) -> dict[str, Any]:
    if "GET" not in route.methods and route.view is not None:
        # A button on another page of the view (a details page, the sandbox chat) posts here.
        ids = re.findall(r"/(\d+)/", url)
        page_url = f"{route.view.url}/details/?id={ids[0]}" if ids and route.table else f"{route.view.url}/"
        found = form_posting_to(owner.get(page_url).get_data(as_text=True), url)
        if found:
            return filled(*found)
    if route.kind == "qid" or route.kind == "create" or ("GET" in route.methods and route.kind in ("custom",
                                                                                                  "path_id")):
        page = owner.get(url)
        if page.status_code == 200 and "text/html" in page.content_type:
            fields, kinds = main_form(page.text)
            if fields:
                return filled(fields, kinds)
    return {"confirm": "yes", "to": PHONE, "text": "probe-was-here", "name": "probe-was-here", "number": PHONE,
            "pairing": "1", "locale": "en", "body": "probe-was-here"}


def _role_walk(probe: Probe, routes: list[Route], role: str, only: Any) -> Findings:
    findings = Findings()
    client = probe.a.clients[role]
    owner = probe.a.clients["owner"]
    token = csrf(client.get("/admin/").text)
    for route in routes:
        if not only(route) or "POST" not in route.methods or route.endpoint in NOT_WALKED:
            continue
        if route.kind in ("static", "public", "webhook", "optout", "api"):
            continue
        requests = _id_requests(route, probe.a) or [("POST", route.url(**_ids(route, probe.a)), {}, None)] \
            + [("POST", route.url(**_ids(route, probe.a)), {}, body) for body in JSON_BODIES
               if route.kind in ("custom", "path_id")]
        for method, url, form, body in requests:
            if method == "GET":
                continue
            form = {**_post_data(probe, route, owner, url), **form} if body is None else form
            before = probe.snapshot(probe.a.org_id)
            _console(findings, client, token, (method, url, form, body), f"{role} posts")
            if route.endpoint in AGENT_MAY_CHANGE and role == "agent":
                continue
            for table in diff(before, probe.snapshot(probe.a.org_id)):
                findings.add(f"POST {url} ({route.endpoint}) as {role} changed org A: {table}")
    return findings


def test_an_agent_changes_nothing_with_the_editors_posts(probe: Probe, routes: list[Route]) -> None:
    _role_walk(probe, routes, "agent", lambda route: True).check()


def test_a_manager_changes_nothing_on_owner_only_pages(probe: Probe, routes: list[Route]) -> None:
    def owner_only(route: Route) -> bool:
        allowed = getattr(route.view, "allowed_roles", None)
        return route.endpoint in OWNER_ONLY or bool(allowed) and "manager" not in allowed

    assert any(owner_only(r) for r in routes)
    _role_walk(probe, routes, "manager", owner_only).check()


def test_the_same_post_by_the_owner_does_change_things(probe: Probe) -> None:
    """The control of the two walks above: the forms they post are ones the app accepts from an
    editor (an edit form as its page fills it, a new-form filled in)."""
    owner = probe.a.clients["owner"]
    with probe.rt.db.begin() as conn:
        scratch = conn.execute(insert(contacts).values(
            org_id=probe.a.org_id, name="Rascunho", phone="+5516977776666", created_at=clock.now(),
            updated_at=clock.now()).returning(contacts.c.id)).scalar_one()
    url = f"/admin/contacts/edit/?id={scratch}"
    for page in (url, "/admin/contacts/new/"):
        fields, kinds = main_form(owner.get(page).text)
        before = probe.snapshot(probe.a.org_id)
        response = owner.post(page, data=filled(fields, kinds))
        assert response.status_code == 302, (page, response.text[-1500:])
        assert diff(before, probe.snapshot(probe.a.org_id)), page


def test_every_console_post_without_the_sessions_csrf_token_is_refused(probe: Probe, routes: list[Route]) -> None:
    findings = Findings()
    client = probe.login("owner@clinica-a.example.com")
    owner = probe.a.clients["owner"]
    foreign = csrf(probe.b.clients["owner"].get("/admin/").text)  # a valid token of another session
    posts = 0
    for route in routes:
        if "POST" not in route.methods or route.kind in ("static", "webhook", "optout", "api"):
            continue
        requests = [r for r in _id_requests(route, probe.a) if r[0] != "GET" and r[3] in (None, {})] \
            or [("POST", route.url(**_ids(route, probe.a)), {}, None)]
        for method, url, form, body in requests:
            data = {**_post_data(probe, route, owner, url), **form} if body is None else None
            if data is not None:
                data.pop("csrf_token", None)
            for label, token in (("no token", None), ("another session's token", foreign)):
                before = probe.snapshot(probe.a.org_id)
                if body is not None:
                    _send(findings, client, method, url, json=body, expect=(400,), label=label,
                          headers={"X-CSRFToken": token} if token else None)
                else:
                    _send(findings, client, method, url, data={**data, **({"csrf_token": token} if token else {})},
                          expect=(400,), label=label)
                posts += 1
                for table in diff(before, probe.snapshot(probe.a.org_id)):
                    findings.add(f"{method} {url} ({route.endpoint}) [{label}] changed org A: {table}")
    # the walking session is still signed in: the logout without a token did not end it
    assert client.get("/admin/").status_code == 200
    assert posts > 40, posts
    findings.check()


def test_zz_the_owner_changes_things_through_the_same_posts(probe: Probe, routes: list[Route]) -> None:
    """The control of the agent walk, route by route (last in the module: it changes org A for good).
    The owner posts what the agent posted; where the owner changes something, the agent's "nothing
    changed" proved the role check. The editor routes of today must be among them."""
    owner = probe.a.clients["owner"]
    token = csrf(owner.get("/admin/").text)
    proven: set[str] = set()
    # What removes rows (deletes, list actions, erasure, revocation) goes last: the other posts need them.
    last = ("erase", "revoke", "delete", "action", "cancel")
    for route in sorted(routes, key=lambda r: (any(w in r.endpoint for w in last), r.rule)):
        if "POST" not in route.methods or route.endpoint in NOT_WALKED or route.endpoint in AGENT_MAY_CHANGE:
            continue
        if route.kind in ("static", "public", "webhook", "optout", "api", "session"):
            continue
        requests = _id_requests(route, probe.a) or [("POST", route.url(**_ids(route, probe.a)), {}, None)] \
            + [("POST", route.url(**_ids(route, probe.a)), {}, body) for body in JSON_BODIES
               if route.kind in ("custom", "path_id")]
        for method, url, form, body in requests:
            if method == "GET":
                continue
            form = {**_post_data(probe, route, owner, url), **form} if body is None else form
            before = probe.snapshot(probe.a.org_id)
            _console(Findings(), owner, token, (method, url, form, body), "owner control")
            if diff(before, probe.snapshot(probe.a.org_id)):
                proven.add(route.endpoint)
    expected = {"appointments.edit_view", "contacts.edit_view", "contacts.create_view", "contacts.optout_view",
                "contacts.erase_view", "channels.edit_view", "channels.create_view", "channels.send_test",
                "templates.edit_view", "rules.edit_view", "apikeys.create_view", "apikeys.action_view",
                "users.edit_view", "users.create_view"}
    unproven = sorted(r.endpoint for r in routes if "POST" in r.methods and r.kind not in (
        "static", "public", "webhook", "optout", "api", "session") and r.endpoint not in proven
        and r.endpoint not in AGENT_MAY_CHANGE)
    print("owner changed nothing through:", ", ".join(unproven))
    assert expected <= proven, sorted(expected - proven)
