"""Chaves de API and Usuários in the console: a key created here opens /api/v1 until it is
revoked, is shown once and never again; only owners/managers see keys and only owners see users;
the last owner stays an owner; another org's ids answer 404."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import select
from werkzeug.security import check_password_hash

from engine.core import clock as engine_clock
from engine.tenants.apikeys import create_key, hash_key
from engine.store.models import api_keys, audit_log, users
from engine.tenants.orgs import create_user
from tests.admin.conftest import csrf, login

KEY_RE = re.compile(r"lembra_[0-9a-f]{8}_[A-Za-z0-9_-]{20,}")


@pytest.fixture
def manager(app, tenants):
    return login(app.test_client(), "manager@a.com.br")


@pytest.fixture
def b_rows(rt, tenants):
    """Org B's key (still working) and owner, the ids A pokes at."""
    _, b = tenants
    with rt.db.begin() as conn:
        key = create_key(conn, org_id=b.world.org_id, name="Chave secreta da B")
        user_id = create_user(conn, org_id=b.world.org_id, email="dono@b.com.br", role="owner",
                              password="senha-forte-b")
    return key, user_id


def _create_key(client, name: str = "Agenda da recepção"):
    token = csrf(client.get("/admin/apikeys/new/").text)
    return client.post("/admin/apikeys/new/", data={"csrf_token": token, "name": name})


def _api(app, key: str):
    return app.test_client().get("/api/v1/contacts", headers={"Authorization": f"Bearer {key}"})


def _user_id(rt, email: str) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(users.c.id).where(users.c.email == email)).scalar_one()


# --- API keys ---------------------------------------------------------------------------------------
def test_a_key_created_in_the_console_opens_the_api_until_revoked(app, rt, owner, tenants):
    created = _create_key(owner)
    assert created.status_code == 200
    assert created.headers["Cache-Control"] == "no-store"
    page = created.get_data(as_text=True)
    keys = KEY_RE.findall(page)
    assert len(keys) == 1, "the whole key appears exactly once, on the creation page"
    key = keys[0]
    assert "não será mostrada de novo" in page and "Copiar" in page

    with rt.db.connect() as conn:
        row = conn.execute(select(api_keys).where(api_keys.c.name == "Agenda da recepção")).one()
        audits = conn.execute(select(audit_log).where(audit_log.c.entity == "api_keys")).all()
    assert row.org_id == tenants[0].world.org_id
    assert row.key_hash == hash_key(key) and key not in row.key_hash  # stored hashed, by engine.tenants.apikeys
    assert [a.action for a in audits] == ["create"] and audits[0].user_id == _user_id(rt, "owner@a.com.br")
    assert key not in json.dumps(audits[0].changes) and row.key_hash not in json.dumps(audits[0].changes)

    response = _api(app, key)
    assert response.status_code == 200, response.text

    # Never again: list, details and export show the prefix only, and never the hash.
    for url in ("/admin/apikeys/", f"/admin/apikeys/details/?id={row.id}", "/admin/apikeys/export/csv/",
                "/admin/audit/", "/admin/audit/export/csv/"):
        text = owner.get(url).get_data(as_text=True)
        assert key not in text and row.key_hash not in text, url
    listing = owner.get("/admin/apikeys/").text
    assert f"lembra_{row.prefix}…" in listing and "Ativa" in listing

    details = owner.get(f"/admin/apikeys/details/?id={row.id}").text
    revoked = owner.post(f"/admin/apikeys/revoke/{row.id}/", data={"csrf_token": csrf(details)})
    assert revoked.status_code == 302
    with rt.db.connect() as conn:
        assert conn.execute(select(api_keys.c.revoked_at).where(api_keys.c.id == row.id)).scalar_one() \
            == engine_clock.now()
        revoke_audit = conn.execute(select(audit_log).where(audit_log.c.action == "revoke")).one()
    assert revoke_audit.entity_id == row.id and key not in json.dumps(revoke_audit.changes)
    assert _api(app, key).status_code == 401
    after = owner.get(f"/admin/apikeys/details/?id={row.id}").text
    assert "Revogada" in after and f"/admin/apikeys/revoke/{row.id}/" not in after  # no button on a dead key


