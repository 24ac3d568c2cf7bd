"""The provider contract (SPEC §5): send, parse a webhook, report health.

Providers know HTTP and wire formats, not the database: they get their configuration (decrypted
credentials and settings) and a `ProviderContext`, and return plain values or typed errors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal, Mapping, Protocol, Sequence

from gateway.egress import STRICT, EgressPolicy
from gateway.errors import PermanentError


@dataclass(frozen=True)
class Button:
    """A quick-reply button; `id` comes back in the reply's payload."""

    id: str
    title: str


@dataclass(frozen=True)
class TemplateRef:
    """A provider-side approved template (Meta) with its ordered body parameters and the payloads
    of its quick-reply buttons (`buttons[i]` is the template's button at index i)."""

    name: str
    language: str
    parameters: tuple[str, ...] = ()
    buttons: tuple[Button, ...] = ()


@dataclass(frozen=True)
class ProviderTemplateButton:
    """One button of a provider-side template: its type as the provider names it (Meta:
    QUICK_REPLY, URL, PHONE_NUMBER, …), its label, and whether it needs a value at send time."""

    type: str
    text: str
    needs_parameter: bool = False


@dataclass(frozen=True)
class ProviderTemplate:
    """A template as the provider's account lists it (Meta: `GET /{waba_id}/message_templates`).

    `parameters` are the body's placeholders in order of first appearance ("1", "2", … or names when
    `named`); `header_needs_parameter` says the header is media or has a placeholder, which a send
    would have to fill."""

    name: str
    language: str
    status: str
    category: str
    body: str = ""
    parameters: tuple[str, ...] = ()
    named: bool = False
    header_needs_parameter: bool = False
    buttons: tuple[ProviderTemplateButton, ...] = ()


