"""Zenvia API v2, SMS channel.

Wire format: Zenvia's published OpenAPI spec (zenvia-openapi-spec; sections cited below as §n, see
tests/fixtures/providers/README.md).

Config keys:
- `api_token` (required): sent as `X-API-TOKEN` on every request (§1).
- `from` (required): the SMS sender's account alias / keyword (§1).
- `base_url` (optional, default https://api.zenvia.com): tests point it at a loopback fake.
- `signature_secret` (optional): the token secret of a Zenvia *signature token*; when set every
  request also carries `Date` and `X-API-Signature` = base64(HMAC-SHA256(secret, string-to-sign))
  (§1 "Optional request signing"; Zenvia refuses unsigned requests made with such a token).
- `webhook_secret` (required to accept webhooks): Zenvia does not sign its webhooks (§3: "No HMAC
  signature on webhooks is defined"), so Lembra requires a shared secret that Zenvia sends back
  as a custom header. Create both subscriptions (`POST /v2/subscriptions`, eventType `MESSAGE` with
  criteria {channel: sms, direction: IN} and eventType `MESSAGE_STATUS` with criteria
  {channel: sms}) with `webhook.url` = this channel's webhook URL and
  `webhook.headers` = {"X-Lembra-Webhook-Secret": <webhook_secret>}. Without a configured
  secret every webhook is refused (401).

Sends put `OutboundMessage.reference` in `externalId`; Zenvia echoes it in status events
(`message.externalId`), which comes back as `StatusEvent.reference`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
from datetime import datetime, timezone
from email.utils import formatdate
from typing import Any, Mapping
from urllib.parse import urlsplit

from gateway.contract import (
    InboundMessageEvent,
    OutboundMessage,
    Provider,
    SendResult,
    StatusEvent,
    WebhookRequest,
    WebhookResult,
)
from gateway.errors import (
    BadSignature,
    MalformedWebhook,
    PermanentError,
    ProviderError,
    TransientError,
)
from gateway.http import Client, HttpResponse, call, default_error
from gateway.phones import InvalidPhone, normalize_phone, recipient_phone
from gateway.webhook_body import bounded, json_object
from providers.sms.fields import ZENVIA_FIELDS

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.zenvia.com"
SEND_PATH = "/v2/channels/sms/messages"
#: The header Lembra asks Zenvia to send with every webhook (set in the subscription).
WEBHOOK_SECRET_HEADER = "X-Lembra-Webhook-Secret"
MAX_WEBHOOK_BYTES = 256 * 1024

#: messageStatus.code → (our status, error_permanent) (§3). Codes not listed (ACCEPTED, DELETED,
#: VERIFIED, the voice-only HANG_UP/TERMINATED/RECORDED, anything new) carry no news: ignored.
STATUS_MAP: dict[str, tuple[str, bool]] = {
    "SENT": ("sent", True),
    "DELIVERED": ("delivered", True),
    "READ": ("read", True),
    # A tracked link in the SMS was opened: it was read.
    "CLICKED": ("read", True),
    # Zenvia (or the carrier) refused the message: sending it again will not help.
    "REJECTED": ("failed", True),
    # The carrier gave up (handset off/out of coverage past validity): a later attempt may work.
    "NOT_DELIVERED": ("failed", False),
}


# --- request signing (§1 "Signature") ------------------------------------------------------------


def string_to_sign(method: str, body_md5: str, content_type: str, date: str, host: str, resource: str) -> str:
    """Zenvia's six-line string to sign: no trailing newline; body lines empty without a body."""
    return "\n".join((method.upper(), body_md5, content_type, date, host, resource))


def request_signature(secret: str, method: str, body: bytes | None, content_type: str, date: str, host: str,
                      resource: str) -> str:
    """X-API-Signature for one request."""
    if body:
        md5, ctype = hashlib.md5(body).hexdigest(), content_type
    else:
        md5, ctype = "", ""
    text = string_to_sign(method, md5, ctype, date, host, resource)
    return base64.b64encode(hmac.new(secret.encode("utf-8"), text.encode("utf-8"), hashlib.sha256).digest()).decode()


