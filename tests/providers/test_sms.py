"""SMS providers (Twilio, Zenvia) against loopback fakes answering in the documented wire formats.

Fixtures: tests/fixtures/providers/twilio/ and tests/fixtures/providers/zenvia/ (written from the
providers' documented formats; Twilio's signature vectors and Zenvia's string-to-sign examples are
the published ones, kept byte for byte). Sources per file: tests/fixtures/providers/README.md.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import socket
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Iterator
from urllib.parse import parse_qsl

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.contract import InboundMessageEvent, OutboundMessage, ProviderContext, StatusEvent, WebhookRequest
from gateway.egress import LOOPBACK
from gateway.errors import BadSignature, MalformedWebhook, PermanentError, TransientError, WebhookError
from providers.sms import twilio as twilio_mod
from providers.sms import zenvia as zenvia_mod
from providers.sms.twilio import TwilioProvider, compute_signature, validate_signature
from providers.sms.zenvia import ZenviaProvider, request_signature, string_to_sign
from tests.fakes import twilio as tw
from tests.fakes import zenvia as zv
from tests.fakes.server import Reply
from tests.fixtures import fixture_bytes

# The fakes listen on loopback, which the egress guard refuses unless allowed.
CONTEXT = ProviderContext(org_id=1, channel_id=7, timeout=2, public_url="https://lembra.example", egress=LOOPBACK)
FAST = ProviderContext(org_id=1, channel_id=7, timeout=0.3, public_url="https://lembra.example", egress=LOOPBACK)
PATIENT = "+5516999887766"
TEXT = "Olá! Sua consulta é amanhã às 9h. Responda 1 para confirmar 👍"
#: Where the proxy hands Twilio's requests to the engine (not the URL Twilio signed).
INTERNAL_URL = "http://10.0.0.5:8000/webhooks/{name}/7"
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def _twilio_server() -> Iterator[tw.FakeTwilio]:
    with tw.FakeTwilio() as fake:
        yield fake


@pytest.fixture
def twilio_fake(_twilio_server: tw.FakeTwilio) -> tw.FakeTwilio:
    """One loopback Twilio for the module (a server's shutdown costs half a second), reset per test."""
    _twilio_server.script.clear()
    _twilio_server.requests.clear()
    return _twilio_server


@pytest.fixture(scope="module")
def _zenvia_server() -> Iterator[zv.FakeZenvia]:
    with zv.FakeZenvia() as fake:
        yield fake


@pytest.fixture
def zenvia_fake(_zenvia_server: zv.FakeZenvia) -> zv.FakeZenvia:
    _zenvia_server.script.clear()
    _zenvia_server.requests.clear()
    return _zenvia_server


def closed_port_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


# ================================================================================================
# Twilio
# ================================================================================================

TWILIO_URL = "https://lembra.example/webhooks/twilio/7"


def twilio(base_url: str = "http://127.0.0.1:9", context: ProviderContext = CONTEXT, **extra: Any) -> TwilioProvider:
    config = {"account_sid": tw.ACCOUNT_SID, "auth_token": tw.AUTH_TOKEN, "from": "+14155552345",
              "base_url": base_url, **extra}
    return TwilioProvider({k: v for k, v in config.items() if v is not None}, context)


def twilio_request(pairs: list[tuple[str, str]], *, signed_url: str = TWILIO_URL, token: str = tw.AUTH_TOKEN,
                   arrived_on: str | None = None, body: bytes | None = None,
                   content_type: str = "application/x-www-form-urlencoded",
                   signature: str | None = None) -> WebhookRequest:
    headers = {"Content-Type": content_type,
               "X-Twilio-Signature": signature if signature is not None else tw.sign(token, signed_url, pairs)}
    return WebhookRequest(method="POST", url=arrived_on or INTERNAL_URL.format(name="twilio"), headers=headers,
                          body=tw.form(pairs) if body is None else body)


# --- signature vectors (twilio/signature_vectors.json: twilio-python's published ones) ---


def _vectors() -> dict[str, Any]:
    return tw.sample_json(tw.VECTORS)


def test_signature_vector_base() -> None:
    v = _vectors()
    assert compute_signature(v["auth_token"], v["uri"], v["params"]) == v["signature"]
    assert validate_signature(v["auth_token"], v["uri"], v["params"], v["signature"])
    assert not validate_signature(v["auth_token"], v["uri"], {**v["params"], "Digits": "1235"}, v["signature"])
    assert not validate_signature("54321", v["uri"], v["params"], v["signature"])
    assert not validate_signature(v["auth_token"], v["uri"], v["params"], None)
    assert not validate_signature(v["auth_token"], v["uri"], v["params"], "ñ-not-ascii")


def test_signature_vectors_port_handling() -> None:
    v = _vectors()
    https_port = v["uri"].replace(".com", ".com:1234")
    http_port = https_port.replace("https", "http")
    http = v["uri"].replace("https", "http")
    assert validate_signature(v["auth_token"], https_port, v["params"], v["signature"])  # https: port stripped
    assert validate_signature(v["auth_token"], http_port, v["params"], v["http_with_port_1234_signature"])
    assert validate_signature(v["auth_token"], v["uri"], v["params"], v["https_with_port_443_signature"])
    assert validate_signature(v["auth_token"], http, v["params"], v["http_with_port_80_signature"])
    assert not validate_signature(v["auth_token"], http, v["params"], v["https_with_port_443_signature"])


def test_signature_vector_repeated_keys() -> None:
    v = _vectors()
    grouped: dict[str, list[str]] = {}
    for name, value in v["repeated_params"] + [["Digits", "1234"]]:  # plus a duplicate: counted once
        grouped.setdefault(name, []).append(value)
    assert compute_signature(v["auth_token"], v["uri"], grouped) == v["repeated_params_signature"]


def test_signature_vector_json_body_variant() -> None:
    v = _vectors()
    assert hashlib.sha256(v["json_body"].encode()).hexdigest() == v["json_body_sha256"]
    assert v["json_uri"].endswith("bodySHA256=" + v["json_body_sha256"])
    assert compute_signature(v["auth_token"], v["json_uri"], {}) == v["json_signature"]


def test_independent_test_signer_agrees_with_the_vectors() -> None:
    v = _vectors()
    assert tw.sign(v["auth_token"], v["uri"], list(v["params"].items())) == v["signature"]
    pairs = [tuple(pair) for pair in v["repeated_params"]]
    assert tw.sign(v["auth_token"], v["uri"], pairs) == v["repeated_params_signature"]


# --- send ---


def test_twilio_identity() -> None:
    assert TwilioProvider.name == "twilio"
    assert TwilioProvider.kinds == ("sms",)
    assert TwilioProvider.honours_idempotency is False
    assert twilio().webhook_url == TWILIO_URL


def test_twilio_send_posts_the_documented_form(twilio_fake: tw.FakeTwilio) -> None:
    fake = twilio_fake
    published = tw.sample_json(tw.CREATE_201)
    result = twilio(fake.url).send(OutboundMessage(to=PATIENT, text=TEXT, reference="m-1"))
    assert result.provider_message_id == published["sid"]
    assert result.provider_status == published["status"]
    [request] = fake.requests
    assert request.method == "POST"
    assert request.path == f"/2010-04-01/Accounts/{tw.ACCOUNT_SID}/Messages.json"
    expected_auth = "Basic " + base64.b64encode(f"{tw.ACCOUNT_SID}:{tw.AUTH_TOKEN}".encode()).decode()
    assert request.header("Authorization") == expected_auth
    assert request.header("Content-Type") == "application/x-www-form-urlencoded"
    assert request.form() == {"To": [PATIENT], "From": ["+14155552345"], "Body": [TEXT],
                              "StatusCallback": [TWILIO_URL]}


def test_twilio_send_through_a_messaging_service(twilio_fake: tw.FakeTwilio) -> None:
    fake = twilio_fake
    twilio(fake.url, messaging_service_sid="MGaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", **{"from": None}).send(
        OutboundMessage(to="(16) 99988-7766", text="oi"))
    form = fake.requests[0].form()
    assert form["MessagingServiceSid"] == ["MGaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]
    assert "From" not in form
    assert form["To"] == [PATIENT]  # normalised to E.164


@pytest.mark.parametrize(
    ("reply", "kind", "code", "opt_out", "broken", "retry_after"),
    [
        # 21610 = recipient replied STOP: final, and an opt-out.
        (tw.rest_error(400, 21610, "Attempt to send to unsubscribed recipient"), PermanentError, "21610", True, False, None),
        # invalid To / not SMS-capable / unroutable / unverified (trial): final.
        (tw.rest_error(400, 21211, "The 'To' number +5516999887766 is not a valid phone number."),
         PermanentError, "21211", False, False, None),
        (tw.rest_error(400, 21614, "'To' number is not a valid mobile number"), PermanentError, "21614", False, False, None),
        (tw.rest_error(400, 21612, "The 'To' phone number is not currently reachable"), PermanentError, "21612", False, False, None),
        (tw.rest_error(400, 21608, "The number is unverified"), PermanentError, "21608", False, False, None),
        # 20003 = authentication: the channel is broken until an operator fixes the token.
        (tw.rest_error(401, 20003, "Authenticate"), PermanentError, "20003", False, True, None),
        # A From that is not this account's: broken channel too.
        (tw.rest_error(400, 21606, "The From phone number is not a valid, SMS-capable inbound phone number"),
         PermanentError, "21606", False, True, None),
        # 20429 / HTTP 429 = throttling, with Retry-After.
        (tw.rest_error(429, 20429, "Too Many Requests", headers={"Retry-After": "7"}), TransientError, "20429", False, False, 7.0),
        (Reply(429, b"", headers={"Retry-After": "3"}), TransientError, "http_429", False, False, 3.0),
        # 5xx = transient, with or without a Twilio body.
        (tw.rest_error(503, 20503, "Service unavailable"), TransientError, "20503", False, False, None),
        (Reply(500, b"<html>oops</html>", headers={"Content-Type": "text/html"}), TransientError, "http_500", False, False, None),
    ],
)
def test_twilio_send_errors(reply: Reply, kind: type, code: str, opt_out: bool, broken: bool,
                            retry_after: float | None, twilio_fake: tw.FakeTwilio) -> None:
    fake = twilio_fake
    fake.script.append(reply)
    with pytest.raises(kind) as caught:
        twilio(fake.url).send(OutboundMessage(to=PATIENT, text=TEXT))
    error = caught.value
    assert (error.code, error.opt_out, error.channel_broken, error.retry_after) == (code, opt_out, broken, retry_after)
    assert PATIENT not in str(error) and PATIENT not in repr(error)  # Twilio's message may quote the number


def test_twilio_send_timeout_is_transient(twilio_fake: tw.FakeTwilio) -> None:
    fake = twilio_fake
    fake.script.append(Reply(201, fixture_bytes(tw.CREATE_201), delay=1.0))
    with pytest.raises(TransientError) as caught:
        twilio(fake.url, context=FAST).send(OutboundMessage(to=PATIENT, text=TEXT))
    assert caught.value.code == "timeout"


def test_twilio_send_connection_refused_is_transient() -> None:
    with pytest.raises(TransientError) as caught:
        twilio(closed_port_url()).send(OutboundMessage(to=PATIENT, text=TEXT))
    assert caught.value.code == "connection_error"


def test_twilio_send_refuses_before_calling_when_misconfigured_or_invalid(twilio_fake: tw.FakeTwilio) -> None:
    fake = twilio_fake
    with pytest.raises(PermanentError) as caught:
        twilio(fake.url, auth_token=None).send(OutboundMessage(to=PATIENT, text=TEXT))
    assert (caught.value.code, caught.value.channel_broken) == ("config_missing", True)
    with pytest.raises(PermanentError) as caught:
        twilio(fake.url, **{"from": None}).send(OutboundMessage(to=PATIENT, text=TEXT))
    assert (caught.value.code, caught.value.channel_broken) == ("config_missing", True)
    with pytest.raises(PermanentError) as caught:
        twilio(fake.url).send(OutboundMessage(to="Maria", text=TEXT))
    assert (caught.value.code, caught.value.channel_broken) == ("invalid_number", False)
    assert fake.requests == []


def test_twilio_send_2xx_without_sid(twilio_fake: tw.FakeTwilio) -> None:
    fake = twilio_fake
    fake.script.append(Reply(201, {"status": "queued"}))
    with pytest.raises(PermanentError) as caught:
        twilio(fake.url).send(OutboundMessage(to=PATIENT, text=TEXT))
    assert caught.value.code == "no_message_id"


# --- webhooks: status callbacks ---


@pytest.mark.parametrize(
    ("twilio_status", "status"),
    [("sent", "sent"), ("delivered", "delivered"), ("read", "read")],
)
def test_twilio_status_callbacks(twilio_status: str, status: str) -> None:
    sid = tw.sample_json(tw.CREATE_201)["sid"]
    result = twilio().parse_webhook(twilio_request(tw.status_callback(sid, twilio_status)))
    [event] = result.events
    assert isinstance(event, StatusEvent)
    assert (event.provider_message_id, event.status, event.error_code) == (sid, status, None)
    assert event.timestamp.tzinfo is not None


@pytest.mark.parametrize("twilio_status", ["queued", "accepted", "sending", "scheduled", "partially_delivered", "new"])
def test_twilio_status_callbacks_without_news_are_ignored(twilio_status: str) -> None:
    result = twilio().parse_webhook(twilio_request(tw.status_callback("SM1", twilio_status)))
    assert list(result.events) == []


def test_twilio_undelivered_30007_from_the_fetched_message() -> None:
    # twilio/message_fetch_response_error_30007.json: a message carrying error 30007 (carrier
    # filtered) — its callback reports it as undelivered with that ErrorCode.
    published = tw.sample_json(tw.FETCH_30007)
    pairs = tw.status_callback(published["sid"], "undelivered", str(published["error_code"]))
    [event] = twilio().parse_webhook(twilio_request(pairs)).events
    assert isinstance(event, StatusEvent)
    assert (event.provider_message_id, event.status, event.error_code) == (published["sid"], "failed", "30007")
    assert (event.error_permanent, event.opt_out) == (True, False)


@pytest.mark.parametrize(
    ("twilio_status", "error_code", "permanent", "opt_out"),
    [
        ("failed", "21610", True, True),  # unsubscribed recipient: opt-out
        ("undelivered", "30003", False, False),  # handset unreachable: may work later
        ("undelivered", "30005", True, False),  # unknown destination
        ("failed", "30008", False, False),  # unknown error
        ("undelivered", None, True, False),
    ],
)
def test_twilio_failed_callbacks(twilio_status: str, error_code: str | None, permanent: bool, opt_out: bool) -> None:
    [event] = twilio().parse_webhook(twilio_request(tw.status_callback("SM2", twilio_status, error_code))).events
    assert isinstance(event, StatusEvent)
    assert (event.status, event.error_code, event.error_permanent, event.opt_out) == (
        "failed", error_code, permanent, opt_out)


def test_twilio_legacy_callback_with_only_sms_status() -> None:
    pairs = [(k, v) for k, v in tw.status_callback("SM3", "delivered") if k != "MessageStatus"]
    [event] = twilio().parse_webhook(twilio_request(pairs)).events
    assert isinstance(event, StatusEvent) and event.status == "delivered"


# --- webhooks: incoming SMS ---


def test_twilio_inbound_sms() -> None:
    pairs = tw.inbound_sms("SMin1", "+55 16 99988-7766", "Sim, confirmo ✅")
    [event] = twilio().parse_webhook(twilio_request(pairs)).events
    assert isinstance(event, InboundMessageEvent)
    assert (event.provider_message_id, event.from_address, event.text) == ("SMin1", PATIENT, "Sim, confirmo ✅")
    assert event.button_payload is None and event.timestamp.tzinfo is not None


def test_twilio_inbound_old_br_mobile_gets_its_ninth_digit() -> None:
    [event] = twilio().parse_webhook(twilio_request(tw.inbound_sms("SMin2", "+551699887766", "ok"))).events
    assert isinstance(event, InboundMessageEvent) and event.from_address == PATIENT


def test_twilio_stop_keyword_passes_through_as_text() -> None:
    # Twilio's Advanced Opt-Out marks it with OptOutType=STOP; the engine's keyword matcher acts on the text.
    [event] = twilio().parse_webhook(twilio_request(tw.inbound_sms("SMin3", PATIENT, "STOP", "STOP"))).events
    assert isinstance(event, InboundMessageEvent) and event.text == "STOP"


def test_twilio_inbound_from_a_short_code_is_acknowledged_and_dropped() -> None:
    result = twilio().parse_webhook(twilio_request(tw.inbound_sms("SMin4", "28273", "promo")))
    assert list(result.events) == []


def test_twilio_inbound_without_body_text() -> None:
    pairs = [(k, "1" if k == "NumMedia" else v) for k, v in tw.inbound_sms("MMin5", PATIENT, "")]
    [event] = twilio().parse_webhook(twilio_request(pairs)).events
    assert isinstance(event, InboundMessageEvent) and event.text is None


def test_twilio_inbound_by_get() -> None:
    pairs = tw.inbound_sms("SMin6", PATIENT, "1")
    query = tw.form(pairs).decode()
    request = WebhookRequest(method="GET", url=INTERNAL_URL.format(name="twilio") + "?" + query,
                             headers={"X-Twilio-Signature": tw.sign(tw.AUTH_TOKEN, f"{TWILIO_URL}?{query}", [])},
                             body=b"")
    [event] = twilio().parse_webhook(request).events
    assert isinstance(event, InboundMessageEvent) and event.text == "1"


# --- webhooks: what URL was signed (Twilio's gotchas: proxy, port, query string) ---


def test_twilio_signature_is_over_the_public_url_not_the_proxied_one() -> None:
    pairs = tw.status_callback("SM4", "delivered")
    with pytest.raises(BadSignature):
        twilio().parse_webhook(twilio_request(pairs, signed_url=INTERNAL_URL.format(name="twilio")))
    assert twilio().parse_webhook(twilio_request(pairs)).events  # signed for webhook_url


def test_twilio_signature_with_the_default_port_and_a_query_string() -> None:
    pairs = tw.status_callback("SM5", "delivered")
    assert twilio().parse_webhook(twilio_request(pairs, signed_url="https://lembra.example:443/webhooks/twilio/7")).events
    request = twilio_request(pairs, signed_url=TWILIO_URL + "?attempt=2&x=a%20b",
                             arrived_on=INTERNAL_URL.format(name="twilio") + "?attempt=2&x=a%20b")
    assert twilio().parse_webhook(request).events
    with pytest.raises(BadSignature):  # the signed query is not the one received
        twilio().parse_webhook(twilio_request(pairs, signed_url=TWILIO_URL + "?attempt=1",
                                              arrived_on=INTERNAL_URL.format(name="twilio") + "?attempt=2"))


def test_twilio_public_url_with_a_port() -> None:
    context = ProviderContext(org_id=1, channel_id=7, timeout=2, public_url="https://lembra.example:8443/")
    url = "https://lembra.example:8443/webhooks/twilio/7"
    assert twilio(context=context).parse_webhook(twilio_request(tw.status_callback("SM6", "sent"), signed_url=url)).events


# --- webhooks: refusals ---


def test_twilio_refusals() -> None:
    provider = twilio()
    pairs = tw.status_callback("SM7", "delivered")
    good = twilio_request(pairs)
    # Tampered body: same signature, one parameter changed.
    tampered = tw.form([(k, "failed" if k == "MessageStatus" else v) for k, v in pairs])
    with pytest.raises(BadSignature):
        provider.parse_webhook(WebhookRequest("POST", good.url, good.headers, tampered))
    with pytest.raises(BadSignature):  # signed with another token
        provider.parse_webhook(twilio_request(pairs, token="not-the-token"))
    with pytest.raises(BadSignature):  # no signature at all
        provider.parse_webhook(WebhookRequest("POST", good.url, {"Content-Type": good.headers["Content-Type"]}, good.body))
    with pytest.raises(BadSignature):  # truncated body
        provider.parse_webhook(WebhookRequest("POST", good.url, good.headers, good.body[:-10]))
    with pytest.raises(BadSignature):  # no token configured: nothing can be verified
        twilio(auth_token=None).parse_webhook(good)
    with pytest.raises(MalformedWebhook):  # a JSON body, even signed (bodySHA256 style)
        body = b'{"MessageSid": "SM7", "MessageStatus": "delivered"}'
        provider.parse_webhook(twilio_request([], body=body, content_type="application/json"))
    with pytest.raises(MalformedWebhook):  # JSON in a form content type
        provider.parse_webhook(twilio_request([], body=b'{"MessageSid": "SM7"}'))
    with pytest.raises(MalformedWebhook):  # not UTF-8
        provider.parse_webhook(twilio_request([], body=b"Body=\xff\xfe"))
    with pytest.raises(MalformedWebhook):  # 5 MB
        provider.parse_webhook(twilio_request([("Body", "x" * (5 * 1024 * 1024))]))
    with pytest.raises(MalformedWebhook):  # signed, but neither a status callback nor a message
        provider.parse_webhook(twilio_request([("AccountSid", tw.ACCOUNT_SID)]))
    with pytest.raises(MalformedWebhook):
        provider.parse_webhook(WebhookRequest("PUT", good.url, good.headers, good.body))


# --- property: whatever arrives, only BadSignature / MalformedWebhook or a result ---

FORM_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
TWILIO_NAMES = st.sampled_from(["MessageSid", "SmsSid", "SmsMessageSid", "MessageStatus", "SmsStatus", "ErrorCode",
                                "From", "To", "Body", "AccountSid", "NumMedia", "OptOutType"]) | FORM_TEXT
TWILIO_VALUES = st.sampled_from(["sent", "delivered", "read", "failed", "undelivered", "queued", "received",
                                 "21610", "30007", PATIENT, "whatsapp:+5516999887766", "STOP", ""]) | FORM_TEXT


@PROPERTY
@given(body=st.binary(max_size=2000), signature=st.text(max_size=40))
def test_twilio_arbitrary_bytes(body: bytes, signature: str) -> None:
    request = WebhookRequest("POST", INTERNAL_URL.format(name="twilio"),
                             {"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": signature}, body)
    with pytest.raises(WebhookError):
        twilio().parse_webhook(request)


@PROPERTY
@given(value=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                          lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                          max_leaves=20),
       content_type=st.sampled_from(["application/json", "application/x-www-form-urlencoded", ""]))
def test_twilio_arbitrary_json(value: Any, content_type: str) -> None:
    body = json.dumps(value).encode()
    try:
        twilio().parse_webhook(twilio_request(parse_qsl(body.decode(), keep_blank_values=True), body=body,
                                              content_type=content_type))
    except WebhookError:
        pass


@PROPERTY
@given(pairs=st.lists(st.tuples(TWILIO_NAMES, TWILIO_VALUES), max_size=12))
def test_twilio_arbitrary_signed_forms(pairs: list[tuple[str, str]]) -> None:
    body = tw.form(pairs)
    # Sign what Twilio would have posted, i.e. the parameters as they parse back.
    signed = parse_qsl(body.decode(), keep_blank_values=True)
    try:
        result = twilio().parse_webhook(twilio_request(signed, body=body))
    except MalformedWebhook:
        return
    for event in result.events:
        assert isinstance(event, (StatusEvent, InboundMessageEvent))


@PROPERTY
@given(data=st.data())
def test_twilio_mutated_valid_callbacks(data: st.DataObject) -> None:
    pairs = data.draw(st.sampled_from([tw.status_callback("SM8", "undelivered", "30007"),
                                       tw.inbound_sms("SMin9", PATIENT, "CANCELAR")]))
    body = bytearray(tw.form(pairs))
    for _ in range(data.draw(st.integers(1, 6))):
        position = data.draw(st.integers(0, len(body)))
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if action == "insert" or not body:
            body[position:position] = data.draw(st.binary(min_size=1, max_size=4))
        elif action == "delete":
            del body[min(position, len(body) - 1)]
        else:
            body[min(position, len(body) - 1)] ^= data.draw(st.integers(1, 255))
    try:
        signed = parse_qsl(bytes(body).decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        signed = []
    try:
        twilio().parse_webhook(twilio_request(signed, body=bytes(body)))
    except WebhookError:
        pass


# ================================================================================================
# Zenvia
# ================================================================================================

ZENVIA_TOKEN = "zenvia-test-api-token"
ZENVIA_SECRET = "zenvia-webhook-shared-secret"
SECRET_HEADER = zenvia_mod.WEBHOOK_SECRET_HEADER


def zenvia(base_url: str = "http://127.0.0.1:9", context: ProviderContext = CONTEXT, **extra: Any) -> ZenviaProvider:
    config = {"api_token": ZENVIA_TOKEN, "from": "2020", "base_url": base_url, "webhook_secret": ZENVIA_SECRET, **extra}
    return ZenviaProvider({k: v for k, v in config.items() if v is not None}, context)


def zenvia_request(body: bytes | Any, secret: str | None = ZENVIA_SECRET) -> WebhookRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    return WebhookRequest("POST", INTERNAL_URL.format(name="zenvia"), headers, raw)


def test_zenvia_identity() -> None:
    assert ZenviaProvider.name == "zenvia"
    assert ZenviaProvider.kinds == ("sms",)
    assert ZenviaProvider.honours_idempotency is False


# --- send ---


def test_zenvia_send_posts_the_documented_body(zenvia_fake: zv.FakeZenvia) -> None:
    fake = zenvia_fake
    # zenvia/send_sms_request.json: the exact body (compact JSON, UTF-8 as is, the fields of
    # Zenvia's own curl sample: from, to, contents[{type, text}]) for that sender, number and text;
    # the reply is send_response.json, the created Message.
    fixture = zv.sample_json("send_sms_request.json")
    result = zenvia(fake.url, **{"from": fixture["from"]}).send(
        OutboundMessage(to="+" + fixture["to"], text=fixture["contents"][0]["text"]))
    assert result.provider_message_id == zv.sample_json("send_response.json")["id"]
    [request] = fake.requests
    assert (request.method, request.path) == ("POST", "/v2/channels/sms/messages")
    assert request.header("X-API-TOKEN") == ZENVIA_TOKEN
    assert request.header("Content-Type") == "application/json"
    assert request.body == fixture_bytes("zenvia/send_sms_request.json").strip()
    assert request.header("X-API-Signature") is None


def test_zenvia_send_echoes_the_reference_as_external_id(zenvia_fake: zv.FakeZenvia) -> None:
    fake = zenvia_fake
    zenvia(fake.url).send(OutboundMessage(to="(16) 9998-87766", text=TEXT, reference="lembra-42"))
    assert fake.requests[0].json() == {"from": "2020", "to": PATIENT.lstrip("+"),
                                       "contents": [{"type": "text", "text": TEXT}], "externalId": "lembra-42"}


def test_zenvia_signature_string_matches_the_published_examples() -> None:
    # zenvia/signature_string_to_sign_{post,get}.txt: the spec's two string-to-sign examples.
    post_block = fixture_bytes("zenvia/signature_string_to_sign_post.txt").decode()
    get_block = fixture_bytes("zenvia/signature_string_to_sign_get.txt").decode()
    post = post_block.split("\n")
    assert len(post) == 6 and post[0] == "POST"
    assert string_to_sign(*post) == post_block
    get = get_block.split("\n")
    assert len(get) == 6 and get[1:3] == ["", ""]
    # A request without a body leaves the MD5 and Content-Type lines empty, whatever the header says.
    secret = "ABCDEF"
    expected = base64.b64encode(hmac.new(secret.encode(), get_block.encode(), hashlib.sha256).digest()).decode()
    assert request_signature(secret, "GET", b"", "application/json", get[3], get[4], get[5]) == expected


def test_zenvia_send_signs_requests_with_a_signature_token(zenvia_fake: zv.FakeZenvia) -> None:
    fake = zenvia_fake
    secret = "ABCDEF"
    zenvia(fake.url, signature_secret=secret).send(OutboundMessage(to=PATIENT, text=TEXT))
    [request] = fake.requests
    date = request.header("Date")
    assert date is not None
    assert abs(parsedate_to_datetime(date) - datetime.now(timezone.utc)) < timedelta(minutes=3)
    # Recompute independently from what went over the wire (spec "Signature generation").
    lines = ["POST", hashlib.md5(request.body).hexdigest(), request.header("Content-Type"), date, "127.0.0.1",
             request.path]
    expected = base64.b64encode(hmac.new(secret.encode(), "\n".join(lines).encode(), hashlib.sha256).digest()).decode()
    assert request.header("X-API-Signature") == expected
    assert request.header("X-API-TOKEN") == ZENVIA_TOKEN


@pytest.mark.parametrize(
    ("reply", "kind", "code", "broken", "retry_after"),
    [
        # The error fixture (with details), as a 400 and as a 200 (a body without an id is a failure).
        (zv.validation_error(400), PermanentError, "VALIDATION_ERROR", False, None),
        (zv.validation_error(200), PermanentError, "VALIDATION_ERROR", False, None),
        # The spec's error table.
        (zv.table_error(400, "VALIDATION_ERROR", "Validation error"), PermanentError, "VALIDATION_ERROR", False, None),
        (zv.table_error(401, "AUTHENTICATION_ERROR", "No authorization token was found"), PermanentError,
         "AUTHENTICATION_ERROR", True, None),
        (zv.table_error(404, "NOT_FOUND", "Not found"), PermanentError, "NOT_FOUND", False, None),
        (zv.table_error(409, "DUPLICATED", "Entity already exists"), PermanentError, "DUPLICATED", False, None),
        (zv.table_error(500, "INTERNAL_ERROR", "Internal error"), TransientError, "INTERNAL_ERROR", False, None),
        (Reply(502, b"Bad Gateway", headers={"Content-Type": "text/plain"}), TransientError, "http_502", False, None),
        (Reply(429, b"", headers={"Retry-After": "5"}), TransientError, "http_429", False, 5.0),
        (Reply(403, b""), PermanentError, "http_403", True, None),
    ],
)
def test_zenvia_send_errors(reply: Reply, kind: type, code: str, broken: bool, retry_after: float | None, zenvia_fake: zv.FakeZenvia) -> None:
    fake = zenvia_fake
    fake.script.append(reply)
    with pytest.raises(kind) as caught:
        zenvia(fake.url).send(OutboundMessage(to=PATIENT, text=TEXT))
    error = caught.value
    assert (error.code, error.channel_broken, error.retry_after, error.opt_out) == (code, broken, retry_after, False)
    assert PATIENT.lstrip("+") not in str(error)


def test_zenvia_send_200_without_id(zenvia_fake: zv.FakeZenvia) -> None:
    fake = zenvia_fake
    fake.script.append(Reply(200, {}))
    with pytest.raises(PermanentError) as caught:
        zenvia(fake.url).send(OutboundMessage(to=PATIENT, text=TEXT))
    assert caught.value.code == "no_message_id"


def test_zenvia_send_timeout_and_refused_connection(zenvia_fake: zv.FakeZenvia) -> None:
    fake = zenvia_fake
    fake.script.append(Reply(200, fixture_bytes("zenvia/send_response.json"), delay=1.0))
    with pytest.raises(TransientError) as caught:
        zenvia(fake.url, context=FAST).send(OutboundMessage(to=PATIENT, text=TEXT))
    assert caught.value.code == "timeout"
    with pytest.raises(TransientError) as caught:
        zenvia(closed_port_url()).send(OutboundMessage(to=PATIENT, text=TEXT))
    assert caught.value.code == "connection_error"


def test_zenvia_send_refuses_before_calling_when_misconfigured_or_invalid(zenvia_fake: zv.FakeZenvia) -> None:
    fake = zenvia_fake
    with pytest.raises(PermanentError) as caught:
        zenvia(fake.url, api_token=None).send(OutboundMessage(to=PATIENT, text=TEXT))
    assert (caught.value.code, caught.value.channel_broken) == ("config_missing", True)
    with pytest.raises(PermanentError) as caught:
        zenvia(fake.url).send(OutboundMessage(to="12", text=TEXT))
    assert caught.value.code == "invalid_number"
    assert fake.requests == []


# --- webhooks: MESSAGE_STATUS ---

ZENVIA_MESSAGE_ID = "2b5c9a4e-7d1f-4e3a-9c8b-6f0a1d2e3b4c"  # send_response.json's id; the statuses are about it


def test_zenvia_status_sent_in_the_legacy_shape() -> None:
    # zenvia/webhook_message_status_sent_legacy.json: top-level messageId/contentIndex (deprecated,
    # still sent), the status timestamp at -03:00 while the event's is in Z.
    body = fixture_bytes("zenvia/webhook_message_status_sent_legacy.json")
    [event] = zenvia().parse_webhook(zenvia_request(body)).events
    assert event == StatusEvent(provider_message_id=ZENVIA_MESSAGE_ID, status="sent",
                                timestamp=utc(2025, 12, 1, 15, 0, 5))


def test_zenvia_status_with_only_the_required_fields() -> None:
    # zenvia/webhook_message_status_minimal.json: no event timestamp nor subscriptionId.
    body = fixture_bytes("zenvia/webhook_message_status_minimal.json")
    [event] = zenvia().parse_webhook(zenvia_request(body)).events
    assert event == StatusEvent(provider_message_id=ZENVIA_MESSAGE_ID, status="delivered",
                                timestamp=utc(2025, 12, 1, 15, 0, 42))


def test_zenvia_status_in_the_current_shape() -> None:
    # zenvia/webhook_message_status_delivered.json: message{id, externalId, …}, channelData.
    body = fixture_bytes("zenvia/webhook_message_status_delivered.json")
    [event] = zenvia().parse_webhook(zenvia_request(body)).events
    assert event == StatusEvent(provider_message_id=ZENVIA_MESSAGE_ID, status="delivered",
                                timestamp=utc(2025, 12, 1, 15, 0, 42), reference="lembra-42")


def _current_status_event(code: str, causes: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The current-shape fixture (message{id, externalId, …}) with another status code and causes."""
    event = zv.sample_json("webhook_message_status_delivered.json")
    event["messageStatus"]["code"] = code
    if causes is not None:
        event["messageStatus"]["causes"] = causes
    return event


@pytest.mark.parametrize(
    ("code", "causes", "status", "error_code", "permanent"),
    [
        ("SENT", None, "sent", None, True),
        ("DELIVERED", None, "delivered", None, True),
        ("READ", None, "read", None, True),
        ("CLICKED", None, "read", None, True),
        ("REJECTED", [{"channelErrorCode": "010", "reason": "Blocked", "details": "blocked number"}], "failed", "010", True),
        ("REJECTED", None, "failed", "REJECTED", True),
        ("NOT_DELIVERED", [{"reason": "no code"}, {"channelErrorCode": "120"}], "failed", "120", False),
        ("NOT_DELIVERED", [], "failed", "NOT_DELIVERED", False),
    ],
)
def test_zenvia_status_codes(code: str, causes: list[dict[str, str]] | None, status: str, error_code: str | None,
                             permanent: bool) -> None:
    [event] = zenvia().parse_webhook(zenvia_request(_current_status_event(code, causes))).events
    assert isinstance(event, StatusEvent)
    assert (event.provider_message_id, event.status, event.error_code, event.error_permanent, event.reference) == (
        ZENVIA_MESSAGE_ID, status, error_code, permanent, "lembra-42")
    assert event.opt_out is False


@pytest.mark.parametrize("code", ["ACCEPTED", "DELETED", "VERIFIED", "HANG_UP", "TERMINATED", "RECORDED", "FOO"])
def test_zenvia_status_codes_without_news_are_ignored(code: str) -> None:
    # Unknown codes must not crash; they carry nothing the engine can act on.
    assert list(zenvia().parse_webhook(zenvia_request(_current_status_event(code))).events) == []


# --- webhooks: MESSAGE (inbound) ---


def test_zenvia_inbound_with_a_message_id_a_payload_and_a_visitor() -> None:
    # zenvia/webhook_message_in_with_visitor.json: message.id, a text content with a payload, visitor.
    body = fixture_bytes("zenvia/webhook_message_in_with_visitor.json")
    [event] = zenvia().parse_webhook(zenvia_request(body)).events
    assert event == InboundMessageEvent(provider_message_id="9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d",
                                        from_address=PATIENT, text="Confirmar",
                                        timestamp=utc(2025, 12, 1, 15, 12), button_payload="confirm:42")


@pytest.mark.parametrize("name", ["webhook_message_in_sms.json", "webhook_message_in_multi_content.json"])
def test_zenvia_inbound_from_a_sender_that_is_not_a_phone_is_dropped(name: str) -> None:
    # Zenvia's own SDK tests send from "FROM": not a phone, so no patient to attribute it to.
    event_body = zv.sample_json(name)
    event_body["message"]["from"] = "FROM"
    assert list(zenvia().parse_webhook(zenvia_request(event_body)).events) == []


@pytest.mark.parametrize(
    ("name", "event_id", "text", "timestamp"),
    [("webhook_message_in_sms.json", "5e7a9c1b-3d2f-4a6e-8b0c-9d1e2f3a4b5c", "Sim, confirmo",
      utc(2025, 12, 1, 15, 10, 22, 731000)),
     # text + file + json contents: only the text is the text (not necessarily contents[0]).
     ("webhook_message_in_multi_content.json", "6f8b0d2c-4e3a-4b7f-9c1d-0e2f3a4b5c6d", "Segue o pedido médico",
      utc(2025, 12, 1, 15, 11, 5, 42000))],
)
def test_zenvia_inbound_without_a_message_id(name: str, event_id: str, text: str, timestamp: datetime) -> None:
    # No message.id in these events (as in Zenvia's SDK tests): the event id, stable across
    # retried deliveries, stands in.
    [event] = zenvia().parse_webhook(zenvia_request(fixture_bytes("zenvia/" + name))).events
    assert event == InboundMessageEvent(provider_message_id=event_id, from_address=PATIENT, text=text,
                                        timestamp=timestamp)


def test_zenvia_inbound_old_br_mobile_gets_its_ninth_digit() -> None:
    event_body = zv.sample_json("webhook_message_in_sms.json")
    event_body["message"]["from"] = "551699887766"  # digits with country code, old 8-digit mobile
    [event] = zenvia().parse_webhook(zenvia_request(event_body)).events
    assert isinstance(event, InboundMessageEvent) and event.from_address == PATIENT


def test_zenvia_inbound_multi_content_order_does_not_matter() -> None:
    event_body = zv.sample_json("webhook_message_in_multi_content.json")
    event_body["message"]["contents"].reverse()
    [event] = zenvia().parse_webhook(zenvia_request(event_body)).events
    assert isinstance(event, InboundMessageEvent) and event.text == "Segue o pedido médico"


def test_zenvia_outgoing_message_events_are_not_inbound() -> None:
    event_body = zv.sample_json("webhook_message_in_with_visitor.json")
    event_body["message"]["direction"] = "OUT"
    assert list(zenvia().parse_webhook(zenvia_request(event_body)).events) == []


def test_zenvia_other_event_types_are_acknowledged() -> None:
    assert list(zenvia().parse_webhook(zenvia_request({"id": "e1", "type": "CONVERSATION_STATUS"})).events) == []


# --- webhooks: refusals ---


def test_zenvia_refusals() -> None:
    body = fixture_bytes("zenvia/webhook_message_status_sent_legacy.json")
    with pytest.raises(BadSignature):
        zenvia().parse_webhook(zenvia_request(body, secret=None))
    with pytest.raises(BadSignature):
        zenvia().parse_webhook(zenvia_request(body, secret="wrong"))
    with pytest.raises(BadSignature):
        zenvia().parse_webhook(zenvia_request(body, secret="ümlaut"))
    with pytest.raises(BadSignature):  # no secret configured: refuse everything
        zenvia(webhook_secret=None).parse_webhook(zenvia_request(body, secret=""))
    with pytest.raises(MalformedWebhook):
        zenvia().parse_webhook(zenvia_request(body[: len(body) // 2]))  # truncated JSON
    with pytest.raises(MalformedWebhook):
        zenvia().parse_webhook(zenvia_request(b" " * (5 * 1024 * 1024) + body))  # 5 MB
    with pytest.raises(MalformedWebhook):
        zenvia().parse_webhook(zenvia_request(b"[" * 100_000 + b"]" * 100_000))  # nesting bomb
    for bad in ([1, 2], "x", {"id": "e1"}, {"type": 5}, {"type": "MESSAGE"}, {"type": "MESSAGE", "message": {}},
                {"type": "MESSAGE_STATUS"}, {"type": "MESSAGE_STATUS", "messageId": "m"},
                {"type": "MESSAGE_STATUS", "messageStatus": {"code": "SENT"}}):
        with pytest.raises(MalformedWebhook):
            zenvia().parse_webhook(zenvia_request(bad))


# --- property: whatever arrives, only BadSignature / MalformedWebhook or a result ---

ZENVIA_SAMPLES = [
    "webhook_message_status_sent_legacy.json",
    "webhook_message_status_minimal.json",
    "webhook_message_status_delivered.json",
    "webhook_message_in_sms.json",
    "webhook_message_in_multi_content.json",
    "webhook_message_in_with_visitor.json",
]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20) | st.sampled_from(["SENT", "REJECTED", "MESSAGE", "MESSAGE_STATUS", "IN", "OUT", "text",
                                              PATIENT.lstrip("+"), "2019-09-17T12:31:05-03:00", "9999-12-31T23:59:59-23:59"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


def _accepts_or_refuses(provider: ZenviaProvider, request: WebhookRequest) -> None:
    try:
        result = provider.parse_webhook(request)
    except MalformedWebhook:
        return
    for event in result.events:
        assert isinstance(event, (StatusEvent, InboundMessageEvent))
        assert event.timestamp.tzinfo is not None


@PROPERTY
@given(body=st.binary(max_size=2000), secret=st.none() | st.text(max_size=30))
def test_zenvia_arbitrary_bytes(body: bytes, secret: str | None) -> None:
    try:
        zenvia().parse_webhook(zenvia_request(body, secret=secret))
    except WebhookError:
        pass
    _accepts_or_refuses(zenvia(), zenvia_request(body))


@PROPERTY
@given(value=JSON_VALUES)
def test_zenvia_arbitrary_json(value: Any) -> None:
    _accepts_or_refuses(zenvia(), zenvia_request(value))


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, prefix + (key,))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _paths(child, prefix + (index,))
    return found


@PROPERTY
@given(data=st.data())
def test_zenvia_mutated_samples(data: st.DataObject) -> None:
    event = copy.deepcopy(zv.sample_json(data.draw(st.sampled_from(ZENVIA_SAMPLES))))
    for _ in range(data.draw(st.integers(1, 4))):
        path = data.draw(st.sampled_from(_paths(event)))
        replacement = data.draw(JSON_VALUES)
        if not path:
            event = replacement
            continue
        parent = event
        for step in path[:-1]:
            parent = parent[step]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
        if not isinstance(event, (dict, list)):
            break
    _accepts_or_refuses(zenvia(), zenvia_request(event))


@PROPERTY
@given(data=st.data())
def test_zenvia_byte_mutated_samples(data: st.DataObject) -> None:
    body = bytearray(fixture_bytes("zenvia/" + data.draw(st.sampled_from(ZENVIA_SAMPLES))))
    for _ in range(data.draw(st.integers(1, 6))):
        position = data.draw(st.integers(0, len(body) - 1))
        body[position] ^= data.draw(st.integers(1, 255))
    _accepts_or_refuses(zenvia(), zenvia_request(bytes(body)))


def test_modules_expose_their_limits() -> None:
    assert twilio_mod.MAX_WEBHOOK_BYTES < 5 * 1024 * 1024
    assert zenvia_mod.MAX_WEBHOOK_BYTES < 5 * 1024 * 1024
