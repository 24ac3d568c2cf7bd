"""Evolution API v2 provider: unofficial WhatsApp through a self-hosted Baileys gateway.

Wire format: read from the Evolution API source
(`EvolutionAPI/evolution-api`, release 2.3.6) — "[R] path" below names a file of that source.

Configuration (the channel's decrypted credentials and settings):

- `base_url` (required): the operator's Evolution server, e.g. ``http://evolution:8080``;
- `api_key` (required): sent as the ``apikey`` header — the global key or the instance's own
  token (the ``hash`` that ``/instance/create`` returns); `create_instance()` needs the global one;
- `instance` (required): the instance name in the URL paths;
- `webhook_secret` (required to accept webhooks): Evolution signs nothing, so Lembra registers
  it as the webhook's ``jwt_key`` header and Evolution then sends
  ``Authorization: Bearer <HS256 JWT>`` (claims ``iat``, ``exp = iat + 600``, ``app``,
  ``action: "webhook"``) with each webhook; that token is what `parse_webhook` verifies.

Sends are plain text (Baileys buttons are unreliable; the rendered text already says "responda
OK / CANCELAR"). Evolution has no idempotency key, so a timed-out send may still have gone out.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping
from urllib.parse import quote

import jwt

from gateway.contract import (
    ConnectInfo,
    ConnectionEvent,
    Health,
    InboundMessageEvent,
    Media,
    MediaRef,
    OutboundMessage,
    Provider,
    SendResult,
    StatusEvent,
    WebhookEvent,
    WebhookRequest,
    WebhookResult,
)
from gateway.errors import (
    BadSignature,
    MalformedWebhook,
    PermanentError,
    ProviderError,
    TransientError,
    WebhookError,
)
from gateway.http import Client, HttpResponse, call
from gateway.phones import InvalidPhone, jid_to_e164, normalize_phone, recipient_phone
from gateway.webhook_body import bounded, json_value
from providers.evolution.fields import FIELDS

#: Events Lembra subscribes to (the UPPER_SNAKE form `/webhook/set` takes; [R] `wa.types.ts`).
WEBHOOK_EVENTS = ("MESSAGES_UPSERT", "MESSAGES_UPDATE", "CONNECTION_UPDATE", "QRCODE_UPDATED")
#: Webhooks larger than this are refused (base64 media is switched off, so real ones are small).
MAX_WEBHOOK_BYTES = 1024 * 1024
#: Clock skew tolerated on the webhook token's `exp` / `iat`, seconds.
JWT_LEEWAY_SECONDS = 30

# Baileys' proto.WebMessageInfo.Status numbers and Evolution's string names for them
# ([R] `src/utils/renderStatus.ts`): 0 ERROR, 1 PENDING, 2 SERVER_ACK, 3 DELIVERY_ACK, 4 READ, 5 PLAYED.
_STATUS_NAMES = {0: "ERROR", 1: "PENDING", 2: "SERVER_ACK", 3: "DELIVERY_ACK", 4: "READ", 5: "PLAYED"}
_STATUS_MAP = {"SERVER_ACK": "sent", "DELIVERY_ACK": "delivered", "READ": "read", "PLAYED": "read",
               "ERROR": "failed"}

# Chats that are not one patient: groups, broadcast lists / status, channels.
_NOT_A_PERSON = ("@g.us", "@broadcast", "@newsletter")
# Message wrappers whose inner `message` holds the content.
_WRAPPERS = ("ephemeralMessage", "viewOnceMessage", "viewOnceMessageV2", "viewOnceMessageV2Extension",
             "documentWithCaptionMessage")
# Message kinds that are bookkeeping, not something the patient wrote.
_NOT_CONTENT = frozenset({"protocolMessage", "reactionMessage", "senderKeyDistributionMessage",
                          "messageContextInfo", "pollUpdateMessage", "keepInChatMessage", "editedMessage"})
_CAPTIONED = ("imageMessage", "videoMessage", "documentMessage")


@dataclass(frozen=True)
class CreatedInstance:
    """What `POST /instance/create` answered ([R] `instance.controller.ts` `createInstance`).

    `token` is the instance's own API key (Evolution's ``hash``): store it encrypted as the
    channel's `api_key` if the global key should not stay in Lembra. `connect` carries the first
    QR code when Evolution generated one (``qrcode: true`` on Baileys).
    """

    instance_name: str
    instance_id: str | None
    status: str | None
    token: str | None
    connect: ConnectInfo | None = None

    def __repr__(self) -> str:  # the token is a credential
        return f"CreatedInstance(instance_name={self.instance_name!r}, status={self.status!r})"


class EvolutionProvider(Provider):
    """WhatsApp through Evolution API v2 (Baileys)."""

    name = "evolution"
    kinds = ("whatsapp",)
    honours_idempotency = False
    credential_fields = FIELDS
    checks_connection = True

    _http: Client | None = None

    # ------------------------------------------------------------------ configuration / HTTP

    def _setting(self, key: str) -> str:
        value = self.config.get(key)
        if not isinstance(value, str) or not value.strip():
            raise PermanentError(f"evolution channel has no {key}", code="not_configured", channel_broken=True)
        return value.strip()

    def _url(self, route: str, *, instance: bool = True) -> str:
        base = self._setting("base_url").rstrip("/")
        if not instance:
            return f"{base}/{route}"
        return f"{base}/{route}/{quote(self._setting('instance'), safe='')}"

    def _request(self, method: str, url: str, **kwargs: Any) -> HttpResponse:
        if self._http is None:
            self._http = Client(self.context.egress)
        headers = {"apikey": self._setting("api_key"), "Accept": "application/json"}
        return call(self._http, method, url, timeout=self.context.timeout, classify=classify_error,
                    headers=headers, **kwargs)

    # ------------------------------------------------------------------ send

    def send(self, message: OutboundMessage) -> SendResult:
        """POST /message/sendText/{instance} ``{"number": digits, "text": text}`` → 201, id = key.id.

        Buttons are not sent (text only). [R] `src/validate/message.schema.ts` `textMessageSchema`,
        `src/api/routes/sendMessage.router.ts` (201), `whatsapp.baileys.service.ts` `prepareMessage`.
        """
        try:
            number = recipient_phone(message.to).lstrip("+")
        except InvalidPhone:
            raise PermanentError("recipient is not a valid phone number", code="invalid_number") from None
        if not isinstance(message.text, str) or not message.text.strip():
            # Evolution answers 400 "Text is required"; do not spend a request on it.
            raise PermanentError("message has no text", code="empty_text")
        response = self._request("POST", self._url("message/sendText"),
                                 json={"number": number, "text": message.text})
        body = response.body
        key = body.get("key") if isinstance(body, dict) else None
        provider_id = key.get("id") if isinstance(key, dict) else None
        if not isinstance(provider_id, str) or not provider_id:
            # 2xx means Evolution accepted it, so it may well have gone out: neither a retry nor a
            # failure is safe. A bare ProviderError is neither transient nor permanent; the
            # dispatcher parks it as `unknown` for the operator.
            raise ProviderError("evolution answered without a message id", code="bad_response",
                                outcome_unknown=True)
        status = body.get("status")
        return SendResult(provider_message_id=provider_id,
                          provider_status=status if isinstance(status, str) else None)

    # ------------------------------------------------------------------ media

    def fetch_media(self, media: MediaRef, *, max_bytes: int) -> Media:
        """POST /chat/getBase64FromMediaMessage/{instance} ``{"message": {"key": {"id": …}}}`` →
        ``{"base64": …, "mimetype": …}`` ([R] `chat.controller.ts` `getBase64FromMediaMessage`).

        The answer is base64 in JSON: it is read up to 4/3 of `max_bytes` (plus the envelope) and
        the decoded audio checked again, so a larger voice note stops the read instead of filling memory."""
        if media.size is not None and media.size > max_bytes:
            raise PermanentError("voice note is too large", code="media_too_large")
        try:
            response = self._request("POST", self._url("chat/getBase64FromMediaMessage"),
                                     json={"message": {"key": {"id": media.media_id}}, "convertToMp4": False},
                                     max_bytes=max_bytes * 4 // 3 + 64 * 1024)
        except TransientError as exc:
            if exc.code == "provider_answer_too_large":
                raise PermanentError("voice note is too large", code="media_too_large") from None
            raise
        body = response.body if isinstance(response.body, dict) else {}
        encoded = body.get("base64")
        if not isinstance(encoded, str) or not encoded:
            raise PermanentError("evolution answered without the media", code="bad_response")
        try:
            content = base64.b64decode(encoded.split(",", 1)[-1], validate=False)
        except (binascii.Error, ValueError):
            raise PermanentError("evolution answered media that is not base64", code="bad_response") from None
        if len(content) > max_bytes:
            raise PermanentError("voice note is too large", code="media_too_large")
        mime = _str(body.get("mimetype")) or media.mime_type or "audio/ogg"
        return Media(content=content, mime_type=mime[:100])

    # ------------------------------------------------------------------ instance management

    def connect(self, number: str | None = None) -> ConnectInfo:
        """GET /instance/connect/{instance}[?number=] → the QR code (and pairing code with `number`).

        `qr_code_base64` is what Evolution returns: a ``data:image/png;base64,…`` URI, usable as
        an ``<img src>`` directly. When the instance is already open, only `state="open"` is set.
        [R] `instance.controller.ts` `connectToWhatsapp`, `whatsapp.baileys.service.ts` getter `qrCode`.
        """
        params: dict[str, str] = {}
        if number:
            try:
                params["number"] = normalize_phone(number).lstrip("+")
            except InvalidPhone:
                raise PermanentError("pairing number is not a valid phone number", code="invalid_number") from None
        response = self._request("GET", self._url("instance/connect"), params=params or None)
        body = response.body if isinstance(response.body, dict) else {}
        if body.get("error") is True:
            # connectToWhatsapp catches its errors and answers 200 {"error": true, "message": …}.
            raise TransientError("evolution could not start the connection", code="connect_failed")
        return _connect_info(body)

    def health(self) -> Health:
        """GET /instance/connectionState/{instance} → ``{"instance": {"state": "open"|"connecting"|"close"}}``."""
        try:
            response = self._request("GET", self._url("instance/connectionState"))
        except ProviderError as exc:
            return Health(ok=False, state="error", detail=exc.code)
        body = response.body if isinstance(response.body, dict) else {}
        instance = body.get("instance") if isinstance(body.get("instance"), dict) else {}
        state = instance.get("state") if isinstance(instance.get("state"), str) else None
        if state is None:
            return Health(ok=False, state="error", detail="bad_response")
        return Health(ok=state == "open", state=state)

    def _webhook_config(self) -> dict[str, Any]:
        secret = self.config.get("webhook_secret")
        if not isinstance(secret, str) or not secret:
            raise PermanentError("evolution channel has no webhook_secret", code="not_configured")
        # [R] `webhook.controller.ts`: a `jwt_key` entry in `headers` is removed from the headers
        # sent and replaced by `Authorization: Bearer <jwt signed with it>`.
        return {
            "enabled": True,
            "url": self.webhook_url,
            "headers": {"jwt_key": secret},
            "byEvents": False,
            "base64": False,
            "events": list(WEBHOOK_EVENTS),
        }

    def configure_webhook(self) -> None:
        """POST /webhook/set/{instance} ``{"webhook": {enabled, url, headers: {jwt_key}, byEvents,
        base64, events}}`` (the body must be wrapped in "webhook": [I#1657]; fields:
        [R] `src/api/integrations/event/event.dto.ts`)."""
        self._request("POST", self._url("webhook/set"), json={"webhook": self._webhook_config()})

    def create_instance(self) -> CreatedInstance:
        """POST /instance/create for a Baileys instance named `instance`, webhook included.

        Needs the global API key. Returns a `CreatedInstance` (name, id, status, the instance
        token, and the first QR code when Evolution made one). A name already in use → 403 →
        PermanentError `instance_name_in_use`.
        """
        body = {
            "instanceName": self._setting("instance"),
            "integration": "WHATSAPP-BAILEYS",
            "qrcode": True,
            "groupsIgnore": True,
            "webhook": self._webhook_config(),
        }
        response = self._request("POST", self._url("instance/create", instance=False), json=body)
        data = response.body if isinstance(response.body, dict) else {}
        instance = data.get("instance") if isinstance(data.get("instance"), dict) else {}
        qrcode = data.get("qrcode")
        return CreatedInstance(
            instance_name=_str(instance.get("instanceName")) or self._setting("instance"),
            instance_id=_str(instance.get("instanceId")),
            status=_str(instance.get("status")),
            token=_str(data.get("hash")),
            connect=_connect_info(qrcode) if isinstance(qrcode, dict) else None,
        )

    # ------------------------------------------------------------------ webhooks

    def parse_webhook(self, request: WebhookRequest) -> WebhookResult:
        """Verify the Bearer JWT, then parse Evolution's ``{event, instance, data, …}`` envelope."""
        self._verify_token(request)
        envelope = json_value(bounded(request.body, MAX_WEBHOOK_BYTES))
        try:
            return WebhookResult(events=self._events(envelope))
        except WebhookError:
            raise
        except Exception:  # never let odd input escape as anything but a 400
            raise MalformedWebhook("body is not what Evolution documents") from None

    def _verify_token(self, request: WebhookRequest) -> None:
        secret = self.config.get("webhook_secret")
        if not isinstance(secret, str) or not secret:
            raise BadSignature("no webhook secret configured")
        header = request.header("Authorization")
        if not isinstance(header, str):
            raise BadSignature("missing bearer token")
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise BadSignature("missing bearer token")
        try:
            jwt.decode(token, secret, algorithms=["HS256"], leeway=JWT_LEEWAY_SECONDS,
                       options={"require": ["exp", "iat"]})
        except Exception:  # PyJWTError, and anything odd a hostile token provokes
            raise BadSignature("webhook token does not verify") from None

    def _events(self, envelope: Any) -> list[WebhookEvent]:
        if not isinstance(envelope, dict):
            raise MalformedWebhook("body is not a JSON object")
        event = envelope.get("event")
        if not isinstance(event, str) or not event:
            raise MalformedWebhook("missing event")
        instance = envelope.get("instance")
        expected = self.config.get("instance")
        if isinstance(instance, str) and isinstance(expected, str) and expected and instance != expected:
            # Another instance's event (a shared/global webhook URL): not this channel's to store.
            return []
        # "messages.upsert" (what Evolution sends) and "MESSAGES_UPSERT" (the subscription form).
        kind = event.replace(".", "_").replace("-", "_").upper()
        data = envelope.get("data")
        if kind == "MESSAGES_UPSERT":
            return [e for item in _items(data, "messages") if (e := _inbound(item)) is not None]
        if kind == "MESSAGES_UPDATE":
            return [e for item in _items(data, None) if (e := _status(item)) is not None]
        if kind == "CONNECTION_UPDATE":
            return [_connection(data)]
        if kind == "QRCODE_UPDATED":
            return [_qrcode(data)]
        return []  # send.message, contacts.*, chats.*, … : acknowledged, ignored


# ---------------------------------------------------------------------- error classification


def classify_error(response: HttpResponse) -> ProviderError | None:
    """Evolution's error envelope ``{"status", "error", "response": {"message": …}}`` ([R] `src/main.ts`)."""
    status = response.status
    message = _envelope_message(response.body)
    if _mentions(message, "connection closed") or (response.body is None and "Connection Closed" in response.text):
        # Baileys' socket is down; Evolution reconnects by itself for most close reasons
        # (400 on 2.3.6 [I#2229], 500 on 2.2.x/2.3.0 [I#1286], [I#1772]).
        return TransientError("evolution instance connection closed", code="connection_closed")
    if status == 400:
        if _not_on_whatsapp(message):
            # sendMessageWithTyping: `throw new BadRequestException(isWA)` with exists:false ([I#2111]).
            return PermanentError("recipient is not on WhatsApp", code="not_on_whatsapp")
        return PermanentError("evolution refused the request", code="bad_request")
    if status == 401:
        return PermanentError("evolution refused the API key", code="unauthorized", channel_broken=True)
    if status == 403:
        if _mentions(message, "already in use"):
            return PermanentError("instance name already in use", code="instance_name_in_use")
        return PermanentError("evolution forbade the request", code="forbidden", channel_broken=True)
    if status == 404:
        if _mentions(message, "does not exist"):
            return PermanentError("evolution instance does not exist", code="instance_not_found",
                                  channel_broken=True)
        # "Cannot POST /…": base_url points at something that is not Evolution v2.
        return PermanentError("evolution route not found", code="not_found", channel_broken=True)
    return None  # 429 / 5xx / others: the shared mapping (transient for 5xx and 429)


def _envelope_message(body: Any) -> Any:
    if isinstance(body, dict):
        inner = body.get("response")
        if isinstance(inner, dict) and "message" in inner:
            return inner["message"]
        if "message" in body:
            return body["message"]
    return body


def _walk(value: Any, depth: int = 0) -> Iterable[Any]:
    if depth > 6:
        return
    yield value
    if isinstance(value, list):
        for item in value[:50]:
            yield from _walk(item, depth + 1)


def _mentions(message: Any, needle: str) -> bool:
    return any(isinstance(v, str) and needle in v.lower() for v in _walk(message))


def _not_on_whatsapp(message: Any) -> bool:
    return any(isinstance(v, dict) and v.get("exists") is False for v in _walk(message))


# ---------------------------------------------------------------------- webhook parsing helpers


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _items(data: Any, list_key: str | None) -> list[Any]:
    """`data` is one object in v2; tolerate a list (or ``{"messages": [...]}``) of them."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        if list_key and isinstance(data.get(list_key), list) and "key" not in data:
            return data[list_key]
        return [data]
    raise MalformedWebhook("data is not an object")


def _timestamp(value: Any) -> datetime:
    """Unix seconds (number, numeric string or a protobuf Long {low, high}); receipt time if absent."""
    try:
        seconds: float | None = None
        if isinstance(value, bool):
            seconds = None
        elif isinstance(value, (int, float)):
            seconds = float(value)
        elif isinstance(value, str) and value.strip().isdigit() and len(value.strip()) < 20:
            seconds = float(value.strip())
        elif isinstance(value, dict) and isinstance(value.get("low"), int) and isinstance(value.get("high"), int):
            seconds = float((value["high"] << 32) + (value["low"] & 0xFFFFFFFF))
        if seconds is not None and seconds > 1e11:  # milliseconds (v1 `datetime: Date.now()`)
            seconds /= 1000
        if seconds is not None and math.isfinite(seconds) and seconds > 0:
            return datetime.fromtimestamp(seconds, timezone.utc)
    except (OverflowError, OSError, ValueError):
        pass
    return datetime.now(timezone.utc)


def _phone_of(key: dict[str, Any], item: dict[str, Any]) -> str | None:
    """E.164 of the chat partner, or None (groups, broadcasts, a LID with no phone alongside).

    `remoteJid` may be ``<n>@lid`` ([I#2466]); Evolution/Baileys then carry the phone JID as
    `key.senderPn` (Evolution 2.x) or `key.remoteJidAlt` (Baileys 7, [I#2588]).
    """
    remote = _str(key.get("remoteJid"))
    if remote is None:
        raise MalformedWebhook("message key has no remoteJid")
    lowered = remote.lower()
    if any(marker in lowered for marker in _NOT_A_PERSON):
        return None
    candidates = [remote] if not lowered.endswith("@lid") else []
    candidates += [key.get("remoteJidAlt"), key.get("senderPn"), item.get("senderPn"), item.get("remoteJidAlt")]
    for candidate in candidates:
        if not isinstance(candidate, str) or not candidate:
            continue
        if "@" not in candidate and candidate.isdigit():
            candidate = candidate + "@s.whatsapp.net"
        try:
            return jid_to_e164(candidate)
        except InvalidPhone:
            continue
    return None


def _content(message: dict[str, Any]) -> dict[str, Any]:
    for _ in range(3):
        for wrapper in _WRAPPERS:
            inner = _dict(message.get(wrapper)).get("message")
            if isinstance(inner, dict):
                message = inner
                break
        else:
            return message
    return message


def _text_and_button(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """(text, button payload) from a Baileys message, v2-flattened or raw."""
    buttons = _dict(message.get("buttonsResponseMessage"))
    if buttons:
        return _str(buttons.get("selectedDisplayText")), _str(buttons.get("selectedButtonId"))
    template = _dict(message.get("templateButtonReplyMessage"))
    if template:
        return _str(template.get("selectedDisplayText")), _str(template.get("selectedId"))
    listed = _dict(message.get("listResponseMessage"))
    if listed:
        row = _str(_dict(listed.get("singleSelectReply")).get("selectedRowId"))
        return _str(listed.get("title")), row
    interactive = _dict(_dict(message.get("interactiveResponseMessage")).get("nativeFlowResponseMessage"))
    if interactive:
        try:
            params = json.loads(interactive.get("paramsJson") or "null")
        except (TypeError, ValueError, RecursionError):
            params = None
        return None, _str(_dict(params).get("id"))
    text = _str(message.get("conversation"))
    if text is None:
        text = _str(_dict(message.get("extendedTextMessage")).get("text"))
    if text is None:
        for kind in _CAPTIONED:
            text = _str(_dict(message.get(kind)).get("caption"))
            if text is not None:
                break
    return text, None


def _reply_target(item: dict[str, Any], message: dict[str, Any]) -> str | None:
    """The id of the message replied to: `data.contextInfo.stanzaId` (v2 lifts the content's
    contextInfo to the top, [R] `prepareMessage`), else the content's own contextInfo (v1/raw)."""
    stanza = _str(_dict(item.get("contextInfo")).get("stanzaId"))
    if stanza:
        return stanza
    for value in message.values():
        stanza = _str(_dict(_dict(value).get("contextInfo")).get("stanzaId"))
        if stanza:
            return stanza
    return None


def _inbound(item: Any) -> InboundMessageEvent | None:
    """One `messages.upsert` data object → an inbound message, or None when it is not one."""
    if not isinstance(item, dict):
        raise MalformedWebhook("message is not an object")
    key = item.get("key")
    if not isinstance(key, dict):
        raise MalformedWebhook("message has no key")
    message_id = _str(key.get("id"))
    if message_id is None:
        raise MalformedWebhook("message key has no id")
    # Our own number wrote (the clinic's phone, WhatsApp Web, or the echo of an API send): kept,
    # flagged; the engine tells an echo of its own send from a person at the clinic.
    from_me = key.get("fromMe") is True
    phone = _phone_of(key, item)
    if phone is None:
        return None
    raw = item.get("message")
    if not isinstance(raw, dict):
        return None  # stubs / notifications without content
    message = _content(raw)
    if not message or all(kind in _NOT_CONTENT for kind in message):
        return None
    text, button = _text_and_button(message)
    return InboundMessageEvent(
        provider_message_id=message_id,
        from_address=phone,
        text=text,
        timestamp=_timestamp(item.get("messageTimestamp")),
        button_payload=button,
        in_reply_to=_reply_target(item, message),
        from_me=from_me,
        audio=_audio(message_id, message),
    )


def _audio(message_id: str, message: dict[str, Any]) -> MediaRef | None:
    """A voice note (`audioMessage`, Baileys' `seconds` and `fileLength`), downloaded later by the
    message's key id."""
    audio = _dict(message.get("audioMessage"))
    if not audio:
        return None

    def number(value: Any) -> int | None:
        if isinstance(value, str) and value.isdigit():
            return int(value)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and \
            math.isfinite(value) and value >= 0 else None

    mime = _str(audio.get("mimetype"))
    return MediaRef(media_id=message_id, mime_type=mime[:100] if mime else None,
                    seconds=number(audio.get("seconds")), size=number(audio.get("fileLength")))


def _status_name(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return _STATUS_NAMES.get(value)
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.isdigit():
            return _STATUS_NAMES.get(int(stripped)) if len(stripped) < 3 else None
        return stripped.upper()
    return None


def _status(item: Any) -> StatusEvent | None:
    """One `messages.update` data object → a status event, or None (PENDING, DELETED, inbound)."""
    if not isinstance(item, dict):
        raise MalformedWebhook("update is not an object")
    key = _dict(item.get("key"))
    # v2: `keyId` is the WhatsApp id (`messageId` is Evolution's DB row); v1 spread the key.
    message_id = _str(item.get("keyId")) or _str(key.get("id")) or _str(item.get("id"))
    if message_id is None:
        raise MalformedWebhook("update has no message id")
    from_me = item.get("fromMe", key.get("fromMe"))
    if from_me is False:
        return None  # a receipt about a message the patient sent, not one of ours
    name = _status_name(item.get("status"))
    status = _STATUS_MAP.get(name or "")
    if status is None:
        return None
    return StatusEvent(
        provider_message_id=message_id,
        status=status,  # type: ignore[arg-type]
        timestamp=_timestamp(item.get("datetime")),
        error_code="ERROR" if status == "failed" else None,
        error_permanent=True,
    )


def _connection(data: Any) -> ConnectionEvent:
    """`connection.update` → ConnectionEvent(state open|connecting|close|refused, detail=statusReason)."""
    if not isinstance(data, dict):
        raise MalformedWebhook("data is not an object")
    state = _str(data.get("state"))
    if state is None:
        raise MalformedWebhook("connection update has no state")
    reason = data.get("statusReason")
    detail = str(reason) if isinstance(reason, (int, str)) and not isinstance(reason, bool) else None
    return ConnectionEvent(state=state[:40], detail=detail[:100] if detail else None)


def _qrcode(data: Any) -> ConnectionEvent:
    """`qrcode.updated` → ConnectionEvent("qrcode"); detail "limit_reached" when Evolution gave up."""
    if not isinstance(data, dict):
        raise MalformedWebhook("data is not an object")
    if "qrcode" not in data and ("message" in data or "statusCode" in data):
        return ConnectionEvent(state="qrcode", detail="limit_reached")
    return ConnectionEvent(state="qrcode")


def _connect_info(body: Mapping[str, Any]) -> ConnectInfo:
    instance = body.get("instance")
    if isinstance(instance, dict) and isinstance(instance.get("state"), str):
        return ConnectInfo(state=instance["state"])  # already open (connectionState object)
    return ConnectInfo(
        qr_code_base64=_str(body.get("base64")),
        pairing_code=_str(body.get("pairingCode")),
        state="connecting",
    )
