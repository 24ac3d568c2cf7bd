"""Evolution API v2 provider against a loopback Evolution and the webhooks it documents.

Evolution publishes no captured payloads, so request/response/webhook shapes are built in
tests/fakes/evolution.py from the Evolution API source (each builder names its path; see the
docstring there and tests/fixtures/providers/README.md).
"""

from __future__ import annotations

import json
import socket
import time
from datetime import datetime, timezone
from typing import Any

import jwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import registry
from gateway.contract import (
    Button,
    ConnectionEvent,
    InboundMessageEvent,
    OutboundMessage,
    ProviderContext,
    StatusEvent,
    WebhookRequest,
    WebhookResult,
)
from gateway.egress import LOOPBACK
from gateway.errors import (
    BadSignature,
    MalformedWebhook,
    PermanentError,
    ProviderError,
    TransientError,
)
from providers.evolution.provider import WEBHOOK_EVENTS, EvolutionProvider
from tests.fakes import evolution as evo
from tests.fakes.server import Reply

# 64 bytes: long enough for every HMAC JWT algorithm (RFC 7518 3.2), so the HS512 token below is refused for
# its algorithm alone and PyJWT has no short key to warn about.
SECRET = "whsec-evolution-channel-7-0123456789abcdef-0123456789abcdefghijk"
# The fake listens on loopback, which the egress guard refuses unless allowed.
CONTEXT = ProviderContext(org_id=1, channel_id=7, timeout=2, public_url="https://lembra.example", egress=LOOPBACK)
TO = "+5516999887766"


def make(base_url: str = "http://127.0.0.1:9", *, context: ProviderContext = CONTEXT, **overrides: Any) -> EvolutionProvider:
    config = {"base_url": base_url, "api_key": "global-api-key", "instance": "clinica", "webhook_secret": SECRET}
    config.update(overrides)
    return EvolutionProvider({k: v for k, v in config.items() if v is not None}, context)


def outbound(text: str = "Olá! Sua consulta é amanhã às 9h. Responda OK ou CANCELAR.", **kw: Any) -> OutboundMessage:
    return OutboundMessage(to=kw.pop("to", TO), text=text, **kw)


# ---------------------------------------------------------------------------------------- send


def test_registered_name_and_flags() -> None:
    assert registry.load("evolution") is EvolutionProvider
    assert EvolutionProvider.name == "evolution"
    assert EvolutionProvider.kinds == ("whatsapp",)
    assert EvolutionProvider.honours_idempotency is False


def test_send_posts_the_documented_request_and_returns_key_id(serve: Any) -> None:
    fake = evo.EvolutionFake()
    with serve(fake) as server:
        result = make(server.url).send(outbound())
    [req] = server.requests
    assert (req.method, req.path) == ("POST", "/message/sendText/clinica")
    assert req.header("apikey") == "global-api-key"
    assert req.header("Content-Type") == "application/json"
    assert req.json() == {"number": "5516999887766",
                          "text": "Olá! Sua consulta é amanhã às 9h. Responda OK ou CANCELAR."}
    assert result.provider_message_id == fake.sent[0]
    assert result.provider_status == "PENDING"


def test_send_is_text_only_even_with_buttons_and_normalises_the_number(serve: Any) -> None:
    fake = evo.EvolutionFake()
    buttons = (Button("confirm:42", "Confirmar"), Button("cancel:42", "Cancelar"))
    with serve(fake) as server:
        make(server.url).send(outbound("Responda OK / CANCELAR", to="(16) 9988-7766", buttons=buttons))
    # Old 8-digit BR mobile gets its 9th digit; Evolution's own onWhatsApp lookup picks the jid.
    assert server.requests[0].json() == {"number": "5516999887766", "text": "Responda OK / CANCELAR"}


def test_instance_name_is_url_quoted_and_base_url_trailing_slash_ignored(serve: Any) -> None:
    fake = evo.EvolutionFake(instance="clínica 2")
    with serve(fake) as server:
        make(server.url + "/", instance="clínica 2").send(outbound())
    assert server.requests[0].path == "/message/sendText/cl%C3%ADnica%202"


def test_not_on_whatsapp_is_permanent(serve: Any) -> None:
    fake = evo.EvolutionFake(not_on_whatsapp={"5516999887766"})
    with serve(fake) as server, pytest.raises(PermanentError) as info:
        make(server.url).send(outbound())
    assert info.value.code == "not_on_whatsapp"
    assert not info.value.channel_broken and not info.value.opt_out
    assert "5516" not in str(info.value)  # no phone number in the message


