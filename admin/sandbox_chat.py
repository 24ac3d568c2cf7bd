"""Answering as the patient on the sandbox provider: the one path the console's Caixa do sandbox and
`lembra sandbox reply` share.

A reply goes in-process (never through the public URL) as the sandbox provider's own webhook body,
with the channel's secret, to `admin.webhooks.deliver` (`engine.messaging.inbound.receive`, then the
inbound workers), so it travels the same inbound path as a real provider's: verified, stored, then
matched to OK / CANCELAR / SAIR by the engine. Every query is scoped by org.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from sqlalchemy import select
from sqlalchemy.engine import Connection

from admin.webhooks import deliver
from engine.core.errors import DomainError
from engine.messaging.inbound import Received, process_inbound
from engine.store.models import channels, enrollments, flow_pointers, inbound_messages, sandbox_messages
from engine.store.runtime import Runtime
from engine.tenants.channels import sandbox_webhook_secret
from engine.words.catalogue import describe
from engine.words.texts import Text
from gateway.contract import WebhookRequest
from gateway.errors import WebhookError
from gateway.phones import InvalidPhone, normalize_phone
from providers.sandbox.provider import SECRET_HEADER

#: The longest reply a person may type as the patient; a WhatsApp message is at most 4096 characters.
MAX_REPLY = 1000
#: Channel kinds a patient can answer on (e-mail replies are not an inbound path of the engine).
REPLYABLE_KINDS = ("whatsapp", "sms")


class SandboxReplyError(DomainError):
    """A reply as the patient that cannot go: its catalogue code and sentence (`text`, for the
    reader's language); nothing was written."""

    def __init__(self, code: str, **params: Any) -> None:
        self.code = code
        self.text: Text = describe(code, **params)
        super().__init__(str(self.text))


@dataclass(frozen=True)
class PatientReply:
    """What the engine made of a reply: the stored inbound message, its outcome code
    (`inbound_messages.outcome`, None while unprocessed) and the contact it was matched to."""

    inbound_id: int
    outcome: str | None
    contact_id: int | None
    #: The follow-up run that took the reply to read it (a conversation, a classifier), and its flow's name.
    run_id: int | None = None
    flow_name: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"inbound_id": self.inbound_id, "outcome": self.outcome, "contact_id": self.contact_id,
                "run_id": self.run_id}


def reply_as_patient(rt: Runtime, *, org_id: int, channel_id: int, from_address: str, text: str | None = None,
                     button: str | None = None, in_reply_to: str | None = None,
                     enqueue: Callable[[Sequence[int]], None] | None = None) -> Received:
    """Deliver a patient's message to one of the org's channels as its provider's webhook would:
    the sandbox provider's body, with the channel's secret, through `admin.webhooks.deliver`
    (verify, store, hand to the inbound workers, or to `enqueue` when given). Raises a
    `WebhookError` when the webhook path refuses it (e.g. the channel is no longer a sandbox)."""
    headers = {"Content-Type": "application/json"}
    with rt.db.begin() as conn:
        channel = conn.execute(select(channels).where(channels.c.org_id == org_id,
                                                      channels.c.id == channel_id)).one()
        if channel.provider == "sandbox":
            # The console vouches for the reply with the secret the public webhook requires (a
            # channel from before every sandbox had one gets it now).
            headers[SECRET_HEADER] = sandbox_webhook_secret(conn, rt.keyring, rt.providers, channel)
    body: dict[str, Any] = {"type": "message", "id": f"sbx-in-{uuid.uuid4().hex}", "from": from_address}
    if in_reply_to:
        body["in_reply_to"] = in_reply_to
    if text:
        body["text"] = text
    if button:
        body["button"] = button
    url = f"{rt.settings.public_url.rstrip('/')}/webhooks/sandbox/{channel_id}"
    req = WebhookRequest(method="POST", url=url, headers=headers, body=json.dumps(body).encode())
    return deliver(rt, "sandbox", channel_id, req, enqueue=enqueue)


def e164(phone: str) -> str:
    """`phone` when it is already a valid number in E.164 (+5516999887766); SandboxReplyError
    otherwise (the sentence never repeats the number: it is personal data)."""
    try:
        normalized = normalize_phone(phone)
    except InvalidPhone:
        raise SandboxReplyError("sandbox_reply_phone") from None
    if normalized != phone.strip() or not phone.strip().startswith("+"):
        raise SandboxReplyError("sandbox_reply_phone")
    return normalized


