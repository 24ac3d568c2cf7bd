"""Sign-in: throttled per account and per address, redirect to the console, language choice."""

from __future__ import annotations

import uuid
from dataclasses import replace
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select, update

from admin.app import create_app
from admin.throttle import PER_ACCOUNT
from engine.store.models import users
from tests.admin.conftest import csrf, login
from tests.conftest import BROKER_URL


def _attempt(client, email: str, password: str, address: str = "127.0.0.1"):
    page = client.get("/login", environ_base={"REMOTE_ADDR": address})
    return client.post("/login", data={"email": email, "password": password, "csrf_token": csrf(page.text)},
                       environ_base={"REMOTE_ADDR": address})


def test_sign_in_lands_on_the_dashboard(app, tenants):
    client = app.test_client()
    page = client.get("/login")
    response = client.post("/login", data={"email": "owner@a.com.br", "password": "senha-forte-a",
                                           "csrf_token": csrf(page.text)})
    assert response.status_code == 302
    assert response.headers["Location"].endswith("/admin/")


def test_sign_in_never_redirects_off_site(app, tenants):
    client = app.test_client()
    page = client.get("/login")
    response = client.post("/login?next=//evil.example/x", data={
        "email": "owner@a.com.br", "password": "senha-forte-a", "csrf_token": csrf(page.text)})
    assert response.headers["Location"].endswith("/admin/")


def test_failed_sign_ins_lock_the_account_even_for_the_right_password(app, tenants, rt):
    client = app.test_client()
    for _ in range(PER_ACCOUNT.amount):
        assert _attempt(client, "owner@a.com.br", "errada").status_code == 200
    blocked = _attempt(client, "owner@a.com.br", "senha-forte-a")
    assert blocked.status_code == 429
    assert int(blocked.headers["Retry-After"]) > 0
    assert "Muitas tentativas" in blocked.text
    with rt.db.connect() as conn:  # the blocked attempt did not sign in
        assert conn.execute(select(users.c.last_login_at).where(users.c.email == "owner@a.com.br")).scalar() is None
    # Another account, from another address, is not affected.
    assert _attempt(app.test_client(), "manager@a.com.br", "senha-forte-a", "10.0.0.9").status_code == 302


def test_a_correct_password_clears_the_account_count(app, tenants):
    client = app.test_client()
    for _ in range(PER_ACCOUNT.amount - 1):
        _attempt(client, "agent@a.com.br", "errada")
    assert _attempt(client, "agent@a.com.br", "senha-forte-a").status_code == 302
    client = app.test_client()
    for _ in range(PER_ACCOUNT.amount - 1):
        assert _attempt(client, "agent@a.com.br", "errada").status_code == 200


def test_unknown_accounts_are_counted_too(app, tenants):
    client = app.test_client()
    for _ in range(PER_ACCOUNT.amount):
        _attempt(client, "ninguem@a.com.br", "x")
    assert _attempt(client, "ninguem@a.com.br", "x").status_code == 429


@pytest.mark.skipif(not BROKER_URL.startswith("redis://"), reason="needs the Redis of the PostgreSQL run")
def test_the_count_is_shared_by_every_web_process_through_redis(rt, tenants):
    shared_rt = replace(rt, settings=replace(rt.settings, ratelimit_url=BROKER_URL))
    one, two = create_app(shared_rt), create_app(shared_rt)  # two processes' apps, one store
    email = f"{uuid.uuid4().hex[:10]}@a.com.br"  # a fresh account: Redis outlives the test
    for n in range(PER_ACCOUNT.amount):
        _attempt((one if n % 2 else two).test_client(), email, "x")
    assert _attempt(one.test_client(), email, "x").status_code == 429
    assert _attempt(two.test_client(), email, "x").status_code == 429


def test_an_unreachable_store_lets_people_sign_in(rt, tenants):
    broken = replace(rt, settings=replace(rt.settings, ratelimit_url="redis://127.0.0.1:1/0"))
    app = create_app(broken)
    assert _attempt(app.test_client(), "owner@a.com.br", "senha-forte-a").status_code == 302