@dataclass(frozen=True)
class OutboundMessage:
    """One message to one recipient, already rendered."""

    #: The recipient: an e-mail address, or a phone number in E.164 as the engine stores it
    #: (`gateway.phones.recipient_phone` gives a provider the number to send to).
    to: str
    text: str
    subject: str | None = None
    html: str | None = None
    template: TemplateRef | None = None
    buttons: tuple[Button, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    #: Our message id, for providers that echo an opaque reference back in status webhooks.
    reference: str | None = None
    #: True when the patient wrote on this channel in the last 24 hours (Meta's customer-service
    #: window): free text may go; outside it only an approved template may.
    conversation_open: bool = False

    def __repr__(self) -> str:  # recipients and bodies are PII; keep them out of logs
        return f"OutboundMessage(key={self.idempotency_key!r}, buttons={len(self.buttons)})"


def N_(msgid: str) -> str:
    """Mark a provider's pt-BR sentence (a field label, its help) for extraction (babel.cfg's `N_`
    keyword, as `engine.words.texts.N_`); the console translates it when it shows it. Providers may not
    import the engine, so this marker lives in the contract and returns the msgid as is."""
    return msgid


@dataclass(frozen=True)
class CredentialField:
    """One value a clinic types to set up a channel at a provider, declared by the provider.

    `label` and `help` are pt-BR msgids (marked with `N_`); `help` says what the value is and where
    it is found in the provider's dashboard. `pattern` is a full-match regex of a well-formed value;
    `address` says which egress check the value must pass ("url" or "host"); `secret` values are
    never shown back; `advanced` fields are tucked away (the provider's defaults fit almost everyone).
    """

    key: str
    label: str
    help: str = ""
    required: bool = True
    secret: bool = False
    pattern: str | None = None
    example: str | None = None
    choices: tuple[str, ...] = ()
    address: Literal["url", "host"] | None = None
    advanced: bool = False
    max_length: int = 2000
    #: Required unless this other key is given (Twilio: a sender number or a messaging service).
    unless: str | None = None
    #: Left blank, Lembra generates the value (a webhook secret it registers with the provider itself).
    generated: bool = False
    #: Part of where the channel's secrets are sent, besides an `address` field (an SMTP port and its
    #: security): a change of any of these moves the secrets elsewhere, so the stored ones are dropped.
    endpoint: bool = False

    @property
    def binds_secrets(self) -> bool:
        """Whether changing this value sends the channel's secrets to another server."""
        return self.address is not None or self.endpoint


@dataclass(frozen=True)
class SendResult:
    """What a provider answered to a successful send."""

    provider_message_id: str
    provider_status: str | None = None


@dataclass(frozen=True)
class WebhookRequest:
    """An HTTP request as a provider sent it: headers, the raw body bytes, the query string."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes
    query: Mapping[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        """Header lookup ignoring case."""
        lowered = name.lower()
        for key, value in self.headers.items():
            if key.lower() == lowered:
                return value
        return None


@dataclass(frozen=True)
class MediaRef:
    """A patient's voice note as the webhook names it: the provider's handle to download it
    (Meta: the media id; Evolution: the message's key id), its type, and what the webhook says of
    its length (Evolution's `seconds`, a `size` in bytes) so that an over-long one is refused unread."""

    media_id: str
    mime_type: str | None = None
    seconds: int | None = None
    size: int | None = None


@dataclass(frozen=True)
class Media:
    """Downloaded media: its bytes and type. Never logged (a voice is personal data)."""

    content: bytes
    mime_type: str

    def __repr__(self) -> str:
        return f"Media(mime_type={self.mime_type!r}, bytes={len(self.content)})"


@dataclass(frozen=True)
class InboundMessageEvent:
    """A patient wrote (or tapped a button, or sent a voice note: `audio`), or, with `from_me`, the
    channel's own number wrote to the patient: someone at the clinic on its phone or WhatsApp Web,
    or the provider echoing a send of ours. `from_address` is always the patient's address (the
    other end of the chat)."""

    provider_message_id: str
    from_address: str
    text: str | None
    timestamp: datetime
    button_payload: str | None = None
    in_reply_to: str | None = None
    from_me: bool = False
    audio: MediaRef | None = None


@dataclass(frozen=True)
class StatusEvent:
    """A provider reports what happened to a message it accepted."""

    provider_message_id: str
    status: Literal["sent", "delivered", "read", "failed"]
    timestamp: datetime
    error_code: str | None = None
    error_permanent: bool = True
    opt_out: bool = False
    #: The person stopped this business's marketing messages (Meta's 131050): utility ones still go.
    marketing_opt_out: bool = False
    #: Our own message reference when the provider echoes it (resolves `unknown` outcomes).
    reference: str | None = None


@dataclass(frozen=True)
class ConnectionEvent:
    """The provider's connection to the network changed (Evolution's QR / open / close)."""

    state: str
    detail: str | None = None


@dataclass(frozen=True)
class TemplateEvent:
    """The provider's account changed one of its message templates (Meta's
    message_template_status_update and template_category_update): its new `status` and/or
    `category` (upper case, as the provider names them; None when the event does not say),
    with the category it had before and the provider's reason when it gives them."""

    name: str
    language: str
    #: When the provider says the change happened (None: when it arrived).
    timestamp: datetime | None = None
    status: str | None = None
    category: str | None = None
    previous_category: str | None = None
    reason: str | None = None


WebhookEvent = InboundMessageEvent | StatusEvent | ConnectionEvent | TemplateEvent


@dataclass(frozen=True)
class WebhookResult:
    """Parsed events, plus an optional direct answer (Meta's GET challenge)."""

    events: Sequence[WebhookEvent] = ()
    response_body: str | None = None
    response_status: int = 200
    #: Content type of `response_body` (Twilio wants TwiML: text/xml).
    response_content_type: str = "text/plain"


@dataclass(frozen=True)
class ConnectInfo:
    """How an operator links a number (Evolution): a QR code image and/or a pairing code."""

    qr_code_base64: str | None = None
    pairing_code: str | None = None
    state: str | None = None


@dataclass(frozen=True)
class Health:
    """Connection health as the provider sees it."""

    ok: bool
    state: str
    detail: str | None = None


class SandboxRecorder(Protocol):
    """Where the sandbox provider writes what it would have sent."""

    def record(self, org_id: int, channel_id: int, message: OutboundMessage, *,
               receipts_after: float = 0.0) -> str:
        """Record `message` and return its provider id; with `receipts_after` > 0, also report it
        delivered that many seconds later and read twice as late (the sandbox's realism)."""
        ...


@dataclass(frozen=True)
class ProviderContext:
    """What a provider may know about where it runs (never the database)."""

    org_id: int
    channel_id: int
    timeout: float = 15.0
    public_url: str = "http://127.0.0.1:8000"
    sandbox_recorder: SandboxRecorder | None = None
    #: Where a tenant-set address (`base_url`, an SMTP host) may connect: every provider opens
    #: its connections through it (`gateway.egress`). The default allows public addresses only.
    egress: EgressPolicy = STRICT


class Provider(ABC):
    """Base class of every provider; subclasses set `name` and `kinds`."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]
    #: True when a retried send with the same idempotency key cannot deliver twice, so an
    #: unknown outcome may be retried instead of parked for the operator.
    honours_idempotency: ClassVar[bool] = False
    #: The values a clinic types to set this provider up (the console's channel form shows these).
    credential_fields: ClassVar[tuple[CredentialField, ...]] = ()
    #: True when `check()` really asks the provider; else only a test send proves the channel works.
    checks_connection: ClassVar[bool] = False
    #: Seconds the provider wants between two messages to the same recipient from one channel
    #: (Meta: one every 6 s); the engine spaces them fleet-wide before sending. None: no spacing.
    recipient_interval: ClassVar[float | None] = None

    def __init__(self, config: Mapping[str, Any], context: ProviderContext) -> None:
        self.config = dict(config)
        self.context = context

    def __repr__(self) -> str:  # config holds secrets
        return f"<{type(self).__name__} channel={self.context.channel_id}>"

    @abstractmethod
    def send(self, message: OutboundMessage) -> SendResult:
        """Send one message; raise TransientError or PermanentError on failure."""

    @abstractmethod
    def parse_webhook(self, request: WebhookRequest) -> WebhookResult:
        """Verify and parse a webhook; raise BadSignature or MalformedWebhook when refused."""

    @property
    def webhook_url(self) -> str:
        """Where this channel's provider must send its webhooks."""
        return f"{self.context.public_url.rstrip('/')}/webhooks/{self.name}/{self.context.channel_id}"

    def health(self) -> Health:
        """Connection health; providers without a connection concept are always ok."""
        return Health(ok=True, state="ok")

    def check(self) -> Health:
        """"Testar conexão": ask the provider now whether these credentials work, sending nothing.

        Raises TransientError (unreachable, timeout, throttled: try later) or PermanentError
        (credentials refused, misconfigured) with the provider's code, or answers a `Health`
        (ok, or not ok with its state and code). Defaults to `health()`.
        """
        return self.health()

    def configure_webhook(self) -> None:
        """Tell the provider where to send webhooks, where the provider supports that by API."""

    def connect(self) -> ConnectInfo:
        """Start linking a number (QR code); only providers that pair a phone support it."""
        raise PermanentError("this provider has no connect step", code="unsupported")

    def list_templates(self) -> Sequence[ProviderTemplate]:
        """The templates of the account behind this channel (Meta: the WABA's message templates),
        whatever their status; raises TransientError / PermanentError like a send, or
        PermanentError("unsupported") for providers without approved templates."""
        raise PermanentError("this provider has no approved templates", code="unsupported")

    def fetch_media(self, media: MediaRef, *, max_bytes: int) -> Media:
        """Download an inbound voice note, reading at most `max_bytes` of it: raises
        PermanentError("media_too_large") past that, TransientError / PermanentError like a send,
        or PermanentError("unsupported") for providers that receive no media."""
        raise PermanentError("this provider receives no media", code="unsupported")

    @classmethod
    def template_preview(cls, template: TemplateRef) -> Mapping[str, Any] | None:
        """What the provider would put on the wire for `template` (Meta: the `template` object of
        a send), for a console to show; None for providers without approved templates."""
        return None