def test_the_revoke_list_action_stops_the_key(app, rt, owner, tenants):
    a, _ = tenants
    with rt.db.begin() as conn:
        new = create_key(conn, org_id=a.world.org_id, name="Integração antiga")
    assert _api(app, new.key).status_code == 200
    token = csrf(owner.get("/admin/apikeys/").text)
    owner.post("/admin/apikeys/action/", data={"csrf_token": token, "action": "revoke", "rowid": [new.id]})
    assert _api(app, new.key).status_code == 401
    with rt.db.connect() as conn:
        assert conn.execute(select(audit_log.c.action).where(audit_log.c.entity_id == new.id,
                                                             audit_log.c.entity == "api_keys")).scalar_one() == "revoke"


def test_a_key_needs_a_name(owner, rt, tenants):
    response = _create_key(owner, name="  ")
    assert response.status_code == 200 and "Dê um nome à chave." in response.text
    assert not KEY_RE.search(response.text)
    with rt.db.connect() as conn:
        assert conn.execute(select(api_keys.c.id)).first() is None


def test_agents_get_403_on_keys_and_users_and_no_menu_entry(agent, tenants):
    for url in ("/admin/apikeys/", "/admin/apikeys/new/", "/admin/apikeys/export/csv/", "/admin/users/",
                "/admin/users/new/", "/admin/users/export/csv/"):
        assert agent.get(url).status_code == 403, url
    token = csrf(agent.get("/admin/queue/").text)
    assert agent.post("/admin/apikeys/new/", data={"csrf_token": token, "name": "x"}).status_code == 403
    menu = agent.get("/admin/").text
    assert "Chaves de API" not in menu and "Usuários" not in menu


def test_managers_see_keys_but_not_users(manager, tenants):
    assert manager.get("/admin/apikeys/").status_code == 200
    assert _create_key(manager).status_code == 200
    for url in ("/admin/users/", "/admin/users/new/", "/admin/users/export/csv/"):
        assert manager.get(url).status_code == 403, url
    menu = manager.get("/admin/").text
    assert "Chaves de API" in menu and "Usuários" not in menu


# --- users ------------------------------------------------------------------------------------------
def test_an_owner_creates_a_user_who_can_sign_in(app, rt, owner, tenants):
    token = csrf(owner.get("/admin/users/new/").text)
    short = owner.post("/admin/users/new/", data={"csrf_token": token, "email": "curta@a.com.br", "role": "agent",
                                                  "password": "curta-11ch"})
    assert short.status_code == 200 and "A senha precisa ter de 12 a 200 caracteres." in short.text
    response = owner.post("/admin/users/new/", data={"csrf_token": token, "email": "Recepcao@A.com.br",
                                                     "role": "agent", "password": "recepcao-2026-segura"})
    assert response.status_code == 302, response.text
    with rt.db.connect() as conn:
        row = conn.execute(select(users).where(users.c.email == "recepcao@a.com.br")).one()
        audit = conn.execute(select(audit_log).where(audit_log.c.entity == "users",
                                                     audit_log.c.entity_id == row.id)).one()
        assert conn.execute(select(users.c.id).where(users.c.email == "curta@a.com.br")).first() is None
    assert row.org_id == tenants[0].world.org_id and row.role == "agent" and row.active
    assert check_password_hash(row.password_hash, "recepcao-2026-segura")
    logged = json.dumps(audit.changes)
    assert "recepcao-2026-segura" not in logged and row.password_hash not in logged
    login(app.test_client(), "recepcao@a.com.br", "recepcao-2026-segura")

    for url in ("/admin/users/", f"/admin/users/details/?id={row.id}", f"/admin/users/edit/?id={row.id}",
                "/admin/users/export/csv/"):
        text = owner.get(url).get_data(as_text=True)
        assert row.password_hash not in text and "pbkdf2" not in text and "scrypt" not in text, url
    listing = owner.get("/admin/users/").text
    assert "recepcao@a.com.br" in listing and "atendente" in listing and "proprietário" in listing


