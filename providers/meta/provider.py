"""Meta WhatsApp Cloud API provider (the official one).

Wire format: Meta's Cloud API reference (messages, webhooks, error codes); the fixtures in
tests/fixtures/providers/meta_whatsapp/ follow it, and their README cites each source.

Sending (SPEC §5, the 24-hour customer-service window):
- window open (`message.conversation_open`), no buttons → `type:"text"`;
- window open with buttons → `type:"interactive"` reply buttons whose ids are ours ("confirm:42");
- window closed → the approved `message.template` (`type:"template"`), body parameters in order
  and one `quick_reply` button component per button of the template reference (index 0, 1, …)
  whose payload is our button id: the clinic's mapping says which of the approved template's
  quick replies is Confirmar and which Cancelar (engine/messaging/meta_templates.py);
- window closed and no template → PermanentError("template_required"); never free text.
- Meta answering 131047 (re-engagement: the window is in fact closed) to a text/interactive send
  → one resend as the template when there is one, else PermanentError("window_closed").
`message.reference` goes out as `biz_opaque_callback_data`, which status webhooks echo back
(`StatusEvent.reference`).

Receiving: `messages` (the patient's messages and replies), `statuses`, template updates, and
`smb_message_echoes` (what the clinic sent from the WhatsApp Business app on a coexistence number:
`from_me` events, as Evolution's `fromMe`).

Listing the account's templates (`list_templates`): `GET /{waba_id}/message_templates` with
`fields` and `limit`, answered as `{data: [{name, language, status, category, components, …}],
paging: {cursors: {before, after}, next}}` (Meta's "Template management" page); the next page is
asked of the same base URL with `after=<cursors.after>` while the answer has `paging.next`.

Config keys: `phone_number_id`, `access_token`, `app_secret`, `verify_token`, optional `waba_id`
(the WhatsApp Business Account whose templates the console lists), `base_url` (default
https://graph.facebook.com/<api_version>), `api_version` (default DEFAULT_API_VERSION, ignored
when `base_url` is given).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence
from urllib.parse import parse_qsl, quote, urlsplit

from gateway.contract import (
    Health,
    InboundMessageEvent,
    Media,
    MediaRef,
    OutboundMessage,
    Provider,
    ProviderContext,
    ProviderTemplate,
    ProviderTemplateButton,
    SendResult,
    StatusEvent,
    TemplateEvent,
    TemplateRef,
    WebhookEvent,
    WebhookRequest,
    WebhookResult,
)
from gateway.errors import (
    BadSignature,
    MalformedWebhook,
    PermanentError,
    ProviderError,
    RateLimited,
    TransientError,
)
from gateway.http import Client, HttpResponse, call, default_error, retry_after_seconds
from gateway.phones import InvalidPhone, normalize_phone, recipient_phone
from gateway.webhook_body import bounded, json_value
from providers.meta.fields import FIELDS

log = logging.getLogger(__name__)

#: Graph API version used when `base_url` is not configured. The notes' curl example is v17.0,
#: which Meta has retired (docs.rs whatsapp-cloud-api 0.5.5, docs corpus: "uses Facebook Graph API
#: version v26.0 by default (v20.0 expires on 2026-09-24)"); a channel may pin `api_version`.
DEFAULT_API_VERSION = "v26.0"
GRAPH_URL = "https://graph.facebook.com"

SIGNATURE_HEADER = "X-Hub-Signature-256"
#: Meta documents webhook payloads of up to 3 MB; anything larger is not a Meta notification.
MAX_BODY_BYTES = 3 * 1024 * 1024
#: `biz_opaque_callback_data` is limited to 512 characters (longer references are not sent).
MAX_CALLBACK_DATA = 512
#: Interactive reply buttons: at most 3, body text at most 1024 characters, title at most 20.
MAX_REPLY_BUTTONS = 3
MAX_INTERACTIVE_BODY = 1024
MAX_BUTTON_TITLE = 20
#: Fields read by health() from the phone-number node.
HEALTH_FIELDS = "display_phone_number,verified_name,quality_rating"
#: Fields, page size and the most pages list_templates() reads (a WABA holds a few hundred at most).
TEMPLATE_FIELDS = "name,language,status,category,components,parameter_format"
TEMPLATES_PER_PAGE = 100
MAX_TEMPLATE_PAGES = 20
#: A template's placeholder: {{1}} (positional) or {{first_name}} (named).
_PLACEHOLDER_RE = re.compile(r"\{\{\s*([A-Za-z0-9_]{1,64})\s*\}\}")
#: Button types whose send needs a value Lembra does not fill (a one-time code, a coupon).
_BUTTONS_WITH_VALUES = frozenset({"COPY_CODE", "OTP"})

#: hub.challenge is echoed back verbatim; Meta sends a number. Anything else is refused so the
#: endpoint never reflects arbitrary content.
_CHALLENGE_RE = re.compile(r"^[A-Za-z0-9._~-]{1,256}$")
_DIGITS_RE = re.compile(r"^[0-9]{6,15}$")
_WHITESPACE_RE = re.compile(r"\s+")

# Graph / WhatsApp error codes (notes §2) → (permanent?, our code, channel_broken).
_ERRORS: dict[int, tuple[bool, str, bool]] = {
    131047: (True, "window_closed", False),       # re-engagement: > 24 h since the patient wrote
    131026: (True, "undeliverable", False),       # not a WhatsApp user, old app, ToS not accepted…
    130429: (False, "throughput", False),         # Cloud API throughput (mps) reached
    131056: (False, "pair_rate_limit", False),    # too many messages to the same user
    131048: (True, "spam_rate_limit", False),     # number restricted for spam: do not hammer it
    131049: (False, "marketing_limit", False),    # per-user marketing limit: later
    131050: (True, "marketing_opted_out", False),  # the user stopped marketing messages from us
    131051: (True, "unsupported_type", False),
    131000: (False, "generic_error", False),      # "something went wrong": retry
    130472: (True, "experiment", False),          # user's number is part of an experiment
    131053: (True, "media_error", False),
    190: (True, "token_invalid", True),           # access token expired / invalid
    368: (True, "account_restricted", True),
    131031: (True, "account_locked", True),
    80007: (False, "waba_rate_limit", False),
}
#: The user stopped marketing messages from this business (a marketing-only opt-out).
MARKETING_OPT_OUT_CODE = 131050
#: Codes that, on a failed status webhook, are worth another attempt (the rest are permanent).
_TRANSIENT_CODES = frozenset(code for code, (permanent, _, _) in _ERRORS.items() if not permanent)
#: Refusals for the rate, not the message (→ `RateLimited`): who must slow down, and for how long
#: when Meta sends no Retry-After. 131056: at most about one message every 6 s to one user (the
#: "pair rate limit"); 130429: the number's throughput (messages per second) was reached.
_RATE_LIMITS: dict[int, tuple[str, float]] = {
    131056: ("recipient", 6.0),
    130429: ("channel", 5.0),
}
#: The spacing the engine keeps between two messages to one person, so that 131056 stays rare.
RECIPIENT_INTERVAL = 6.0


class MetaProvider(Provider):
    """WhatsApp through Meta's Cloud API (Graph `/{phone_number_id}/messages`)."""

    name = "meta"
    kinds = ("whatsapp",)
    # The Cloud API has no idempotency key: an unknown outcome must not be retried blindly.
    honours_idempotency = False
    credential_fields = FIELDS
    checks_connection = True
    recipient_interval = RECIPIENT_INTERVAL

    def __init__(self, config: Mapping[str, Any], context: ProviderContext) -> None:
        super().__init__(config, context)
        self._http = Client(self.context.egress)

    # ------------------------------------------------------------------ configuration

    def _setting(self, key: str) -> str:
        value = self.config.get(key)
        return value.strip() if isinstance(value, str) else ""

    @property
    def base_url(self) -> str:
        base = self._setting("base_url")
        if not base:
            base = f"{GRAPH_URL}/{self._setting('api_version') or DEFAULT_API_VERSION}"
        return base.rstrip("/")

    def _credentials(self) -> tuple[str, str]:
        phone_number_id = self._setting("phone_number_id")
        token = self._setting("access_token")
        if not phone_number_id or not token:
            raise PermanentError("channel has no phone_number_id / access_token", code="misconfigured",
                                 channel_broken=True)
        return quote(phone_number_id, safe=""), token

    # ------------------------------------------------------------------ sending

    def send(self, message: OutboundMessage) -> SendResult:
        phone_number_id, token = self._credentials()
        try:
            to = recipient_phone(message.to).lstrip("+")
        except InvalidPhone:
            raise PermanentError("recipient is not a valid phone number", code="invalid_number") from None
        url = f"{self.base_url}/{phone_number_id}/messages"
        if not message.conversation_open:
            if message.template is None:
                raise PermanentError("outside the 24-hour window and no approved template", code="template_required")
            return self._post(url, token, self._envelope(message, to, _template_payload(message.template)))
        try:
            return self._post(url, token, self._envelope(message, to, _session_payload(message)))
        except PermanentError as exc:
            if exc.code != "window_closed" or message.template is None:
                raise
            # Our idea of the window was stale; Meta sent nothing, so one template send is safe.
            log.info("meta window closed, resending as template", extra={"channel_id": self.context.channel_id})
            return self._post(url, token, self._envelope(message, to, _template_payload(message.template)))

    def _envelope(self, message: OutboundMessage, to: str, typed: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": to, **typed}
        if message.reference and len(message.reference) <= MAX_CALLBACK_DATA:
            body["biz_opaque_callback_data"] = message.reference
        return body

    def _post(self, url: str, token: str, body: dict[str, Any]) -> SendResult:
        response = call(
            self._http, "POST", url, timeout=self.context.timeout, classify=classify_error,
            headers={"Authorization": f"Bearer {token}"}, json=body,
        )
        data = response.body
        try:
            first = data["messages"][0]
            message_id = first["id"]
        except (KeyError, IndexError, TypeError):
            message_id = None
            first = None
        if not isinstance(message_id, str) or not message_id:
            # Meta said 2xx, so something may have gone out: fail without a retry rather than risk
            # a second copy.
            raise PermanentError("send answer carries no message id", code="bad_response")
        status = first.get("message_status") if isinstance(first, dict) else None
        return SendResult(provider_message_id=message_id,
                          provider_status=status if isinstance(status, str) else "accepted")

    # ------------------------------------------------------------------ media

    def fetch_media(self, media: MediaRef, *, max_bytes: int) -> Media:
        """GET /{media_id} with the channel's token → ``{"url", "mime_type", "file_size"}``, then GET
        that url with the same token → the bytes (Cloud API "Retrieve media URL" / "Download media";
        the url lasts 5 minutes, so both calls happen now). Read up to `max_bytes`, no further."""
        _, token = self._credentials()
        headers = {"Authorization": f"Bearer {token}"}
        found = call(self._http, "GET", f"{self.base_url}/{quote(media.media_id, safe='')}",
                     timeout=self.context.timeout, classify=classify_error, headers=headers)
        info = found.body if isinstance(found.body, dict) else {}
        url = info.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise PermanentError("media answer carries no url", code="bad_response")
        size = info.get("file_size")
        if isinstance(size, int) and not isinstance(size, bool) and size > max_bytes:
            raise PermanentError("voice note is too large", code="media_too_large")
        try:
            response = call(self._http, "GET", url, timeout=self.context.timeout, classify=classify_error,
                            headers=headers, max_bytes=max_bytes)
        except TransientError as exc:
            if exc.code == "provider_answer_too_large":
                raise PermanentError("voice note is too large", code="media_too_large") from None
            raise
        mime = info.get("mime_type") if isinstance(info.get("mime_type"), str) else None
        return Media(content=response.content, mime_type=(mime or media.mime_type or "audio/ogg")[:100])

    # ------------------------------------------------------------------ health

    def health(self) -> Health:
        try:
            phone_number_id, token = self._credentials()
            response = call(
                self._http, "GET", f"{self.base_url}/{phone_number_id}", timeout=self.context.timeout,
                classify=classify_error, headers={"Authorization": f"Bearer {token}"},
                params={"fields": HEALTH_FIELDS},
            )
        except TransientError as exc:
            return Health(ok=False, state="unreachable", detail=exc.code)
        except PermanentError as exc:
            if exc.channel_broken:
                return Health(ok=False, state=exc.code or "broken", detail=exc.code)
            return Health(ok=False, state="error", detail=exc.code)
        rating = response.body.get("quality_rating") if isinstance(response.body, dict) else None
        return Health(ok=True, state="ok",
                      detail=f"quality_rating={rating}" if isinstance(rating, str) and rating.isalnum() else None)

    # ------------------------------------------------------------------ templates

    def list_templates(self) -> Sequence[ProviderTemplate]:
        """Every template of the channel's WhatsApp Business Account, whatever its status."""
        waba_id = self._setting("waba_id")
        token = self._setting("access_token")
        if not waba_id or not token:
            raise PermanentError("channel has no waba_id / access_token", code="waba_missing")
        url = f"{self.base_url}/{quote(waba_id, safe='')}/message_templates"
        found: list[ProviderTemplate] = []
        after: str | None = None
        for _page in range(MAX_TEMPLATE_PAGES):
            params = {"fields": TEMPLATE_FIELDS, "limit": str(TEMPLATES_PER_PAGE)}
            if after is not None:
                params["after"] = after
            response = call(self._http, "GET", url, timeout=self.context.timeout, classify=classify_error,
                            headers={"Authorization": f"Bearer {token}"}, params=params)
            body = response.body
            if not isinstance(body, dict) or not isinstance(body.get("data"), list):
                raise PermanentError("template list answer has no data list", code="bad_response")
            found.extend(t for t in map(_provider_template, body["data"]) if t is not None)
            # `paging.next` is an absolute URL (with the token in it, at times): the next page is
            # asked of our own base URL with the cursor instead, so the token goes nowhere else.
            after = _next_cursor(body.get("paging"))
            if after is None:
                break
        return found

    @classmethod
    def template_preview(cls, template: TemplateRef) -> Mapping[str, Any] | None:
        return template_object(template)

    # ------------------------------------------------------------------ webhooks

    def parse_webhook(self, request: WebhookRequest) -> WebhookResult:
        if request.method.upper() == "GET":
            return self._verify_subscription(request)
        body = bounded(request.body, MAX_BODY_BYTES)
        self._check_signature(request.header(SIGNATURE_HEADER), body)
        data = json_value(body)
        return WebhookResult(events=_parse_notification(data, waba_id=self._setting("waba_id")))

    def _verify_subscription(self, request: WebhookRequest) -> WebhookResult:
        """Meta's GET handshake: echo hub.challenge when hub.verify_token is ours (notes §3)."""
        query: Mapping[str, Any] = request.query or {}
        if not query:
            try:
                query = dict(parse_qsl(urlsplit(request.url).query, keep_blank_values=True))
            except ValueError:
                query = {}
        expected = self._setting("verify_token")
        given = _first(query.get("hub.verify_token"))
        if not expected or not isinstance(given, str) or not hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
        ):
            raise BadSignature("verify token does not match")
        if _first(query.get("hub.mode")) != "subscribe":
            raise MalformedWebhook("hub.mode is not subscribe")
        challenge = _first(query.get("hub.challenge"))
        if not isinstance(challenge, str) or not _CHALLENGE_RE.match(challenge):
            raise MalformedWebhook("missing or odd hub.challenge")
        return WebhookResult(events=[], response_body=challenge)

    def _check_signature(self, header: str | None, body: bytes) -> None:
        secret = self._setting("app_secret")
        if not secret:
            raise BadSignature("channel has no app secret to check the signature with")
        if not isinstance(header, str) or not header.isascii():
            raise BadSignature("missing signature")
        scheme, _, given = header.strip().partition("=")
        if scheme.lower() != "sha256" or not given:
            raise BadSignature("missing signature")
        expected = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(given.lower().encode("ascii"), expected.encode("ascii")):
            raise BadSignature("signature does not match")


