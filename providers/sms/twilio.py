"""Twilio Programmable Messaging (SMS).

Wire format: Twilio's Message resource, status callback and webhook security pages (sections of
tests/fixtures/providers/README.md's Twilio sources cited below as §n).

Config keys:
- `account_sid`, `auth_token` (required): HTTP basic auth on sends; the token also signs webhooks.
- `from` (E.164 sender) or `messaging_service_sid` (when both are set the Messaging Service wins).
- `base_url` (optional, default https://api.twilio.com): tests point it at a loopback fake.

Webhooks (status callbacks and incoming SMS) are form posts signed with `X-Twilio-Signature`
(§5). Twilio signs the URL *it* requested: the public one. Lembra runs behind a proxy, so the
signature is checked against `self.webhook_url` (LEMBRA_PUBLIC_URL based) plus the query string
the request carried, never against the URL the request arrived on. The same URL must therefore be
configured as the number's "A message comes in" webhook in the Twilio console; sends pass it as
`StatusCallback` themselves.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from datetime import datetime, timezone
from typing import Any, Mapping
from urllib.parse import parse_qs, quote, urlencode, urlsplit, urlunsplit

from gateway.contract import (
    Health,
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
from gateway.http import Client, HttpResponse, call, default_error, retry_after_seconds
from gateway.phones import InvalidPhone, normalize_phone, recipient_phone
from providers.sms.fields import TWILIO_FIELDS

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.twilio.com"
SIGNATURE_HEADER = "X-Twilio-Signature"
#: Twilio's form posts are a few KB at most; anything this big is not Twilio.
MAX_WEBHOOK_BYTES = 256 * 1024

#: Send-time error codes (§2; the channel-broken ones from Twilio's error dictionary): the sender
#: or the account is misconfigured, so every send on this channel will fail until an operator acts.
CHANNEL_BROKEN_CODES = frozenset({
    "20003",  # authentication failed
    "20005",  # account not active
    "20404",  # resource not found (wrong Account SID in the path)
    "21212",  # invalid From number
    "21606",  # From is not an SMS-capable number of this account
    "21609",  # invalid StatusCallback URL (LEMBRA_PUBLIC_URL)
    "21659",  # From is not a Twilio number
    "21660",  # From does not belong to this account
    "21703",  # Messaging Service has no phone numbers
    "21705",  # Messaging Service is invalid
})
#: The recipient replied STOP: Twilio blocks the pair until they text START (§2).
OPT_OUT_CODE = "21610"
#: Throttling (§2, §6).
THROTTLE_CODE = "20429"

#: Delivery (callback) error codes worth trying again later; every other failure is final (§2).
TRANSIENT_DELIVERY_CODES = frozenset({
    "30001",  # queue overflow
    "30003",  # unreachable destination handset (off / out of coverage)
    "30008",  # unknown error
    "30009",  # missing segment
    "30017",  # carrier network congestion
    "30022",  # throughput exceeded
})

#: MessageStatus → our status; statuses not listed (queued, accepted, sending, scheduled,
#: receiving, received, partially_delivered, anything new) carry no news and are ignored (§1, §3).
STATUS_MAP = {
    "sent": "sent",
    "delivered": "delivered",
    "read": "read",
    "undelivered": "failed",
    "failed": "failed",
    "canceled": "failed",
}


# --- X-Twilio-Signature (§5) -------------------------------------------------------------------


def compute_signature(auth_token: str, url: str, params: Mapping[str, Any]) -> str:
    """base64(HMAC-SHA1(auth_token, url + name+value for sorted names, sorted distinct values)).

    `params` maps each POST parameter name to its value or list of values (as parse_qs gives);
    empty for GET requests and JSON bodies.
    """
    signed = url
    for name in sorted(set(params)):
        values = params[name]
        if isinstance(values, str):
            values = [values]
        for value in sorted(set(values)):
            signed += name + value
    digest = hmac.new(auth_token.encode("utf-8"), signed.encode("utf-8"), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def _url_variants(url: str) -> list[str]:
    """The URL without its port and with the scheme's default port (Twilio signs either form)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return [url]
    host = parts.netloc.rsplit(":", 1)[0] if port is not None else parts.netloc
    without_port = urlunsplit(parts._replace(netloc=host))
    if port is not None:
        with_port = url
    else:
        default = {"https": 443, "http": 80}.get(parts.scheme.lower())
        with_port = urlunsplit(parts._replace(netloc=f"{parts.netloc}:{default}")) if default else url
    return list(dict.fromkeys((without_port, with_port)))


def validate_signature(auth_token: str, url: str, params: Mapping[str, Any], signature: str | None) -> bool:
    """Whether `signature` is Twilio's for `url` (with or without port) and `params`."""
    if not signature or not auth_token:
        return False
    try:
        given = signature.strip().encode("ascii")
    except UnicodeEncodeError:
        return False
    valid = False
    for candidate in _url_variants(url):
        expected = compute_signature(auth_token, candidate, params).encode("ascii")
        valid |= hmac.compare_digest(expected, given)
    return valid