def _field_errors(html: str) -> list[str]:
    """The messages under the form's fields."""
    blocks = re.findall(r'class="invalid-feedback"[^>]*>(.*?)</div>', html, re.DOTALL)
    return [re.sub(r"\s+", " ", li).strip() for block in blocks for li in re.findall(r"<li>(.*?)</li>", block, re.DOTALL)]


def test_a_taken_email_is_a_neutral_form_error_whoever_has_it(rt, owner, tenants, b_rows):
    """E-mails are unique across orgs (they are the login), but whether one belongs to another
    clinic is none of this one's business: the same neutral refusal, nothing of B's on the page."""
    token = csrf(owner.get("/admin/users/new/").text)
    errors = {}
    for email in ("dono@b.com.br", "MANAGER@a.com.br"):  # another org's user, and case-insensitively one of A's
        response = owner.post("/admin/users/new/", data={"csrf_token": token, "email": email, "role": "agent",
                                                         "password": "uma-senha-bem-longa"})
        assert response.status_code == 200, email
        errors[email] = _field_errors(response.text)
        assert "Já existe" not in response.text and "clinica-b" not in response.text.lower()
    assert errors["dono@b.com.br"] == errors["MANAGER@a.com.br"] == \
        ["Não foi possível usar este e-mail. Confira o endereço ou use outro."]
    with rt.db.connect() as conn:
        assert conn.execute(select(users.c.org_id).where(users.c.email == "dono@b.com.br")).scalar_one() \
            == tenants[1].world.org_id
        assert len(conn.execute(select(users.c.id).where(users.c.email == "manager@a.com.br")).all()) == 1
        assert conn.execute(select(audit_log.c.id).where(audit_log.c.entity == "users")).first() is None


def _edit(client, user_id: int, **data):
    page = client.get(f"/admin/users/edit/?id={user_id}")
    assert page.status_code == 200
    form = {"csrf_token": csrf(page.text), "role": data.pop("role", "owner"), "new_password": "", **data}
    if form.pop("active", True):
        form["active"] = "y"
    return client.post(f"/admin/users/edit/?id={user_id}", data=form)


def test_the_last_active_owner_cannot_be_demoted_or_deactivated(rt, owner, tenants, b_rows):
    owner_id = _user_id(rt, "owner@a.com.br")  # B has an owner too: it does not count for A
    for change in ({"role": "manager"}, {"active": False}):
        response = _edit(owner, owner_id, **change)
        assert response.status_code == 200, change
        assert "última pessoa proprietária ativa" in response.text
    with rt.db.connect() as conn:
        row = conn.execute(select(users).where(users.c.id == owner_id)).one()
        assert conn.execute(select(audit_log.c.id).where(audit_log.c.entity == "users")).first() is None
    assert row.role == "owner" and row.active

    # With a second owner, the first may step down (and lands on the panel, no longer allowed here).
    second = _user_id(rt, "manager@a.com.br")
    assert _edit(owner, second, role="owner").status_code == 302
    stepped = _edit(owner, owner_id, role="manager")
    assert stepped.status_code == 302 and stepped.headers["Location"].endswith("/admin/")
    with rt.db.connect() as conn:
        roles = dict(conn.execute(select(users.c.id, users.c.role).where(users.c.id.in_([owner_id, second]))).all())
        actions = conn.execute(select(audit_log.c.entity_id, audit_log.c.changes)
                               .where(audit_log.c.entity == "users").order_by(audit_log.c.id)).all()
    assert roles == {owner_id: "manager", second: "owner"}
    assert [(a.entity_id, a.changes) for a in actions] == [(second, {"role": "owner"}), (owner_id, {"role": "manager"})]
    assert owner.get("/admin/users/").status_code == 403  # a manager now