def test_wrong_api_key_breaks_the_channel(serve: Any) -> None:
    with serve(evo.EvolutionFake()) as server, pytest.raises(PermanentError) as info:
        make(server.url, api_key="nope").send(outbound())
    assert (info.value.code, info.value.channel_broken) == ("unauthorized", True)


def test_missing_instance_breaks_the_channel(serve: Any) -> None:
    with serve(evo.EvolutionFake()) as server, pytest.raises(PermanentError) as info:
        make(server.url, instance="outra").send(outbound())
    assert (info.value.code, info.value.channel_broken) == ("instance_not_found", True)


def test_unknown_route_breaks_the_channel(serve: Any) -> None:
    # base_url pointing at something that is not Evolution v2 → "Cannot POST /…" ([R] src/main.ts).
    with serve(evo.EvolutionFake()) as server, pytest.raises(PermanentError) as info:
        make(server.url + "/v1").send(outbound())
    assert (info.value.code, info.value.channel_broken) == ("not_found", True)


def test_html_404_breaks_the_channel(serve: Any) -> None:
    # Express' default HTML 404 when Evolution runs behind a different router ([I#2242]).
    html = "<!DOCTYPE html><html><body><pre>Cannot POST /message/sendText/clinica</pre></body></html>"
    fake = evo.EvolutionFake(script=[Reply(404, html, headers={"Content-Type": "text/html"})])
    with serve(fake) as server, pytest.raises(PermanentError) as info:
        make(server.url).send(outbound())
    assert (info.value.code, info.value.channel_broken) == ("not_found", True)


def test_schema_error_is_a_permanent_bad_request(serve: Any) -> None:
    # Nested-array message from BadRequestException ([I#2570]).
    fake = evo.EvolutionFake(script=[evo.error(400, [['instance requires property "text"']])])
    with serve(fake) as server, pytest.raises(PermanentError) as info:
        make(server.url).send(outbound())
    assert (info.value.code, info.value.channel_broken) == ("bad_request", False)


@pytest.mark.parametrize("reply", [
    evo.error(400, ["Error: Connection Closed"]),   # 2.3.6 ([I#2229])
    evo.error(500, ["Error: Connection Closed"]),   # 2.3.0 ([I#1772])
    evo.error(500, "Connection Closed"),            # 2.2.3, message as a string ([I#1286])
], ids=["400-2.3.6", "500-array", "500-string"])
def test_connection_closed_is_transient(serve: Any, reply: Reply) -> None:
    with serve(evo.EvolutionFake(script=[reply])) as server, pytest.raises(TransientError) as info:
        make(server.url).send(outbound())
    assert info.value.code == "connection_closed"


def test_server_error_is_transient(serve: Any) -> None:
    # Real 2.2.3 500 body ([I#1412]).
    reply = evo.error(500, "Cannot read properties of undefined (reading 'textMessage')")
    with serve(evo.EvolutionFake(script=[reply])) as server, pytest.raises(TransientError) as info:
        make(server.url).send(outbound())
    assert info.value.code == "http_500"


def test_timeout_is_transient(serve: Any) -> None:
    slow = evo.EvolutionFake(script=[Reply(201, {"key": {"id": "late"}}, delay=1.0)])
    with serve(slow) as server, pytest.raises(TransientError) as info:
        make(server.url, context=ProviderContext(org_id=1, channel_id=7, timeout=0.3,
                                                 public_url="https://lembra.example", egress=LOOPBACK)).send(outbound())
    assert info.value.code == "timeout"


def test_connection_refused_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TransientError) as info:
        make(f"http://127.0.0.1:{port}").send(outbound())
    assert info.value.code == "connection_error"


def test_success_without_an_id_is_neither_transient_nor_permanent(serve: Any) -> None:
    # 2xx: Evolution accepted it, so the outcome is unknown rather than failed or retryable.
    fake = evo.EvolutionFake(script=[Reply(201, {"status": "PENDING"})])
    with serve(fake) as server, pytest.raises(ProviderError) as info:
        make(server.url).send(outbound())
    assert not isinstance(info.value, (TransientError, PermanentError))
    assert info.value.code == "bad_response"