# --- the provider --------------------------------------------------------------------------------


EMPTY_TWIML = '<?xml version="1.0" encoding="UTF-8"?><Response/>'


class TwilioProvider(Provider):
    """SMS through Twilio's REST API; status callbacks and incoming SMS through signed webhooks."""

    name = "twilio"
    kinds = ("sms",)
    # Twilio's Messages API takes no idempotency key: a retried create sends twice.
    honours_idempotency = False
    credential_fields = TWILIO_FIELDS
    checks_connection = True

    _http: Client | None = None

    @property
    def http(self) -> Client:
        if self._http is None:
            self._http = Client(self.context.egress)
        return self._http

    @property
    def base_url(self) -> str:
        return str(self.config.get("base_url") or DEFAULT_BASE_URL).rstrip("/")

    def _credentials(self) -> tuple[str, str]:
        sid = self.config.get("account_sid")
        token = self.config.get("auth_token")
        if not isinstance(sid, str) or not sid or not isinstance(token, str) or not token:
            raise PermanentError("twilio channel lacks account_sid or auth_token", code="config_missing",
                                 channel_broken=True)
        return sid, token

    # -- connection check --

    def check(self) -> Health:
        """GET /2010-04-01/Accounts/{sid}.json with the channel's credentials: 200 means the SID and
        token work (nothing is sent); a refusal raises the typed error `send` would."""
        sid, token = self._credentials()
        url = f"{self.base_url}/2010-04-01/Accounts/{quote(sid, safe='')}.json"
        response = call(self.http, "GET", url, timeout=self.context.timeout, classify=classify_error,
                        auth=(sid, token))
        body = response.body if isinstance(response.body, dict) else {}
        status = body.get("status")
        if isinstance(status, str) and status != "active":  # suspended / closed accounts send nothing
            return Health(ok=False, state="error", detail=f"account_{status}"[:40])
        return Health(ok=True, state="ok")

    # -- send (§1, §2) --

    def send(self, message: OutboundMessage) -> SendResult:
        sid, token = self._credentials()
        try:
            to = recipient_phone(message.to)
        except InvalidPhone:
            raise PermanentError("recipient is not a valid phone number", code="invalid_number") from None
        fields: dict[str, str] = {"To": to}
        service = self.config.get("messaging_service_sid")
        sender = self.config.get("from")
        if service:
            fields["MessagingServiceSid"] = str(service)
        elif sender:
            fields["From"] = str(sender)
        else:
            raise PermanentError("twilio channel needs `from` or `messaging_service_sid`", code="config_missing",
                                 channel_broken=True)
        # SMS has no buttons: the rendered text already tells the patient what to reply.
        fields["Body"] = message.text
        fields["StatusCallback"] = self.webhook_url
        url = f"{self.base_url}/2010-04-01/Accounts/{quote(sid, safe='')}/Messages.json"
        response = call(self.http, "POST", url, timeout=self.context.timeout, classify=classify_error,
                        data=fields, auth=(sid, token))
        body = response.body if isinstance(response.body, dict) else {}
        provider_id = body.get("sid")
        if not isinstance(provider_id, str) or not provider_id:
            raise PermanentError("twilio accepted the request but returned no message sid", code="no_message_id")
        status = body.get("status")
        return SendResult(provider_message_id=provider_id, provider_status=status if isinstance(status, str) else None)

    # -- webhooks (§3, §4, §5) --

    def parse_webhook(self, request: WebhookRequest) -> WebhookResult:
        token = self.config.get("auth_token")
        if not isinstance(token, str) or not token:
            raise BadSignature("no auth token configured to verify twilio signatures")
        body = request.body or b""
        if len(body) > MAX_WEBHOOK_BYTES:
            raise MalformedWebhook("body too large")
        query = _raw_query(request)
        method = (request.method or "").upper()
        if method == "POST":
            signed_params = _form_params(request, body)
            fields = signed_params
        elif method == "GET":
            # Twilio may be told to GET the incoming-message webhook: everything is in the query,
            # which is part of the signed URL, and there are no POST parameters.
            signed_params = {}
            fields = _parse_form(query)
        else:
            raise MalformedWebhook("twilio webhooks are POST (or GET)")
        url = self.webhook_url + (f"?{query}" if query else "")
        if not validate_signature(token, url, signed_params, request.header(SIGNATURE_HEADER)):
            raise BadSignature("X-Twilio-Signature does not match")
        # Twilio expects TwiML back from its messaging webhooks; an empty <Response/> means
        # "no reply" (anything else logs warning 12300 on every message).
        return WebhookResult(events=self._events(fields), response_body=EMPTY_TWIML,
                             response_content_type="text/xml")

    def _events(self, fields: Mapping[str, list[str]]) -> list[StatusEvent | InboundMessageEvent]:
        status = _first(fields, "MessageStatus")
        sms_status = _first(fields, "SmsStatus")
        if status is None and sms_status is not None and sms_status.lower() != "received":
            status = sms_status  # legacy callbacks carry only SmsStatus
        if status is not None:
            return _status_events(fields, status)
        return _inbound_events(fields)