def test_edit_sets_a_new_password_and_deactivates(app, rt, owner, tenants):
    agent_id = _user_id(rt, "agent@a.com.br")
    agent = login(app.test_client(), "agent@a.com.br")
    assert _edit(owner, agent_id, role="agent", new_password="curta").status_code == 200  # too short: nothing saved
    assert _edit(owner, agent_id, role="agent", new_password="nova-senha-da-recepcao").status_code == 302
    with rt.db.connect() as conn:
        row = conn.execute(select(users).where(users.c.id == agent_id)).one()
        audit = conn.execute(select(audit_log.c.changes).where(audit_log.c.entity == "users")).scalar_one()
    assert check_password_hash(row.password_hash, "nova-senha-da-recepcao")
    assert audit == {"password_changed": True, "sessions_ended": True}
    login(app.test_client(), "agent@a.com.br", "nova-senha-da-recepcao")

    assert _edit(owner, agent_id, role="agent", active=False).status_code == 302
    assert agent.get("/admin/queue/").status_code == 302  # signed out at once: inactive users do not load


def test_a_forged_role_is_refused(rt, owner, tenants):
    agent_id = _user_id(rt, "agent@a.com.br")
    response = _edit(owner, agent_id, role="superuser")
    assert response.status_code == 200  # the select refuses it
    with rt.db.connect() as conn:
        assert conn.execute(select(users.c.role).where(users.c.id == agent_id)).scalar_one() == "agent"


# --- isolation and CSRF -------------------------------------------------------------------------------
def test_other_orgs_keys_and_users_answer_404_and_never_show(app, rt, owner, tenants, b_rows):
    b_key, b_user = b_rows
    token = csrf(owner.get("/admin/apikeys/").text)
    for url in (f"/admin/apikeys/details/?id={b_key.id}", f"/admin/users/details/?id={b_user}",
                f"/admin/users/edit/?id={b_user}"):
        assert owner.get(url).status_code == 404, url
    assert owner.post(f"/admin/apikeys/revoke/{b_key.id}/", data={"csrf_token": token}).status_code == 404
    assert owner.post(f"/admin/users/edit/?id={b_user}", data={"csrf_token": token, "role": "agent"}).status_code == 404
    owner.post("/admin/apikeys/action/", data={"csrf_token": token, "action": "revoke", "rowid": [b_key.id]})
    assert owner.get(f"/admin/apikeys/edit/?id={b_key.id}").status_code in (302, 404)  # no edit at all
    assert owner.post("/admin/users/delete/", data={"csrf_token": token, "id": b_user}).status_code in (302, 404)

    assert _api(app, b_key.key).status_code == 200  # still alive
    with rt.db.connect() as conn:
        b_row = conn.execute(select(users).where(users.c.id == b_user)).one()
        assert conn.execute(select(api_keys.c.revoked_at).where(api_keys.c.id == b_key.id)).scalar_one() is None
    assert b_row.role == "owner" and b_row.active
    for url in ("/admin/apikeys/", "/admin/apikeys/export/csv/", "/admin/users/", "/admin/users/export/csv/",
                "/admin/apikeys/?search=Chave", "/admin/users/?search=b.com.br"):
        text = owner.get(url).get_data(as_text=True)
        assert "Chave secreta da B" not in text and "dono@b.com.br" not in text and b_key.prefix not in text, url


