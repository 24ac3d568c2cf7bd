"""A stored key goes only where it was typed for (issue 30, point 7), and a base URL the HTTP client
cannot read is a sentence, never a 500 (point 6).

Before, an editor could change an agent's base URL to a server of their own, leave the key blank
("keeps the stored key") and press "Testar conexão": Lembra sent `Authorization: Bearer <the org's
key>` to that server. Now a base URL that points to another endpoint (scheme, host, port) clears
the stored key, for agents and for every channel credential bound to an address (Evolution's
base_url and apikey, the advanced base URLs of Meta, Resend, Twilio and Zenvia, an SMTP host, port
and security), through the one rule `gateway.egress.secrets_follow`. The servers here are loopback
fakes on different ports: another port is another endpoint.
"""

from __future__ import annotations

import html
from typing import Any

import pytest
from sqlalchemy import insert, select

from engine.core import clock
from engine.tenants.channels import create_channel
from engine.flows import agents as agent_ops
from engine.store.models import agents, audit_log, channels
from tests.admin.conftest import csrf
from tests.fakes import evolution as evo
from tests.fakes.llm import Huge, LLMFake, Trickle
from tests.fakes.server import FakeServer

API_KEY = "sk-chave-paga-da-clinica-0xC0FFEE"


def text_of(response: Any) -> str:
    return html.unescape(response.get_data(as_text=True))


def agent_form(token: str, **overrides: Any) -> dict[str, Any]:
    data = {"csrf_token": token, "name": "IA", "persona": "", "llm_base_url": "", "llm_model": "llama3",
            "new_api_key": "", "handoff_policy": "pause", "flow_ids": []}
    data.update(overrides)
    return data


def llm_agent(rt: Any, org_id: int, base_url: str, key: str | None = API_KEY) -> int:
    with rt.db.begin() as conn:
        return agent_ops.create_agent(conn, rt.keyring, org_id, name="IA", llm_base_url=base_url, llm_model="llama3",
                                      llm_api_key=key)


def agent_row(rt: Any, agent_id: int) -> Any:
    with rt.db.connect() as conn:
        return conn.execute(select(agents).where(agents.c.id == agent_id)).one()


def bearers(*fakes: LLMFake) -> list[str | None]:
    return [request.header("Authorization") for fake in fakes for request in fake.requests]


def test_a_base_url_moved_to_another_server_clears_the_key_and_the_test_never_sends_it(owner, rt, tenants):
    a, _ = tenants
    with LLMFake(api_key=API_KEY) as clinic, LLMFake() as theirs:
        agent_id = llm_agent(rt, a.world.org_id, clinic.base_url)
        edit = f"/admin/followup_agents/edit/?id={agent_id}"
        token = csrf(owner.get(edit).text)
        # The editor points the agent at their own server and leaves the key blank.
        saved = owner.post(edit, data=agent_form(token, llm_base_url=theirs.base_url), follow_redirects=True)
        assert saved.status_code == 200
        assert "as chaves e senhas guardadas para o endereço anterior foram apagadas" in text_of(saved)
        assert agent_row(rt, agent_id).llm_api_key is None
        tested = text_of(owner.post(f"/admin/followup_agents/test/{agent_id}/", data={"csrf_token": token},
                                    follow_redirects=True))
        assert "Conexão funcionando" in tested
        assert bearers(theirs) == ["Bearer none"]  # the test went out with no key at all
        assert API_KEY not in str(bearers(clinic, theirs))
        # Back to the clinic's server: the key is not restored by itself either.
        owner.post(edit, data=agent_form(token, llm_base_url=clinic.base_url))
        assert agent_row(rt, agent_id).llm_api_key is None
    with rt.db.connect() as conn:
        changes = conn.execute(select(audit_log.c.changes).where(audit_log.c.entity == "agents",
                                                                 audit_log.c.action == "update")).scalars().all()
    assert changes[0]["api_key_removed"] == "new_endpoint" and API_KEY not in str(changes)


