"""Resend (https://resend.com): `POST /emails` over HTTPS and Svix-signed status webhooks.

Config keys (the channel's decrypted settings):
- `api_key` (`re_…`), `from_email`, optional `from_name`
- `webhook_secret`: the endpoint's Svix signing secret (`whsec_…`); without it every webhook is refused
- `base_url`: default https://api.resend.com (tests point it at a loopback fake)

Idempotency: every send carries `Idempotency-Key: <message.idempotency_key>`. Resend keeps keys for
**24 hours**: a repeat within that window returns the first response (the same email id) without
sending again; after 24 hours the key is forgotten and a repeat would send. The payload must be
identical on a retry — the same key with a different body is refused (409
`invalid_idempotent_request`), so everything we put in the request is deterministic. Keys over
Resend's 256-character limit (or not plain ASCII) are replaced by their SHA-256.

Our message reference goes out as the tag `lembra_ref`; Resend echoes tags in webhooks, so status
events carry `reference` (it resolves sends whose outcome we never saw).

Status webhooks: email.sent → sent; email.delivered → delivered; email.bounced → failed (hard
bounce permanent, `opt_out=False`); email.complained → failed with `opt_out=True` (a spam complaint
is an opt-out of email); email.failed / email.suppressed → failed. Ignored (no event):
email.delivery_delayed (Resend keeps trying; a later event settles it), email.opened and
email.clicked — opens are NOT mapped to `read`: open tracking is a pixel that image proxies
(Apple Mail Privacy Protection, Gmail) fetch on their own and that image blocking hides, so it
says nothing reliable about a person reading. Also ignored: email.received and contact/domain events.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from datetime import datetime, timezone
from typing import Any, Callable

from gateway.contract import (
    Health,
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
from gateway.http import Client, HttpResponse, call, retry_after_seconds
from gateway.webhook_body import json_object
from providers.email import mime
from providers.email.fields import RESEND_FIELDS

DEFAULT_BASE_URL = "https://api.resend.com"
#: Svix: timestamps further than this from our clock (either way) are refused (replay protection).
TOLERANCE_SECONDS = 5 * 60
#: Resend event bodies are a few hundred bytes; anything near this is not Resend.
MAX_WEBHOOK_BODY = 256 * 1024
REFERENCE_TAG = "lembra_ref"
_TAG_VALUE = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_KEY_OK = re.compile(r"^[\x21-\x7e]{1,256}$")
_ERROR_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_SVIX_ID = re.compile(r"^[\x21-\x7e]{1,256}$")
_DIGITS = re.compile(r"^[0-9]{1,15}$")
_NEEDS_QUOTES = re.compile(r'[()<>@,;:\\".\[\]]')


class ResendProvider(Provider):
    """Resend's HTTP API with its idempotency key; Svix-verified webhooks."""

    name = "resend"
    kinds = ("email",)
    honours_idempotency = True
    credential_fields = RESEND_FIELDS
    checks_connection = True
    #: The clock of the Svix timestamp check (seconds since the epoch); tests replace it.
    now: Callable[[], float] = staticmethod(time.time)

    def __init__(self, config: Any, context: Any) -> None:
        super().__init__(config, context)
        self._http = Client(self.context.egress)

    # -- connection check -----------------------------------------------------------------------

    def check(self) -> Health:
        """GET /domains with the key: 200, or 401 `restricted_api_key` (a sending-only key, which
        is enough), means Resend knows the key; anything else raises the typed error."""
        api_key = self._api_key()
        try:
            call(self._http, "GET", f"{self.base_url}/domains", timeout=self.context.timeout,
                 classify=classify, headers={"Authorization": f"Bearer {api_key}", "User-Agent": "lembra"})
        except PermanentError as exc:
            if exc.code != "restricted_api_key":
                raise
        return Health(ok=True, state="ok")

    # -- send ---------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return str(self.config.get("base_url") or DEFAULT_BASE_URL).rstrip("/")

    def _api_key(self) -> str:
        key = str(self.config.get("api_key") or "").strip()
        if not key:
            raise PermanentError("resend api_key is not configured", code="config_missing", channel_broken=True)
        if not key.isascii() or any(c.isspace() or not c.isprintable() for c in key):
            raise PermanentError("resend api_key is malformed", code="config_invalid", channel_broken=True)
        return key

    def request_body(self, message: OutboundMessage) -> dict[str, Any]:
        """The JSON of `POST /emails` for one message (deterministic, for the idempotency key)."""
        from_email, from_name = mime.sender(self.config)
        parts = mime.prepare(message)
        body: dict[str, Any] = {
            "from": _from_field(from_email, from_name),
            "to": [parts.to],
            "subject": parts.subject,
            "html": parts.html,
            "text": parts.text,
        }
        if parts.headers:
            body["headers"] = dict(parts.headers)
        if message.reference and _TAG_VALUE.fullmatch(str(message.reference)):
            body["tags"] = [{"name": REFERENCE_TAG, "value": str(message.reference)}]
        return body

    def send(self, message: OutboundMessage) -> SendResult:
        api_key = self._api_key()
        body = self.request_body(message)
        headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                   "User-Agent": "lembra"}
        key = idempotency_key(message.idempotency_key)
        if key:
            headers["Idempotency-Key"] = key
        response = call(self._http, "POST", f"{self.base_url}/emails", timeout=self.context.timeout,
                        classify=classify, headers=headers,
                        data=json.dumps(body, ensure_ascii=False).encode("utf-8"))
        email_id = response.body.get("id") if isinstance(response.body, dict) else None
        if not isinstance(email_id, str) or not email_id.strip():
            raise TransientError("resend accepted the request but returned no id", code="no_message_id")
        return SendResult(provider_message_id=email_id.strip(), provider_status="accepted")

    # -- webhooks -----------------------------------------------------------------------------

    def parse_webhook(self, request: WebhookRequest) -> WebhookResult:
        body = request.body if isinstance(request.body, (bytes, bytearray)) else b""
        if len(body) > MAX_WEBHOOK_BODY:
            raise MalformedWebhook("body too large")
        timestamp = self._verify(request, bytes(body))
        data = json_object(body)
        event_type = data.get("type")
        if not isinstance(event_type, str) or not event_type:
            raise MalformedWebhook("missing type")
        if event_type not in _STATUS_TYPES:
            return WebhookResult(events=())  # opened, clicked, delivery_delayed, received, contact.*, domain.*…
        payload = data.get("data")
        if not isinstance(payload, dict):
            raise MalformedWebhook("missing data")
        email_id = payload.get("email_id")
        if not isinstance(email_id, str) or not email_id.strip() or len(email_id) > 256:
            raise MalformedWebhook("missing data.email_id")
        when = _parse_time(data.get("created_at")) or datetime.fromtimestamp(timestamp, timezone.utc)
        event = _status_event(event_type, payload, email_id.strip(), when)
        return WebhookResult(events=(event,))

    def _verify(self, request: WebhookRequest, body: bytes) -> int:
        """Svix: HMAC-SHA256 over `{svix-id}.{svix-timestamp}.{body}`; returns the timestamp."""
        secret = self.config.get("webhook_secret")
        if not isinstance(secret, str) or not secret.strip():
            raise BadSignature("no webhook secret configured")
        secret = secret.strip()
        if secret.startswith("whsec_"):
            secret = secret[len("whsec_"):]
        try:
            key = base64.b64decode(secret, validate=True)
        except (binascii.Error, ValueError):
            raise BadSignature("webhook secret is not valid base64") from None
        msg_id = request.header("svix-id")
        raw_timestamp = request.header("svix-timestamp")
        signatures = request.header("svix-signature")
        if not msg_id or not raw_timestamp or not signatures:
            raise BadSignature("missing svix headers")
        if not _SVIX_ID.fullmatch(msg_id):
            raise BadSignature("bad svix-id")
        if not _DIGITS.fullmatch(raw_timestamp.strip()):
            raise BadSignature("bad svix-timestamp")
        timestamp = int(raw_timestamp.strip())
        if abs(float(self.now()) - timestamp) > TOLERANCE_SECONDS:
            raise BadSignature("svix-timestamp outside the tolerance")
        signed = f"{msg_id}.{timestamp}.".encode("ascii") + body
        expected = hmac.new(key, signed, hashlib.sha256).digest()
        for candidate in signatures.split(" "):
            version, _, encoded = candidate.partition(",")
            if version != "v1" or not encoded:
                continue
            try:
                given = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                continue
            if hmac.compare_digest(given, expected):
                return timestamp
        raise BadSignature("no svix signature matches")