def test_invalid_number_and_empty_text_fail_without_a_request(serve: Any) -> None:
    with serve(evo.EvolutionFake()) as server:
        with pytest.raises(PermanentError) as bad_number:
            make(server.url).send(outbound(to="12"))
        with pytest.raises(PermanentError) as empty:
            make(server.url).send(outbound(text="  "))
    assert (bad_number.value.code, empty.value.code) == ("invalid_number", "empty_text")
    assert server.requests == []


@pytest.mark.parametrize("missing", ["base_url", "api_key", "instance"])
def test_missing_settings_break_the_channel(missing: str) -> None:
    with pytest.raises(PermanentError) as info:
        make(**{missing: None}).send(outbound())
    assert (info.value.code, info.value.channel_broken) == ("not_configured", True)


def test_repr_hides_config() -> None:
    assert "global-api-key" not in repr(make()) and SECRET not in repr(make())


# --------------------------------------------------------------------- connect, health, webhook set


def test_connect_returns_the_qr_code(serve: Any) -> None:
    with serve(evo.EvolutionFake(state="close")) as server:
        info = make(server.url).connect()
    [req] = server.requests
    assert (req.method, req.path, req.header("apikey")) == ("GET", "/instance/connect/clinica", "global-api-key")
    assert info.qr_code_base64 == evo.QR_BASE64 and info.pairing_code is None
    assert info.state == "connecting"


def test_connect_with_a_number_asks_for_a_pairing_code(serve: Any) -> None:
    with serve(evo.EvolutionFake(state="close")) as server:
        info = make(server.url).connect(number="(16) 3333-4444")
    assert server.requests[0].query == {"number": ["551633334444"]}
    assert info.pairing_code == "WZYEH1YY"


def test_connect_when_already_open(serve: Any) -> None:
    with serve(evo.EvolutionFake(state="open")) as server:
        info = make(server.url).connect()
    assert (info.state, info.qr_code_base64) == ("open", None)


def test_connect_error_answered_with_200_is_transient(serve: Any) -> None:
    # connectToWhatsapp catches and answers 200 {"error": true, "message": …} ([R] instance.controller.ts).
    fake = evo.EvolutionFake(script=[Reply(200, {"error": True, "message": "Error: something broke"})])
    with serve(fake) as server, pytest.raises(TransientError) as info:
        make(server.url).connect()
    assert info.value.code == "connect_failed"


@pytest.mark.parametrize("state,ok", [("open", True), ("connecting", False), ("close", False)])
def test_health_reports_the_connection_state(serve: Any, state: str, ok: bool) -> None:
    with serve(evo.EvolutionFake(state=state)) as server:
        health = make(server.url).health()
    assert server.requests[0].path == "/instance/connectionState/clinica"
    assert (health.ok, health.state) == (ok, state)


def test_health_on_error_is_not_ok(serve: Any) -> None:
    with serve(evo.EvolutionFake()) as server:
        health = make(server.url, api_key="nope").health()
    assert (health.ok, health.state, health.detail) == (False, "error", "unauthorized")


def test_configure_webhook_sets_url_events_and_jwt_key(serve: Any) -> None:
    fake = evo.EvolutionFake()
    with serve(fake) as server:
        make(server.url).configure_webhook()
    [req] = server.requests
    assert (req.method, req.path, req.header("apikey")) == ("POST", "/webhook/set/clinica", "global-api-key")
    assert req.json() == {"webhook": {
        "enabled": True,
        "url": "https://lembra.example/webhooks/evolution/7",
        "headers": {"jwt_key": SECRET},
        "byEvents": False,
        "base64": False,
        "events": ["MESSAGES_UPSERT", "MESSAGES_UPDATE", "CONNECTION_UPDATE", "QRCODE_UPDATED"],
    }}
    assert fake.webhook is not None and fake.webhook["events"] == list(WEBHOOK_EVENTS)


def test_configure_webhook_needs_a_secret(serve: Any) -> None:
    with serve(evo.EvolutionFake()) as server, pytest.raises(PermanentError) as info:
        make(server.url, webhook_secret=None).configure_webhook()
    assert info.value.code == "not_configured" and server.requests == []


