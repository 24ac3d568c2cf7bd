"""A message in words: why a `messages` row was not sent, failed or waits (its `error_code` and
`skip_reason`), its status and its events, and what became of a patient's message
(`inbound_messages.outcome`). The queue, the logs, Pendências, the REST API and the CLI all call
these functions, so a person never reads a raw code; the sentences live in engine/words/catalogue.py.

Codes come from three places: the engine's own (dispatch, outbox, populate...), the names the
providers give their errors (`sandbox_permanent`, `not_on_whatsapp`...), and codes a provider
passes through as it got them (a Twilio or Graph error number, an SMTP reply code, an HTTP
status). The last ones are resolved by family; a code no family knows reads as a generic sentence
that names it, as a last resort.
"""

from __future__ import annotations

import re

from engine.words.catalogue import describe, known
from engine.words.texts import Text

#: Message codes whose plain key the catalogue gives to another context (the AI's own errors, a
#: flow step), and provider spellings of something the catalogue already says.
ALIASES: dict[str, str] = {
    "timeout": "send_timeout",
    "media_too_large": "voice_too_large",  # Provider.fetch_media past the cap (engine/messaging/voice.py)
    "connection_error": "send_connection_error",
    "window_closed": "send_window_closed",  # Meta 131047, named by providers/meta
    "ERROR": "provider_failed",  # Evolution's failed status
    "canceled": "provider_cancelled",  # Twilio's canceled status
    "REJECTED": "sms_rejected",  # Zenvia's statuses and errors
    "NOT_DELIVERED": "sms_not_delivered",
    "AUTHENTICATION_ERROR": "unauthorized",
    "INTERNAL_ERROR": "provider_error",
    "rate_limit_exceeded": "provider_throttled",  # Resend's error names
    "daily_quota_exceeded": "email_quota_daily",
    "missing_api_key": "email_api_key_refused",
    "invalid_api_key": "email_api_key_refused",
    "restricted_api_key": "email_api_key_refused",
    "missing_required_field": "validation_error",
    "application_error": "provider_error",
    "internal_server_error": "provider_error",
}

#: WhatsApp Cloud API (Graph) error numbers, as `meta_<n>` or bare on a failed status webhook.
#: The named ones match providers/meta's `_ERRORS` (tests/test_message_reasons.py checks it).
META_CODES: dict[int, str] = {
    131047: "send_window_closed",
    131026: "undeliverable",
    130429: "throughput",
    131056: "pair_rate_limit",
    131048: "spam_rate_limit",
    131049: "marketing_limit",
    131050: "marketing_opted_out",
    131051: "unsupported_type",
    131000: "generic_error",
    130472: "experiment",
    131053: "media_error",
    190: "token_invalid",
    368: "account_restricted",
    131031: "account_locked",
    80007: "waba_rate_limit",
    100: "meta_invalid_parameter",
    132000: "meta_template_params",
    132001: "meta_template_missing",
    132012: "meta_template_format",
    132015: "meta_template_paused",
    132016: "meta_template_paused",
}
#: Graph's template errors: 132000 and up.
_META_TEMPLATE_RANGE = range(132000, 133000)

#: Twilio error numbers a failed SMS carries (send answers and status callbacks).
TWILIO_CODES: dict[str, str] = {
    "21610": "sms_stop",
    "21211": "invalid_number",
    "21614": "sms_not_mobile",
    "30006": "sms_not_mobile",
    "30003": "sms_unreachable",
    "30004": "sms_blocked",
    "30005": "sms_unknown_number",
    "30007": "sms_filtered",
    "30008": "sms_carrier_error",
    "20003": "sms_account_refused",
    "20429": "provider_throttled",
}