def sandbox_channel(conn: Connection, org_id: int, channel_id: int | None = None) -> Any:
    """The org's sandbox channel a patient answers on: the given one (refused when it is another
    org's, not a sandbox, or an e-mail channel, all in one sentence so that another org's ids say
    nothing), else the org's sandbox WhatsApp channel (the default, then active ones first)."""
    if channel_id is not None:
        row = conn.execute(select(channels).where(channels.c.org_id == org_id, channels.c.id == channel_id,
                                                  channels.c.provider == "sandbox")).first()
        if row is None:
            raise SandboxReplyError("sandbox_reply_channel", channel=channel_id)
        if row.kind not in REPLYABLE_KINDS:
            raise SandboxReplyError("sandbox_reply_email")
        return row
    row = conn.execute(
        select(channels)
        .where(channels.c.org_id == org_id, channels.c.provider == "sandbox", channels.c.kind == "whatsapp")
        .order_by(channels.c.is_default.desc(), (channels.c.status == "active").desc(), channels.c.id)
        .limit(1)).first()
    if row is None:
        raise SandboxReplyError("sandbox_reply_no_channel")
    return row


def last_sent(conn: Connection, org_id: int, channel_id: int, phone: str) -> Any:
    """The latest message the sandbox "sent" to `phone` on the channel (what the patient answers),
    or None."""
    sm = sandbox_messages
    return conn.execute(
        select(sm.c.id, sm.c.provider_message_id, sm.c.buttons)
        .where(sm.c.org_id == org_id, sm.c.channel_id == channel_id, sm.c.to_address == phone)
        .order_by(sm.c.created_at.desc(), sm.c.id.desc()).limit(1)).first()


def button_ids(message: Any) -> list[str]:
    """The quick-reply payloads of a sandbox message (`confirm:<id>`, `cancel:<id>`)."""
    if message is None:
        return []
    return [str(b["id"]) for b in (message.buttons or []) if isinstance(b, dict) and b.get("id")]


def reply_from_phone(rt: Runtime, org_id: int, phone: str, text: str | None, *, channel_id: int | None = None,
                     button: str | None = None) -> PatientReply:
    """Play the patient who has `phone`: answer the latest sandbox message sent to it on the org's
    sandbox channel (or `channel_id`), then act on the reply before returning, as a one-off tool
    must (the workers of an in-process broker leave with the process). The processing is the
    inbound actor's own function, compare-and-set per message, so a worker poked again later finds
    it done. Raises SandboxReplyError, before anything is written, for bad input."""
    phone = e164(phone)
    text = (text or "").strip() or None
    if text is None and not button:
        raise SandboxReplyError("sandbox_reply_empty")
    if text is not None and len(text) > MAX_REPLY:
        raise SandboxReplyError("sandbox_reply_too_long", max=MAX_REPLY)
    with rt.db.connect() as conn:
        channel = sandbox_channel(conn, org_id, channel_id)
        original = last_sent(conn, org_id, channel.id, phone)
    if button is not None and button not in button_ids(original):
        raise SandboxReplyError("sandbox_reply_button", buttons=", ".join(button_ids(original)) or "—")

    def process_now(ids: Sequence[int]) -> None:
        for inbound_id in ids:
            process_inbound(rt, int(inbound_id))

    try:
        received = reply_as_patient(rt, org_id=org_id, channel_id=channel.id, from_address=phone, text=text,
                                    button=button, in_reply_to=original.provider_message_id if original else None,
                                    enqueue=process_now)
    except WebhookError as exc:
        raise SandboxReplyError("sandbox_reply_refused", motivo=exc.reason) from None
    inbound_id = received.inbound_ids[0]  # a fresh provider id: always one new message
    with rt.db.connect() as conn:
        row = conn.execute(select(inbound_messages.c.outcome, inbound_messages.c.contact_id,
                                  inbound_messages.c.flow_enrollment_id, flow_pointers.c.name)
                           .select_from(inbound_messages.outerjoin(enrollments, (
                               enrollments.c.org_id == inbound_messages.c.org_id)
                               & (enrollments.c.id == inbound_messages.c.flow_enrollment_id))
                                        .outerjoin(flow_pointers, (flow_pointers.c.org_id == enrollments.c.org_id)
                                                   & (flow_pointers.c.id == enrollments.c.pointer_id)))
                           .where(inbound_messages.c.org_id == org_id, inbound_messages.c.id == inbound_id)).one()
    return PatientReply(inbound_id=int(inbound_id), outcome=row.outcome,
                        contact_id=int(row.contact_id) if row.contact_id is not None else None,
                        run_id=row.flow_enrollment_id, flow_name=row.name)
