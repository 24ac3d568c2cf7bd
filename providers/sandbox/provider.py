"""Sandbox provider: the embedded default. It records, it never sends.

What it "sent" goes to the recorder the engine hands it (the admin's sandbox inbox). Replies
typed in the admin go, in-process, through the same inbound path as a real provider's webhook, in
this provider's own small JSON format. Its public webhook takes a patient's SAIR or CANCELAR, so
it always needs the channel's `webhook_secret` (every sandbox channel gets one at creation) in
the `X-Sandbox-Secret` header: without it, or with another, the delivery is refused (401).

Settings, for demos and tests of failure handling:
- `simulate`: "ok" (default), "transient" or "permanent" — every send fails that way.
- `delay_ms`: wait this long before answering, like a slow provider.
- `receipts_seconds`: report each recorded message delivered this many seconds after the send and
  read twice as late, like a patient's phone would (the demo's channels set a few seconds, so the
  dashboard shows sent → delivered → read). 0 or unset (tests, new channels): no receipts. The
  statuses are not sent by a sleeping thread: the recorder writes them as due statuses, which the
  scheduler applies through the same path as a real provider's status webhook.
"""

from __future__ import annotations

import hmac
import time
from datetime import datetime, timezone
from typing import Any

from gateway.contract import (
    Button,
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
    TransientError,
)
from gateway.webhook_body import bounded, json_object
from providers.sandbox.fields import FIELDS

SECRET_HEADER = "X-Sandbox-Secret"
MAX_WEBHOOK_BYTES = 64 * 1024
QUICK_REPLIES = (Button("confirm", "Confirmar"), Button("cancel", "Cancelar"))


class SandboxProvider(Provider):
    """Records messages through `context.sandbox_recorder`."""

    name = "sandbox"
    kinds = ("whatsapp", "email", "sms")
    # It records every call, like a provider with no idempotency key: an unknown outcome must not
    # be retried blindly.
    honours_idempotency = False
    credential_fields = FIELDS
    checks_connection = True

    def send(self, message: OutboundMessage) -> SendResult:
        delay_ms = int(self.config.get("delay_ms") or 0)
        if delay_ms > 0:
            time.sleep(delay_ms / 1000)
        simulate = self.config.get("simulate") or "ok"
        if simulate == "transient":
            raise TransientError("sandbox simulates a transient failure", code="sandbox_transient")
        if simulate == "permanent":
            raise PermanentError("sandbox simulates a permanent failure", code="sandbox_permanent")
        recorder = self.context.sandbox_recorder
        if recorder is None:
            raise PermanentError("sandbox has nowhere to record", code="sandbox_no_recorder")
        provider_id = recorder.record(self.context.org_id, self.context.channel_id, message,
                                      receipts_after=receipts_seconds(self.config.get("receipts_seconds")))
        return SendResult(provider_message_id=provider_id, provider_status="sent")

    def parse_webhook(self, request: WebhookRequest) -> WebhookResult:
        """Accept `{"type": "message", "id", "from", "text"?, "button"?, "in_reply_to"?}` or
        `{"type": "status", "id", "status", "error_code"?}`, with the channel's secret in the
        `X-Sandbox-Secret` header (compared in constant time)."""
        secret = self.config.get("webhook_secret")
        if not secret:
            raise BadSignature("sandbox channel has no webhook secret")
        given = str(request.header(SECRET_HEADER) or "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, str(secret).encode("utf-8", "surrogateescape")):
            raise BadSignature("sandbox secret does not match")
        data = json_object(bounded(request.body, MAX_WEBHOOK_BYTES))
        kind = data.get("type")
        message_id = data.get("id")
        if not isinstance(message_id, str) or not message_id:
            raise MalformedWebhook("missing id")
        timestamp = _timestamp(data.get("timestamp"))
        if kind == "message":
            sender = data.get("from")
            text = data.get("text")
            button = data.get("button")
            if not isinstance(sender, str) or not sender:
                raise MalformedWebhook("missing from")
            if text is not None and not isinstance(text, str):
                raise MalformedWebhook("text must be a string")
            if button is not None and not isinstance(button, str):
                raise MalformedWebhook("button must be a string")
            if text is None and button is None:
                raise MalformedWebhook("a message needs text or button")
            in_reply_to = data.get("in_reply_to")
            return WebhookResult(events=[InboundMessageEvent(
                provider_message_id=message_id,
                from_address=sender,
                text=text,
                timestamp=timestamp,
                button_payload=button,
                in_reply_to=in_reply_to if isinstance(in_reply_to, str) else None,
            )])
        if kind == "status":
            status = data.get("status")
            if status not in ("sent", "delivered", "read", "failed"):
                raise MalformedWebhook("unknown status")
            code = data.get("error_code")
            return WebhookResult(events=[StatusEvent(
                provider_message_id=message_id,
                status=status,
                timestamp=timestamp,
                error_code=str(code) if code is not None else None,
            )])
        raise MalformedWebhook("unknown type")


#: The longest receipt delay a channel may ask for (a mistyped setting must not hide the funnel for days).
MAX_RECEIPTS_SECONDS = 3600.0


def receipts_seconds(value: Any) -> float:
    """The channel's `receipts_seconds` setting as a delay: 0 (no receipts) when unset, not a
    number, negative or not finite; at most MAX_RECEIPTS_SECONDS."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        return 0.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        return 0.0
    return min(seconds, MAX_RECEIPTS_SECONDS)


def _timestamp(value: Any) -> datetime:
    if value is None:
        return datetime.now(timezone.utc)
    try:
        return datetime.fromtimestamp(float(value), timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        raise MalformedWebhook("bad timestamp") from None