def test_the_same_endpoint_keeps_the_key_and_a_key_typed_with_a_new_url_goes_there(owner, rt, tenants):
    a, _ = tenants
    with LLMFake(api_key=API_KEY) as clinic, LLMFake(api_key="sk-do-novo-servidor") as moved:
        agent_id = llm_agent(rt, a.world.org_id, clinic.base_url)
        edit = f"/admin/followup_agents/edit/?id={agent_id}"
        token = csrf(owner.get(edit).text)
        # Another path on the same scheme, host and port is the same server: the key stays.
        same = clinic.base_url.replace("/v1", "/v1/").replace("http://127.0.0.1", "HTTP://127.0.0.1")
        owner.post(edit, data=agent_form(token, llm_base_url=same))
        assert agent_row(rt, agent_id).llm_base_url == same and agent_row(rt, agent_id).llm_api_key is not None
        test = f"/admin/followup_agents/test/{agent_id}/"
        assert "Conexão funcionando" in text_of(owner.post(test, data={"csrf_token": token}, follow_redirects=True))
        assert bearers(clinic) == [f"Bearer {API_KEY}"]
        # A new server with its own key typed: that key, sealed for that server, is what it gets.
        owner.post(edit, data=agent_form(token, llm_base_url=moved.base_url, new_api_key="sk-do-novo-servidor"))
        assert "Conexão funcionando" in text_of(owner.post(test, data={"csrf_token": token}, follow_redirects=True))
        assert bearers(moved) == ["Bearer sk-do-novo-servidor"]


@pytest.mark.parametrize(("url", "sentence"), [
    ("http://0177.0.0.1/v1", "Escreva o endereço IP como quatro números decimais"),
    ("http://0x7f.1/v1", "Escreva o endereço IP como quatro números decimais"),
    ("http://evil.example%4093.184.216.34/v1", "Não coloque usuário nem senha no endereço"),
    ("http://user:senha@api.example.com/v1", "Não coloque usuário nem senha no endereço"),
    ("http://api.example.com\\@127.0.0.1/v1", "Este endereço não pode ser usado"),
    ("http://api.example.com:99999/v1", "Este endereço não pode ser usado"),
    ("http://exa%6dple.com/v1", "Este endereço não pode ser usado"),
    ("http://[::1/v1", "Este endereço não pode ser usado"),
])
def test_a_base_url_the_client_would_read_otherwise_is_a_form_error_and_nothing_is_saved(owner, rt, tenants, url,
                                                                                         sentence):
    a, _ = tenants
    agent_id = llm_agent(rt, a.world.org_id, "https://api.example.com/v1")
    before = agent_row(rt, agent_id)
    edit = f"/admin/followup_agents/edit/?id={agent_id}"
    refused = owner.post(edit, data=agent_form(csrf(owner.get(edit).text), llm_base_url=url))
    assert refused.status_code == 200 and sentence in text_of(refused)
    assert agent_row(rt, agent_id) == before
    created = owner.post("/admin/followup_agents/new/", data=agent_form(
        csrf(owner.get("/admin/followup_agents/new/").text), llm_base_url=url))
    assert created.status_code == 200 and sentence in text_of(created)


@pytest.mark.parametrize("url", ["http://0177.0.0.1/v1", "http://[::1/v1", "http://a%40b@203.0.113.9/v1"])
def test_testar_conexao_on_a_stored_url_the_client_cannot_read_says_so_and_sends_nothing(owner, rt, tenants, url):
    a, _ = tenants
    now = clock.now()
    with rt.db.begin() as conn:  # saved before the form checked it
        agent_id = conn.execute(insert(agents).values(
            org_id=a.world.org_id, name="Antigo", llm_base_url=url, llm_model="llama3", handoff_policy="pause",
            followup_enabled=False, flow_pointer_ids=[], created_at=now, updated_at=now).returning(agents.c.id)
        ).scalar_one()
    token = csrf(owner.get(f"/admin/followup_agents/details/?id={agent_id}").text)
    response = owner.post(f"/admin/followup_agents/test/{agent_id}/", data={"csrf_token": token})
    assert response.status_code == 302
    page = text_of(owner.get(response.headers["Location"]))
    assert "A conexão falhou: o endereço da API do agente não pode ser usado; corrija-o no agente." in page


