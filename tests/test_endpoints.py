"""A tenant-set URL is read once, as the HTTP clients will read it (`gateway.egress.endpoint`), and
the secrets stored with it follow it only to the same endpoint (`secrets_follow`). Issue 30, points 6
and 7: the egress guard decided on `urlsplit` while httpx and urllib3 read some URLs otherwise (a
backslash before an `@`, an octal IPv4 address), and the client's refusal was a 500."""

from __future__ import annotations

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from urllib3.util import parse_url

from gateway.egress import LOOPBACK, STRICT, Endpoint, EgressRefused, InvalidAddress, endpoint, secrets_follow


@pytest.mark.parametrize(("url", "expected"), [
    ("https://api.openai.com/v1", Endpoint("https", "api.openai.com", 443)),
    ("HTTP://Llm.Clinica.Example:8080/v1?x=1#y", Endpoint("http", "llm.clinica.example", 8080)),
    ("http://203.0.113.7", Endpoint("http", "203.0.113.7", 80)),
    ("http://[2001:db8::1]:11434/v1", Endpoint("http", "2001:db8::1", 11434)),
    ("  https://1e100.net/  ", Endpoint("https", "1e100.net", 443)),
])
def test_an_http_url_is_read_as_scheme_host_and_port(url, expected):
    assert endpoint(url) == expected


@pytest.mark.parametrize(("url", "code"), [
    ("http://0177.0.0.1/", "url_ip_spelling"),      # octal: 127.0.0.1 to the resolver, refused by httpx
    ("http://0x7f.0.0.1/", "url_ip_spelling"),
    ("http://127.1/", "url_ip_spelling"),
    ("http://2130706433/", "url_ip_spelling"),
    ("http://127.0.0.1./", "url_ip_spelling"),
    ("http://a%40b@203.0.113.7/", "url_credentials"),
    ("http://evil.example%40127.0.0.1/", "url_credentials"),
    ("http://user:pass@api.example.com/", "url_credentials"),
    ("http://a@b@c/", "url_credentials"),
    ("http://api.example.com\\@127.0.0.1/", "url_invalid"),  # urllib3: api.example.com; httpx: 127.0.0.1
    ("http://ex%61mple.com/", "url_invalid"),
    ("http://exa mple.com/", "url_invalid"),
    ("http://example.com\t/", "url_invalid"),
    ("http://例え.jp/", "url_invalid"),
    ("http://example.com:99999/", "url_invalid"),
    ("http://example.com:/", "url_invalid"),
    ("http://:80/", "url_invalid"),
    ("http://[::1/", "url_invalid"),
    ("http://[fe80::1%25eth0]/", "url_invalid"),
    ("ftp://example.com/", "url_invalid"),
    ("example.com/v1", "url_invalid"),
    ("", "url_invalid"),
])
def test_a_url_a_client_could_read_otherwise_is_refused_with_its_code(url, code):
    with pytest.raises(InvalidAddress) as raised:
        endpoint(url)
    assert raised.value.code == code


def test_check_url_decides_on_the_same_reading():
    with pytest.raises(EgressRefused):
        STRICT.check_url("http://127.0.0.1:8080/v1")
    with pytest.raises(InvalidAddress):
        LOOPBACK.check_url("http://0177.0.0.1/v1")  # the resolver would say 127.0.0.1; the client refuses it
    assert LOOPBACK.check_url("http://127.0.0.1:8080/v1") == Endpoint("http", "127.0.0.1", 8080)


@pytest.mark.parametrize("url", ["http://0177.0.0.1/", "http://2130706433/", "http://127.1:8080/",
                                 "http://user:pw@127.0.0.1:8080/", "http://example.com%40169.254.169.254/"])
def test_a_refused_spelling_that_points_inside_is_said_to_be_internal(url):
    with pytest.raises(EgressRefused):
        STRICT.check_url(url)


@pytest.mark.parametrize(("url", "code"), [("http://0010.0.0.1/", "url_ip_spelling"),
                                           ("http://a%40b@93.184.216.34/", "url_credentials")])
def test_a_refused_spelling_of_a_public_address_says_what_to_fix(url, code):
    with pytest.raises(InvalidAddress) as raised:
        STRICT.check_url(url)
    assert raised.value.code == code


_PIECES = st.sampled_from(["http://", "https://", "HTTP://", "a", "example", ".", "com", "127", "0", "0177", "0x7f",
                           "1", ":", "80", "8080", "@", "%40", "%", "\\", "/", "?", "#", "[", "]", "::1", "-", "_",
                           " ", "\t", "é", "user", "v1"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(_PIECES, min_size=1, max_size=12).map("".join))
def test_whatever_endpoint_accepts_every_client_reads_the_same_way(url):
    try:
        where = endpoint(url)
    except InvalidAddress:
        return
    ours = parse_url(url.strip())
    theirs = httpx2.URL(url.strip())
    assert ours.scheme == theirs.scheme == where.scheme
    assert (ours.host or "").strip("[]") == theirs.host == where.host
    assert (ours.port or {"http": 80, "https": 443}[ours.scheme]) == (theirs.port or {"http": 80, "https": 443}[
        theirs.scheme]) == where.port
    assert ours.auth is None and theirs.userinfo == b""


@pytest.mark.parametrize(("before", "after", "follow"), [
    ({"url": "https://api.openai.com/v1"}, {"url": "HTTPS://API.openai.com:443/v2/"}, True),  # same endpoint
    ({"url": "https://api.openai.com/v1"}, {"url": "https://api.openai.com.attacker.example/v1"}, False),
    ({"url": "https://api.openai.com/v1"}, {"url": "http://api.openai.com/v1"}, False),    # the key in clear
    ({"url": "https://llm.clinica.example/v1"}, {"url": "https://llm.clinica.example:8443/v1"}, False),
    ({"url": "https://llm.clinica.example/v1"}, {"url": None}, False),
    ({"url": None}, {"url": "https://llm.clinica.example/v1"}, False),
    ({"url": "http://0177.0.0.1/"}, {"url": "http://0177.0.0.1/"}, True),                   # unchanged
    ({"host": "smtp.x.example", "port": "587"}, {"host": "SMTP.x.example ", "port": "587"}, True),
    ({"host": "smtp.x.example", "port": "587"}, {"host": "smtp.x.example", "port": "465"}, False),
    ({"host": "smtp.x.example", "security": "starttls"}, {"host": "smtp.x.example", "security": "none"}, False),
])
def test_secrets_follow_a_change_only_to_the_same_endpoint(before, after, follow):
    assert secrets_follow(before, after) is follow