def test_create_instance(serve: Any) -> None:
    fake = evo.EvolutionFake(instance="existing")
    with serve(fake) as server:
        created = make(server.url, instance="clinica").create_instance()
    [req] = server.requests
    assert (req.method, req.path, req.header("apikey")) == ("POST", "/instance/create", "global-api-key")
    body = req.json()
    assert body["instanceName"] == "clinica" and body["integration"] == "WHATSAPP-BAILEYS"
    assert body["qrcode"] is True and body["groupsIgnore"] is True
    assert body["webhook"]["headers"] == {"jwt_key": SECRET}
    assert body["webhook"]["url"] == "https://lembra.example/webhooks/evolution/7"
    assert created.instance_name == "clinica" and created.instance_id == evo.INSTANCE_ID
    assert created.token == fake.instance_token and created.status == "connecting"
    assert created.connect is not None and created.connect.qr_code_base64 == evo.QR_BASE64
    assert fake.instance_token not in repr(created)


def test_create_instance_with_a_used_name(serve: Any) -> None:
    with serve(evo.EvolutionFake(instance="clinica")) as server, pytest.raises(PermanentError) as info:
        make(server.url).create_instance()
    assert info.value.code == "instance_name_in_use" and not info.value.channel_broken


# ------------------------------------------------------------------------------------ webhooks