@pytest.mark.parametrize(("answer", "sentence"), [
    (Trickle(0.02, {"label": "ok"}), "A conexão falhou: tempo esgotado."),
    (Huge(50 * 1024 * 1024), "A conexão falhou: resposta grande demais."),
], ids=["trickle", "50_mb"])
def test_testar_conexao_ends_at_its_deadline_or_size_cap_with_a_sentence(owner, rt, tenants, monkeypatch, answer,
                                                                         sentence):
    # The console's deadline is 10 s; a small one here keeps the test quick. The trickle would take
    # seconds more than it, and came a byte at a time, well within any per-read timeout.
    monkeypatch.setattr("admin.views.followup.agents.TEST_TIMEOUT", 0.5)
    a, _ = tenants
    with LLMFake(answer) as fake:
        agent_id = llm_agent(rt, a.world.org_id, fake.base_url)
        token = csrf(owner.get(f"/admin/followup_agents/details/?id={agent_id}").text)
        page = text_of(owner.post(f"/admin/followup_agents/test/{agent_id}/", data={"csrf_token": token},
                                  follow_redirects=True))
        assert sentence in page
        [streamed] = fake.streams
        assert streamed.done.wait(30) and not streamed.finished  # the console hung up before the end


# --- channels ---------------------------------------------------------------------------------------

EVOLUTION_KEY = "global-api-key"
HOOK_SECRET = "segredo-do-webhook-123"


def evolution_channel(rt: Any, org_id: int, base_url: str) -> int:
    with rt.db.begin() as conn:
        return create_channel(conn, rt.keyring, org_id=org_id, kind="whatsapp", provider="evolution", name="Zap",
                              credentials={"base_url": base_url, "api_key": EVOLUTION_KEY, "instance": "clinica",
                                           "webhook_secret": HOOK_SECRET}, is_default=False)


def stored(rt: Any, channel_id: int) -> dict[str, Any]:
    with rt.db.connect() as conn:
        row = conn.execute(select(channels).where(channels.c.id == channel_id)).one()
    return rt.keyring.open(row.credentials, key_version=row.key_version, table="channels", org_id=row.org_id,
                           row_id=row.id)


def evolution_form(token: str, base_url: str, api_key: str = "") -> dict[str, str]:
    return {"csrf_token": token, "name": "Zap", "status": "active", "cred_base_url": base_url,
            "cred_api_key": api_key, "cred_instance": "clinica", "cred_webhook_secret": ""}


def test_a_channel_moved_to_another_server_needs_its_secrets_typed_again(owner, rt, tenants):
    a, _ = tenants
    with FakeServer(evo.EvolutionFake(state="open")) as clinic, FakeServer(evo.EvolutionFake()) as theirs:
        cid = evolution_channel(rt, a.world.org_id, clinic.url)
        edit = f"/admin/channels/edit/?id={cid}"
        token = csrf(owner.get(edit).text)
        refused = owner.post(edit, data=evolution_form(token, theirs.url))
        assert refused.status_code == 200
        assert "O endereço mudou para outro servidor: informe este valor de novo" in text_of(refused)
        assert stored(rt, cid)["base_url"] == clinic.url  # nothing saved
        check = f"/admin/channels/check/{cid}/"
        owner.post(check, data={"csrf_token": token})
        assert theirs.requests == []  # the check still asks the clinic's own server, with its key

        moved = owner.post(edit, data=evolution_form(token, theirs.url, api_key="chave-do-novo"), follow_redirects=True)
        assert "as chaves e senhas guardadas para o endereço anterior foram apagadas" in text_of(moved)
        creds = stored(rt, cid)
        assert (creds["base_url"], creds["api_key"]) == (theirs.url, "chave-do-novo")
        assert creds["webhook_secret"] not in (HOOK_SECRET, "")  # a fresh one, never the old server's
        owner.post(check, data={"csrf_token": token})
        assert {r.header("apikey") for r in theirs.requests} == {"chave-do-novo"}
    assert EVOLUTION_KEY not in str([r.headers for r in theirs.requests])