def test_posts_without_a_csrf_token_are_refused(rt, owner, tenants):
    a, _ = tenants
    with rt.db.begin() as conn:
        new = create_key(conn, org_id=a.world.org_id, name="Sem token")
    owner_id = _user_id(rt, "owner@a.com.br")
    assert owner.post("/admin/apikeys/new/", data={"name": "Forjada"}).status_code == 400
    assert owner.post(f"/admin/apikeys/revoke/{new.id}/").status_code == 400
    assert owner.post("/admin/apikeys/action/", data={"action": "revoke", "rowid": [new.id]}).status_code == 400
    assert owner.post("/admin/users/new/", data={"email": "forjado@a.com.br", "role": "owner",
                                                  "password": "uma-senha-bem-longa"}).status_code == 400
    assert owner.post(f"/admin/users/edit/?id={owner_id}", data={"role": "agent"}).status_code == 400
    with rt.db.connect() as conn:
        assert conn.execute(select(api_keys.c.revoked_at).where(api_keys.c.id == new.id)).scalar_one() is None
        assert conn.execute(select(api_keys.c.id).where(api_keys.c.name == "Forjada")).first() is None
        assert conn.execute(select(users.c.id).where(users.c.email == "forjado@a.com.br")).first() is None
        assert conn.execute(select(users.c.role).where(users.c.id == owner_id)).scalar_one() == "owner"


# --- sessions end with a password change or a deactivation (issue 9, point 7) ----------------------------
def _replay(app, cookie: str):
    thief = app.test_client()
    thief.set_cookie("session", cookie)
    return thief.get("/admin/queue/")


def test_a_password_change_ends_every_session_of_that_user(app, rt, owner, tenants):
    agent_id = _user_id(rt, "agent@a.com.br")
    agent = login(app.test_client(), "agent@a.com.br")
    cookie = agent.get_cookie("session").value
    assert _replay(app, cookie).status_code == 200
    assert _edit(owner, agent_id, role="agent", new_password="nova-senha-da-recepcao").status_code == 302
    replayed = _replay(app, cookie)
    assert replayed.status_code == 302 and "/login" in replayed.headers["Location"]
    assert agent.get("/admin/queue/").status_code == 302
    assert owner.get("/admin/users/").status_code == 200  # the owner who changed it stays signed in
    assert _edit(owner, agent_id, role="agent").status_code == 302  # a role change alone ends nothing
    fresh = login(app.test_client(), "agent@a.com.br", "nova-senha-da-recepcao")
    assert _edit(owner, agent_id, role="manager").status_code == 302
    assert fresh.get("/admin/queue/").status_code == 200


def test_changing_your_own_password_keeps_this_browser_and_ends_the_others(app, rt, owner, tenants):
    owner_id = _user_id(rt, "owner@a.com.br")
    other_browser = login(app.test_client(), "owner@a.com.br")
    copied = owner.get_cookie("session").value
    assert _edit(owner, owner_id, role="owner", new_password="outra-senha-do-dono-1").status_code == 302
    assert owner.get("/admin/users/").status_code == 200
    assert other_browser.get("/admin/").status_code == 302
    assert _replay(app, copied).status_code == 302


def test_a_deactivated_users_cookie_stays_dead_when_they_are_reactivated(app, rt, owner, tenants):
    agent_id = _user_id(rt, "agent@a.com.br")
    cookie = login(app.test_client(), "agent@a.com.br").get_cookie("session").value
    assert _edit(owner, agent_id, role="agent", active=False).status_code == 302
    assert _edit(owner, agent_id, role="agent").status_code == 302  # active again
    assert _replay(app, cookie).status_code == 302
    assert login(app.test_client(), "agent@a.com.br").get("/admin/queue/").status_code == 200


def test_the_keys_page_names_the_orgs_slug(owner, manager, tenants):
    """Issue 33: the slug `--org` and the CLI take is shown on Configuração → Chaves de API."""
    for client in (owner, manager):
        page = client.get("/admin/apikeys/").text
        assert "Organização: Clínica Clinica-A · identificador (slug): clinica-a" in page
        assert "clinica-b" not in page