# --- the provider --------------------------------------------------------------------------------


class ZenviaProvider(Provider):
    """SMS through Zenvia's v2 API; MESSAGE and MESSAGE_STATUS webhooks authenticated by a shared header."""

    name = "zenvia"
    kinds = ("sms",)
    credential_fields = ZENVIA_FIELDS
    # `externalId` is echoed back but does not make Zenvia refuse a duplicate send.
    honours_idempotency = False

    _http: Client | None = None

    @property
    def http(self) -> Client:
        if self._http is None:
            self._http = Client(self.context.egress)
        return self._http

    @property
    def base_url(self) -> str:
        return str(self.config.get("base_url") or DEFAULT_BASE_URL).rstrip("/")

    # -- send (§1, §2) --

    def send(self, message: OutboundMessage) -> SendResult:
        token = self.config.get("api_token")
        sender = self.config.get("from")
        if not isinstance(token, str) or not token or not sender:
            raise PermanentError("zenvia channel lacks api_token or from", code="config_missing", channel_broken=True)
        try:
            to = recipient_phone(message.to).lstrip("+")  # SMS `to`: country code + number, digits only
        except InvalidPhone:
            raise PermanentError("recipient is not a valid phone number", code="invalid_number") from None
        payload: dict[str, Any] = {
            "from": str(sender),
            "to": to,
            # SMS has no buttons: the rendered text already tells the patient what to reply.
            "contents": [{"type": "text", "text": message.text}],
        }
        if message.reference:
            payload["externalId"] = message.reference
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        headers = {"X-API-TOKEN": token, "Content-Type": "application/json"}
        secret = self.config.get("signature_secret")
        if secret:
            date = formatdate(usegmt=True)
            headers["Date"] = date
            headers["X-API-Signature"] = request_signature(
                str(secret), "POST", body, "application/json", date, urlsplit(self.base_url).hostname or "",
                urlsplit(self.base_url).path.rstrip("/") + SEND_PATH,
            )
        response = call(self.http, "POST", self.base_url + SEND_PATH, timeout=self.context.timeout,
                        classify=classify_error, data=body, headers=headers)
        result = response.body if isinstance(response.body, dict) else {}
        provider_id = result.get("id")
        if isinstance(provider_id, (str, int)) and not isinstance(provider_id, bool) and str(provider_id):
            return SendResult(provider_message_id=str(provider_id))
        # A 200 whose body is an error object (§2, courier's "No External ID" case).
        error = _error_from_body(result, response.status)
        if error is not None:
            raise error
        raise PermanentError("zenvia accepted the request but returned no message id", code="no_message_id")

    # -- webhooks (§3) --

    def parse_webhook(self, request: WebhookRequest) -> WebhookResult:
        secret = self.config.get("webhook_secret")
        if not isinstance(secret, str) or not secret:
            raise BadSignature("no webhook secret configured for this zenvia channel")
        given = request.header(WEBHOOK_SECRET_HEADER) or ""
        if not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), secret.encode("utf-8")):
            raise BadSignature("webhook secret does not match")
        data = json_object(bounded(request.body or b"", MAX_WEBHOOK_BYTES))
        kind = data.get("type")
        if not isinstance(kind, str) or not kind:
            raise MalformedWebhook("event without type")
        if kind == "MESSAGE_STATUS":
            return WebhookResult(events=_status_events(data))
        if kind == "MESSAGE":
            return WebhookResult(events=_inbound_events(data))
        return WebhookResult()  # another subscription's event type: nothing for us


def classify_error(response: HttpResponse) -> ProviderError | None:
    """Zenvia's error object `{code, message, details}` (§2) → typed error; message never copied."""
    if response.status == 429:
        return default_error(response)  # transient, with Retry-After
    body = response.body if isinstance(response.body, dict) else {}
    return _error_from_body(body, response.status) or default_error(response)


