"""The egress guard (gateway/egress.py): an address a tenant typed never reaches loopback, private,
link-local or reserved networks unless ops allow it, and the check holds on the resolved address
at connect time (DNS rebinding), for urllib3 (the HTTP providers' client), httpx (the `openai` package
behind an agent's LLM) and smtplib.

No test here sends a packet to a non-loopback address: the `connects` fixture replaces
`socket.connect` with a recorder that refuses anything but loopback, and the addresses the guard
refuses must be refused before any connect at all (`connects == []`).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from engine.messaging import dispatch
from engine.tenants.channels import create_channel
from engine.core.config import ENV_VARS, ConfigError, Settings
from engine.core.errors import DomainError
from engine.flows.agents import create_agent, update_agent
from engine.flows.ai.base import AIError
from engine.flows.ai.openai_compat import OpenAICompatAI
from engine.store.models import channels
from gateway.contract import OutboundMessage, ProviderContext
from gateway.egress import (
    LOOPBACK,
    STRICT,
    EgressPolicy,
    EgressRefused,
    GuardedSMTP,
    GuardedSMTP_SSL,
    httpx_client,
    is_internal,
    pool_manager,
)
from gateway.errors import PermanentError, TransientError
from gateway.http import Client, call
from providers.email.resend import ResendProvider
from providers.email.smtp import SmtpProvider
from providers.evolution.provider import EvolutionProvider
from tests.conftest import BROKER_URL, TEST_KEY
from tests.factories import World
from tests.fakes import evolution as evo
from tests.fakes.llm import LLMFake
from tests.fakes.server import FakeServer, Reply
from tests.fakes.smtp import FakeSmtpServer, free_port, make_certificate
from tests.flows.test_ai import classify

#: A public address the guard lets through; `connects` refuses it, so nothing is ever sent to it.
PUBLIC = "93.184.216.34"
REAL_GETADDRINFO = socket.getaddrinfo


@pytest.fixture
def settings(database_url: str) -> Settings:
    """This module's runtime has the production default: no LEMBRA_PROVIDER_ALLOW, public only."""
    return Settings(database_url=database_url, broker_url=BROKER_URL, secret_keys=TEST_KEY)


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A DNS the test scripts: `answers[name]` is a list of answers, one per lookup (the last one
    repeats); `lookups` lists every lookup of a scripted name. Other names resolve for real."""
    state = SimpleNamespace(answers={}, lookups=[])

    def getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0) -> Any:
        if isinstance(host, bytes):
            host = host.decode()
        if host not in state.answers:
            return REAL_GETADDRINFO(host, port, family, type, proto, flags)
        state.lookups.append(host)
        script = state.answers[host]
        ips = script.pop(0) if len(script) > 1 else script[0]
        port = int(port or 0)
        return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port, 0, 0)) if ":" in ip
                else (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port)) for ip in ips]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return state


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer(lambda req: Reply(200, {"ok": True})) as fake:
        yield fake


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# ------------------------------------------------------------------------------------ addresses


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "10.0.0.1", "172.16.0.1", "192.168.1.10", "169.254.169.254", "100.64.0.1",
    "0.0.0.0", "224.0.0.1", "240.0.0.1", "255.255.255.255", "192.0.0.170",
    "::1", "::", "fe80::1", "fc00::1", "fd00:ec2::254", "ff02::1",
    "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1", "2002:7f00:1::", "64:ff9b::a00:1",
])
def test_internal_addresses(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert is_internal(ip) and not STRICT.allows_ip(ip)


@pytest.mark.parametrize("address", [PUBLIC, "8.8.8.8", "2606:4700:4700::1111", "177.71.128.1"])
def test_public_addresses(address: str) -> None:
    assert not is_internal(ipaddress.ip_address(address))


# --------------------------------------------------------------------- the default refuses, unsent


REFUSED_HOSTS = ["127.0.0.1", "10.0.0.1", "169.254.169.254", "[::1]", "localhost", "[::ffff:127.0.0.1]",
                 "192.168.0.1", "100.64.0.1", "[fe80::1]", "[fd00:ec2::254]", "0.0.0.0", "2130706433", "0x7f.1"]


@pytest.mark.parametrize("host", REFUSED_HOSTS)
def test_the_http_client_refuses_internal_addresses_before_connecting(host: str, connects: list) -> None:
    with pytest.raises(EgressRefused) as caught:
        call(Client(STRICT), "GET", f"http://{host}:8080/instance/connectionState/x", timeout=2)
    error = caught.value
    assert isinstance(error, PermanentError) and error.permanent and error.channel_broken
    assert (error.code, error.host) == ("egress_refused", host.strip("[]"))
    assert connects == []


@pytest.mark.parametrize("host", REFUSED_HOSTS)
def test_httpx_refuses_internal_addresses_before_connecting(host: str, connects: list) -> None:
    with httpx_client(STRICT, timeout=2) as client, pytest.raises(EgressRefused):
        client.get(f"http://{host}:11434/v1/models")
    assert connects == []


@pytest.mark.parametrize("host", [h.strip("[]") for h in REFUSED_HOSTS])
def test_smtp_refuses_internal_addresses_before_connecting(host: str, connects: list) -> None:
    with pytest.raises(EgressRefused):
        GuardedSMTP(host, 25, timeout=2, egress=STRICT)
    with pytest.raises(EgressRefused):
        GuardedSMTP_SSL(host, 465, timeout=2, egress=STRICT)
    assert connects == []


def test_a_name_with_one_internal_address_is_refused_whole(resolver: SimpleNamespace, connects: list) -> None:
    resolver.answers["mixed.example"] = [[PUBLIC, "127.0.0.1"]]
    with pytest.raises(EgressRefused):
        call(Client(STRICT), "GET", "http://mixed.example/", timeout=2)
    assert connects == []


def test_a_refused_address_answers_the_same_whatever_listens_there(connects: list) -> None:
    """The guard is no port scanner: an open port and a closed one give the same answer."""
    outcomes = []
    with FakeServer(evo.EvolutionFake()) as listening:
        for base_url in (listening.url, f"http://127.0.0.1:{free_port()}"):
            provider = EvolutionProvider({"base_url": base_url, "api_key": "k", "instance": "clinica"},
                                         ProviderContext(org_id=1, channel_id=7, timeout=2))
            with pytest.raises(EgressRefused) as caught:
                provider.send(OutboundMessage(to="+5516999887766", text="Olá"))
            outcomes.append((type(caught.value), caught.value.code, caught.value.reason, caught.value.channel_broken))
            assert provider.health() == provider.health()
            assert (provider.health().state, provider.health().detail) == ("error", "egress_refused")
        assert listening.requests == []
    assert outcomes[0] == outcomes[1] == (EgressRefused, "egress_refused", "address not allowed: 127.0.0.1", True)
    assert connects == []


def test_the_providers_refuse_internal_addresses(connects: list) -> None:
    context = ProviderContext(org_id=1, channel_id=7, timeout=2)  # the default policy: public only
    message = OutboundMessage(to="ana@example.com", text="Olá", subject="Teste", idempotency_key="k1")
    for security, port in (("starttls", 587), ("ssl", 465), ("none", 25)):
        smtp = SmtpProvider({"host": "localhost", "port": port, "security": security,
                             "from_email": "agenda@clinica.com.br"}, context)
        with pytest.raises(EgressRefused):
            smtp.send(message)
    resend = ResendProvider({"api_key": "re_x", "from_email": "agenda@clinica.com.br",
                             "base_url": "http://169.254.169.254/latest"}, context)
    with pytest.raises(EgressRefused):
        resend.send(message)
    assert connects == []


# -------------------------------------------------------------------------------- what ops allow


@pytest.mark.parametrize("allow, host", [
    ("127.0.0.0/8", "127.0.0.1"),
    ("127.0.0.1", "127.0.0.1"),
    ("10.0.0.0/8, 127.0.0.0/8", "127.0.0.1"),
    ("localhost", "localhost"),
    ("LocalHost.", "localhost"),
])
def test_an_allowed_cidr_or_host_passes(allow: str, host: str, server: FakeServer, connects: list) -> None:
    policy = EgressPolicy.parse(allow)
    response = call(Client(policy), "GET", f"http://{host}:{_port(server.url)}/ping", timeout=2)
    assert response.status == 200 and [r.path for r in server.requests] == ["/ping"]
    with httpx_client(policy, timeout=2) as client:
        assert client.get(f"http://{host}:{_port(server.url)}/ping").status_code == 200
    assert len(server.requests) == 2
    assert connects and all(ipaddress.ip_address(c[0]).is_loopback for c in connects)


def test_an_allowance_opens_only_what_it_names(server: FakeServer, connects: list) -> None:
    port = _port(server.url)
    for allow, host in (("10.0.0.0/8", "127.0.0.1"), ("localhost", "127.0.0.1"), ("evolution", "localhost"),
                        ("127.0.0.1", "127.0.0.2"), ("::1", "127.0.0.1")):
        with pytest.raises(EgressRefused):
            call(Client(EgressPolicy.parse(allow)), "GET", f"http://{host}:{port}/", timeout=2)
    assert server.requests == [] and connects == []


def test_the_allow_list_is_parsed_strictly() -> None:
    policy = EgressPolicy.parse(" Evolution , relay.clinica.internal., 10.0.5.0/24, [fd00::1], 192.168.1.7 ")
    assert str(policy) == "evolution,relay.clinica.internal,10.0.5.0/24,fd00::1/128,192.168.1.7/32"
    assert policy.allows_host("EVOLUTION") and not policy.allows_host("evolution2")
    assert policy.allows_ip(ipaddress.ip_address("10.0.5.9")) and not policy.allows_ip(ipaddress.ip_address("10.0.6.1"))
    assert policy.allows_ip(ipaddress.ip_address("::ffff:10.0.5.9"))  # the same address, IPv4-mapped
    assert EgressPolicy.parse("") == EgressPolicy.parse(" , ") == STRICT
    for bad in ("http://evolution:8080", "evolution:8080", "*.internal", "10.0.0.0/33", "a b", "1.2.3"):
        with pytest.raises(ValueError, match="not a host name or CIDR"):
            EgressPolicy.parse(bad)


# ------------------------------------------------------------------------ resolved once, at connect


def test_the_http_client_connects_to_the_address_it_checked(resolver: SimpleNamespace, server: FakeServer,
                                                      connects: list) -> None:
    """DNS rebinding: the name is public when checked and loopback right after. The guard resolves
    once and connects to what it checked, so the loopback fake never hears from it."""
    port = _port(server.url)
    resolver.answers["rebind.example"] = [[PUBLIC], ["127.0.0.1"]]
    http = Client(STRICT)
    with pytest.raises(TransientError) as caught:  # the test refuses the public connect
        call(http, "GET", f"http://rebind.example:{port}/", timeout=2)
    assert caught.value.code == "connection_error"
    assert resolver.lookups == ["rebind.example"]
    assert connects == [(PUBLIC, port)]
    assert server.requests == []
    # Every new connection is checked again: the name is loopback now, so it is refused.
    with pytest.raises(EgressRefused):
        call(http, "GET", f"http://rebind.example:{port}/", timeout=2)
    assert connects == [(PUBLIC, port)] and server.requests == []


def test_httpx_connects_to_the_address_it_checked(resolver: SimpleNamespace, server: FakeServer,
                                                  connects: list) -> None:
    import httpx2

    port = _port(server.url)
    resolver.answers["rebind.example"] = [[PUBLIC], ["127.0.0.1"]]
    with httpx_client(STRICT, timeout=2) as client:
        with pytest.raises(httpx2.ConnectError):
            client.get(f"http://rebind.example:{port}/v1/chat/completions")
        assert resolver.lookups == ["rebind.example"]
        assert connects == [(PUBLIC, port)] and server.requests == []
        with pytest.raises(EgressRefused):
            client.get(f"http://rebind.example:{port}/v1/chat/completions")
    assert connects == [(PUBLIC, port)] and server.requests == []


def test_smtp_connects_to_the_address_it_checked(resolver: SimpleNamespace, connects: list) -> None:
    with FakeSmtpServer() as smtp:
        connects.clear()  # the fake's own start-up self-check
        resolver.answers["rebind.example"] = [[PUBLIC], ["127.0.0.1"]]
        with pytest.raises(ConnectionRefusedError):
            GuardedSMTP("rebind.example", smtp.port, timeout=2, egress=STRICT)
        assert resolver.lookups == ["rebind.example"] and connects == [(PUBLIC, smtp.port)]
        with pytest.raises(EgressRefused):
            GuardedSMTP("rebind.example", smtp.port, timeout=2, egress=STRICT)
        assert connects == [(PUBLIC, smtp.port)] and smtp.received == []


def test_an_allowed_name_is_still_resolved_once(resolver: SimpleNamespace, server: FakeServer,
                                                connects: list) -> None:
    port = _port(server.url)
    resolver.answers["evolution"] = [["127.0.0.1"], [PUBLIC]]
    response = call(Client(EgressPolicy.parse("evolution")), "GET", f"http://evolution:{port}/ok", timeout=2)
    assert response.status == 200 and resolver.lookups == ["evolution"] and connects == [("127.0.0.1", port)]
    assert server.requests[0].header("Host") == f"evolution:{port}"  # the name, not the address


# ---------------------------------------------------------------------------------- redirects, TLS


def test_redirects_are_not_followed(connects: list) -> None:
    with FakeServer(lambda req: Reply(302, {}, headers={"Location": "/internal"}) if req.path == "/start"
                    else Reply(200, {"secret": True})) as fake:
        with pytest.raises(PermanentError) as caught:
            call(Client(LOOPBACK), "GET", f"{fake.url}/start", timeout=2)
        assert caught.value.code == "http_302"
        with httpx_client(LOOPBACK, timeout=2) as client:
            assert client.get(f"{fake.url}/start").status_code == 302
        assert [r.path for r in fake.requests] == ["/start"] * 2


def test_a_followed_redirect_is_guarded_too(connects: list) -> None:
    """Code that follows redirects through the guarded pools still cannot be bounced inside the network."""
    with FakeServer(lambda req: Reply(302, {}, headers={"Location": "http://169.254.169.254/latest/meta-data/"})
                    ) as fake:
        with pytest.raises(EgressRefused):
            pool_manager(LOOPBACK).request("GET", f"{fake.url}/start", redirect=True, timeout=2)
        with httpx_client(LOOPBACK, timeout=2) as client, pytest.raises(EgressRefused):
            client.get(f"{fake.url}/start", follow_redirects=True)
    assert all(ipaddress.ip_address(c[0]).is_loopback for c in connects)


class _TLSServer:
    """HTTPS on 127.0.0.1 with a certificate for `localhost` only (no IP in it)."""

    def __init__(self, cert: Any) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = cert.server_context().wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_tls_still_checks_the_certificate_against_the_name(tmp_path: Any, connects: list) -> None:
    cert = make_certificate(tmp_path, names=("localhost",), ips=())
    tls = _TLSServer(cert)
    try:
        policy = EgressPolicy.parse("localhost")
        # Connected to the checked 127.0.0.1, verified (and SNI sent) as "localhost".
        response = call(Client(policy), "GET", f"https://localhost:{tls.port}/", timeout=2, verify=str(cert.cert_path))
        assert response.status == 200
        with pytest.raises(TransientError):  # no system CA trusts the self-signed certificate
            call(Client(policy), "GET", f"https://localhost:{tls.port}/", timeout=2)
        with pytest.raises(TransientError):  # the certificate does not name 127.0.0.1
            call(Client(LOOPBACK), "GET", f"https://127.0.0.1:{tls.port}/", timeout=2, verify=str(cert.cert_path))
    finally:
        tls.close()
    assert all(c[0] == "127.0.0.1" or c[0] == "::1" for c in connects)
    assert ssl.HAS_SNI


# ------------------------------------------------------------------------------------ the agent's LLM


def test_an_agents_llm_url_inside_the_network_fails_permanently_unsent(serve: Any, connects: list) -> None:
    fake = LLMFake(classify=lambda text, labels: "confirm")
    with serve(fake) as llm:
        ai = OpenAICompatAI(f"{llm.url}/v1", "sk-x", "m", timeout=2)  # the default policy
        try:
            with pytest.raises(AIError) as caught:
                classify(ai, "sim", ["confirm"])
        finally:
            ai.close()
        assert (caught.value.code, caught.value.permanent) == ("egress_refused", True)
        assert "sk-x" not in str(caught.value) and llm.url not in str(caught.value)
        allowed = OpenAICompatAI(f"{llm.url}/v1", "sk-x", "m", timeout=2, egress=LOOPBACK)
        try:
            assert classify(allowed, "sim", ["confirm"]).label == "confirm"
        finally:
            allowed.close()
    assert len(fake.requests) == 1  # only the allowed one


def test_an_agents_llm_name_is_resolved_once(resolver: SimpleNamespace, serve: Any, connects: list) -> None:
    fake = LLMFake(classify=lambda text, labels: "confirm")
    with serve(fake) as llm:
        port = _port(llm.url)
        resolver.answers["llm.rebind.example"] = [[PUBLIC], ["127.0.0.1"]]
        ai = OpenAICompatAI(f"http://llm.rebind.example:{port}/v1", None, "m", timeout=2)
        try:
            with pytest.raises(AIError) as caught:
                classify(ai, "sim", ["confirm"])
            assert (caught.value.code, caught.value.permanent) == ("connection_error", False)
            assert resolver.lookups == ["llm.rebind.example"] and connects == [(PUBLIC, port)]
            with pytest.raises(AIError) as again:
                classify(ai, "sim", ["confirm"])
            assert again.value.code == "egress_refused"
        finally:
            ai.close()
    assert fake.requests == []


def test_an_agents_llm_url_is_checked_when_saved(rt: Any, clock: Any) -> None:
    world = World(rt)
    with rt.db.begin() as conn:
        for url in ("http://127.0.0.1:11434/v1", "http://169.254.169.254/latest", "http://[::1]:8000/v1"):
            with pytest.raises(DomainError, match="llm_base_url: address not allowed"):
                create_agent(conn, rt.keyring, world.org_id, name="IA", llm_base_url=url, llm_model="m",
                             egress=rt.settings.egress)
        agent_id = create_agent(conn, rt.keyring, world.org_id, name="IA", llm_base_url="http://127.0.0.1:11434/v1",
                                llm_model="m", egress=LOOPBACK)
        with pytest.raises(DomainError, match="address not allowed: localhost"):
            update_agent(conn, world.org_id, agent_id, llm_base_url="http://localhost:11434/v1",
                         egress=rt.settings.egress)
        update_agent(conn, world.org_id, agent_id, llm_base_url="http://localhost:11434/v1", egress=LOOPBACK)


# ----------------------------------------------------------------------------------- a real send


def test_a_send_to_an_internal_address_fails_permanently_and_breaks_the_channel(rt: Any, clock: Any,
                                                                               serve: Any, connects: list) -> None:
    world = World(rt)
    fake = evo.EvolutionFake()
    with serve(fake) as server:
        with rt.db.begin() as conn:
            channel_id = create_channel(conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="evolution",
                                        name="WhatsApp", credentials={"base_url": server.url, "api_key": fake.api_key,
                                                                      "instance": fake.instance,
                                                                      "webhook_secret": "s"})
        world.rule(120)
        contact = world.contact()
        world.appointment(contact, clock.now() + timedelta(hours=3))
        clock.advance(timedelta(hours=1, minutes=1))
        [message_id] = dispatch.claim_due(rt, limit=10)
        assert dispatch.send_one(rt, message_id) == "failed"
        assert server.requests == [] and fake.sent == []
    message = world.message(message_id)
    assert (message.status, message.error_code) == ("failed", "egress_refused")
    with rt.db.connect() as conn:
        channel = conn.execute(channels.select().where(channels.c.id == channel_id)).one()
    assert (channel.status, channel.status_detail) == ("broken", "egress_refused")
    assert connects == []


# ------------------------------------------------------------------------------------- settings


def test_the_embedded_default_allows_loopback_and_production_does_not() -> None:
    embedded = Settings.from_env({})  # SQLite + stub://, what `lembra up` runs
    assert embedded.provider_allow == "127.0.0.0/8,::1/128"
    assert embedded.egress.allows_ip(ipaddress.ip_address("127.0.0.1"))
    assert not embedded.egress.allows_ip(ipaddress.ip_address("10.0.0.1"))
    for env in ({"DATABASE_URL": "postgresql+psycopg://u@db/lembra"}, {"BROKER_URL": "redis://redis:6379/0"},
                {"LEMBRA_PROVIDER_ALLOW": "none"}):
        assert Settings.from_env(env).egress == STRICT
    assert Settings().egress == STRICT  # built directly (tests, embedding): strict too
    ops = Settings.from_env({"DATABASE_URL": "postgresql+psycopg://u@db/lembra",
                             "LEMBRA_PROVIDER_ALLOW": "Evolution, 10.0.5.0/24"})
    assert ops.provider_allow == "evolution,10.0.5.0/24"
    assert not ops.egress.allows_ip(ipaddress.ip_address("127.0.0.1"))  # an explicit list replaces loopback
    assert "LEMBRA_PROVIDER_ALLOW" in ENV_VARS


def test_a_bad_allow_list_is_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match="LEMBRA_PROVIDER_ALLOW") as caught:
        Settings.from_env({"LEMBRA_PROVIDER_ALLOW": "http://evolution:8080"})
    assert "\n" not in str(caught.value)