def test_a_channel_edit_on_the_same_endpoint_keeps_its_secrets(owner, rt, tenants):
    a, _ = tenants
    cid = evolution_channel(rt, a.world.org_id, "https://evolution.clinica.example")
    edit = f"/admin/channels/edit/?id={cid}"
    kept = owner.post(edit, data=evolution_form(csrf(owner.get(edit).text), "HTTPS://Evolution.Clinica.Example:443/"))
    assert kept.status_code == 302
    creds = stored(rt, cid)
    assert (creds["api_key"], creds["webhook_secret"]) == (EVOLUTION_KEY, HOOK_SECRET)


def test_an_smtp_host_port_or_security_change_drops_the_stored_password(owner, rt, tenants):
    a, _ = tenants
    base = {"host": "smtp.clinica.example", "port": "587", "security": "starttls", "from_email": "agenda@clinica.example",
            "username": "agenda@clinica.example", "password": "senha-do-email"}
    with rt.db.begin() as conn:
        cid = create_channel(conn, rt.keyring, org_id=a.world.org_id, kind="email", provider="smtp", name="E-mail",
                             credentials=base, is_default=False)
    edit = f"/admin/channels/edit/?id={cid}"

    def post(**changes: str) -> Any:
        data = {"csrf_token": csrf(owner.get(edit).text), "name": "E-mail", "status": "active",
                **{f"cred_{k}": v for k, v in base.items() if k != "password"}, "cred_password": ""}
        data.update({f"cred_{k}": v for k, v in changes.items()})
        return owner.post(edit, data=data)

    assert post(from_name="Clínica").status_code == 302 and stored(rt, cid)["password"] == "senha-do-email"
    assert post(security="none").status_code == 302  # the password would cross the network in clear
    assert "password" not in stored(rt, cid)
    assert post(password="senha-nova").status_code == 302 and stored(rt, cid)["password"] == "senha-nova"
    assert post(host="smtp.outro.example").status_code == 302 and "password" not in stored(rt, cid)


def test_a_twilio_base_url_moved_needs_the_auth_token_again_and_a_hostile_one_is_refused(owner, rt, tenants):
    a, _ = tenants
    creds = {"account_sid": "AC" + "0" * 32, "auth_token": "f" * 32, "from": "+5511999990000",
             "base_url": "https://api.twilio.com"}
    with rt.db.begin() as conn:
        cid = create_channel(conn, rt.keyring, org_id=a.world.org_id, kind="sms", provider="twilio", name="SMS",
                             credentials=creds, is_default=False)
    edit = f"/admin/channels/edit/?id={cid}"
    form = {"csrf_token": csrf(owner.get(edit).text), "name": "SMS", "status": "active",
            "cred_account_sid": creds["account_sid"], "cred_auth_token": "", "cred_from": creds["from"]}
    moved = owner.post(edit, data={**form, "cred_base_url": "https://twilio.proxy.example"})
    assert "informe este valor de novo" in text_of(moved) and stored(rt, cid) == creds
    for url, sentence in (("http://0177.0.0.1", "Escreva o endereço IP como quatro números decimais"),
                          ("https://api.twilio.com%40evil.example", "Não coloque usuário nem senha no endereço")):
        refused = owner.post(edit, data={**form, "cred_base_url": url, "cred_auth_token": "e" * 32})
        assert refused.status_code == 200 and sentence in text_of(refused), url
    assert stored(rt, cid) == creds