# ---------------------------------------------------------------------- outbound payloads


def _session_payload(message: OutboundMessage) -> dict[str, Any]:
    """Free-form message, only valid inside the 24-hour window."""
    buttons = message.buttons[:MAX_REPLY_BUTTONS]
    if buttons and len(message.text) <= MAX_INTERACTIVE_BODY:
        return {
            "type": "interactive",
            "interactive": {
                "type": "button",
                "body": {"text": message.text},
                "action": {"buttons": [
                    {"type": "reply", "reply": {"id": b.id, "title": b.title[:MAX_BUTTON_TITLE]}} for b in buttons
                ]},
            },
        }
    # No buttons, or a body too long for an interactive message: plain text (keywords still work).
    return {"type": "text", "text": {"preview_url": False, "body": message.text}}


def _template_payload(template: TemplateRef) -> dict[str, Any]:
    return {"type": "template", "template": template_object(template)}


def template_object(template: TemplateRef) -> dict[str, Any]:
    """The `template` object of a send: body parameters in order, one quick-reply component per
    button of the reference (its index in the approved template), whose payload is our button id."""
    components: list[dict[str, Any]] = []
    if template.parameters:
        components.append({"type": "body", "parameters": [
            {"type": "text", "text": _template_text(p)} for p in template.parameters
        ]})
    for index, button in enumerate(template.buttons):
        components.append({
            "type": "button", "sub_type": "quick_reply", "index": str(index),
            "parameters": [{"type": "payload", "payload": button.id}],
        })
    payload: dict[str, Any] = {"name": template.name, "language": {
        "policy": "deterministic", "code": template.language.replace("-", "_"),
    }}
    if components:
        payload["components"] = components
    return payload


