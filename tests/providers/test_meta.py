"""Meta WhatsApp Cloud API provider against a loopback fake answering in the documented wire format.

Fixtures: tests/fixtures/providers/meta_whatsapp/ — one reminder (`wamid.lembra-out-01`) to Maria
(wa_id 5516999887766), its statuses and her replies, written from Meta's documented webhook and
send formats; the X-Hub-Signature-256 vector is pywa's published one, kept byte for byte. Sources
per file: tests/fixtures/providers/README.md.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import socket
from datetime import datetime, timezone
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.contract import (
    Button,
    InboundMessageEvent,
    OutboundMessage,
    ProviderContext,
    StatusEvent,
    TemplateRef,
    WebhookRequest,
)
from gateway.egress import LOOPBACK
from gateway.errors import BadSignature, MalformedWebhook, PermanentError, TransientError, WebhookError
from providers.meta.provider import DEFAULT_API_VERSION, MetaProvider
from tests.fakes.meta import (
    SAMPLES,
    FakeGraph,
    fixture_error,
    notes_error,
    phone_number_node,
    sample_json,
)
from tests.fakes.server import Reply
from tests.fixtures import fixture_bytes, fixture_json

# The fake listens on loopback, which the egress guard refuses unless allowed.
CONTEXT = ProviderContext(org_id=1, channel_id=7, timeout=2, public_url="https://lembra.example", egress=LOOPBACK)
SECRET = "test-app-secret"
TOKEN = "EAAG-test-token"
PHONE_ID = "106540352242922"
WAMID = "wamid.lembra-out-01"  # send_response.json; the statuses and replies in the fixtures are about it
BUTTONS = (Button("confirm:42", "Confirmar"), Button("cancel:42", "Cancelar"))
TEMPLATE = TemplateRef(name="lembrete_consulta", language="pt_BR", parameters=("Ana", "02/12 às 14:00"),
                       buttons=BUTTONS)


@pytest.fixture(scope="module")
def graph() -> Iterator[FakeGraph]:
    """One loopback Graph fake for the module (starting and stopping one per test costs ~0.5 s)."""
    with FakeGraph() as server:
        yield server


@pytest.fixture
def fake(graph: FakeGraph) -> FakeGraph:
    return graph.reset()


def provider(base_url: str = "http://127.0.0.1:9", **extra: Any) -> MetaProvider:
    config = {"phone_number_id": PHONE_ID, "access_token": TOKEN, "app_secret": SECRET,
              "verify_token": "verify-me", "base_url": base_url, **extra}
    return MetaProvider(config, CONTEXT)


def outbound(**kw: Any) -> OutboundMessage:
    defaults: dict[str, Any] = {"to": "(16) 99988-7766", "text": "Olá! Sua consulta é amanhã.", "reference": "981"}
    return OutboundMessage(**{**defaults, **kw})


def envelope(typed: dict[str, Any], reference: str | None = "981") -> dict[str, Any]:
    """The documented send envelope (Meta's Cloud API docs, SDK bodyBuilder) around a typed payload."""
    body = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": "5516999887766", **typed}
    if reference is not None:
        body["biz_opaque_callback_data"] = reference
    return body


def template_object() -> dict[str, Any]:
    # Same shape as send_template_object.json (name, language{policy,code},
    # components[{type:body, parameters:[{type:text,text}]}]) plus the documented quick_reply buttons.
    return {
        "name": "lembrete_consulta",
        "language": {"policy": "deterministic", "code": "pt_BR"},
        "components": [
            {"type": "body", "parameters": [{"type": "text", "text": "Ana"}, {"type": "text", "text": "02/12 às 14:00"}]},
            {"type": "button", "sub_type": "quick_reply", "index": "0",
             "parameters": [{"type": "payload", "payload": "confirm:42"}]},
            {"type": "button", "sub_type": "quick_reply", "index": "1",
             "parameters": [{"type": "payload", "payload": "cancel:42"}]},
        ],
    }


def keys_shape(value: Any) -> Any:
    """The structure of a JSON value (dict keys and nesting), without its leaf values."""
    if isinstance(value, dict):
        return {k: keys_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [keys_shape(v) for v in value[:1]]
    return type(value).__name__


# ---------------------------------------------------------------------------- send


def test_text_inside_the_window_is_the_documented_request(fake: FakeGraph) -> None:
    fake.reset()
    result = provider(fake.url).send(outbound(conversation_open=True))
    assert result.provider_message_id == WAMID
    [req] = fake.requests
    assert req.method == "POST"
    assert req.path == f"/{PHONE_ID}/messages"
    assert req.header("Authorization") == f"Bearer {TOKEN}"
    assert req.header("Content-Type") == "application/json"
    # Meta's documented text send: type text, text{preview_url, body}
    assert req.json() == envelope({"type": "text", "text": {"preview_url": False, "body": "Olá! Sua consulta é amanhã."}})


def test_buttons_inside_the_window_go_as_interactive_reply_buttons(fake: FakeGraph) -> None:
    fake.reset()
    result = provider(fake.url).send(outbound(conversation_open=True, buttons=BUTTONS))
    assert result.provider_message_id == WAMID
    body = fake.requests[0].json()
    assert body == envelope({"type": "interactive", "interactive": {
        "type": "button",
        "body": {"text": "Olá! Sua consulta é amanhã."},
        "action": {"buttons": [
            {"type": "reply", "reply": {"id": "confirm:42", "title": "Confirmar"}},
            {"type": "reply", "reply": {"id": "cancel:42", "title": "Cancelar"}},
        ]},
    }})
    # Same structure as the documented reply-buttons object (send_interactive_reply_buttons_object.json).
    assert keys_shape(body["interactive"]) == keys_shape(sample_json("send_interactive_reply_buttons_object.json"))


def test_outside_the_window_the_template_goes_with_parameters_and_quick_reply_payloads(fake: FakeGraph) -> None:
    fake.reset()
    result = provider(fake.url).send(outbound(conversation_open=False, template=TEMPLATE, buttons=BUTTONS))
    assert result.provider_message_id == WAMID
    body = fake.requests[0].json()
    assert body == envelope({"type": "template", "template": template_object()})
    sdk = sample_json("send_template_object.json")
    assert keys_shape(body["template"]["language"]) == keys_shape(sdk["language"])
    assert keys_shape(body["template"]["components"][0]) == keys_shape(sdk["components"][0])


def test_quick_replies_are_the_template_s_own_not_the_message_s(fake: FakeGraph) -> None:
    # The clinic's mapping says which quick replies its approved template has: one mapped without
    # buttons gets no button components, whatever buttons the message shows inside the window.
    fake.reset()
    bare = TemplateRef(name="lembrete_consulta", language="pt_BR", parameters=("Ana", "02/12 às 14:00"))
    provider(fake.url).send(outbound(conversation_open=False, template=bare, buttons=BUTTONS))
    components = fake.requests[0].json()["template"]["components"]
    assert [c["type"] for c in components] == ["body"]


def test_template_without_parameters_or_buttons_has_no_components_and_language_is_meta_style(fake: FakeGraph) -> None:
    fake.reset()
    provider(fake.url).send(outbound(template=TemplateRef("ola", "pt-BR"), reference=None))
    assert fake.requests[0].json() == envelope(
        {"type": "template", "template": {"name": "ola", "language": {"policy": "deterministic", "code": "pt_BR"}}},
        reference=None)


def test_template_parameters_lose_new_lines_and_tabs_meta_refuses(fake: FakeGraph) -> None:
    fake.reset()
    provider(fake.url).send(outbound(template=TemplateRef("t", "pt_BR", ("Rua A,\n\t 10     fundos",))))
    params = fake.requests[0].json()["template"]["components"][0]["parameters"]
    assert params == [{"type": "text", "text": "Rua A, 10 fundos"}]


def test_window_closed_without_template_is_refused_before_any_request(fake: FakeGraph) -> None:
    fake.reset()
    with pytest.raises(PermanentError) as err:
        provider(fake.url).send(outbound(conversation_open=False, buttons=BUTTONS))
    assert err.value.code == "template_required"
    assert fake.requests == []


def test_131047_on_a_text_send_resends_once_as_the_template(fake: FakeGraph) -> None:
    # error_131047_reengagement.json as the synchronous Graph error
    fake.reset(fixture_error("error_131047_reengagement.json"))
    result = provider(fake.url).send(outbound(conversation_open=True, template=TEMPLATE, buttons=BUTTONS))
    assert result.provider_message_id == WAMID
    first, second = fake.requests
    assert first.json()["type"] == "interactive"
    assert second.json() == envelope({"type": "template", "template": template_object()})


def test_131047_without_a_template_is_window_closed(fake: FakeGraph) -> None:
    fake.reset(fixture_error("error_131047_reengagement.json"))
    with pytest.raises(PermanentError) as err:
        provider(fake.url).send(outbound(conversation_open=True))
    assert err.value.code == "window_closed"
    assert len(fake.requests) == 1


def test_131047_on_the_template_resend_is_not_retried_again(fake: FakeGraph) -> None:
    reengage = fixture_error("error_131047_reengagement.json")
    fake.reset(reengage, reengage)
    with pytest.raises(PermanentError) as err:
        provider(fake.url).send(outbound(conversation_open=True, template=TEMPLATE))
    assert err.value.code == "window_closed"
    assert len(fake.requests) == 2


@pytest.mark.parametrize(
    ("reply", "permanent", "code", "channel_broken", "retry_after"),
    [
        # the error object fixtures inside the Graph envelope
        (fixture_error("error_190_expired_token.json", 401), True, "token_invalid", True, None),
        (fixture_error("error_190_expired_token.json", 400), True, "token_invalid", True, None),
        (fixture_error("error_131053_media_upload.json"), True, "media_error", False, None),
        (fixture_error("error_131047_reengagement.json"), True, "window_closed", False, None),
        # codes from Meta's error-code table, in Graph's error syntax
        (notes_error(130429, "Rate limit hit", 400, {"Retry-After": "30"}), False, "throughput", False, 30.0),
        (notes_error(130429, "Rate limit hit", 429), False, "throughput", False, 5.0),
        (notes_error(131056, "(Business Account, Consumer Account) pair rate limit hit"), False, "pair_rate_limit",
         False, 6.0),
        (notes_error(131026, "Message undeliverable"), True, "undeliverable", False, None),
        (notes_error(131048, "Spam rate limit hit"), True, "spam_rate_limit", False, None),
        (notes_error(131049, "Per-user marketing limit"), False, "marketing_limit", False, None),
        (notes_error(131051, "Unsupported message type"), True, "unsupported_type", False, None),
        (notes_error(131000, "Something went wrong", 500), False, "generic_error", False, None),
        (notes_error(130472, "User's number is part of an experiment"), True, "experiment", False, None),
        (notes_error(368, "Temporarily blocked for policies violations"), True, "account_restricted", True, None),
        (notes_error(131031, "Account has been locked"), True, "account_locked", True, None),
        (notes_error(80007, "Rate limit issues"), False, "waba_rate_limit", False, None),
        # codes the provider does not know fall back to the HTTP status, keeping Meta's code
        (notes_error(100, "Invalid parameter"), True, "meta_100", False, None),
        (notes_error(100, "Invalid parameter", 503), False, "meta_100", False, None),
        # no Graph error body at all: plain HTTP mapping
        (Reply(500, b""), False, "http_500", False, None),
        (Reply(502, b"<html>bad gateway</html>"), False, "http_502", False, None),
        (Reply(429, b"", headers={"Retry-After": "7"}), False, "http_429", False, 7.0),
        (Reply(401, b""), True, "http_401", True, None),
    ],
)
def test_errors_map_to_typed_errors(reply: Reply, permanent: bool, code: str, channel_broken: bool,
                                    retry_after: float | None, fake: FakeGraph) -> None:
    fake.reset(reply)
    with pytest.raises((PermanentError, TransientError)) as err:
        provider(fake.url).send(outbound(template=TEMPLATE))
    assert err.value.permanent is permanent
    assert err.value.code == code
    assert err.value.channel_broken is channel_broken
    assert err.value.retry_after == retry_after
    assert len(fake.requests) == 1  # never retried inside the provider (a template send)
    assert "5516" not in str(err.value) and "Ana" not in str(err.value)  # no PII in the message


def test_a_provider_slower_than_the_timeout_is_transient(fake: FakeGraph) -> None:
    fake.reset(Reply(200, fixture_bytes(SAMPLES + "send_response.json"), delay=2.6))
    with pytest.raises(TransientError) as err:
        provider(fake.url).send(outbound(template=TEMPLATE))
    assert err.value.code == "timeout"


def test_connection_refused_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TransientError) as err:
        provider(f"http://127.0.0.1:{port}").send(outbound(template=TEMPLATE))
    assert err.value.code == "connection_error"


def test_an_answer_without_a_message_id_fails_without_retry(fake: FakeGraph) -> None:
    fake.reset(Reply(200, {"messaging_product": "whatsapp", "messages": []}))
    with pytest.raises(PermanentError) as err:
        provider(fake.url).send(outbound(template=TEMPLATE))
    assert err.value.code == "bad_response"


def test_message_status_of_newer_answers_is_passed_on(fake: FakeGraph) -> None:
    answer = sample_json("send_response.json")
    answer["messages"][0]["message_status"] = "held_for_quality_assessment"  # newer answers carry it
    fake.reset(Reply(200, answer))
    result = provider(fake.url).send(outbound(template=TEMPLATE))
    assert result.provider_status == "held_for_quality_assessment"


def test_invalid_recipient_and_missing_credentials_fail_before_any_request(fake: FakeGraph) -> None:
    fake.reset()
    with pytest.raises(PermanentError) as err:
        provider(fake.url).send(outbound(to="not a phone", template=TEMPLATE))
    assert err.value.code == "invalid_number"
    with pytest.raises(PermanentError) as err:
        provider(fake.url, access_token="").send(outbound(template=TEMPLATE))
    assert err.value.code == "misconfigured" and err.value.channel_broken
    assert fake.requests == []


def test_overlong_reference_is_not_sent_and_long_text_drops_buttons(fake: FakeGraph) -> None:
    fake.reset()
    provider(fake.url).send(outbound(conversation_open=True, buttons=BUTTONS, text="x" * 1500, reference="r" * 600))
    body = fake.requests[0].json()
    assert "biz_opaque_callback_data" not in body
    assert body["type"] == "text" and body["text"]["body"] == "x" * 1500


def test_default_base_url_is_the_graph_api_with_a_version() -> None:
    p = MetaProvider({"phone_number_id": PHONE_ID, "access_token": TOKEN}, CONTEXT)
    assert p.base_url == f"https://graph.facebook.com/{DEFAULT_API_VERSION}"
    p = MetaProvider({"phone_number_id": PHONE_ID, "access_token": TOKEN, "api_version": "v23.0"}, CONTEXT)
    assert p.base_url == "https://graph.facebook.com/v23.0"
    assert MetaProvider.name == "meta" and MetaProvider.kinds == ("whatsapp",)
    assert MetaProvider.honours_idempotency is False
    assert TOKEN not in repr(p)


# ---------------------------------------------------------------------------- health


def test_health_reads_the_phone_number_node(fake: FakeGraph) -> None:
    fake.reset(default=phone_number_node())
    health = provider(fake.url).health()
    assert health.ok and health.state == "ok" and health.detail == "quality_rating=GREEN"
    [req] = fake.requests
    assert req.method == "GET" and req.path == f"/{PHONE_ID}"
    assert req.query == {"fields": ["display_phone_number,verified_name,quality_rating"]}
    assert req.header("Authorization") == f"Bearer {TOKEN}"


def test_health_reports_an_expired_token_and_an_unreachable_api(fake: FakeGraph) -> None:
    fake.reset(default=fixture_error("error_190_expired_token.json", 401))
    health = provider(fake.url).health()
    assert not health.ok and health.state == "token_invalid"
    fake.reset(default=Reply(503, b""))
    health = provider(fake.url).health()
    assert not health.ok and health.state == "unreachable"


# ---------------------------------------------------------------------------- the WABA's templates

WABA = "102290129340398"


def test_list_templates_reads_every_page_by_cursor_from_our_own_base_url(fake: FakeGraph) -> None:
    fake.reset()
    listed = provider(fake.url, waba_id=WABA).list_templates()
    assert [(t.name, t.language, t.status) for t in listed] == [
        ("session_reminder_v1", "pt_BR", "APPROVED"), ("lembrete_sorriso", "pt_BR", "APPROVED"),
        ("volte_a_sorrir", "pt_BR", "PENDING"), ("aviso_com_nome", "pt_BR", "APPROVED"),
        ("lembrete_com_foto", "pt_BR", "APPROVED"), ("session_reminder_v1", "en_US", "REJECTED"),
        ("conversation_reopen_v1", "pt_BR", "APPROVED")]
    first, second = fake.requests
    assert (first.method, first.path) == ("GET", f"/{WABA}/message_templates")
    assert first.header("Authorization") == f"Bearer {TOKEN}"
    assert first.query["fields"] == ["name,language,status,category,components,parameter_format"]
    assert first.query["limit"] == ["100"] and "after" not in first.query
    # Page 1's `next` points at graph.facebook.com: the next page is asked of the channel's own
    # base URL (the one the egress guard checked) with `cursors.after`, never by following `next`.
    cursor = sample_json("message_templates_page1.json")["paging"]["cursors"]["after"]
    assert (second.path, second.query["after"]) == (f"/{WABA}/message_templates", [cursor])


def test_list_templates_reads_what_a_mapping_is_checked_against(fake: FakeGraph) -> None:
    fake.reset()
    by_name = {(t.name, t.language): t for t in provider(fake.url, waba_id=WABA).list_templates()}
    reminder = by_name[("session_reminder_v1", "pt_BR")]
    assert (reminder.category, reminder.parameters, reminder.named) == ("UTILITY", ("1", "2", "3", "4", "5"), False)
    assert reminder.body.startswith("Olá, {{1}}! Lembrete")
    assert [(b.type, b.text) for b in reminder.buttons] == [("QUICK_REPLY", "Confirmar"), ("QUICK_REPLY", "Cancelar")]
    sorriso = by_name[("lembrete_sorriso", "pt_BR")]
    assert not sorriso.header_needs_parameter  # a fixed text header needs nothing at send
    assert [b.type for b in sorriso.buttons] == ["QUICK_REPLY", "QUICK_REPLY", "PHONE_NUMBER"]
    assert not any(b.needs_parameter for b in sorriso.buttons)
    assert by_name[("aviso_com_nome", "pt_BR")].named
    assert by_name[("aviso_com_nome", "pt_BR")].parameters == ("primeiro_nome",)
    assert by_name[("lembrete_com_foto", "pt_BR")].header_needs_parameter
    assert by_name[("volte_a_sorrir", "pt_BR")].category == "MARKETING"


def test_list_templates_keeps_the_usable_entries_of_an_odd_page(fake: FakeGraph) -> None:
    odd = {"data": [7, None, {"name": ""}, {"language": "pt_BR"}, {"name": "x", "language": "pt_BR",
                                                                   "components": "nope", "status": 3},
                    {"name": "url_dinamica", "language": "pt_BR", "status": "APPROVED", "components": [
                        {"type": "BODY", "text": "Oi {{1}}"},
                        {"type": "BUTTONS", "buttons": [{"type": "URL", "text": "Ver", "url": "https://a.example/{{1}}"},
                                                        "junk"]}]}],
           "paging": {"cursors": {"after": "x"}}}
    fake.reset(Reply(200, odd))
    listed = provider(fake.url, waba_id=WABA).list_templates()
    assert [(t.name, t.status) for t in listed] == [("x", ""), ("url_dinamica", "APPROVED")]
    assert listed[1].buttons[0].needs_parameter  # a URL button with a variable needs a value at send
    assert len(fake.requests) == 1  # no `next`: the last page


def test_list_templates_stops_after_a_bounded_number_of_pages(fake: FakeGraph) -> None:
    from providers.meta.provider import MAX_TEMPLATE_PAGES

    endless = {"data": [], "paging": {"cursors": {"after": "again"}, "next": "https://graph.facebook.com/x"}}
    fake.reset(*[Reply(200, endless)] * (MAX_TEMPLATE_PAGES + 5))
    assert provider(fake.url, waba_id=WABA).list_templates() == []
    assert len(fake.requests) == MAX_TEMPLATE_PAGES


def test_list_templates_failures_are_typed(fake: FakeGraph) -> None:
    fake.reset()
    with pytest.raises(PermanentError) as missing:
        provider(fake.url).list_templates()
    assert missing.value.code == "waba_missing" and fake.requests == []
    fake.reset(fixture_error("error_190_expired_token.json", 401))
    with pytest.raises(PermanentError) as expired:
        provider(fake.url, waba_id=WABA).list_templates()
    assert expired.value.code == "token_invalid"
    fake.reset(Reply(200, {"error_summary": "not a list"}))
    with pytest.raises(PermanentError) as odd:
        provider(fake.url, waba_id=WABA).list_templates()
    assert odd.value.code == "bad_response"
    fake.reset(Reply(503, b""))
    with pytest.raises(TransientError):
        provider(fake.url, waba_id=WABA).list_templates()


def test_list_templates_goes_through_the_egress_guard(fake: FakeGraph) -> None:
    from gateway.egress import STRICT
    from gateway.errors import EgressRefused

    fake.reset()
    config = {"phone_number_id": PHONE_ID, "access_token": TOKEN, "app_secret": SECRET, "verify_token": "verify-me",
              "base_url": fake.url, "waba_id": WABA}
    strict = MetaProvider(config, ProviderContext(org_id=1, channel_id=7, timeout=2, egress=STRICT))
    with pytest.raises(EgressRefused):
        strict.list_templates()
    assert fake.requests == []


def test_the_template_preview_is_the_template_object_a_send_carries(fake: FakeGraph) -> None:
    fake.reset()
    provider(fake.url).send(outbound(conversation_open=False, template=TEMPLATE))
    assert MetaProvider.template_preview(TEMPLATE) == fake.requests[0].json()["template"]


# ---------------------------------------------------------------------------- webhooks: GET handshake


def get(query: dict[str, str], url: str = "https://lembra.example/webhooks/meta/7") -> WebhookRequest:
    return WebhookRequest(method="GET", url=url, headers={}, body=b"", query=query)


def test_get_verification_echoes_the_challenge() -> None:
    # Meta's "Create a webhook endpoint" page and SDK webhooks.ts: 200 with the raw hub.challenge
    result = provider().parse_webhook(get({"hub.mode": "subscribe", "hub.verify_token": "verify-me",
                                           "hub.challenge": "1158201444"}))
    assert result.response_body == "1158201444" and result.response_status == 200 and list(result.events) == []


def test_get_verification_reads_the_url_when_no_query_mapping_is_given() -> None:
    url = "https://lembra.example/webhooks/meta/7?hub.mode=subscribe&hub.challenge=42&hub.verify_token=verify-me"
    assert provider().parse_webhook(get({}, url)).response_body == "42"


@pytest.mark.parametrize(
    ("query", "config", "error"),
    [
        ({"hub.mode": "subscribe", "hub.verify_token": "wrong", "hub.challenge": "1"}, {}, BadSignature),
        ({"hub.mode": "subscribe", "hub.challenge": "1"}, {}, BadSignature),
        ({"hub.mode": "subscribe", "hub.verify_token": "", "hub.challenge": "1"}, {"verify_token": ""}, BadSignature),
        ({"hub.mode": "subscribe", "hub.verify_token": "vérify", "hub.challenge": "1"}, {}, BadSignature),
        ({"hub.mode": "unsubscribe", "hub.verify_token": "verify-me", "hub.challenge": "1"}, {}, MalformedWebhook),
        ({"hub.mode": "subscribe", "hub.verify_token": "verify-me"}, {}, MalformedWebhook),
        ({"hub.mode": "subscribe", "hub.verify_token": "verify-me", "hub.challenge": "<script>"}, {}, MalformedWebhook),
    ],
)
def test_get_verification_refusals(query: dict[str, str], config: dict[str, str], error: type) -> None:
    with pytest.raises(error):
        provider(**config).parse_webhook(get(query))


# ---------------------------------------------------------------------------- webhooks: signatures


def vector() -> tuple[str, str, str]:
    """(app_secret, good header, re-serialised digest) of pywa's published vector
    (signed_inbound_text_signature_vector.json; the body is signed_inbound_text_raw_body.json)."""
    data = fixture_json(SAMPLES + "signed_inbound_text_signature_vector.json")
    return data["app_secret"], data["x_hub_signature_256"], data["recomputed_reserialised_digest"]


def post(body: bytes, signature: str | None, header: str = "X-Hub-Signature-256") -> WebhookRequest:
    headers = {"Content-Type": "application/json"}
    if signature is not None:
        headers[header] = signature
    return WebhookRequest(method="POST", url="https://lembra.example/webhooks/meta/7", headers=headers, body=body)


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_published_signature_vector_is_accepted() -> None:
    secret, header, _ = vector()
    raw = fixture_bytes(SAMPLES + "signed_inbound_text_raw_body.json")
    result = provider(app_secret=secret).parse_webhook(post(raw, header, header="x-hub-signature-256"))
    assert list(result.events) == [InboundMessageEvent(
        provider_message_id="wamid.HBgMOTcyNTQ0NDAxMjQzFQIAEhggM0RFQTNCMEEwRTY3QzUwODYzMDc4NjQ4QzM4ODAxM0YA",
        from_address="+972544401243", text="Hey there! I am using PyWa.",
        timestamp=datetime.fromtimestamp(1730231903, timezone.utc))]


def test_signature_refusals() -> None:
    secret, header, reserialised_digest = vector()
    raw = fixture_bytes(SAMPLES + "signed_inbound_text_raw_body.json")
    p = provider(app_secret=secret)
    reserialised = json.dumps(json.loads(raw)).encode()
    assert sign(reserialised, secret) == "sha256=" + reserialised_digest  # the negative case (recomputed)
    cases = [
        post(reserialised, header),                                   # re-serialised JSON: digest differs
        post(raw, "sha256=" + reserialised_digest),
        post(raw.replace(b"Hey there", b"Hey thera"), header),        # tampered body
        post(raw, None),                                              # no header
        post(raw, header.removeprefix("sha256=")),                    # no scheme
        post(raw, "sha1=" + header.removeprefix("sha256=")),
        post(raw, "sha256="),
        post(raw, "sha256=ção"),                                      # non-ASCII header
    ]
    for request in cases:
        with pytest.raises(BadSignature):
            p.parse_webhook(request)
    with pytest.raises(BadSignature):  # wrong secret
        provider(app_secret="another-secret").parse_webhook(post(raw, header))
    with pytest.raises(BadSignature):  # no secret configured: nothing is accepted
        provider(app_secret="").parse_webhook(post(raw, header))


def test_truncated_and_non_json_bodies_are_malformed_once_signed() -> None:
    raw = fixture_bytes(SAMPLES + "webhook_inbound_text.json")
    for body in (raw[: len(raw) // 2], b"", b"\xff\xfe\x00garbage", b"[" * 100_000, b"[]", b'{"entry":[]}',
                 b'{"object":"whatsapp_business_account","entry":{}}'):
        with pytest.raises(MalformedWebhook):
            provider().parse_webhook(post(body, sign(body)))


def test_signed_notifications_of_other_meta_products_are_acknowledged_and_ignored() -> None:
    body = b'{"object":"page","entry":[{"id":"1","changes":[]}]}'
    assert list(provider().parse_webhook(post(body, sign(body))).events) == []


def test_a_5_mb_body_is_refused() -> None:
    body = b'{"object":"whatsapp_business_account","entry":[],"pad":"' + b"x" * (5 * 1024 * 1024) + b'"}'
    with pytest.raises(MalformedWebhook):
        provider().parse_webhook(post(body, sign(body)))


# ---------------------------------------------------------------------------- webhooks: the fixtures


def parse_sample(name: str) -> list[Any]:
    raw = fixture_bytes(SAMPLES + name)
    return list(provider().parse_webhook(post(raw, sign(raw))).events)


def ts(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


PATIENT = "+5516999887766"  # Maria, wa_id 5516999887766 in every fixture


def test_inbound_text() -> None:
    assert parse_sample("webhook_inbound_text.json") == [
        InboundMessageEvent("wamid.lembra-in-01", PATIENT, "Oi! Posso remarcar para sexta?", ts(1764591000))]


def test_coexistence_echo_is_a_from_me_message_to_the_patient() -> None:  # smb_message_echoes: from us, to her
    text = "Oi Maria, aqui é a Júlia da recepção. Posso te ligar agora?"
    assert parse_sample("webhook_smb_message_echoes_text.json") == [
        InboundMessageEvent("wamid.lembra-echo-01", PATIENT, text, ts(1764591300), from_me=True)]
    body = sample_json("webhook_smb_message_echoes_text.json")
    echoes = body["entry"][0]["changes"][0]["value"]["message_echoes"]
    echoes[0]["to"] = "+" + echoes[0]["to"]  # Meta's reference shows `to` with a leading +
    echoes.append({"from": "551633334444", "to": "5516999887766", "id": "wamid.edit", "timestamp": "1764591301",
                   "type": "revoke", "revoke": {"original_message_id": "wamid.lembra-echo-01"}})
    raw = json.dumps(body).encode()
    [event] = provider().parse_webhook(post(raw, sign(raw))).events  # the revoke is no new message
    assert (event.from_address, event.from_me) == (PATIENT, True)
    del echoes[0]["to"]
    raw = json.dumps(body).encode()
    with pytest.raises(MalformedWebhook):
        provider().parse_webhook(post(raw, sign(raw)))


def test_inbound_text_replying_to_a_message() -> None:  # context{from, id}: the reminder she answers
    assert parse_sample("webhook_inbound_text_reply_with_context.json") == [
        InboundMessageEvent("wamid.lembra-in-02", PATIENT, "Vou sim, obrigada", ts(1764591060), in_reply_to=WAMID)]


def test_interactive_button_reply() -> None:  # interactive.button_reply{id, title}
    assert parse_sample("webhook_inbound_interactive_button_reply.json") == [
        InboundMessageEvent("wamid.lembra-in-03", PATIENT, "Confirmar", ts(1764591120), button_payload="confirm:42",
                            in_reply_to=WAMID)]


def test_list_reply() -> None:  # interactive.list_reply{id, title, description}
    assert parse_sample("webhook_inbound_list_reply.json") == [
        InboundMessageEvent("wamid.lembra-in-04", PATIENT, "Sex 05/12 09:00", ts(1764591180),
                            button_payload="slot:2025-12-05T09:00", in_reply_to=WAMID)]


def test_template_quick_reply_button() -> None:  # type "button", button{payload, text}
    assert parse_sample("webhook_inbound_template_quick_reply_button.json") == [
        InboundMessageEvent("wamid.lembra-in-05", PATIENT, "Confirmar", ts(1764591240), button_payload="confirm:42",
                            in_reply_to=WAMID)]


def test_template_quick_reply_without_context_with_bsuid() -> None:  # no context, from_user_id beside from
    assert parse_sample("webhook_inbound_template_quick_reply_no_context_bsuid.json") == [
        InboundMessageEvent("wamid.lembra-in-06", PATIENT, "Cancelar", ts(1764591300), button_payload="cancel:42")]


def test_unsupported_message_is_skipped() -> None:  # type "unsupported" with errors[] 131051
    assert parse_sample("webhook_inbound_unsupported.json") == []


def test_interactive_message_with_a_change_level_error_is_skipped() -> None:  # no interactive body, value.errors 131000
    assert parse_sample("webhook_inbound_interactive_with_error.json") == []


@pytest.mark.parametrize(
    ("name", "status", "seconds"),
    [
        ("webhook_status_sent.json", "sent", 1764590400),          # with conversation{expiration_timestamp}
        ("webhook_status_delivered.json", "delivered", 1764590403),
        ("webhook_status_read.json", "read", 1764590700),
    ],
)
def test_statuses(name: str, status: str, seconds: int) -> None:
    assert parse_sample(name) == [StatusEvent(WAMID, status, ts(seconds))]  # type: ignore[arg-type]


def test_failed_status_carries_the_error_code() -> None:  # errors[{code 130472, title, message, error_data, href}]
    assert parse_sample("webhook_status_failed_130472.json") == [
        StatusEvent(WAMID, "failed", ts(1764590402), error_code="130472", error_permanent=True)]


def test_status_echoes_biz_opaque_callback_data_as_reference() -> None:  # the reference we sent, echoed back
    assert parse_sample("webhook_status_sent_biz_opaque_callback_data.json") == [
        StatusEvent(WAMID, "sent", ts(1764590400), reference="981")]


@pytest.mark.parametrize(("code", "permanent"), [(131026, True), (131047, True), (130429, False), (131056, False)])
def test_failed_status_codes_from_meta_s_table(code: int, permanent: bool) -> None:
    data = sample_json("webhook_status_failed_130472.json")
    data["entry"][0]["changes"][0]["value"]["statuses"][0]["errors"] = [sample_json("error_131047_reengagement.json")]
    data["entry"][0]["changes"][0]["value"]["statuses"][0]["errors"][0]["code"] = code
    body = json.dumps(data).encode()
    [event] = provider().parse_webhook(post(body, sign(body))).events
    assert isinstance(event, StatusEvent)
    assert event.error_code == str(code) and event.error_permanent is permanent


def test_a_batch_of_entries_changes_and_items_yields_every_event() -> None:
    inbound = sample_json("webhook_inbound_text.json")
    status = sample_json("webhook_status_read.json")
    button = sample_json("webhook_inbound_template_quick_reply_button.json")
    change = inbound["entry"][0]["changes"][0]
    change["value"]["messages"].append(button["entry"][0]["changes"][0]["value"]["messages"][0])
    change["value"]["statuses"] = status["entry"][0]["changes"][0]["value"]["statuses"]
    inbound["entry"].append(status["entry"][0])
    inbound["entry"][0]["changes"].insert(0, {"field": "message_template_status_update", "value": {"event": "APPROVED"}})
    body = json.dumps(inbound).encode()
    events = list(provider().parse_webhook(post(body, sign(body))).events)
    assert [type(e).__name__ for e in events] == ["InboundMessageEvent", "InboundMessageEvent", "StatusEvent", "StatusEvent"]


def test_brazilian_sender_without_the_ninth_digit_becomes_e164_with_it() -> None:
    data = sample_json("webhook_inbound_template_quick_reply_button.json")
    message = data["entry"][0]["changes"][0]["value"]["messages"][0]
    message["from"] = "551699887766"  # legacy BR wa_id (Meta's wa_id may lack the 9th digit)
    message["button"]["payload"] = "confirm:42"
    body = json.dumps(data).encode()
    [event] = provider().parse_webhook(post(body, sign(body))).events
    assert isinstance(event, InboundMessageEvent)
    assert event.from_address == "+5516999887766" and event.button_payload == "confirm:42"


def test_sender_without_a_phone_number_is_skipped_and_media_counts_as_inbound() -> None:
    data = sample_json("webhook_inbound_text.json")
    messages = data["entry"][0]["changes"][0]["value"]["messages"]
    no_phone = copy.deepcopy(messages[0])
    del no_phone["from"]
    no_phone["from_user_id"] = "US.13491208655302741918"
    image = {"from": "5516999887766", "id": "wamid.img", "timestamp": "1764591500", "type": "image",
             "image": {"caption": "receita", "mime_type": "image/jpeg", "id": "1"}}
    reaction = {"from": "5516999887766", "id": "wamid.r", "timestamp": "1764591500", "type": "reaction",
                "reaction": {"message_id": "wamid.x", "emoji": "👍"}}
    messages[:] = [no_phone, image, reaction]
    body = json.dumps(data).encode()
    events = list(provider().parse_webhook(post(body, sign(body))).events)
    assert events == [InboundMessageEvent("wamid.img", PATIENT, "receita", ts(1764591500))]


def test_a_number_phonenumbers_does_not_know_is_kept_as_sent() -> None:
    data = sample_json("webhook_inbound_text.json")
    data["entry"][0]["changes"][0]["value"]["messages"][0]["from"] = "972987654321"  # no valid plan has it
    body = json.dumps(data).encode()
    [event] = provider().parse_webhook(post(body, sign(body))).events
    assert isinstance(event, InboundMessageEvent) and event.from_address == "+972987654321"


# ---------------------------------------------------------------------------- property tests

ALL_SAMPLES = sorted(
    name for name in (
        "webhook_inbound_text.json", "webhook_inbound_text_reply_with_context.json", "webhook_inbound_unsupported.json",
        "webhook_inbound_interactive_with_error.json", "webhook_inbound_interactive_button_reply.json",
        "webhook_inbound_template_quick_reply_button.json", "webhook_inbound_template_quick_reply_no_context_bsuid.json",
        "webhook_inbound_list_reply.json", "webhook_status_sent.json", "webhook_status_delivered.json",
        "webhook_status_read.json", "webhook_status_failed_130472.json",
        "webhook_status_sent_biz_opaque_callback_data.json",
    )
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _only_webhook_errors(request: WebhookRequest) -> None:
    try:
        result = provider().parse_webhook(request)
    except (BadSignature, MalformedWebhook):
        return
    for event in result.events:
        assert isinstance(event, (InboundMessageEvent, StatusEvent))
        assert event.timestamp.tzinfo is not None


@PROPERTY
@given(st.binary(max_size=2048), st.booleans())
def test_arbitrary_bytes(body: bytes, signed: bool) -> None:
    _only_webhook_errors(post(body, sign(body) if signed else "sha256=" + "0" * 64))


@PROPERTY
@given(JSON_VALUES)
def test_arbitrary_json(value: Any) -> None:
    body = json.dumps(value).encode()
    _only_webhook_errors(post(body, sign(body)))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, prefix + (index,))
    return found


@PROPERTY
@given(st.sampled_from(ALL_SAMPLES), st.data())
def test_mutated_samples(name: str, data: st.DataObject) -> None:
    document = sample_json(name)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(document)))
        replacement = data.draw(JSON_VALUES)
        if not path:
            document = replacement
            continue
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
        if not isinstance(document, (dict, list)):
            break
    body = json.dumps(document).encode()
    _only_webhook_errors(post(body, sign(body)))


@PROPERTY
@given(st.dictionaries(st.sampled_from(["hub.mode", "hub.verify_token", "hub.challenge", "x"]),
                       st.text(max_size=30) | st.lists(st.text(max_size=5), max_size=2), max_size=4),
       st.text(max_size=60))
def test_arbitrary_get_queries(query: dict[str, Any], url: str) -> None:
    try:
        provider().parse_webhook(WebhookRequest(method="GET", url=url, headers={}, body=b"", query=query))
    except WebhookError as exc:
        assert isinstance(exc, (BadSignature, MalformedWebhook))
