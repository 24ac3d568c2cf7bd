"""The egress guard in the console (issue 9, SSRF): a channel's base_url or SMTP host that points
inside the network is a form error when saved, and the test send and "Conectar WhatsApp" answer
"Endereço não permitido" — the same whether something listens there or not — without a single
request reaching it. The runtime here has the production default (no LEMBRA_PROVIDER_ALLOW).

The guard itself (resolution, rebinding, every client) is tested in tests/test_egress.py.
"""

from __future__ import annotations

import html
import socket
from typing import Any

import pytest
from sqlalchemy import func, select

from engine.tenants.channels import create_channel
from engine.core.config import Settings
from engine.store.models import channels
from tests.admin.conftest import SECRET, csrf
from tests.conftest import BROKER_URL, TEST_KEY
from tests.fakes import evolution as evo
from tests.fakes.smtp import free_port

REFUSED = "Endereço não permitido"
REAL_GETADDRINFO = socket.getaddrinfo


@pytest.fixture
def settings(database_url: str) -> Settings:
    """No LEMBRA_PROVIDER_ALLOW: tenant-set addresses may only be public (the fakes on 127.0.0.1 are not)."""
    return Settings(database_url=database_url, broker_url=BROKER_URL, secret_keys=TEST_KEY)


def evolution_channel(rt: Any, org_id: int, base_url: str) -> int:
    """A channel stored with an internal base_url (as one saved before the guard existed would be)."""
    with rt.db.begin() as conn:
        return create_channel(conn, rt.keyring, org_id=org_id, kind="whatsapp", provider="evolution", name="WhatsApp",
                              credentials={"base_url": base_url, "api_key": "global-api-key", "instance": "clinica",
                                           "webhook_secret": SECRET}, is_default=False)


def channel_count(rt: Any) -> int:
    with rt.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(channels)).scalar_one())


@pytest.mark.parametrize("field, value, provider, kind", [
    ("cred_base_url", "http://127.0.0.1:8080", "evolution", "whatsapp"),
    ("cred_base_url", "http://169.254.169.254/latest/meta-data/", "evolution", "whatsapp"),
    ("cred_base_url", "http://[::1]:8080", "evolution", "whatsapp"),
    ("cred_base_url", "http://localhost:8080", "evolution", "whatsapp"),
    ("cred_host", "10.0.0.1", "smtp", "email"),
])
def test_an_internal_address_is_a_form_error_when_saved(owner: Any, tenants: Any, rt: Any, field: str, value: str,
                                                        provider: str, kind: str) -> None:
    page = owner.get("/admin/channels/new/")
    before = channel_count(rt)
    data = {"csrf_token": csrf(page.text), "name": "Interno", "kind": kind, "provider": provider,
            "status": "active", "cred_base_url": "", "cred_api_key": "k", "cred_instance": "clinica",
            "cred_webhook_secret": "segredo-do-webhook-1", "cred_host": "", "cred_port": "587", "cred_security": "starttls",
            "cred_from_email": "agenda@clinica.com.br", field: value}
    response = owner.post("/admin/channels/new/", data=data)
    assert response.status_code == 200  # the form again, with its error
    text = html.unescape(response.text)
    assert REFUSED in text and "LEMBRA_PROVIDER_ALLOW" in text
    assert channel_count(rt) == before


def test_a_public_address_saves(owner: Any, tenants: Any, rt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "evolution.clinica.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("93.184.216.34", 0))]
        return REAL_GETADDRINFO(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    page = owner.get("/admin/channels/new/")
    before = channel_count(rt)
    response = owner.post("/admin/channels/new/", data={
        "csrf_token": csrf(page.text), "name": "Evolution", "kind": "whatsapp", "provider": "evolution",
        "status": "active", "cred_base_url": "https://evolution.clinica.example", "cred_api_key": "k",
        "cred_instance": "clinica", "cred_webhook_secret": "segredo-do-webhook-1"})
    assert response.status_code == 302, html.unescape(response.text)[-2000:]
    assert channel_count(rt) == before + 1


def test_the_test_send_says_the_address_is_not_allowed_whatever_listens(owner: Any, tenants: Any, rt: Any,
                                                                        serve: Any) -> None:
    a, _ = tenants
    fake = evo.EvolutionFake()
    flashes = []
    with serve(fake) as server:
        for base_url in (server.url, f"http://127.0.0.1:{free_port()}"):
            cid = evolution_channel(rt, a.world.org_id, base_url)
            token = csrf(owner.get(f"/admin/channels/details/?id={cid}").text)
            page = owner.post(f"/admin/channels/test/{cid}/", data={"csrf_token": token, "to": "+5516999887766"},
                              follow_redirects=True)
            text = html.unescape(page.text)
            assert f"{REFUSED}: 127.0.0.1." in text and "O teste falhou" not in text
            flashes.append(text[text.index(REFUSED):text.index("LEMBRA_PROVIDER_ALLOW")])
        assert server.requests == [] and fake.sent == []
    assert flashes[0] == flashes[1]  # an open port and a closed one read the same


def test_connect_says_the_address_is_not_allowed(owner: Any, tenants: Any, rt: Any, serve: Any) -> None:
    a, _ = tenants
    fake = evo.EvolutionFake(state="close")
    with serve(fake) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        page = owner.get(f"/admin/channels/connect/{cid}/")
        assert page.status_code == 200 and REFUSED in html.unescape(page.text)
        assert "egress_refused" not in page.text  # said in words, never as its code
        started = owner.post(f"/admin/channels/connect/{cid}/", data={"csrf_token": csrf(page.text)})
        assert started.status_code == 200 and REFUSED in html.unescape(started.text)
        state = owner.get(f"/admin/channels/connect/{cid}/state").get_json()
        assert state["state"] == "error" and REFUSED in state["error"]
        assert server.requests == []
