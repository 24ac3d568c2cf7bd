"""The providers' HTTP client (gateway/http.py): what it puts on the wire, how it reads the answer,
that it keeps its connections, and that a proxy from the environment is used only after the
egress guard has checked the target. Every server here is a loopback fake."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from gateway.egress import LOOPBACK, STRICT, EgressPolicy, EgressRefused
from gateway.errors import TransientError
from gateway.http import USER_AGENT, Client, call
from tests.fakes.server import FakeServer, Reply

REAL_GETADDRINFO = socket.getaddrinfo
PUBLIC = "93.184.216.34"


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def test_one_connection_carries_many_calls(connects: list, no_proxy_env: None) -> None:
    with FakeServer(lambda req: Reply(200, {"messages": [{"id": "wamid.1"}]})) as fake:
        client = Client(LOOPBACK)
        for _ in range(20):
            assert call(client, "POST", f"{fake.url}/v26.0/1/messages", timeout=2, json={"to": "1"}).status == 200
        client.close()
    assert len(fake.requests) == 20
    assert len(connects) == 1  # keep-alive: the first call connected, the other 19 reused it


def test_what_goes_on_the_wire(no_proxy_env: None) -> None:
    with FakeServer(lambda req: Reply(201, {"sid": "SM1"})) as fake:
        client = Client(LOOPBACK)
        call(client, "POST", f"{fake.url}/json?x=1", timeout=2, json={"text": "Olá", "n": 1},
             params={"a": "b c", "skip": None}, headers={"Authorization": "Bearer t"})
        call(client, "POST", f"{fake.url}/form", timeout=2, data={"To": "+5516999887766", "Body": "Olá & até"},
             auth=("AC1", "s3cr3t"))
        call(client, "POST", f"{fake.url}/raw", timeout=2, data=b'{"id":1}',
             headers={"Content-Type": "application/json", "User-Agent": "custom"})
    as_json, as_form, as_raw = fake.requests
    assert (as_json.path, as_json.query) == ("/json", {"x": ["1"], "a": ["b c"]})
    assert as_json.json() == {"text": "Olá", "n": 1}
    assert as_json.header("Content-Type") == "application/json"
    assert as_json.header("Authorization") == "Bearer t" and as_json.header("User-Agent") == USER_AGENT
    assert as_form.form() == {"To": ["+5516999887766"], "Body": ["Olá & até"]}
    assert as_form.header("Content-Type") == "application/x-www-form-urlencoded"
    assert as_form.header("Authorization") == "Basic QUMxOnMzY3IzdA=="  # base64("AC1:s3cr3t")
    assert as_raw.body == b'{"id":1}' and as_raw.header("User-Agent") == "custom"


@pytest.mark.parametrize("payload, content_type, body, text", [
    ('{"erro": "número inválido"}'.encode("latin-1"), "application/json; charset=ISO-8859-1",
     {"erro": "número inválido"}, '{"erro": "número inválido"}'),
    ('{"erro": "número"}'.encode(), "application/json", {"erro": "número"}, '{"erro": "número"}'),
    (b"<html>bad gateway</html>", "text/html; charset=nonsense", None, "<html>bad gateway</html>"),
    (b"", "application/json", None, ""),
])
def test_the_answer_is_read_in_its_charset(payload: bytes, content_type: str, body: Any, text: str,
                                           no_proxy_env: None) -> None:
    with FakeServer(lambda req: Reply(200, payload, headers={"Content-Type": content_type})) as fake:
        response = call(Client(LOOPBACK), "GET", f"{fake.url}/", timeout=2)
    assert (response.body, response.text) == (body, text)


def test_an_answer_that_never_comes_is_an_unknown_outcome(no_proxy_env: None) -> None:
    with FakeServer(lambda req: Reply(200, {}, delay=1.0)) as fake:
        with pytest.raises(TransientError) as caught:
            call(Client(LOOPBACK), "POST", f"{fake.url}/", timeout=0.2, json={})
    assert (caught.value.code, caught.value.outcome_unknown) == ("timeout", True)


def test_a_proxy_from_the_environment_is_used_after_the_target_is_checked(
        monkeypatch: pytest.MonkeyPatch, connects: list, no_proxy_env: None) -> None:
    def getaddrinfo(host: Any, port: Any, *args: Any) -> Any:
        if host == "graph.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (PUBLIC, int(port or 0)))]
        return REAL_GETADDRINFO(host, port, *args)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with FakeServer(lambda req: Reply(200, {"via": "proxy"})) as proxy, \
            FakeServer(lambda req: Reply(200, {"via": "direct"})) as direct:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        client = Client(STRICT)
        # A public target goes through the proxy (which the guard does not police: ops set it).
        assert call(client, "GET", "http://graph.example/v26.0/1", timeout=2).body == {"via": "proxy"}
        assert [(r.path, r.header("Host")) for r in proxy.requests] == [("/v26.0/1", "graph.example")]
        # An internal target is refused before anything reaches the proxy.
        with pytest.raises(EgressRefused):
            call(client, "GET", "http://169.254.169.254/latest/meta-data/", timeout=2)
        assert len(proxy.requests) == 1
        # NO_PROXY: straight to the target, through the guard.
        allowed = Client(EgressPolicy.parse("127.0.0.0/8"))
        assert call(allowed, "GET", f"{direct.url}/x", timeout=2).body == {"via": "direct"}
        with pytest.raises(EgressRefused):
            call(client, "GET", f"{direct.url}/x", timeout=2)
    assert len(proxy.requests) == 1 and len(direct.requests) == 1
    assert all(ipaddress.ip_address(host).is_loopback for host, _ in connects)


@pytest.mark.parametrize("url", ["graph.example/v26.0/1/messages", "ftp://graph.example/x", "http:///nohost"])
def test_a_url_that_is_not_http_with_a_host_fails_before_any_connection(url: str, connects: list,
                                                                        no_proxy_env: None) -> None:
    with pytest.raises(TransientError) as caught:
        call(Client(STRICT), "POST", url, timeout=2, json={})
    assert caught.value.code == "request_error" and connects == []