def hook(body: Any, *, token: str | None = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> WebhookRequest:
    payload = raw if raw is not None else json.dumps(body).encode()
    all_headers = {"Content-Type": "application/json",
                   "Authorization": f"Bearer {token if token is not None else evo.mint_token(SECRET)}"}
    all_headers.update(headers or {})
    return WebhookRequest("POST", "https://lembra.example/webhooks/evolution/7", all_headers, payload)


def parse(body: Any, **kw: Any) -> list[Any]:
    return list(make().parse_webhook(hook(body, **kw)).events)


def test_inbound_text() -> None:
    # v2 shape: prepareMessage flattens text into `conversation` ([R] prepareMessage).
    [event] = parse(evo.envelope("messages.upsert", evo.upsert({"conversation": "OK"})))
    assert event == InboundMessageEvent(
        provider_message_id="3A5F1C2B9D8E7F60A1B2", from_address="+5516999887766", text="OK",
        timestamp=datetime.fromtimestamp(1796126400, timezone.utc), button_payload=None, in_reply_to=None)


def test_inbound_reply_v2_flattened_with_context() -> None:
    # v2: extendedTextMessage copied into conversation, its contextInfo lifted to data.contextInfo.
    data = evo.upsert({"conversation": "cancelar"}, context_info={
        "stanzaId": "3EB0A1B2C3D4E5F60718", "participant": "551633334444@s.whatsapp.net",
        "quotedMessage": {"conversation": "Sua consulta é amanhã"}})
    [event] = parse(evo.envelope("messages.upsert", data))
    assert (event.text, event.in_reply_to) == ("cancelar", "3EB0A1B2C3D4E5F60718")


def test_inbound_reply_v1_raw_extended_text() -> None:
    # v1.x kept the raw Baileys message ([R] tag 1.8.2): text and contextInfo inside extendedTextMessage.
    data = evo.upsert({"extendedTextMessage": {"text": "SIM", "contextInfo": {"stanzaId": "3EB0FFEE"}}},
                      message_type="extendedTextMessage")
    data.pop("contextInfo")
    data.pop("instanceId")
    data["owner"] = "clinica"
    [event] = parse(evo.envelope("messages.upsert", data))
    assert (event.text, event.in_reply_to) == ("SIM", "3EB0FFEE")


@pytest.mark.parametrize("message,text,payload", [
    ({"buttonsResponseMessage": {"selectedButtonId": "confirm:42", "selectedDisplayText": "Confirmar",
                                 "contextInfo": {"stanzaId": "3EB0A1"}, "type": 1}}, "Confirmar", "confirm:42"),
    ({"templateButtonReplyMessage": {"selectedId": "cancel:42", "selectedDisplayText": "Cancelar",
                                     "selectedIndex": 1, "contextInfo": {"stanzaId": "3EB0A1"}}},
     "Cancelar", "cancel:42"),
    ({"listResponseMessage": {"title": "Confirmar", "listType": 1,
                              "singleSelectReply": {"selectedRowId": "confirm:42"},
                              "contextInfo": {"stanzaId": "3EB0A1"}}}, "Confirmar", "confirm:42"),
], ids=["buttons", "template", "list"])
def test_button_replies(message: dict[str, Any], text: str, payload: str) -> None:
    [kind] = message
    data = evo.upsert(message, message_type=kind, context_info=message[kind]["contextInfo"])
    [event] = parse(evo.envelope("messages.upsert", data))
    assert (event.text, event.button_payload, event.in_reply_to) == (text, payload, "3EB0A1")


def test_button_reply_in_reply_to_from_the_content_when_not_lifted() -> None:
    message = {"buttonsResponseMessage": {"selectedButtonId": "cancel:7", "contextInfo": {"stanzaId": "3EB0B2"}}}
    [event] = parse(evo.envelope("messages.upsert", evo.upsert(message, message_type="buttonsResponseMessage")))
    assert (event.button_payload, event.in_reply_to, event.text) == ("cancel:7", "3EB0B2", None)


def test_brazilian_number_without_the_ninth_digit() -> None:
    # createJid drops the 9 for DDD >= 31 ([R] src/utils/createJid.ts); we store E.164 with it.
    data = evo.upsert({"conversation": "ok"}, remote_jid="553188887777@s.whatsapp.net")
    [event] = parse(evo.envelope("messages.upsert", data))
    assert event.from_address == "+5531988887777"


@pytest.mark.parametrize("key_extra", [
    {"senderPn": "5516999887766@s.whatsapp.net"},
    {"remoteJidAlt": "5516999887766@s.whatsapp.net", "addressingMode": "lid"},  # [I#2588]
    {"senderPn": "5516999887766"},
], ids=["senderPn", "remoteJidAlt", "senderPn-digits"])
def test_lid_chats_use_the_phone_alongside(key_extra: dict[str, Any]) -> None:
    # LID-addressed contacts ([I#2466]).
    data = evo.upsert({"conversation": "ok"}, remote_jid="123456789012345@lid", key_extra=key_extra)
    [event] = parse(evo.envelope("messages.upsert", data))
    assert event.from_address == "+5516999887766"


def test_lid_without_a_phone_is_skipped() -> None:
    data = evo.upsert({"conversation": "ok"}, remote_jid="123456789012345@lid")
    assert parse(evo.envelope("messages.upsert", data)) == []


@pytest.mark.parametrize("data", [
    evo.upsert({"conversation": "ok"}, from_me=True, remote_jid="120363025555555555@g.us",
               key_extra={"participant": "5516999887766@s.whatsapp.net"}),
    evo.upsert({"conversation": "ok"}, remote_jid="120363025555555555@g.us",
               key_extra={"participant": "5516999887766@s.whatsapp.net"}),
    evo.upsert({"conversation": "ok"}, remote_jid="status@broadcast",
               key_extra={"participant": "5516999887766@s.whatsapp.net"}),
    evo.upsert({"reactionMessage": {"key": {"id": "3EB0A1"}, "text": "👍"}}, message_type="reactionMessage"),
    evo.upsert({"protocolMessage": {"type": 0}}, message_type="protocolMessage"),
], ids=["fromMe-group", "group", "status-broadcast", "reaction", "protocol"])
def test_not_patient_messages_are_ignored(data: dict[str, Any]) -> None:
    assert parse(evo.envelope("messages.upsert", data)) == []


def test_a_message_our_own_number_sent_is_flagged_with_the_patient_as_its_address() -> None:
    """`key.fromMe`: the clinic's phone (or the echo of an API send) wrote to the chat's
    `remoteJid`; the engine tells which (engine/messaging/clinic_phone.py)."""
    [event] = parse(evo.envelope("messages.upsert", evo.upsert({"conversation": "Oi, aqui é a recepção"},
                                                                from_me=True, message_id="3EB0FF")))
    assert (event.from_me, event.from_address, event.text, event.provider_message_id) == \
        (True, "+5516999887766", "Oi, aqui é a recepção", "3EB0FF")
    [patient] = parse(evo.envelope("messages.upsert", evo.upsert({"conversation": "ok"})))
    assert patient.from_me is False


def test_media_with_caption_and_without() -> None:
    with_caption = evo.upsert({"imageMessage": {"caption": "OK", "mimetype": "image/jpeg"}}, message_type="imageMessage")
    audio = evo.upsert({"audioMessage": {"seconds": 3, "ptt": True}}, message_type="audioMessage", message_id="AUD1")
    [first] = parse(evo.envelope("messages.upsert", with_caption))
    [second] = parse(evo.envelope("messages.upsert", audio))
    assert first.text == "OK" and (second.text, second.provider_message_id) == (None, "AUD1")


def test_upper_snake_event_name_is_accepted() -> None:
    [event] = parse(evo.envelope("MESSAGES_UPSERT", evo.upsert({"conversation": "OK"})))
    assert isinstance(event, InboundMessageEvent)


@pytest.mark.parametrize("status,expected", [
    ("SERVER_ACK", "sent"), ("DELIVERY_ACK", "delivered"), ("READ", "read"), ("PLAYED", "read"), ("ERROR", "failed"),
    (2, "sent"), (3, "delivered"), (4, "read"), (5, "read"), (0, "failed"),
])
def test_status_updates(status: Any, expected: str) -> None:
    before = datetime.now(timezone.utc)
    [event] = parse(evo.envelope("messages.update", evo.update(status)))
    assert isinstance(event, StatusEvent)
    assert (event.provider_message_id, event.status) == ("3EB0A1B2C3D4E5F60718", expected)
    assert event.timestamp >= before and event.timestamp.tzinfo is not None
    assert event.reference is None
    assert (event.error_code is not None) == (expected == "failed")


@pytest.mark.parametrize("status", ["PENDING", 1, "DELETED", None, "SOMETHING_NEW"])
def test_status_updates_without_an_outcome_are_ignored(status: Any) -> None:
    assert parse(evo.envelope("messages.update", evo.update(status))) == []


def test_status_of_an_inbound_message_is_ignored() -> None:
    assert parse(evo.envelope("messages.update", evo.update("READ", from_me=False))) == []


def test_status_update_v1_shape() -> None:
    # v1.x: `{...key (id, remoteJid, fromMe), status, datetime: Date.now(), owner}` ([R] tag 1.8.2).
    data = {"id": "3EB0C3", "remoteJid": "5516999887766@s.whatsapp.net", "fromMe": True,
            "status": "DELIVERY_ACK", "datetime": 1796126400123, "owner": "clinica"}
    [event] = parse(evo.envelope("messages.update", data))
    assert (event.provider_message_id, event.status) == ("3EB0C3", "delivered")
    assert event.timestamp == datetime.fromtimestamp(1796126400.123, timezone.utc)


@pytest.mark.parametrize("data,state,detail", [
    (evo.connection("open", 200), "open", "200"),
    (evo.connection("close", 401), "close", "401"),
    (evo.connection("close", 515), "close", "515"),
    (evo.connection("connecting"), "connecting", None),
    ({"instance": "clinica", "state": "refused", "statusReason": 500, "wuid": None}, "refused", "500"),
], ids=["open", "logged-out", "restart", "connecting", "qr-limit"])
def test_connection_updates(data: dict[str, Any], state: str, detail: str | None) -> None:
    assert parse(evo.envelope("connection.update", data)) == [ConnectionEvent(state=state, detail=detail)]


def test_qrcode_updates() -> None:
    fresh = {"qrcode": {"instance": "clinica", "pairingCode": None, "code": evo.QR_CODE, "base64": evo.QR_BASE64}}
    limit = {"message": "QR code limit reached, please login again", "statusCode": 500}
    assert parse(evo.envelope("qrcode.updated", fresh)) == [ConnectionEvent(state="qrcode")]
    assert parse(evo.envelope("qrcode.updated", limit)) == [ConnectionEvent(state="qrcode", detail="limit_reached")]


@pytest.mark.parametrize("event", ["send.message", "contacts.update", "chats.upsert", "presence.update",
                                   "messages.delete", "status.instance"])
def test_other_events_are_acknowledged_and_ignored(event: str) -> None:
    result = make().parse_webhook(hook(evo.envelope(event, {"anything": [1, 2]})))
    assert list(result.events) == []
    assert result.response_status == 200


def test_events_of_another_instance_are_ignored() -> None:
    body = evo.envelope("messages.upsert", evo.upsert({"conversation": "OK"}), instance="outra-clinica")
    assert parse(body) == []


# ---------------------------------------------------------------------- token (the "signature")


def test_missing_or_malformed_authorization_is_refused() -> None:
    body = evo.envelope("messages.upsert", evo.upsert({"conversation": "OK"}))
    provider = make()
    request = hook(body)
    no_auth = WebhookRequest("POST", request.url, {"Content-Type": "application/json"}, request.body)
    for req in (no_auth, hook(body, headers={"Authorization": "Basic dXNlcjpwYXNz"}),
                hook(body, headers={"Authorization": "Bearer "}), hook(body, token="not-a-jwt")):
        with pytest.raises(BadSignature):
            provider.parse_webhook(req)


def test_lowercase_header_and_scheme_are_accepted() -> None:
    request = hook(evo.envelope("messages.upsert", evo.upsert({"conversation": "OK"})))
    lowered = WebhookRequest("POST", request.url, {"authorization": "bearer " + evo.mint_token(SECRET)}, request.body)
    assert len(make().parse_webhook(lowered).events) == 1


@pytest.mark.parametrize("token", [
    pytest.param(lambda: evo.mint_token("another-channel-secret-0123456789abcdef"), id="wrong-secret"),
    pytest.param(lambda: evo.mint_token(SECRET, iat=int(time.time()) - 700), id="expired"),
    pytest.param(lambda: evo.mint_token(SECRET, exp=None), id="no-exp"),
    pytest.param(lambda: jwt.encode({"iat": int(time.time()), "exp": int(time.time()) + 600}, SECRET,
                                    algorithm="HS512"), id="other-alg"),
    pytest.param(lambda: jwt.encode({"iat": int(time.time()), "exp": int(time.time()) + 600}, None,
                                    algorithm="none"), id="alg-none"),
    pytest.param(lambda: _tamper(evo.mint_token(SECRET)), id="tampered-claims"),
    pytest.param(lambda: evo.mint_token(SECRET)[:-3], id="truncated-signature"),
])
def test_bad_tokens_are_refused(token: Any) -> None:
    with pytest.raises(BadSignature):
        make().parse_webhook(hook(evo.envelope("messages.upsert", evo.upsert({"conversation": "OK"})),
                                  token=token()))


def _tamper(token: str) -> str:
    """Swap the claims for longer-lived ones, keeping the original signature."""
    import base64

    header, _, signature = token.split(".")
    claims = base64.urlsafe_b64encode(json.dumps(
        {"iat": int(time.time()), "exp": int(time.time()) + 86400, "app": "evolution", "action": "webhook"}
    ).encode()).rstrip(b"=").decode()
    return f"{header}.{claims}.{signature}"


def test_token_within_leeway_is_accepted() -> None:
    # Expired 10 s ago: tolerated clock skew (30 s).
    token = evo.mint_token(SECRET, iat=int(time.time()) - 610)
    assert len(parse(evo.envelope("messages.upsert", evo.upsert({"conversation": "OK"})), token=token)) == 1


def test_without_a_configured_secret_everything_is_refused() -> None:
    provider = make(webhook_secret=None)
    with pytest.raises(BadSignature):
        provider.parse_webhook(hook(evo.envelope("messages.upsert", evo.upsert({"conversation": "OK"}))))


def test_token_does_not_cover_the_body() -> None:
    # Evolution's JWT carries no body digest ([R] generateJwtToken): a body changed in transit
    # under a valid token cannot be detected. Documented limitation, pinned here; TLS is what
    # protects the body.
    body = json.dumps(evo.envelope("messages.upsert", evo.upsert({"conversation": "OK"}))).encode()
    tampered = body.replace(b'"OK"', b'"CANCELAR"')
    [event] = make().parse_webhook(hook(None, raw=tampered)).events
    assert event.text == "CANCELAR"


# ------------------------------------------------------------------------------- malformed bodies


@pytest.mark.parametrize("raw", [
    b'{"event": "messages.upsert", "instance": "clinica", "data": {"key": {"remoteJid": "55',  # truncated
    b"",
    b"[]",
    b'"messages.upsert"',
    b'{"instance": "clinica", "data": {}}',
    b'{"event": 7}',
    b"\xff\xfe\x00garbage",
    b"[" * 100_000,
], ids=["truncated", "empty", "array", "string", "no-event", "event-not-string", "not-utf8", "deep"])
def test_malformed_bodies(raw: bytes) -> None:
    with pytest.raises(MalformedWebhook):
        make().parse_webhook(hook(None, raw=raw))


@pytest.mark.parametrize("data", [
    None, "x", [1], {"key": "x"}, {"key": {"remoteJid": "5516999887766@s.whatsapp.net"}},
    {"key": {"id": "A1", "fromMe": False}},
], ids=["null", "string", "list-of-int", "key-not-object", "no-id", "no-remoteJid"])
def test_malformed_upserts(data: Any) -> None:
    with pytest.raises(MalformedWebhook):
        parse(evo.envelope("messages.upsert", data))


@pytest.mark.parametrize("event,data", [
    ("messages.update", {"status": "READ"}),
    ("messages.update", None),
    ("connection.update", {"statusReason": 401}),
    ("connection.update", "open"),
    ("qrcode.updated", None),
])
def test_malformed_other_events(event: str, data: Any) -> None:
    with pytest.raises(MalformedWebhook):
        parse(evo.envelope(event, data))


def test_five_megabyte_body_is_refused() -> None:
    body = evo.envelope("messages.upsert", evo.upsert({"conversation": "x" * (5 * 1024 * 1024)}))
    with pytest.raises(MalformedWebhook):
        make().parse_webhook(hook(body))


def test_five_megabyte_body_without_a_token_is_a_bad_signature() -> None:
    request = hook(None, raw=b"x" * (5 * 1024 * 1024), headers={"Authorization": "Bearer nope"})
    with pytest.raises(BadSignature):
        make().parse_webhook(request)


# ------------------------------------------------------------------------------------ properties

TOKEN = evo.mint_token(SECRET, ttl=3600)
PROVIDER = make()
SAMPLES = [
    evo.envelope("messages.upsert", evo.upsert({"conversation": "OK"})),
    evo.envelope("messages.upsert", evo.upsert({"buttonsResponseMessage": {"selectedButtonId": "confirm:1"}},
                                               remote_jid="1234@lid", key_extra={"senderPn": "5516999887766"})),
    evo.envelope("messages.upsert", evo.upsert({"extendedTextMessage": {"text": "SIM", "contextInfo": {"stanzaId": "A"}}},
                                               context_info={"stanzaId": "A"})),
    evo.envelope("messages.update", evo.update("DELIVERY_ACK")),
    evo.envelope("messages.update", evo.update(4)),
    evo.envelope("connection.update", evo.connection("close", 401)),
    evo.envelope("qrcode.updated", {"qrcode": {"instance": "clinica", "base64": evo.QR_BASE64}}),
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


def _accepts_or_refuses(request: WebhookRequest) -> None:
    try:
        result = PROVIDER.parse_webhook(request)
    except (BadSignature, MalformedWebhook):
        return
    assert isinstance(result, WebhookResult)
    for event in result.events:
        assert isinstance(event, (InboundMessageEvent, StatusEvent, ConnectionEvent))
        if isinstance(event, (InboundMessageEvent, StatusEvent)):
            assert event.timestamp.tzinfo is not None


def _mutate(value: Any, path: list[int], replacement: Any) -> Any:
    """Replace the node reached by walking `path` (indices into children) with `replacement`."""
    if not path:
        return replacement
    if isinstance(value, dict) and value:
        keys = list(value)
        key = keys[path[0] % len(keys)]
        return {**value, key: _mutate(value[key], path[1:], replacement)}
    if isinstance(value, list) and value:
        index = path[0] % len(value)
        return [*value[:index], _mutate(value[index], path[1:], replacement), *value[index + 1:]]
    return replacement


FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.binary(max_size=2048))
def test_property_arbitrary_bytes(raw: bytes) -> None:
    _accepts_or_refuses(hook(None, raw=raw, token=TOKEN))


@FAST
@given(json_values)
def test_property_arbitrary_json(value: Any) -> None:
    _accepts_or_refuses(hook(value, token=TOKEN))


@FAST
@given(st.sampled_from(["messages.upsert", "messages.update", "connection.update", "qrcode.updated",
                        "MESSAGES_UPSERT", "x"]), json_values)
def test_property_arbitrary_data_for_known_events(event: str, data: Any) -> None:
    _accepts_or_refuses(hook(evo.envelope(event, data), token=TOKEN))


@FAST
@given(st.sampled_from(SAMPLES), st.lists(st.integers(min_value=0, max_value=50), max_size=6), json_values)
def test_property_mutated_samples(sample: dict[str, Any], path: list[int], replacement: Any) -> None:
    _accepts_or_refuses(hook(_mutate(sample, path, replacement), token=TOKEN))


@FAST
@given(st.dictionaries(st.sampled_from(["Authorization", "authorization", "X-Other"]), st.text(max_size=200)),
       st.binary(max_size=256))
def test_property_arbitrary_headers(headers: dict[str, str], raw: bytes) -> None:
    request = WebhookRequest("POST", "https://lembra.example/webhooks/evolution/7", headers, raw)
    _accepts_or_refuses(request)