def _error_from_body(body: Mapping[str, Any], status: int) -> ProviderError | None:
    raw = body.get("code")
    if not isinstance(raw, (str, int)) or isinstance(raw, bool) or not str(raw):
        return None
    code = str(raw)[:64]
    if status >= 500 or code == "INTERNAL_ERROR":
        return TransientError(f"zenvia internal error (HTTP {status})", code=code)
    if status == 401 or code == "AUTHENTICATION_ERROR":
        return PermanentError("zenvia refused the api token", code=code, channel_broken=True)
    if status == 403:
        return PermanentError("zenvia refused the request (HTTP 403)", code=code, channel_broken=True)
    return PermanentError(f"zenvia refused the message ({code})", code=code)


def _status_events(data: Mapping[str, Any]) -> list[StatusEvent]:
    message = data.get("message") if isinstance(data.get("message"), dict) else {}
    message_id = _string(message.get("id")) or _string(data.get("messageId"))  # messageId: deprecated form
    if not message_id:
        raise MalformedWebhook("status event without message id")
    status_obj = data.get("messageStatus")
    if not isinstance(status_obj, dict):
        raise MalformedWebhook("status event without messageStatus")
    code = status_obj.get("code")
    if not isinstance(code, str):
        raise MalformedWebhook("status event without code")
    mapped = STATUS_MAP.get(code.strip().upper())
    if mapped is None:
        return []
    status, permanent = mapped
    timestamp = _timestamp(status_obj.get("timestamp")) or _timestamp(data.get("timestamp")) or _now()
    reference = _string(message.get("externalId"))
    if status != "failed":
        return [StatusEvent(provider_message_id=message_id, status=status, timestamp=timestamp,  # type: ignore[arg-type]
                            reference=reference)]
    error_code = code.strip().upper()
    causes = status_obj.get("causes")
    if isinstance(causes, list):
        for cause in causes:
            channel_code = _string(cause.get("channelErrorCode")) if isinstance(cause, dict) else None
            if channel_code:
                error_code = channel_code[:64]
                break
    return [StatusEvent(provider_message_id=message_id, status="failed", timestamp=timestamp,
                        error_code=error_code, error_permanent=permanent, reference=reference)]


def _inbound_events(data: Mapping[str, Any]) -> list[InboundMessageEvent]:
    message = data.get("message")
    if not isinstance(message, dict):
        raise MalformedWebhook("message event without message")
    if "OUT" in (_string(data.get("direction")), _string(message.get("direction"))):
        return []  # a message our own sender sent (a MESSAGE subscription without direction criteria)
    sender = _string(message.get("from"))
    if not sender:
        raise MalformedWebhook("message without from")
    contents = message.get("contents")
    if not isinstance(contents, list):
        raise MalformedWebhook("message without contents")
    # Several contents may come in one message; the text is not necessarily the first (§3).
    texts: list[str] = []
    payload: str | None = None
    for content in contents:
        if not isinstance(content, dict) or content.get("type") != "text":
            continue
        text = content.get("text")
        if isinstance(text, str) and text:
            texts.append(text)
        if payload is None:
            payload = _string(content.get("payload"))
    message_id = _string(message.get("id")) or _string(data.get("id"))  # event id is stable across retries
    if not message_id:
        raise MalformedWebhook("message without id")
    digits = sender.strip()
    try:
        from_address = normalize_phone("+" + digits if digits.isdigit() else digits)
    except (InvalidPhone, ValueError, TypeError):
        log.info("zenvia inbound from a non-phone sender ignored", extra={"provider_message_id": message_id})
        return []
    timestamp = _timestamp(message.get("timestamp")) or _timestamp(data.get("timestamp")) or _now()
    return [InboundMessageEvent(
        provider_message_id=message_id,
        from_address=from_address,
        text="\n".join(texts) if texts else None,
        timestamp=timestamp,
        button_payload=payload,
    )]


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _timestamp(value: Any) -> datetime | None:
    """An ISO 8601 timestamp (`Z` or an offset like -03:00) as aware UTC; None when absent or bad."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return parsed.astimezone(timezone.utc)
    except (ValueError, TypeError, OverflowError):
        return None


def _now() -> datetime:
    return datetime.now(timezone.utc)