_STATUS_TYPES = frozenset({
    "email.sent", "email.delivered", "email.bounced", "email.complained", "email.failed", "email.suppressed",
})


def _status_event(event_type: str, payload: dict[str, Any], email_id: str, when: datetime) -> StatusEvent:
    reference = _reference(payload.get("tags"))
    if event_type == "email.sent":
        return StatusEvent(email_id, "sent", when, reference=reference)
    if event_type == "email.delivered":
        return StatusEvent(email_id, "delivered", when, reference=reference)
    if event_type == "email.complained":
        return StatusEvent(email_id, "failed", when, error_code="complained", error_permanent=True,
                           opt_out=True, reference=reference)
    if event_type == "email.suppressed":
        return StatusEvent(email_id, "failed", when, error_code="suppressed", reference=reference)
    if event_type == "email.failed":
        return StatusEvent(email_id, "failed", when, error_code="send_failed", reference=reference)
    # email.bounced
    bounce = payload.get("bounce")
    bounce = bounce if isinstance(bounce, dict) else {}
    kind = bounce.get("type") if isinstance(bounce.get("type"), str) else ""
    sub_type = bounce.get("subType") if isinstance(bounce.get("subType"), str) else ""
    text = bounce.get("message") if isinstance(bounce.get("message"), str) else ""
    if "suppress" in sub_type.lower() or text.startswith("Resend has suppressed"):
        # The address is on a suppression list (an earlier hard bounce or complaint): nothing went out.
        return StatusEvent(email_id, "failed", when, error_code="suppressed", reference=reference)
    if kind.lower() == "transient":
        return StatusEvent(email_id, "failed", when, error_code="soft_bounce", error_permanent=False,
                           reference=reference)
    # "Permanent", "Undetermined" or (older captures) no type at all: Resend documents
    # email.bounced as the receiving server permanently rejecting the email.
    return StatusEvent(email_id, "failed", when, error_code="hard_bounce", error_permanent=True,
                       opt_out=False, reference=reference)


