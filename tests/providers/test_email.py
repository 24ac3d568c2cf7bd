"""Email providers: SMTP against a real SMTP server (aiosmtpd, plain / STARTTLS / implicit TLS) and
Resend against a loopback fake answering in Resend's documented wire format; Resend webhooks with
Svix's published signature vector and a fixture of every Resend event type Lembra receives
(tests/fixtures/providers/resend/; sources per file: tests/fixtures/providers/README.md)."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from email.message import EmailMessage

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import registry
from gateway.contract import OutboundMessage, ProviderContext, StatusEvent, WebhookRequest, WebhookResult
from gateway.egress import LOOPBACK
from gateway.errors import BadSignature, MalformedWebhook, PermanentError, TransientError, WebhookError
from providers.email.mime import text_to_html
from providers.email.resend import ResendProvider, idempotency_key
from providers.email.smtp import SmtpProvider
from tests.fakes.resend import (
    DOCUMENTED_ERRORS,
    ResendFake,
    error,
    svix_headers,
    svix_signature,
    validation_error_sample,
)
from tests.fakes.server import Reply
from tests.fakes.smtp import FakeSmtpServer, Script, SilentServer, free_port, make_certificate
from tests.fixtures import fixture_bytes, fixture_json

# The fakes listen on loopback, which the egress guard refuses unless allowed.
CTX = ProviderContext(org_id=1, channel_id=7, timeout=2, public_url="https://lembra.example", egress=LOOPBACK)
FAST = ProviderContext(org_id=1, channel_id=7, timeout=0.5, public_url="https://lembra.example", egress=LOOPBACK)

TEXT = ("Olá, João! Sua consulta com a Dra. Conceição Araújo é amanhã às 14h30.\n"
        "Responda CONFIRMAR ou CANCELAR.\n"
        ".\n"
        "..linha que começa com ponto <b>&</b> — até já")
SUBJECT = "Lembrete: consulta amanhã às 14h30 — Clínica Sorriso Saúde"
UNSUBSCRIBE = "<https://lembra.example/optout/WzEsNDIsImVtYWlsIl0.Qm9ndXMtc2lnbmF0dXJlLWZvci10ZXN0cy0wMTIzNDU2Nzg5>"
HEADERS = {"List-Unsubscribe": UNSUBSCRIBE, "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}
HTML = "<p>Olá, <strong>João</strong>! Até amanhã às 14h30.</p>"


def outbound(**changes: object) -> OutboundMessage:
    fields: dict[str, object] = dict(
        to="paciente@example.org", text=TEXT, subject=SUBJECT, html=HTML, headers=HEADERS,
        idempotency_key="appointment:42:3:email:1", reference="42",
    )
    fields.update(changes)
    return OutboundMessage(**fields)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# SMTP
# --------------------------------------------------------------------------------------------


@pytest.fixture
def cert(tmp_path):
    return make_certificate(tmp_path / "tls")


def smtp_config(port: int, security: str = "none", **extra: object) -> dict[str, object]:
    return {"host": "127.0.0.1", "port": port, "security": security, "from_email": "agenda@clinica.example",
            "from_name": "Clínica Sorriso, Saúde", **extra}


def parts(message: EmailMessage) -> tuple[str, str]:
    plain = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    assert plain is not None and html is not None
    return plain.get_content(), html.get_content()


def assert_delivered(server: FakeSmtpServer, provider_id: str, *, html: str = HTML) -> EmailMessage:
    assert len(server.received) == 1
    got = server.received[0]
    assert got.mail_from == "agenda@clinica.example"
    assert got.rcpt_tos == ["paciente@example.org"]
    message = got.message
    assert message["From"].addresses[0].display_name == "Clínica Sorriso, Saúde"
    assert message["From"].addresses[0].addr_spec == "agenda@clinica.example"
    assert str(message["To"]) == "paciente@example.org"
    assert str(message["Subject"]) == SUBJECT
    assert message["Message-ID"] == provider_id
    assert message["Date"] is not None
    assert message.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in message.iter_parts()] == ["text/plain", "text/html"]
    # RFC 8058: both headers, verbatim (not RFC 2047-encoded, not folded inside the URL)
    assert message["List-Unsubscribe"] == UNSUBSCRIBE
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert f"List-Unsubscribe: {UNSUBSCRIBE}\r\n".encode() in got.raw
    assert b"List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n" in got.raw
    text, html_part = parts(message)
    assert text.replace("\r\n", "\n").rstrip("\n") == TEXT  # accents, dot-stuffed lines intact
    assert html_part.replace("\r\n", "\n").rstrip("\n") == html
    assert all(byte < 128 for byte in got.raw)  # 7-bit on the wire: no relay needs 8BITMIME
    return message


def test_registry_names_both_providers():
    assert registry.load("smtp") is SmtpProvider
    assert registry.load("resend") is ResendProvider
    assert SmtpProvider.kinds == ResendProvider.kinds == ("email",)
    assert SmtpProvider.honours_idempotency is False and ResendProvider.honours_idempotency is True


def test_smtp_starttls_with_login_delivers_the_message(cert):
    with FakeSmtpServer(security="starttls", certificate=cert, users={"agenda": "s3cret"}) as server:
        provider = SmtpProvider(smtp_config(server.port, "starttls", username="agenda", password="s3cret",
                                            ca_file=str(cert.cert_path)), CTX)
        result = provider.send(outbound())
    assert result.provider_message_id.startswith("<lembra.") and result.provider_message_id.endswith("@clinica.example>")
    assert_delivered(server, result.provider_message_id)
    assert server.received[0].tls is True
    assert server.received[0].authenticated_as == "agenda"
    assert server.auth_attempts == [("agenda", True)]


def test_smtp_implicit_tls_with_ca_as_pem_text(cert):
    with FakeSmtpServer(security="ssl", certificate=cert) as server:
        provider = SmtpProvider(smtp_config(server.port, "ssl", ca_file=cert.pem), CTX)
        result = provider.send(outbound())
    assert_delivered(server, result.provider_message_id)
    assert server.received[0].tls is True


def test_smtp_plain_without_html_gets_an_escaped_html_part():
    with FakeSmtpServer() as server:
        result = SmtpProvider(smtp_config(server.port), CTX).send(outbound(html=None))
    message = assert_delivered(server, result.provider_message_id, html=text_to_html(TEXT).rstrip("\n"))
    html_part = parts(message)[1].replace("\r\n", "\n")
    assert "&lt;b&gt;&amp;&lt;/b&gt;" in html_part and "<b>" not in html_part
    assert "Olá, João! Sua consulta" in html_part and "14h30.<br>\nResponda" in html_part


def test_text_to_html_escapes_and_breaks_lines():
    rendered = text_to_html('a < b & "c"\r\nline 2\rline 3')
    assert 'a &lt; b &amp; &quot;c&quot;<br>\nline 2<br>\nline 3' in rendered
    assert '<meta charset="utf-8">' in rendered


def test_smtp_message_id_follows_the_idempotency_key():
    with FakeSmtpServer() as server:
        provider = SmtpProvider(smtp_config(server.port), CTX)
        first = provider.send(outbound()).provider_message_id
        again = provider.send(outbound()).provider_message_id
        other = provider.send(outbound(idempotency_key="appointment:43:3:email:1")).provider_message_id
        random_a = provider.send(outbound(idempotency_key=None)).provider_message_id
        random_b = provider.send(outbound(idempotency_key=None)).provider_message_id
    assert first == again != other
    assert random_a != random_b
    assert [r.message["Message-ID"] for r in server.received] == [first, again, other, random_a, random_b]


def test_smtp_international_domain_goes_out_as_idna():
    with FakeSmtpServer() as server:
        SmtpProvider(smtp_config(server.port), CTX).send(outbound(to="jose@clínica-ção.com.br"))
    ascii_domain = "clínica-ção.com.br".encode("idna").decode()
    assert ascii_domain.startswith("xn--")
    assert server.received[0].rcpt_tos == [f"jose@{ascii_domain}"]
    assert str(server.received[0].message["To"]) == f"jose@{ascii_domain}"
    assert "SMTPUTF8" not in server.received[0].mail_options


def test_smtp_login_refused_is_535_and_breaks_the_channel(cert):
    with FakeSmtpServer(security="starttls", certificate=cert, users={"agenda": "s3cret"}) as server:
        provider = SmtpProvider(smtp_config(server.port, "starttls", username="agenda", password="wrong",
                                            ca_file=str(cert.cert_path)), CTX)
        with pytest.raises(PermanentError) as caught:
            provider.send(outbound())
    assert caught.value.code == "smtp_535" and caught.value.channel_broken
    # smtplib tries each offered mechanism (PLAIN, then LOGIN) before giving up
    assert server.received == [] and server.auth_attempts and all(not ok for _, ok in server.auth_attempts)


def test_smtp_server_demanding_auth_without_credentials_breaks_the_channel(cert):
    with FakeSmtpServer(security="starttls", certificate=cert, users={"agenda": "s3cret"}) as server:
        provider = SmtpProvider(smtp_config(server.port, "starttls", ca_file=str(cert.cert_path)), CTX)
        with pytest.raises(PermanentError) as caught:
            provider.send(outbound())
    assert caught.value.code == "smtp_530" and caught.value.channel_broken


@pytest.mark.parametrize("stage, reply, kind, code, broken", [
    ("rcpt", "550 5.1.1 <paciente@example.org>: Recipient address rejected: mailbox unavailable", PermanentError, "smtp_550", False),
    ("rcpt", "553 5.1.3 mailbox name not allowed", PermanentError, "smtp_553", False),
    ("rcpt", "554 5.7.1 rejected", PermanentError, "smtp_554", False),
    ("rcpt", "451 4.3.0 temporary failure, try later", TransientError, "smtp_451", False),
    ("rcpt", "450 4.2.0 mailbox busy", TransientError, "smtp_450", False),
    ("rcpt", "452 4.5.3 too many recipients", TransientError, "smtp_452", False),
    ("mail", "421 4.7.0 too many connections, closing", TransientError, "smtp_421", False),
    ("mail", "550 5.7.1 sender not allowed to relay", PermanentError, "smtp_550", True),
    ("data", "554 5.6.0 message content rejected", PermanentError, "smtp_554", False),
    ("data", "451 4.7.1 greylisted", TransientError, "smtp_451", False),
])
def test_smtp_replies_map_to_typed_errors(stage, reply, kind, code, broken):
    script = Script(**{f"{stage}_reply": reply})
    with FakeSmtpServer(script=script) as server:
        with pytest.raises(kind) as caught:
            SmtpProvider(smtp_config(server.port), CTX).send(outbound())
    assert caught.value.code == code
    assert caught.value.channel_broken is broken
    assert "paciente" not in str(caught.value) and "paciente" not in caught.value.reason
    assert server.received == []


def test_smtp_server_not_listening_is_transient():
    with pytest.raises(TransientError) as caught:
        SmtpProvider(smtp_config(free_port()), CTX).send(outbound())
    assert caught.value.code == "connection_refused"


def test_smtp_server_that_never_greets_times_out():
    with SilentServer() as silent:
        with pytest.raises(TransientError) as caught:
            SmtpProvider(smtp_config(silent.port), FAST).send(outbound())
    assert caught.value.code == "timeout"


def test_smtp_silence_after_the_body_is_a_distinct_transient_code():
    # The relay may have queued the message: the code says a retry can duplicate it.
    with FakeSmtpServer(script=Script(data_delay=1.5)) as server:
        with pytest.raises(TransientError) as caught:
            SmtpProvider(smtp_config(server.port), FAST).send(outbound())
    assert caught.value.code == "timeout_after_data"


@pytest.mark.parametrize("security", ["starttls", "ssl"])
def test_smtp_untrusted_certificate_breaks_the_channel(cert, security):
    # No ca_file: the system store does not know our self-signed certificate, and never will.
    with FakeSmtpServer(security=security, certificate=cert) as server:
        with pytest.raises(PermanentError) as caught:
            SmtpProvider(smtp_config(server.port, security), CTX).send(outbound())
    assert caught.value.code == "tls_certificate" and caught.value.channel_broken


def test_smtp_certificate_for_another_host_breaks_the_channel(tmp_path):
    other = make_certificate(tmp_path / "other", common_name="mail.other.example",
                             names=("mail.other.example",), ips=())
    with FakeSmtpServer(security="ssl", certificate=other) as server:
        provider = SmtpProvider(smtp_config(server.port, "ssl", ca_file=str(other.cert_path)), CTX)
        with pytest.raises(PermanentError) as caught:
            provider.send(outbound())
    assert caught.value.code == "tls_certificate" and caught.value.channel_broken


def test_smtp_starttls_required_but_not_offered_is_refused_not_downgraded():
    with FakeSmtpServer(security="none") as server:
        with pytest.raises(PermanentError) as caught:
            SmtpProvider(smtp_config(server.port, "starttls"), CTX).send(outbound())
    assert caught.value.code == "starttls_unsupported" and caught.value.channel_broken
    assert server.received == []


def test_smtp_implicit_tls_against_a_plain_port_is_a_config_error():
    with FakeSmtpServer(security="none") as server:
        with pytest.raises(PermanentError) as caught:
            SmtpProvider(smtp_config(server.port, "ssl"), CTX).send(outbound())
    assert caught.value.code == "tls_error" and caught.value.channel_broken


@pytest.mark.parametrize("changes, code", [
    ({"subject": None}, "no_subject"),
    ({"subject": "  \n "}, "no_subject"),
    ({"to": "not-an-address"}, "invalid_address"),
    ({"to": "a@b.org, c@d.org"}, "invalid_address"),
    ({"to": "a@b.org\r\nBcc: x@y.org"}, "invalid_address"),
    ({"to": "josé@example.org"}, "invalid_address"),
    ({"headers": {"Bcc": "x@y.org"}}, "bad_header"),
    ({"headers": {"X-Evil": "a\r\nBcc: x@y.org"}}, "bad_header"),
    ({"headers": {"Bad Name": "v"}}, "bad_header"),
])
def test_messages_refused_before_any_connection(changes, code):
    port = free_port()  # nothing listens: reaching the network would be a transient error instead
    for provider in (SmtpProvider(smtp_config(port), CTX),
                     ResendProvider({"api_key": "re_x", "from_email": "a@clinica.example",
                                     "base_url": f"http://127.0.0.1:{port}"}, CTX)):
        with pytest.raises(PermanentError) as caught:
            provider.send(outbound(**changes))
        assert caught.value.code == code


@pytest.mark.parametrize("config, code", [
    ({"host": ""}, "config_missing"),
    ({"from_email": None}, "config_missing"),
    ({"security": "tls13-please"}, "config_invalid"),
    ({"port": "smtp"}, "config_invalid"),
    ({"ca_file": "/nonexistent/ca.pem", "security": "ssl"}, "config_invalid"),
])
def test_smtp_bad_config_breaks_the_channel(config, code):
    with pytest.raises(PermanentError) as caught:
        SmtpProvider({**smtp_config(free_port()), **config}, CTX).send(outbound())
    assert caught.value.code == code and caught.value.channel_broken


def test_smtp_has_no_webhooks():
    request = WebhookRequest("POST", "https://lembra.example/webhooks/smtp/7", {}, b"{}")
    with pytest.raises(MalformedWebhook):
        SmtpProvider(smtp_config(25), CTX).parse_webhook(request)


# --------------------------------------------------------------------------------------------
# Resend: send
# --------------------------------------------------------------------------------------------

RESEND_ID = "4ef9a417-02e9-4d39-ad75-9611e0fcc33c"  # resend/send_response.json; the webhook fixtures are about it


@pytest.fixture(scope="module")
def resend_fake():
    with ResendFake() as fake:
        yield fake


def resend(fake_url: str, context: ProviderContext = CTX, **extra: object) -> ResendProvider:
    config = {"api_key": "re_123456789", "from_email": "agenda@clinica.example", "from_name": "Clínica Sorriso",
              "webhook_secret": VECTOR_SECRET, "base_url": fake_url, **extra}
    return ResendProvider(config, context)


def test_resend_send_is_the_documented_request(resend_fake):
    fake = resend_fake.reset()
    result = resend(fake.url).send(outbound())
    assert result.provider_message_id == RESEND_ID
    [request] = fake.requests
    assert (request.method, request.path) == ("POST", "/emails")
    assert request.header("Authorization") == "Bearer re_123456789"
    assert request.header("Idempotency-Key") == "appointment:42:3:email:1"
    assert request.header("Content-Type") == "application/json"
    assert request.json() == {
        "from": "Clínica Sorriso <agenda@clinica.example>",
        "to": ["paciente@example.org"],
        "subject": SUBJECT,
        "html": HTML,
        "text": TEXT,
        "headers": {"List-Unsubscribe": UNSUBSCRIBE, "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"},
        "tags": [{"name": "lembra_ref", "value": "42"}],
    }


def test_resend_sample_response_and_html_fallback(resend_fake):
    fake = resend_fake.reset(Reply(200, fixture_bytes("resend/send_response.json")))
    result = resend(fake.url, from_name="Dra. Ana \"Sorriso\"").send(
        outbound(html=None, headers={}, reference=None, idempotency_key=None))
    assert result.provider_message_id == RESEND_ID
    [request] = fake.requests
    body = request.json()
    assert body["from"] == '"Dra. Ana \\"Sorriso\\"" <agenda@clinica.example>'
    assert body["html"] == text_to_html(TEXT)
    assert "headers" not in body and "tags" not in body
    assert request.header("Idempotency-Key") is None


def test_resend_idempotency_key_over_the_documented_limit_is_hashed(resend_fake):
    long_key = "k" * 300
    assert len(idempotency_key(long_key)) == 64 and idempotency_key(long_key) == idempotency_key(long_key)
    assert idempotency_key("k" * 256) == "k" * 256
    fake = resend_fake.reset()
    resend(fake.url).send(outbound(idempotency_key=long_key))
    assert fake.requests[0].header("Idempotency-Key") == idempotency_key(long_key)


def test_resend_validation_error_is_permanent(resend_fake):
    fake = resend_fake.reset(validation_error_sample())
    with pytest.raises(PermanentError) as caught:
        resend(fake.url).send(outbound())
    assert caught.value.code == "validation_error" and not caught.value.channel_broken


EXPECTED = {  # (name, status) → (error class, channel_broken)
    ("invalid_idempotency_key", 400): (PermanentError, False),
    ("validation_error", 400): (PermanentError, False),
    ("validation_error", 422): (PermanentError, False),
    ("missing_required_field", 422): (PermanentError, False),
    ("invalid_attachment", 422): (PermanentError, False),
    ("missing_api_key", 401): (PermanentError, True),
    ("restricted_api_key", 401): (PermanentError, True),
    ("invalid_api_key", 403): (PermanentError, True),
    ("validation_error", 403): (PermanentError, True),
    ("invalid_from_address", 403): (PermanentError, True),
    ("not_found", 404): (PermanentError, True),
    ("method_not_allowed", 405): (PermanentError, True),
    ("invalid_idempotent_request", 409): (PermanentError, False),
    ("concurrent_idempotent_requests", 409): (TransientError, False),
    ("rate_limit_exceeded", 429): (TransientError, False),
    ("daily_quota_exceeded", 429): (TransientError, False),
    ("monthly_quota_exceeded", 429): (TransientError, True),
    ("application_error", 500): (TransientError, False),
    ("internal_server_error", 500): (TransientError, False),
}


@pytest.mark.parametrize("name, status", [(n, s) for n, s, _ in DOCUMENTED_ERRORS])
def test_resend_documented_errors(name, status, resend_fake):
    kind, broken = EXPECTED[(name, status)]
    fake = resend_fake.reset(error(name, status, retry_after="7"))
    with pytest.raises(kind) as caught:
        resend(fake.url).send(outbound())
    assert caught.value.code == name
    assert caught.value.channel_broken is broken
    if status == 429:
        assert caught.value.retry_after == 7.0  # Resend's lowercase `retry-after` header


@pytest.mark.parametrize("reply, kind, code", [
    (Reply(502, "<html>bad gateway</html>", headers={"Content-Type": "text/html"}), TransientError, "http_502"),
    (Reply(503, b""), TransientError, "http_503"),
    (Reply(429, b"", headers={"Retry-After": "3"}), TransientError, "http_429"),
    (Reply(418, {"statusCode": 418, "message": "x", "name": "Not A Valid Name!"}), PermanentError, "http_418"),
    (Reply(200, {"object": "email"}), TransientError, "no_message_id"),
    (Reply(200, b"not json"), TransientError, "no_message_id"),
])
def test_resend_undocumented_answers(reply, kind, code, resend_fake):
    fake = resend_fake.reset(reply)
    with pytest.raises(kind) as caught:
        resend(fake.url).send(outbound())
    assert caught.value.code == code


def test_resend_slower_than_the_timeout_is_transient(resend_fake):
    fake = resend_fake.reset(Reply(200, fixture_bytes("resend/send_response.json"), delay=1.5))
    with pytest.raises(TransientError) as caught:
        resend(fake.url, FAST).send(outbound())
    assert caught.value.code == "timeout"


def test_resend_connection_refused_is_transient():
    with pytest.raises(TransientError) as caught:
        resend(f"http://127.0.0.1:{free_port()}").send(outbound())
    assert caught.value.code == "connection_error"


def test_resend_missing_api_key_breaks_the_channel():
    with pytest.raises(PermanentError) as caught:
        resend("http://127.0.0.1:9", api_key="").send(outbound())
    assert caught.value.code == "config_missing" and caught.value.channel_broken


# --------------------------------------------------------------------------------------------
# Resend: webhooks (Svix)
# --------------------------------------------------------------------------------------------

# resend/svix_signature_vector.json: Svix's published vector (svix-webhooks python/tests/test_webhooks.py)
VECTOR = fixture_json("resend/svix_signature_vector.json")
VECTOR_SECRET = VECTOR["secret"]
VECTOR_ID = VECTOR["svix_id"]
VECTOR_TS = VECTOR["svix_timestamp"]
VECTOR_BODY = VECTOR["body"].encode()
VECTOR_SIG = VECTOR["svix_signature"]
VECTOR_BAD = VECTOR_SIG[:-2] + "A="  # the vector's signature with one bit of the digest changed


def test_the_test_signer_reproduces_the_published_vector():
    assert (VECTOR_SECRET, VECTOR_ID, VECTOR_TS) == (
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330)
    assert VECTOR_BODY == b'{"test": 2432232314}' and VECTOR_BAD != VECTOR_SIG
    assert svix_signature(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG


def hook(body: bytes, headers: dict[str, str]) -> WebhookRequest:
    return WebhookRequest("POST", "https://lembra.example/webhooks/resend/7", headers, body)


def at(timestamp: float, **extra: object) -> ResendProvider:
    provider = resend("http://127.0.0.1:9", **extra)
    provider.now = lambda: timestamp  # type: ignore[method-assign]
    return provider


def vector_headers(signature: str = VECTOR_SIG) -> dict[str, str]:
    return {"svix-id": VECTOR_ID, "svix-timestamp": str(VECTOR_TS), "svix-signature": signature}


def test_published_vector_verifies():
    provider = at(VECTOR_TS)
    assert provider._verify(hook(VECTOR_BODY, vector_headers()), VECTOR_BODY) == VECTOR_TS
    # The vector's body is not a Resend event: past the signature, it is refused as malformed (400).
    with pytest.raises(MalformedWebhook):
        provider.parse_webhook(hook(VECTOR_BODY, vector_headers()))


def test_any_v1_among_several_signatures_passes():
    junk = "v1," + base64.b64encode(b"\x00" * 32).decode()
    other_version = "v2," + VECTOR_SIG.split(",", 1)[1]
    headers = vector_headers(f"{junk} {other_version} {VECTOR_SIG}")
    assert at(VECTOR_TS)._verify(hook(VECTOR_BODY, headers), VECTOR_BODY) == VECTOR_TS
    with pytest.raises(BadSignature):  # the right digest under another version tag does not count
        at(VECTOR_TS).parse_webhook(hook(VECTOR_BODY, vector_headers(f"{junk} {other_version}")))


@pytest.mark.parametrize("mutate", [
    lambda h, b: (vector_headers(VECTOR_BAD), b),                               # digest changed
    lambda h, b: (h, b'{"test": 2432232315}'),                                  # tampered body
    lambda h, b: ({**h, "svix-id": "msg_other"}, b),                            # tampered id
    lambda h, b: ({k: v for k, v in h.items() if k != "svix-signature"}, b),    # missing header
    lambda h, b: ({k: v for k, v in h.items() if k != "svix-id"}, b),
    lambda h, b: ({k: v for k, v in h.items() if k != "svix-timestamp"}, b),
    lambda h, b: ({**h, "svix-timestamp": "1614265330.0"}, b),
    lambda h, b: ({**h, "svix-signature": "v1,not base64!!"}, b),
    lambda h, b: ({**h, "svix-signature": "garbage"}, b),
    lambda h, b: ({**h, "svix-id": "msg_é"}, b),
])
def test_bad_signatures_are_refused(mutate):
    headers, body = mutate(vector_headers(), VECTOR_BODY)
    with pytest.raises(BadSignature):
        at(VECTOR_TS).parse_webhook(hook(body, headers))


def test_wrong_or_missing_secret_is_refused():
    for secret in ("whsec_" + base64.b64encode(b"another secret key!!").decode(), "", None, "whsec_%%%"):
        with pytest.raises(BadSignature):
            at(VECTOR_TS, webhook_secret=secret).parse_webhook(hook(VECTOR_BODY, vector_headers()))


@pytest.mark.parametrize("offset, ok", [(0, True), (299, True), (-299, True), (301, False), (-301, False),
                                        (86400, False)])
def test_timestamp_tolerance_is_five_minutes_both_ways(offset, ok):
    provider = at(VECTOR_TS + offset)
    request = hook(VECTOR_BODY, vector_headers())
    if ok:
        assert provider._verify(request, VECTOR_BODY) == VECTOR_TS
    else:
        with pytest.raises(BadSignature):
            provider.parse_webhook(request)


NOW = 1_800_000_000


def signed(body: bytes, secret: str = VECTOR_SECRET) -> WebhookRequest:
    return hook(body, svix_headers(secret, body, timestamp=NOW))


def parse_sample(name: str) -> WebhookResult:
    return at(NOW).parse_webhook(signed(fixture_bytes(f"resend/{name}")))


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


@pytest.mark.parametrize("sample, expected", [
    # the event's created_at is the event time; the sent event carries our lembra_ref tag
    ("webhook_email_sent.json",
     StatusEvent(RESEND_ID, "sent", utc("2025-12-01T12:00:01.204Z"), reference="42")),
    ("webhook_email_delivered.json",
     StatusEvent(RESEND_ID, "delivered", utc("2025-12-01T12:00:03.517Z"))),
    ("webhook_email_bounced_hard.json",  # bounce{message} only, as older captures carry it
     StatusEvent(RESEND_ID, "failed", utc("2025-12-01T12:00:04.330Z"), error_code="hard_bounce",
                 error_permanent=True, opt_out=False)),
    ("webhook_email_bounced_suppressed.json",  # Resend's "has suppressed sending" bounce
     StatusEvent(RESEND_ID, "failed", utc("2025-12-01T12:00:01.598Z"), error_code="suppressed",
                 error_permanent=True, opt_out=False)),
    ("webhook_email_complained.json",
     StatusEvent(RESEND_ID, "failed", utc("2025-12-01T14:21:09.690Z"), error_code="complained",
                 error_permanent=True, opt_out=True)),
    # the raw compact body as Resend posts it (no whitespace), with data.message_id
    ("webhook_email_sent_compact.json",
     StatusEvent("0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f", "sent", utc("2025-12-01T12:10:01.126Z"))),
])
def test_status_samples(sample, expected):
    assert list(parse_sample(sample).events) == [expected]


@pytest.mark.parametrize("sample", [
    "webhook_email_opened.json",            # pixel opens are not "read"
    "webhook_email_clicked.json",
    "webhook_email_delivery_delayed.json",  # data.created_at with microseconds and +00:00
])
def test_ignored_samples_give_no_event(sample):
    assert list(parse_sample(sample).events) == []


def mutated(sample: str, **data_changes: object) -> bytes:
    body = fixture_json(f"resend/{sample}")
    body["data"].update(data_changes)
    return json.dumps(body).encode()


def test_reference_tag_is_echoed():
    # the email.sent fixture, with our tag among others in the webhook's object form ({name: value})
    body = mutated("webhook_email_sent.json", tags={"tag1": "x", "lembra_ref": "43"})
    [event] = at(NOW).parse_webhook(signed(body)).events
    assert event.reference == "43"
    [event] = at(NOW).parse_webhook(signed(mutated("webhook_email_sent.json", tags={"tag1": "x"}))).events
    assert event.reference is None


@pytest.mark.parametrize("bounce, code, permanent", [
    # field names from resend-python _webhook_event.py (bounce: message, type, subType)
    ({"message": "mailbox full", "type": "Transient", "subType": "MailboxFull"}, "soft_bounce", False),
    ({"message": "no such user", "type": "Permanent", "subType": "General"}, "hard_bounce", True),
    ({"message": "on list", "type": "Permanent", "subType": "Suppressed"}, "suppressed", True),
    ({"message": "??", "type": "Undetermined"}, "hard_bounce", True),
    ("not an object", "hard_bounce", True),
])
def test_bounce_types(bounce, code, permanent):
    body = mutated("webhook_email_bounced_hard.json", bounce=bounce)
    [event] = at(NOW).parse_webhook(signed(body)).events
    assert (event.status, event.error_code, event.error_permanent, event.opt_out) == ("failed", code, permanent, False)


def test_failed_and_suppressed_events():
    for event_type, code in (("email.failed", "send_failed"), ("email.suppressed", "suppressed")):
        body = fixture_json("resend/webhook_email_delivered.json")
        body["type"] = event_type
        [event] = at(NOW).parse_webhook(signed(json.dumps(body).encode())).events
        assert (event.status, event.error_code) == ("failed", code)


@pytest.mark.parametrize("body", [
    b'{"type": "email.delivered", "data": {"email_id": "aaaa"',      # truncated
    b"",
    b"[]",
    b'"email.sent"',
    b'{"data": {"email_id": "x"}}',                                    # no type
    b'{"type": "email.sent", "data": []}',
    b'{"type": "email.sent", "data": {"email_id": 5}}',
    b'{"type": "email.sent", "data": {"email_id": ""}}',
    b"\xff\xfe{}",
    b"[" * 100_000 + b"]" * 100_000,                                     # deep nesting
])
def test_malformed_bodies_are_400(body):
    with pytest.raises(MalformedWebhook):
        at(NOW).parse_webhook(signed(body))


def test_five_megabyte_body_is_refused_signed_or_not():
    body = b'{"type": "email.sent", "pad": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    with pytest.raises(MalformedWebhook):
        at(NOW).parse_webhook(signed(body))
    with pytest.raises(MalformedWebhook):
        at(NOW).parse_webhook(hook(body, {}))


def test_bad_created_at_falls_back_to_the_signed_timestamp():
    body = fixture_json("resend/webhook_email_delivered.json")
    body["created_at"] = "yesterday"
    [event] = at(NOW).parse_webhook(signed(json.dumps(body).encode())).events
    assert event.timestamp == datetime.fromtimestamp(NOW, timezone.utc)


SAMPLES = [
    "webhook_email_bounced_hard.json", "webhook_email_bounced_suppressed.json",
    "webhook_email_clicked.json", "webhook_email_complained.json",
    "webhook_email_delivered.json", "webhook_email_delivery_delayed.json",
    "webhook_email_opened.json", "webhook_email_sent.json",
    "webhook_email_sent_compact.json",
]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
EVENT_TYPES = st.sampled_from(["email.sent", "email.delivered", "email.bounced", "email.complained",
                               "email.failed", "email.suppressed", "email.opened", "contact.created"])


def outcome(request: WebhookRequest) -> None:
    try:
        result = at(NOW).parse_webhook(request)
    except WebhookError:
        return
    assert isinstance(result, WebhookResult)
    for event in result.events:
        assert isinstance(event, StatusEvent) and event.timestamp.tzinfo is not None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=512), sign=st.booleans())
def test_property_arbitrary_bytes(body, sign):
    outcome(signed(body) if sign else hook(body, {"svix-id": "x", "svix-timestamp": str(NOW), "svix-signature": "v1,AAAA"}))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON, event_type=EVENT_TYPES, data=JSON)
def test_property_arbitrary_json(value, event_type, data):
    outcome(signed(json.dumps(value).encode()))
    outcome(signed(json.dumps({"type": event_type, "created_at": value, "data": data}).encode()))
    if isinstance(data, dict):
        outcome(signed(json.dumps({"type": event_type, "data": {**data, "email_id": "e", "bounce": value,
                                                                 "tags": value}}).encode()))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample=st.sampled_from(SAMPLES), position=st.integers(min_value=0), byte=st.integers(0, 255),
       cut=st.booleans(), headers=st.dictionaries(st.sampled_from(["svix-id", "svix-timestamp", "svix-signature"]),
                                                   st.text(max_size=40), max_size=3))
def test_property_mutated_samples(sample, position, byte, cut, headers):
    body = bytearray(fixture_bytes(f"resend/{sample}"))
    index = position % len(body)
    if cut:
        del body[index:]
    else:
        body[index] = byte
    outcome(signed(bytes(body)))                                          # valid signature, mutated body
    outcome(hook(fixture_bytes(f"resend/{sample}"), {**svix_headers(VECTOR_SECRET, b"", timestamp=NOW),
                                                     **headers}))  # mutated headers