def classify_error(response: HttpResponse) -> ProviderError | None:
    """Twilio REST error `{code, message, more_info, status}` (§2) → typed error.

    Twilio's `message` is never copied into the error: it may quote the phone number.
    """
    body = response.body if isinstance(response.body, dict) else {}
    raw = body.get("code")
    code = str(raw) if isinstance(raw, (int, str)) and not isinstance(raw, bool) and str(raw) else None
    if code == OPT_OUT_CODE:
        return PermanentError("recipient unsubscribed (replied STOP)", code=code, opt_out=True)
    if code == THROTTLE_CODE or response.status == 429:
        return TransientError("twilio is throttling", code=code or "http_429",
                              retry_after=retry_after_seconds(_header(response.headers, "Retry-After")))
    if code in CHANNEL_BROKEN_CODES:
        return PermanentError(f"twilio refused the channel's configuration (error {code})", code=code,
                              channel_broken=True)
    error = default_error(response)
    if code is None:
        return error
    return type(error)(f"twilio error {code} (HTTP {response.status})", code=code,
                       retry_after=error.retry_after, channel_broken=error.channel_broken)


def _status_events(fields: Mapping[str, list[str]], twilio_status: str) -> list[StatusEvent | InboundMessageEvent]:
    message_id = _first(fields, "MessageSid") or _first(fields, "SmsSid")
    if not message_id:
        raise MalformedWebhook("status callback without MessageSid")
    status = STATUS_MAP.get(twilio_status.strip().lower())
    if status is None:
        return []
    now = datetime.now(timezone.utc)
    if status != "failed":
        return [StatusEvent(provider_message_id=message_id, status=status, timestamp=now)]  # type: ignore[arg-type]
    error_code = _first(fields, "ErrorCode") or None
    if error_code is None and twilio_status.strip().lower() == "canceled":
        error_code = "canceled"
    return [StatusEvent(
        provider_message_id=message_id,
        status="failed",
        timestamp=now,
        error_code=error_code,
        error_permanent=error_code not in TRANSIENT_DELIVERY_CODES,
        opt_out=error_code == OPT_OUT_CODE,
    )]


def _inbound_events(fields: Mapping[str, list[str]]) -> list[StatusEvent | InboundMessageEvent]:
    message_id = _first(fields, "MessageSid") or _first(fields, "SmsMessageSid") or _first(fields, "SmsSid")
    sender = _first(fields, "From")
    if not message_id or not sender:
        raise MalformedWebhook("incoming message without MessageSid or From")
    if sender.lower().startswith("whatsapp:"):
        sender = sender[len("whatsapp:"):]
    try:
        from_address = normalize_phone(sender)
    except (InvalidPhone, ValueError, TypeError):
        # A short code or alphanumeric sender cannot be a patient: acknowledge, store nothing.
        log.info("twilio inbound from a non-phone sender ignored", extra={"provider_message_id": message_id})
        return []
    # Twilio's own STOP/START/HELP keywords (OptOutType) arrive as ordinary text: pass them
    # through, the engine's keyword matcher decides.
    text = _first(fields, "Body")
    return [InboundMessageEvent(
        provider_message_id=message_id,
        from_address=from_address,
        text=text if text else None,
        timestamp=datetime.now(timezone.utc),
    )]


# --- helpers -------------------------------------------------------------------------------------


def _form_params(request: WebhookRequest, body: bytes) -> dict[str, list[str]]:
    """The POST parameters of a form body; anything else is refused."""
    content_type = (request.header("Content-Type") or "").split(";", 1)[0].strip().lower()
    if content_type and content_type != "application/x-www-form-urlencoded":
        raise MalformedWebhook("twilio webhooks are form-encoded")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedWebhook("body is not UTF-8") from None
    if text.lstrip().startswith(("{", "[")):
        raise MalformedWebhook("twilio webhooks are form-encoded, not JSON")
    return _parse_form(text)


def _parse_form(text: str) -> dict[str, list[str]]:
    try:
        return parse_qs(text, keep_blank_values=True, strict_parsing=False)
    except ValueError:
        raise MalformedWebhook("body is not a form") from None


def _raw_query(request: WebhookRequest) -> str:
    """The query string exactly as the request carried it (it is part of the signed URL)."""
    try:
        query = urlsplit(request.url or "").query
    except ValueError:
        query = ""
    if not query and request.query:
        query = urlencode(dict(request.query))
    return query


def _first(fields: Mapping[str, list[str]], name: str) -> str | None:
    values = fields.get(name)
    return values[0] if values else None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None