def _reference(tags: Any) -> str | None:
    """Our `lembra_ref` tag: an object in webhooks ({"name": "value"}), a list on send."""
    value: Any = None
    if isinstance(tags, dict):
        value = tags.get(REFERENCE_TAG)
    elif isinstance(tags, list):
        for tag in tags:
            if isinstance(tag, dict) and tag.get("name") == REFERENCE_TAG:
                value = tag.get("value")
                break
    if isinstance(value, str) and _TAG_VALUE.fullmatch(value):
        return value
    return None


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return parsed.astimezone(timezone.utc)
    except (ValueError, OverflowError, TypeError):
        return None


def _from_field(from_email: str, from_name: str | None) -> str:
    if not from_name:
        return from_email
    if _NEEDS_QUOTES.search(from_name):
        escaped = from_name.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}" <{from_email}>'
    return f"{from_name} <{from_email}>"


def idempotency_key(key: str | None) -> str | None:
    """The key as sent: verbatim when Resend accepts it (1–256 printable ASCII), else its SHA-256."""
    if not key:
        return None
    if _KEY_OK.fullmatch(key):
        return key
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _header(response: HttpResponse, name: str) -> str | None:
    for key, value in response.headers.items():
        if key.lower() == name.lower():
            return value
    return None


def classify(response: HttpResponse) -> ProviderError | None:
    """Resend's documented errors: `{"statusCode", "message", "name"}` (the message is never kept)."""
    status = response.status
    raw_name = response.body.get("name") if isinstance(response.body, dict) else None
    name = raw_name if isinstance(raw_name, str) and _ERROR_NAME.fullmatch(raw_name) else None
    code = name or f"http_{status}"
    if status == 429:
        retry_after = retry_after_seconds(_header(response, "retry-after"))
        if name == "monthly_quota_exceeded":
            # Only an operator (plan upgrade) or next month ends it: pause the channel.
            return TransientError("resend monthly quota exceeded", code=code, retry_after=retry_after,
                                  channel_broken=True)
        return TransientError("resend is throttling", code=code, retry_after=retry_after)
    if status == 409:
        if name == "concurrent_idempotent_requests":
            return TransientError("same idempotency key still in progress", code=code)
        # invalid_idempotent_request: the key was used with another payload; retrying cannot help.
        return PermanentError("idempotency key reused with a different payload", code=code)
    if status in (401, 403):
        # missing/invalid/restricted key, unverified domain, invalid from: every send fails alike.
        return PermanentError(f"resend refused the credentials or sender (HTTP {status})", code=code,
                              channel_broken=True)
    if status in (404, 405):
        return PermanentError(f"resend endpoint not found (HTTP {status})", code=code, channel_broken=True)
    if status >= 500 or status == 408:
        return TransientError(f"resend error (HTTP {status})", code=code)
    if 400 <= status < 500:
        return PermanentError(f"resend refused the request (HTTP {status})", code=code)
    return TransientError(f"unexpected resend answer (HTTP {status})", code=code)