def _template_text(value: str) -> str:
    """Meta refuses template parameters with new lines, tabs or runs of spaces: fold them."""
    return _WHITESPACE_RE.sub(" ", str(value)).strip()


# ---------------------------------------------------------------------- template lists


def _short(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _placeholders(text: str) -> tuple[str, ...]:
    """The placeholders of a template text in order of first appearance, each once."""
    return tuple(dict.fromkeys(_PLACEHOLDER_RE.findall(text)))


def _provider_template(item: Any) -> ProviderTemplate | None:
    """One entry of `data`; None for an entry without a name or a language (nothing to map it by)."""
    if not isinstance(item, dict):
        return None
    name, language = _short(item.get("name"), 512), _short(item.get("language"), 32)
    if not name or not language:
        return None
    body, header_needs_parameter = "", False
    buttons: list[ProviderTemplateButton] = []
    components = item.get("components")
    for component in components if isinstance(components, list) else []:
        if not isinstance(component, dict):
            continue
        kind = _short(component.get("type"), 32).upper()
        if kind == "BODY":
            body = _short(component.get("text"), 4096)
        elif kind == "HEADER":
            text = _short(component.get("text"), 1024)
            header_needs_parameter = (_short(component.get("format"), 32).upper() or "TEXT") != "TEXT" \
                or bool(_placeholders(text))
        elif kind == "BUTTONS" and isinstance(component.get("buttons"), list):
            for button in component["buttons"][:20]:
                if not isinstance(button, dict):
                    continue
                button_type = _short(button.get("type"), 32).upper()
                needs = button_type in _BUTTONS_WITH_VALUES or (
                    button_type == "URL" and bool(_placeholders(_short(button.get("url"), 2048))))
                buttons.append(ProviderTemplateButton(button_type, _short(button.get("text"), 64), needs))
    parameters = _placeholders(body)
    named = item.get("parameter_format") == "NAMED" or any(not p.isdigit() for p in parameters)
    return ProviderTemplate(
        name=name, language=language, status=_short(item.get("status"), 32).upper(),
        category=_short(item.get("category"), 32).upper(), body=body, parameters=parameters, named=named,
        header_needs_parameter=header_needs_parameter, buttons=tuple(buttons),
    )


def _next_cursor(paging: Any) -> str | None:
    """The `after` cursor when Graph says there is a next page (`paging.next`), else None."""
    if not isinstance(paging, dict) or not isinstance(paging.get("next"), str):
        return None
    cursors = paging.get("cursors")
    after = cursors.get("after") if isinstance(cursors, dict) else None
    return after if isinstance(after, str) and after and len(after) <= 1024 else None


# ---------------------------------------------------------------------- errors


def _error_object(body: Any) -> dict[str, Any] | None:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"]
    return None


def _int_code(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 12:
        return int(value)
    return None


def classify_error(response: HttpResponse) -> ProviderError | None:
    """Map a Graph error answer (`{"error":{"code":…}}`, notes §2) to a typed error."""
    error = _error_object(response.body)
    code = _int_code(error.get("code")) if error is not None else None
    if code is None:
        return None
    retry_after = retry_after_seconds(response.headers.get("Retry-After"))
    known = _ERRORS.get(code)
    if known is not None:
        permanent, name, broken = known
        if permanent:
            return PermanentError(f"Meta refused the message ({code})", code=name, channel_broken=broken)
        if code in _RATE_LIMITS:
            scope, default_wait = _RATE_LIMITS[code]
            return RateLimited(f"Meta asked to slow down ({code})", code=name, scope=scope,
                               retry_after=retry_after or default_wait)
        return TransientError(f"Meta asked to retry later ({code})", code=name, retry_after=retry_after)
    fallback = default_error(response)
    kind = PermanentError if fallback.permanent else TransientError
    return kind(f"Meta error {code} (HTTP {response.status})", code=f"meta_{code}",
                retry_after=fallback.retry_after, channel_broken=fallback.channel_broken)


# ---------------------------------------------------------------------- notifications


def _first(value: Any) -> Any:
    """Query values may come as lists (parse_qs) or strings."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedWebhook(f"{what} is not a list")
    return value


def _parse_notification(data: Any, *, waba_id: str = "") -> list[WebhookEvent]:
    """Events of a `whatsapp_business_account` notification (notes §4); batches are iterated.

    Template changes count only for the channel's own WABA (`entry.id` equal to its `waba_id`):
    one Meta app may serve several clinics, and a change to another clinic's account must not
    touch this one's templates."""
    if not isinstance(data, dict):
        raise MalformedWebhook("body is not a JSON object")
    kind = data.get("object")
    if not isinstance(kind, str):
        raise MalformedWebhook("not a Meta notification")
    if kind != "whatsapp_business_account":
        # Signed by our app, but for another product (page, instagram…): acknowledge, so Meta does
        # not keep retrying it, and record nothing.
        return []
    events: list[WebhookEvent] = []
    for entry in _list(data.get("entry"), "entry"):
        if not isinstance(entry, dict):
            raise MalformedWebhook("entry item is not an object")
        for change in _list(entry.get("changes"), "changes"):
            if not isinstance(change, dict):
                raise MalformedWebhook("change is not an object")
            field = change.get("field")
            if isinstance(field, str) and field in _TEMPLATE_FIELDS:
                event = _template_event(field, change.get("value"), entry, waba_id)
                if event is not None:
                    events.append(event)
                continue
            if field not in ("messages", _ECHOES_FIELD):
                continue  # account / quality updates: not events we act on
            value = change.get("value")
            if not isinstance(value, dict):
                raise MalformedWebhook("change value is not an object")
            if field == _ECHOES_FIELD:
                for item in _list(value.get("message_echoes"), "message_echoes"):
                    event = _echo(item)
                    if event is not None:
                        events.append(event)
                continue
            for item in _list(value.get("messages"), "messages"):
                event = _inbound(item)
                if event is not None:
                    events.append(event)
            for item in _list(value.get("statuses"), "statuses"):
                status = _status(item)
                if status is not None:
                    events.append(status)
            for error in _list(value.get("errors"), "errors"):
                code = _int_code(error.get("code")) if isinstance(error, dict) else None
                log.info("meta webhook carries an error", extra={"meta_code": code})
    return events


#: The template changes a notification may carry (Meta's webhook reference pages of the same names).
_TEMPLATE_FIELDS = frozenset({"message_template_status_update", "template_category_update"})
_UPPER_RE = re.compile(r"^[A-Z_]{1,40}$")


def _upper(value: Any) -> str | None:
    """A status or category as Meta spells it (APPROVED, MARKETING, …), else None."""
    if not isinstance(value, str):
        return None
    value = value.strip().upper()
    return value if _UPPER_RE.match(value) else None


def _template_event(field: str, value: Any, entry: Mapping[str, Any], waba_id: str) -> TemplateEvent | None:
    """A template's new status or category; None when it is for another WABA (or the channel
    names none) or does not say which template."""
    if not isinstance(value, dict):
        raise MalformedWebhook("change value is not an object")
    entry_id = entry.get("id")
    if not waba_id or str(entry_id) != waba_id:
        log.info("meta template update for another account skipped", extra={"meta_field": field})
        return None
    name, language = _short(value.get("message_template_name"), 512), _short(value.get("message_template_language"), 32)
    if not name or not language:
        return None
    seconds = _int_code(entry.get("time"))
    timestamp = _timestamp(seconds) if seconds else None
    if field == "template_category_update":
        # A completed change names previous_category; an impending one (correct_category) has not
        # happened yet: only the completed one changes what a send costs.
        if not isinstance(value.get("previous_category"), str):
            return None
        category = _upper(value.get("new_category"))
        if category is None:
            return None
        return TemplateEvent(name=name, language=language, timestamp=timestamp, category=category,
                             previous_category=_upper(value.get("previous_category")))
    status = _upper(value.get("event"))
    if status is None:
        return None
    reason = _short(value.get("reason"), 200) or None
    return TemplateEvent(name=name, language=language, timestamp=timestamp, status=status,
                         category=_upper(value.get("message_template_category")),
                         reason=None if reason == "NONE" else reason)


def _timestamp(value: Any) -> datetime:
    seconds = _int_code(value)
    if seconds is None or not 0 < seconds < 10**11:
        raise MalformedWebhook("bad timestamp")
    try:
        return datetime.fromtimestamp(seconds, timezone.utc)
    except (OverflowError, OSError, ValueError):
        raise MalformedWebhook("bad timestamp") from None


def _required_str(item: Mapping[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise MalformedWebhook(f"missing {key}")
    return value


def _e164(wa_id: str) -> str:
    """Meta's `from` is the wa_id (digits with country code); E.164 with the BR 9th digit fixed."""
    if not _DIGITS_RE.match(wa_id):
        raise MalformedWebhook("from is not a WhatsApp number")
    try:
        return normalize_phone("+" + wa_id)
    except InvalidPhone:
        return "+" + wa_id  # a number phonenumbers does not know: keep it as sent


def _text_of(value: Any, key: str) -> str | None:
    text = value.get(key) if isinstance(value, dict) else None
    return text if isinstance(text, str) else None


#: Media types that carry a caption; they count as inbound (they open the window, feed replies).
_MEDIA_TYPES = frozenset({"image", "video", "document", "audio", "sticker", "location", "contacts"})


def _inbound(item: Any) -> InboundMessageEvent | None:
    if not isinstance(item, dict):
        raise MalformedWebhook("message is not an object")
    message_id = _required_str(item, "id")
    timestamp = _timestamp(item.get("timestamp"))
    kind = item.get("type") if isinstance(item.get("type"), str) else None
    sender = item.get("from")
    if sender is None:
        # Username (BSUID-only) senders have no phone number to match a contact with.
        log.info("meta inbound without a phone number skipped", extra={"provider_message_id": message_id})
        return None
    if not isinstance(sender, str):
        raise MalformedWebhook("from is not a string")
    from_address = _e164(sender)
    text: str | None = None
    payload: str | None = None
    audio: MediaRef | None = None
    if kind == "text":
        text = _text_of(item.get("text"), "body")
        if text is None:
            raise MalformedWebhook("text message without body")
    elif kind == "interactive":
        interactive = item.get("interactive")
        reply_type = interactive.get("type") if isinstance(interactive, dict) else None
        if reply_type not in ("button_reply", "list_reply"):
            return _skipped(message_id, kind)  # e.g. flows replies, or the errored sample
        reply = interactive.get(reply_type)
        payload = _text_of(reply, "id")
        text = _text_of(reply, "title")
        if payload is None:
            raise MalformedWebhook("interactive reply without id")
    elif kind == "button":
        button = item.get("button")
        payload = _text_of(button, "payload")
        text = _text_of(button, "text")
        if payload is None and text is None:
            raise MalformedWebhook("button reply without payload")
    elif kind in _MEDIA_TYPES:
        text = _text_of(item.get(kind), "caption")
        if kind == "audio" and (media_id := _text_of(item.get("audio"), "id")):
            audio = MediaRef(media_id=media_id, mime_type=(_text_of(item.get("audio"), "mime_type") or "")[:100] or None)
    else:
        return _skipped(message_id, kind)  # unsupported, reaction, system, …
    context = item.get("context")
    in_reply_to = _text_of(context, "id") or None
    return InboundMessageEvent(
        provider_message_id=message_id, from_address=from_address, text=text, timestamp=timestamp,
        button_payload=payload or None, in_reply_to=in_reply_to, audio=audio,
    )


#: A coexistence number (used in the WhatsApp Business app and the Cloud API at once) reports what
#: the clinic sent from the app or a linked device under this field, in `value.message_echoes[]`.
_ECHOES_FIELD = "smb_message_echoes"


def _echo(item: Any) -> InboundMessageEvent | None:
    """A message the business number sent from the WhatsApp Business app (an `smb_message_echoes`
    item: shaped like a message, `from` the business number, `to` the patient) as a `from_me`
    event whose address is the patient's, as Evolution's `fromMe` is. Edits and revokes are not
    new messages: skipped."""
    if not isinstance(item, dict):
        raise MalformedWebhook("message echo is not an object")
    recipient = item.get("to")
    if not isinstance(recipient, str):
        raise MalformedWebhook("message echo without to")
    # `to` is the number as the app had it (Meta's example shows a leading +): the wa_id without it.
    event = _inbound({**item, "from": recipient.strip().removeprefix("+")})
    if event is None:
        return None
    return replace(event, from_me=True)


def _skipped(message_id: str, kind: Any) -> None:
    log.info("meta inbound type skipped", extra={"provider_message_id": message_id, "meta_type": kind})
    return None


def _status(item: Any) -> StatusEvent | None:
    if not isinstance(item, dict):
        raise MalformedWebhook("status is not an object")
    message_id = _required_str(item, "id")
    status = item.get("status")
    if not isinstance(status, str):
        raise MalformedWebhook("missing status")
    timestamp = _timestamp(item.get("timestamp"))
    if status not in ("sent", "delivered", "read", "failed"):
        return None  # "played" (voice), "deleted", … : nothing to record
    errors = _list(item.get("errors"), "status errors")
    code: int | None = None
    if errors and isinstance(errors[0], dict):
        code = _int_code(errors[0].get("code"))
    reference = item.get("biz_opaque_callback_data")
    return StatusEvent(
        provider_message_id=message_id,
        status=status,  # type: ignore[arg-type]
        timestamp=timestamp,
        error_code=str(code) if code is not None else None,
        error_permanent=code not in _TRANSIENT_CODES,
        marketing_opt_out=code == MARKETING_OPT_OUT_CODE,
        reference=reference if isinstance(reference, str) and reference else None,
    )