def test_the_console_speaks_english_when_the_user_chooses_it(owner, rt):
    assert "Agendamentos" in owner.get("/admin/").text
    page = owner.get("/admin/")
    response = owner.post("/account/locale", data={"locale": "en", "next": "/admin/appointments/",
                                                   "csrf_token": csrf(page.text)})
    assert response.status_code == 302 and response.headers["Location"].endswith("/admin/appointments/")
    with rt.db.connect() as conn:
        assert conn.execute(select(users.c.locale).where(users.c.email == "owner@a.com.br")).scalar() == "en"
    html = owner.get("/admin/appointments/").text
    assert "Appointments" in html and "Agendamentos" not in html
    assert '<option value="en" selected' in html


def test_a_language_that_does_not_exist_is_refused(owner):
    page = owner.get("/admin/")
    assert owner.post("/account/locale", data={"locale": "xx", "csrf_token": csrf(page.text)}).status_code == 400
    assert owner.post("/account/locale", data={"locale": "en"}).status_code == 400  # no CSRF token


def test_sign_in_page_follows_the_browser_language(app):
    assert "Senha" in app.test_client().get("/login", headers={"Accept-Language": "pt-BR,pt;q=0.9"}).text
    assert "Password" in app.test_client().get("/login", headers={"Accept-Language": "en-US,en;q=0.9"}).text
    assert "Senha" in app.test_client().get("/login").text


# --- where a sign-in lands (issue 9, point 5) ---------------------------------------------------------
def _sign_in_to(app, raw_next: str):
    """Sign in through `/login?next=<raw_next>`, the query string exactly as an attacker's link has it."""
    client = app.test_client()
    page = client.get("/login")
    response = client.post(f"/login?next={raw_next}", data={
        "email": "owner@a.com.br", "password": "senha-forte-a", "csrf_token": csrf(page.text)})
    assert response.status_code == 302
    return response.headers["Location"]


@pytest.mark.parametrize("raw_next", [
    "/%09/evil.example/x",  # a tab: browsers drop it and go to //evil.example/x
    "/%0A/evil.example/x", "/%0D%0A/evil.example/x",  # newlines, likewise
    "/%5Cevil.example/x", "/%5C%5Cevil.example/x", "%5C%5Cevil.example",  # a backslash is a slash to browsers
    "//evil.example/x", "///evil.example/x",
    "/%2F%2Fevil.example/x", "/%252F%252Fevil.example/x",  # encoded (twice) slashes
    "/%255Cevil.example/x",  # an encoded backslash
    "https:evil.example", "https://evil.example/", "HTTPS://evil.example/", "javascript:alert(1)",
    "%20//evil.example", "evil.example/admin/",
    "/nao-existe/",  # no such page
    "/logout",  # a page, but not one you GET
    "/admin",  # only the redirect to /admin/
])
def test_sign_in_never_lands_off_site_nor_on_a_page_the_app_does_not_route(app, tenants, raw_next):
    location = _sign_in_to(app, raw_next)
    assert urlsplit(location).netloc in ("", "localhost") and urlsplit(location).path == "/admin/", location


@pytest.mark.parametrize("raw_next, expected", [
    ("/admin/", "/admin/"),
    ("/admin/appointments/", "/admin/appointments/"),
    ("/admin/contacts/%3Fsearch%3DAna%26page%3D1", "/admin/contacts/?search=Ana&page=1"),
    ("/admin/sandbox/%3F", "/admin/sandbox/"),  # Flask's full_path of a page with no query
])
def test_sign_in_goes_back_to_the_page_that_asked_for_it(app, tenants, raw_next, expected):
    assert _sign_in_to(app, raw_next) == expected


def test_the_login_redirect_of_a_console_page_brings_you_back_to_it(app, tenants):
    client = app.test_client()
    asked = client.get("/admin/appointments/?page=1")
    assert asked.status_code == 302 and "/login?next=" in asked.headers["Location"]
    page = client.get(asked.headers["Location"])
    response = client.post(asked.headers["Location"], data={
        "email": "owner@a.com.br", "password": "senha-forte-a", "csrf_token": csrf(page.text)})
    assert response.headers["Location"] == "/admin/appointments/?page=1"