#: The families of codes built at run time (`f"http_{status}"`...): each prefix here is resolved
#: by `message_reason`, and the test fails on a provider that builds a code with another prefix.
FAMILIES = ("http_", "smtp_", "meta_")
_HTTP = re.compile(r"http_(\d{3})")
_SMTP = re.compile(r"smtp_(\d{3})")
_META = re.compile(r"meta_(\d{1,11})")
_SMTP_LOGIN = frozenset({530, 534, 535})
#: What of an unknown code may be repeated in a sentence: a code never carries PII, but one that
#: a provider passed through is cut to this shape all the same.
_SAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def _safe(code: str) -> str:
    return _SAFE.sub("?", code)[:64]


def _meta(number: int) -> Text:
    key = META_CODES.get(number)
    if key is not None:
        return describe(key)
    if number in _META_TEMPLATE_RANGE:
        return describe("meta_template", code=number)
    return describe("meta_error", code=number)


def _family(code: str, kind: str | None) -> Text | None:
    """The sentence of a code built at run time, or None when it is of no family."""
    if match := _HTTP.fullmatch(code):
        status = int(match.group(1))
        if status == 429:
            return describe("provider_throttled")
        if status in (401, 403):
            return describe("send_http_credentials", status=status)
        if status >= 500 or status == 408:
            return describe("send_http_server", status=status)
        return describe("send_http_refused", status=status)
    if match := _SMTP.fullmatch(code):
        reply = int(match.group(1))
        if reply in _SMTP_LOGIN:
            return describe("smtp_login_refused", code=reply)
        return describe("smtp_refused" if 500 <= reply < 600 else "smtp_deferred", code=reply)
    if match := _META.fullmatch(code):
        return _meta(int(match.group(1)))
    if code.isascii() and code.isdigit() and len(code) <= 11:
        # A bare number is the provider's own error number: Twilio's on SMS, Graph's on WhatsApp.
        if kind != "whatsapp" and code in TWILIO_CODES:
            return describe(TWILIO_CODES[code])
        if kind != "sms" and (kind == "whatsapp" or int(code) in META_CODES):
            return _meta(int(code))
        return describe("provider_code", code=code)
    return None


def message_reason(code: str | None, *, kind: str | None = None) -> Text | None:
    """The sentence for a code a message carries in `error_code` or `skip_reason` (or in an
    event's detail), None for no code; never the raw code. `kind` (the message's channel kind)
    tells a Twilio error number from a Graph one."""
    if not code:
        return None
    key = ALIASES.get(code, code)
    family = _family(code, kind)
    if family is not None:
        return family
    if known(key):
        return describe(key)
    if code.upper() == code and any(c.isalpha() for c in code):
        return describe("provider_code", code=_safe(code))  # a provider's own spelling (Zenvia's)
    return describe("unknown_code", code=_safe(code))


def row_reason(error_code: str | None, skip_reason: str | None, *, kind: str | None = None) -> Text | None:
    """Why a message is where it is, in one sentence: its skip reason (why it was cancelled,
    skipped or expired) before its last error; a message that expired waiting for a retry says
    both."""
    if skip_reason == "retry_after_expiry" and error_code:
        return describe("retry_after_expiry_error", error=message_reason(error_code, kind=kind))
    return message_reason(skip_reason, kind=kind) or message_reason(error_code, kind=kind)


def status_label(status: str) -> Text:
    """A message status (engine.store.models.MESSAGE_STATUSES) as a label."""
    key = f"message_status_{status}"
    return describe(key) if known(key) else describe("unknown_code", code=_safe(status))


def event_label(event: str) -> Text:
    """A message event (`message_events.event`) as a label."""
    key = f"message_event_{event}"
    return describe(key) if known(key) else describe("unknown_code", code=_safe(event))


def reply_outcome(outcome: str | None) -> Text:
    """What became of a patient's message (`inbound_messages.outcome`); None is not processed yet."""
    if not outcome:
        return describe("reply_pending")
    key = f"reply_{outcome}"
    return describe(key) if known(key) else describe("reply_other", code=_safe(outcome))
