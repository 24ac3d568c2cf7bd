"""Sign-in: throttled per account and per address, redirect to the console, language choice."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from sqlalchemy import select

from admin.app import create_app
from admin.throttle import PER_ACCOUNT
from engine.models import users
from tests.admin.conftest import csrf
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