def test_the_language_switch_never_sends_you_off_site(owner):
    token = csrf(owner.get("/admin/").text)
    for target in ("/\t/evil.example/x", "/\\evil.example", "//evil.example", "https:evil.example"):
        response = owner.post("/account/locale", data={"locale": "en", "next": target, "csrf_token": token})
        assert response.status_code == 302 and response.headers["Location"] == "/admin/", target


# --- sessions end (issue 9, point 7) ---------------------------------------------------------------------
def _captured(client) -> str:
    cookie = client.get_cookie("session")
    assert cookie is not None
    return cookie.value


def _replay(app, cookie: str):
    """A new browser with a copy of a session cookie: what does the console answer?"""
    thief = app.test_client()
    thief.set_cookie("session", cookie)
    return thief.get("/admin/")


def test_a_cookie_copied_before_sign_out_no_longer_works(app, owner):
    cookie = _captured(owner)
    assert _replay(app, cookie).status_code == 200
    token = csrf(owner.get("/admin/").text)
    assert owner.post("/logout", data={"csrf_token": token}).status_code == 302
    replayed = _replay(app, cookie)
    assert replayed.status_code == 302 and "/login" in replayed.headers["Location"]
    assert owner.get("/admin/").status_code == 302  # and the browser that signed out, of course


def test_signing_out_ends_the_users_other_sessions_too(app, tenants):
    laptop, phone = login(app.test_client(), "agent@a.com.br"), login(app.test_client(), "agent@a.com.br")
    laptop.post("/logout", data={"csrf_token": csrf(laptop.get("/admin/").text)})
    assert phone.get("/admin/").status_code == 302
    assert login(app.test_client(), "agent@a.com.br").get("/admin/").status_code == 200  # signing in again works
    assert login(app.test_client(), "manager@a.com.br").get("/admin/").status_code == 200


def test_a_session_from_before_generations_loads_nobody(app, tenants, rt):
    """A cookie signed before this release names only the user id: that user signs in again."""
    with rt.db.connect() as conn:
        user_id = conn.execute(select(users.c.id).where(users.c.email == "owner@a.com.br")).scalar_one()
    client = app.test_client()
    with client.session_transaction() as session:
        session["_user_id"] = str(user_id)
        session["_fresh"] = True
    assert client.get("/admin/").status_code == 302
    with client.session_transaction() as session:
        session["_user_id"] = f"{user_id}:0"
    assert client.get("/admin/").status_code == 200  # the generation it has: a valid session


# --- sign-in timing (issue 9, point 9) -------------------------------------------------------------------
@pytest.fixture
def hashes(monkeypatch):
    """Every password hash computed, by method (werkzeug's check_password_hash hashes once)."""
    import werkzeug.security

    calls: list[str] = []
    real = werkzeug.security._hash_internal

    def counting(method: str, salt: str, password: str):
        calls.append(method)
        return real(method, salt, password)

    monkeypatch.setattr(werkzeug.security, "_hash_internal", counting)
    return calls


def test_an_unknown_email_costs_the_same_hash_as_a_wrong_password(app, tenants, rt, hashes):
    with rt.db.begin() as conn:
        conn.execute(update(users).where(users.c.email == "manager@a.com.br").values(active=False))
    client = app.test_client()
    work = {}
    for case, email in (("wrong password", "owner@a.com.br"), ("unknown e-mail", "ninguem@a.com.br"),
                        ("inactive user", "manager@a.com.br")):
        hashes.clear()
        response = _attempt(client, email, "senha-errada-123")
        assert response.status_code == 200 and "E-mail ou senha incorretos." in response.text, case
        work[case] = list(hashes)
    with rt.db.connect() as conn:
        stored = conn.execute(select(users.c.password_hash).where(users.c.email == "owner@a.com.br")).scalar_one()
    method = stored.split("$", 1)[0]  # e.g. scrypt:32768:8:1: the same hasher and cost for every path
    assert work == {"wrong password": [method], "unknown e-mail": [method], "inactive user": [method]}
