"""The data model (SPEC §3), mapped onto the schema that `sql/` creates.

The SQL migrations are the source of truth for the schema; these classes describe it to
SQLAlchemy and Flask-Admin. tests/test_schema.py checks that both agree column by column.
Every table but `orgs` carries `org_id`, and every query filters on it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, ForeignKey, Integer, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine.store.db import BinaryType, JSONType, UTCDateTime

# SQLite only auto-increments an INTEGER PRIMARY KEY, PostgreSQL uses bigint identities.
PK = BigInteger().with_variant(Integer(), "sqlite")

CHANNEL_KINDS = ("whatsapp", "email", "sms")
PROVIDERS = ("evolution", "meta", "smtp", "resend", "twilio", "zenvia", "sandbox")
APPOINTMENT_STATUSES = ("scheduled", "confirmed", "cancelled", "completed", "no_show")
MESSAGE_STATUSES = (
    "new", "pending", "claimed", "sending", "sent", "delivered", "read",
    "failed", "unknown", "cancelled", "expired", "dead", "skipped",
)
#: Statuses from which a message may still go out.
OPEN_STATUSES = ("new", "pending", "claimed")
#: Statuses after which nothing will happen to a message any more (bar status webhooks).
TERMINAL_STATUSES = ("sent", "delivered", "read", "failed", "cancelled", "expired", "dead", "skipped")


class Base(DeclarativeBase):
    """Declarative base of every Lembra table."""

    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType}


def _fk(target: str, *, nullable: bool = False, ondelete: str | None = None) -> Any:
    return mapped_column(PK, ForeignKey(target, ondelete=ondelete), nullable=nullable)


class Org(Base):
    __tablename__ = "orgs"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    slug: Mapped[str] = mapped_column(Text, unique=True)
    name: Mapped[str] = mapped_column(Text)
    timezone: Mapped[str] = mapped_column(Text, default="America/Sao_Paulo")
    locale: Mapped[str] = mapped_column(Text, default="pt_BR")
    state: Mapped[str | None] = mapped_column(Text)
    quiet_start: Mapped[str] = mapped_column(Text, default="08:00")
    quiet_end: Mapped[str] = mapped_column(Text, default="20:00")
    skip_sundays: Mapped[bool] = mapped_column(Boolean, default=True)
    skip_holidays: Mapped[bool] = mapped_column(Boolean, default=True)
    optout_keywords: Mapped[str | None] = mapped_column(Text)
    confirm_keywords: Mapped[str | None] = mapped_column(Text)
    cancel_keywords: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    #: Retention (engine/privacy/retention.py): texts go after the first, rows after the second.
    retention_queue_days: Mapped[int] = mapped_column(Integer, default=90)
    retention_events_days: Mapped[int] = mapped_column(Integer, default=730)
    #: The clinic's availability webhook (engine/people/agenda/webhook.py): free times come from it
    #: instead of the built-in agenda when set.
    availability_url: Mapped[str | None] = mapped_column(Text)
    #: A patient's messages this close together are one turn of a conversation (engine/flows/replies.py).
    reply_debounce_seconds: Mapped[int] = mapped_column(Integer, default=8)
    #: The org's OpenAI-compatible transcription server for voice notes (engine/messaging/voice.py);
    #: none: voice notes go to a person. The key is sealed for this row (`transcription.seal_key`).
    transcription_base_url: Mapped[str | None] = mapped_column(Text)
    transcription_model: Mapped[str | None] = mapped_column(Text)
    transcription_api_key: Mapped[bytes | None] = mapped_column(BinaryType)
    transcription_key_version: Mapped[int | None] = mapped_column(Integer)
    #: A hand-off the clinic's own phone started ends after this many minutes without another
    #: message from it (engine/messaging/clinic_phone.py); 0: only a person ends it.
    staff_quiet_minutes: Mapped[int] = mapped_column(Integer, default=30)

    def __str__(self) -> str:
        return self.name


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    email: Mapped[str] = mapped_column(Text, unique=True)
    password_hash: Mapped[str] = mapped_column(Text)
    role: Mapped[str] = mapped_column(Text)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    last_login_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    locale: Mapped[str | None] = mapped_column(Text)
    #: Bumped when the user signs out, changes password or is deactivated: the signed session
    #: carries the generation it was issued under, and an older one no longer loads (admin/auth.py).
    session_generation: Mapped[int] = mapped_column(Integer, default=0)

    def __repr__(self) -> str:  # never the hash
        return f"<User {self.id} org={self.org_id} role={self.role}>"


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    name: Mapped[str] = mapped_column(Text)
    prefix: Mapped[str] = mapped_column(Text)
    key_hash: Mapped[str] = mapped_column(Text, unique=True)
    created_at: Mapped[datetime]
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class Contact(Base):
    __tablename__ = "contacts"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    name: Mapped[str | None] = mapped_column(Text)
    phone: Mapped[str | None] = mapped_column(Text)
    email: Mapped[str | None] = mapped_column(Text)
    external_id: Mapped[str | None] = mapped_column(Text)
    locale: Mapped[str | None] = mapped_column(Text)
    erased_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    #: Who erased the contact (`user:ID`, `api_key:ID`, `cli:NAME`); the row is then a tombstone.
    erased_by: Mapped[str | None] = mapped_column(Text)
    #: Meta's 131050: the person stopped this business's marketing messages (0029).
    marketing_opted_out_at: Mapped[datetime | None]

    def __repr__(self) -> str:  # no name or phone: reprs end up in logs
        return f"<Contact {self.id} org={self.org_id}>"


class Preference(Base):
    __tablename__ = "preferences"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    contact_id: Mapped[int] = _fk("contacts.id")
    kind: Mapped[str] = mapped_column(Text)
    opted_in: Mapped[bool] = mapped_column(Boolean, default=False)
    opted_in_at: Mapped[datetime | None]
    opted_out_at: Mapped[datetime | None]
    source: Mapped[str | None] = mapped_column(Text)
    evidence: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime]


class Appointment(Base):
    __tablename__ = "appointments"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    contact_id: Mapped[int] = _fk("contacts.id")
    professional: Mapped[str | None] = mapped_column(Text)
    starts_at: Mapped[datetime]
    timezone: Mapped[str] = mapped_column(Text)
    mode: Mapped[str | None] = mapped_column(Text)
    location: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text, default="scheduled")
    external_id: Mapped[str | None] = mapped_column(Text)
    confirmed_at: Mapped[datetime | None]
    cancelled_at: Mapped[datetime | None]
    cancel_source: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    #: Who the appointment is with in the built-in agenda; `professional` keeps the text shown.
    professional_id: Mapped[int | None] = _fk("professionals.id", nullable=True)


class Channel(Base):
    __tablename__ = "channels"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    kind: Mapped[str] = mapped_column(Text)
    provider: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    credentials: Mapped[bytes | None] = mapped_column(BinaryType)
    key_version: Mapped[int | None] = mapped_column(Integer)
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(Text, default="active")
    status_detail: Mapped[str | None] = mapped_column(Text)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    min_interval_ms: Mapped[int | None] = mapped_column(Integer)
    daily_cap: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    def __repr__(self) -> str:  # never the credentials
        return f"<Channel {self.id} org={self.org_id} {self.kind}/{self.provider}>"


class Template(Base):
    __tablename__ = "templates"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int | None] = _fk("orgs.id", nullable=True)
    key: Mapped[str] = mapped_column(Text)
    channel_kind: Mapped[str] = mapped_column(Text)
    locale: Mapped[str] = mapped_column(Text, default="pt_BR")
    subject: Mapped[str | None] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    body_html: Mapped[str | None] = mapped_column(Text)
    meta_template_name: Mapped[str | None] = mapped_column(Text)
    meta_language: Mapped[str | None] = mapped_column(Text)
    meta_parameters: Mapped[list[str] | None] = mapped_column(JSONType)
    updated_at: Mapped[datetime]
    meta_buttons: Mapped[list[str] | None] = mapped_column(JSONType)  # added by 0018, so last


class ReminderRule(Base):
    __tablename__ = "reminder_rules"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    name: Mapped[str] = mapped_column(Text)
    purpose: Mapped[str] = mapped_column(Text)
    template_key: Mapped[str] = mapped_column(Text)
    trigger: Mapped[str] = mapped_column(Text)
    offset_minutes: Mapped[int] = mapped_column(Integer, default=0)
    respect_window: Mapped[bool] = mapped_column(Boolean, default=True)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class ReminderRuleKind(Base):
    __tablename__ = "reminder_rule_kinds"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    rule_id: Mapped[int] = _fk("reminder_rules.id", ondelete="CASCADE")
    kind: Mapped[str] = mapped_column(Text)
    position: Mapped[int] = mapped_column(Integer)


class FlowPointer(Base):
    __tablename__ = "flow_pointers"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    name: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text, default="draft")
    active_version_id: Mapped[int | None] = mapped_column(PK)
    draft_graph: Mapped[dict[str, Any]] = mapped_column(default=lambda: {"nodes": [], "edges": []})
    handoff_policy: Mapped[str] = mapped_column(Text, default="pause")
    cancel_on_reply: Mapped[bool] = mapped_column(Boolean, default=False)
    trigger_config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    max_steps: Mapped[int] = mapped_column(Integer, default=30)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    resume_grace_minutes: Mapped[int] = mapped_column(Integer, default=30)


class FlowVersion(Base):
    __tablename__ = "flow_versions"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    pointer_id: Mapped[int] = _fk("flow_pointers.id")
    version: Mapped[int] = mapped_column(Integer)
    graph: Mapped[dict[str, Any]]
    created_by: Mapped[int | None] = _fk("users.id", nullable=True)
    created_at: Mapped[datetime]
    #: Who published it: 'user' (`created_by`), or the system: 'demo', 'import', 'api' (None: not recorded).
    published_by: Mapped[str | None] = mapped_column(Text)


class Enrollment(Base):
    __tablename__ = "enrollments"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    pointer_id: Mapped[int] = _fk("flow_pointers.id")
    version_id: Mapped[int] = _fk("flow_versions.id")
    contact_id: Mapped[int] = _fk("contacts.id")
    appointment_id: Mapped[int | None] = _fk("appointments.id", nullable=True)
    current_node_id: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text, default="active")
    next_eval_at: Mapped[datetime | None]
    lease_until: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=5)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    llm_calls: Mapped[int] = mapped_column(Integer, default=0)
    timing_plan: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    last_error: Mapped[str | None] = mapped_column(Text)
    outcome: Mapped[str | None] = mapped_column(Text)
    cancel_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    revision: Mapped[int] = mapped_column(Integer, default=0)
    node_entered_at: Mapped[datetime | None]
    pending_inbound_id: Mapped[int | None] = _fk("inbound_messages.id", nullable=True)
    paused_status: Mapped[str | None] = mapped_column(Text)
    agent_id: Mapped[int | None] = _fk("agents.id", nullable=True)
    trigger_kind: Mapped[str | None] = mapped_column(Text)
    trigger_key: Mapped[str | None] = mapped_column(Text)
    trigger_payload: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    messages_sent: Mapped[int] = mapped_column(Integer, default=0)
    replies: Mapped[int] = mapped_column(Integer, default=0)
    last_reply_at: Mapped[datetime | None]
    last_outbound_at: Mapped[datetime | None]
    last_class: Mapped[str | None] = mapped_column(Text)
    ended_at: Mapped[datetime | None]
    #: The clock a hand-off stopped (`next_eval_at` at the pause), kept to resume on it.
    paused_next_eval_at: Mapped[datetime | None]
    #: When the actor began on the current claim (NULL: the claim has not reached a worker);
    #: meaningful while `lease_until` is set, cleared by each claim (engine/flows/runtime.py).
    claim_started_at: Mapped[datetime | None]
    #: What the run has collected, by conversation field slug (engine/flows/conversation/fields.py).
    data: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    #: Where an `ask` node is: the node visit it belongs to, the field asked last, asks per field.
    ask_state: Mapped[dict[str, Any] | None] = mapped_column(JSONType)


class EnrollmentEvent(Base):
    __tablename__ = "enrollment_events"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    enrollment_id: Mapped[int] = _fk("enrollments.id")
    node_id: Mapped[str | None] = mapped_column(Text)
    event_type: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    idempotency_key: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]


class FlowClaim(Base):
    __tablename__ = "flow_claims"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    pointer_id: Mapped[int] = _fk("flow_pointers.id")
    contact_id: Mapped[int] = _fk("contacts.id")
    dedupe_key: Mapped[str] = mapped_column(Text)
    enrollment_id: Mapped[int | None] = _fk("enrollments.id", nullable=True)
    claimed_at: Mapped[datetime]


class Agent(Base):
    __tablename__ = "agents"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    name: Mapped[str] = mapped_column(Text)
    persona: Mapped[str | None] = mapped_column(Text)
    llm_base_url: Mapped[str | None] = mapped_column(Text)
    llm_model: Mapped[str | None] = mapped_column(Text)
    llm_api_key: Mapped[bytes | None] = mapped_column(BinaryType)
    key_version: Mapped[int | None] = mapped_column(Integer)
    handoff_policy: Mapped[str] = mapped_column(Text, default="pause")
    followup_enabled: Mapped[bool] = mapped_column(Boolean, default=False)
    flow_pointer_ids: Mapped[dict[str, Any]] = mapped_column(JSONType, default=list)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class ConversationField(Base):
    """A field an org's flows may ask a patient for (engine/flows/conversation/fields.py)."""

    __tablename__ = "conversation_fields"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    slug: Mapped[str] = mapped_column(Text)
    label: Mapped[str] = mapped_column(Text)
    type: Mapped[str] = mapped_column(Text)
    options: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    question: Mapped[str] = mapped_column(Text)
    template_key: Mapped[str | None] = mapped_column(Text)
    harvest: Mapped[str] = mapped_column(Text)
    maps_to: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Message(Base):
    __tablename__ = "messages"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    purpose: Mapped[str] = mapped_column(Text)
    contact_id: Mapped[int] = _fk("contacts.id")
    channel_kind: Mapped[str] = mapped_column(Text)
    channel_id: Mapped[int | None] = _fk("channels.id", nullable=True)
    appointment_id: Mapped[int | None] = _fk("appointments.id", nullable=True)
    appointment_starts_at: Mapped[datetime | None]
    enrollment_id: Mapped[int | None] = _fk("enrollments.id", nullable=True)
    rule_id: Mapped[int | None] = _fk("reminder_rules.id", nullable=True)
    template_key: Mapped[str | None] = mapped_column(Text)
    respect_window: Mapped[bool] = mapped_column(Boolean, default=True)
    payload: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    idempotency_key: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    nominal_due_at: Mapped[datetime | None]
    due_at: Mapped[datetime | None]
    next_attempt_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_until: Mapped[datetime | None]
    claimed_by: Mapped[str | None] = mapped_column(Text)
    provider_message_id: Mapped[str | None] = mapped_column(Text)
    subject: Mapped[str | None] = mapped_column(Text)
    body: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(Text)
    error_detail: Mapped[str | None] = mapped_column(Text)
    skip_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    sent_at: Mapped[datetime | None]
    delivered_at: Mapped[datetime | None]
    read_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    #: When retention or an erasure removed the message's text (the row and its counts stay).
    anonymised_at: Mapped[datetime | None]
    #: How Meta bills the send (0029, engine/messaging/pricing): the category ("service" for free
    #: text), whether it fell inside the free customer-service window, the recipient's country.
    price_category: Mapped[str | None] = mapped_column(Text)
    price_free: Mapped[bool | None] = mapped_column(Boolean)
    price_country: Mapped[str | None] = mapped_column(Text)


class MessageEvent(Base):
    __tablename__ = "message_events"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    message_id: Mapped[int] = _fk("messages.id")
    event: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int | None] = mapped_column(Integer)
    provider_status: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    created_at: Mapped[datetime]


class InboundMessage(Base):
    __tablename__ = "inbound_messages"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    channel_id: Mapped[int] = _fk("channels.id")
    provider_message_id: Mapped[str] = mapped_column(Text)
    contact_id: Mapped[int | None] = _fk("contacts.id", nullable=True)
    from_address: Mapped[str | None] = mapped_column(Text)
    text: Mapped[str | None] = mapped_column(Text)
    button_payload: Mapped[str | None] = mapped_column(Text)
    intent: Mapped[str | None] = mapped_column(Text)
    in_reply_to: Mapped[str | None] = mapped_column(Text)
    received_at: Mapped[datetime]
    processed_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(Text)
    #: When a person of the clinic dealt with a reply no keyword handled (engine/messaging/conversations.py).
    handled_at: Mapped[datetime | None]
    handled_by: Mapped[int | None] = _fk("users.id", nullable=True)
    #: The follow-up run whose waiting node took the reply (engine/flows/replies.py), what the
    #: flow made of it when it read it (codes and node ids) and, if it understood it, when.
    # `use_alter`: enrollments point here too (`pending_inbound_id`); without it the two tables form
    # a cycle the metadata cannot sort.
    flow_enrollment_id: Mapped[int | None] = mapped_column(PK, ForeignKey("enrollments.id", use_alter=True),
                                                           nullable=True)
    flow_result: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    flow_handled_at: Mapped[datetime | None]
    #: A voice note (engine/messaging/voice.py): the provider's handle, type and length, the audio
    #: once downloaded, and where its transcription stands (pending / transcribed / needs_person,
    #: with a catalogue code); `text` holds the transcript.
    media_id: Mapped[str | None] = mapped_column(Text)
    media_mime: Mapped[str | None] = mapped_column(Text)
    media_seconds: Mapped[int | None] = mapped_column(Integer)
    media_size: Mapped[int | None] = mapped_column(BigInteger)
    audio: Mapped[bytes | None] = mapped_column(BinaryType)
    voice_state: Mapped[str | None] = mapped_column(Text)
    voice_reason: Mapped[str | None] = mapped_column(Text)
    voice_attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: The clinic's own number wrote it (its phone or WhatsApp Web), to `from_address`: a staff
    #: message of the conversation, not a patient's (engine/messaging/clinic_phone.py).
    from_me: Mapped[bool] = mapped_column(Boolean, default=False)
    #: On the contact's latest staff message: when its hand-off ends if the staff stays quiet.
    quiet_until: Mapped[datetime | None]


class SandboxMessage(Base):
    __tablename__ = "sandbox_messages"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    channel_id: Mapped[int] = _fk("channels.id")
    provider_message_id: Mapped[str] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(Text)
    to_address: Mapped[str] = mapped_column(Text)
    subject: Mapped[str | None] = mapped_column(Text)
    body: Mapped[str | None] = mapped_column(Text)
    buttons: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    created_at: Mapped[datetime]


class InboxItem(Base):
    __tablename__ = "inbox_items"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    kind: Mapped[str] = mapped_column(Text)
    message_id: Mapped[int | None] = _fk("messages.id", nullable=True)
    appointment_id: Mapped[int | None] = _fk("appointments.id", nullable=True)
    enrollment_id: Mapped[int | None] = _fk("enrollments.id", nullable=True)
    channel_id: Mapped[int | None] = _fk("channels.id", nullable=True)
    detail: Mapped[str | None] = mapped_column(Text)
    dedupe_key: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    resolved_at: Mapped[datetime | None]
    resolved_by: Mapped[int | None] = _fk("users.id", nullable=True)


class AuditLog(Base):
    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    user_id: Mapped[int | None] = _fk("users.id", nullable=True)
    api_key_id: Mapped[int | None] = _fk("api_keys.id", nullable=True)
    action: Mapped[str] = mapped_column(Text)
    entity: Mapped[str] = mapped_column(Text)
    entity_id: Mapped[int | None] = mapped_column(PK)
    changes: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    created_at: Mapped[datetime]


orgs = Org.__table__
users = User.__table__
api_keys = ApiKey.__table__
contacts = Contact.__table__
preferences = Preference.__table__
appointments = Appointment.__table__
channels = Channel.__table__
templates = Template.__table__
reminder_rules = ReminderRule.__table__
reminder_rule_kinds = ReminderRuleKind.__table__
flow_pointers = FlowPointer.__table__
flow_versions = FlowVersion.__table__
enrollments = Enrollment.__table__
enrollment_events = EnrollmentEvent.__table__
agents = Agent.__table__
conversation_fields = ConversationField.__table__
flow_claims = FlowClaim.__table__
messages = Message.__table__
message_events = MessageEvent.__table__
inbound_messages = InboundMessage.__table__
sandbox_messages = SandboxMessage.__table__
inbox_items = InboxItem.__table__
audit_log = AuditLog.__table__


class ChannelPacing(Base):
    __tablename__ = "channel_pacing"
    channel_id: Mapped[int] = mapped_column(PK, ForeignKey("channels.id"), primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    next_slot_at: Mapped[datetime]
    day: Mapped[str] = mapped_column(Text)
    sent_today: Mapped[int] = mapped_column(Integer, default=0)


class RecipientPacing(Base):
    """When a channel may next send to one recipient (engine/queue/recipient_pacing.py)."""

    __tablename__ = "recipient_pacing"
    channel_id: Mapped[int] = mapped_column(PK, ForeignKey("channels.id"), primary_key=True)
    #: A keyed hash of the recipient's address, never the address itself.
    recipient: Mapped[str] = mapped_column(Text, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    next_allowed_at: Mapped[datetime]
    #: Which check took the current slot (the one statement that reserves says who won).
    taken_by: Mapped[str] = mapped_column(Text)


class WebhookEvent(Base):
    __tablename__ = "webhook_events"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    channel_id: Mapped[int] = _fk("channels.id")
    provider: Mapped[str] = mapped_column(Text)
    events: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    received_at: Mapped[datetime]
    #: SHA-256 (hex) of the raw body: a replayed delivery to the same channel adds no row.
    body_sha256: Mapped[str | None] = mapped_column(Text)


channel_pacing = ChannelPacing.__table__
recipient_pacing = RecipientPacing.__table__
webhook_events = WebhookEvent.__table__


class EarlyStatus(Base):
    """A provider status that arrived before its send was recorded (engine/messaging/statuses.py)."""

    __tablename__ = "early_statuses"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    channel_id: Mapped[int] = _fk("channels.id")
    provider_message_id: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    occurred_at: Mapped[datetime]
    error_code: Mapped[str | None] = mapped_column(Text)
    error_permanent: Mapped[bool] = mapped_column(Boolean, default=True)
    opt_out: Mapped[bool] = mapped_column(Boolean, default=False)
    reference: Mapped[str | None] = mapped_column(Text)
    received_at: Mapped[datetime]


early_statuses = EarlyStatus.__table__


class ContactEvent(Base):
    __tablename__ = "contact_events"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    contact_id: Mapped[int] = _fk("contacts.id")
    type: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    created_at: Mapped[datetime]


contact_events = ContactEvent.__table__


class AddressOptout(Base):
    """An opt-out that follows the address (engine/queue/address_optouts.py): the plain normalised
    value while a live contact carries it, only its keyed hash once the last one is erased."""

    __tablename__ = "address_optouts"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    address_kind: Mapped[str] = mapped_column(Text)
    value: Mapped[str | None] = mapped_column(Text)
    value_hash: Mapped[str | None] = mapped_column(Text)
    hash_version: Mapped[int | None] = mapped_column(Integer)
    channel_kind: Mapped[str] = mapped_column(Text)
    contact_id: Mapped[int | None] = _fk("contacts.id", nullable=True)
    source: Mapped[str] = mapped_column(Text)
    evidence: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]

    def __repr__(self) -> str:  # never the address
        return f"<AddressOptout {self.id} org={self.org_id} {self.address_kind}/{self.channel_kind}>"


class RetentionRun(Base):
    __tablename__ = "retention_runs"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    day: Mapped[str] = mapped_column(Text)
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    counts: Mapped[dict[str, Any] | None] = mapped_column(JSONType)


class MetaTemplateState(Base):
    """What the channel's WABA says of one of its templates (engine/messaging/meta_categories.py):
    category, status, and when and why the last change came."""

    __tablename__ = "meta_template_states"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    channel_id: Mapped[int] = _fk("channels.id")
    name: Mapped[str] = mapped_column(Text)
    language: Mapped[str] = mapped_column(Text)
    category: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str | None] = mapped_column(Text)
    previous_category: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)
    changed_at: Mapped[datetime | None]
    updated_at: Mapped[datetime]


address_optouts = AddressOptout.__table__
meta_template_states = MetaTemplateState.__table__
retention_runs = RetentionRun.__table__


class WebhookEndpoint(Base):
    """Where an org's events are POSTed (engine/tenants/webhooks): its URL passes the egress guard,
    its signing secret is sealed for this row (`secret`, `key_version`) like a channel's credentials."""

    __tablename__ = "webhook_endpoints"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    url: Mapped[str] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text)
    secret: Mapped[bytes | None] = mapped_column(BinaryType)
    key_version: Mapped[int | None] = mapped_column(Integer)
    event_types: Mapped[list[str]] = mapped_column(JSONType)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    def __repr__(self) -> str:  # never the secret
        return f"<WebhookEndpoint {self.id} org={self.org_id}>"


class WebhookDelivery(Base):
    """One event for one endpoint, delivered at least once with the same `webhook_id`."""

    __tablename__ = "webhook_deliveries"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    endpoint_id: Mapped[int] = _fk("webhook_endpoints.id", ondelete="CASCADE")
    event_type: Mapped[str] = mapped_column(Text)
    webhook_id: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType)
    status: Mapped[str] = mapped_column(Text, default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None]
    lease_until: Mapped[datetime | None]
    claim_started_at: Mapped[datetime | None]
    revision: Mapped[int] = mapped_column(Integer, default=0)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    last_attempt_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]
    # Added by 0025, so last: the receiver's answer to the last attempt (its reason phrase and the
    # start of its body, as text; never logged) and the attempt's duration; a person's resend.
    last_response_reason: Mapped[str | None] = mapped_column(Text)
    last_response_body: Mapped[str | None] = mapped_column(Text)
    last_duration_ms: Mapped[int | None] = mapped_column(Integer)
    resend_base: Mapped[int] = mapped_column(Integer, default=0)
    resent_at: Mapped[datetime | None]


webhook_endpoints = WebhookEndpoint.__table__
webhook_deliveries = WebhookDelivery.__table__


class Professional(Base):
    """A professional of the built-in agenda (engine/people/agenda/): weekly hours make free times."""

    __tablename__ = "professionals"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    name: Mapped[str] = mapped_column(Text)
    slot_minutes: Mapped[int] = mapped_column(Integer, default=30)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class ProfessionalHours(Base):
    """One interval of a weekday (0 = Monday) of a professional, 'HH:MM' in the org's wall clock."""

    __tablename__ = "professional_hours"
    id: Mapped[int] = mapped_column(PK, primary_key=True)
    org_id: Mapped[int] = _fk("orgs.id")
    professional_id: Mapped[int] = _fk("professionals.id")
    weekday: Mapped[int] = mapped_column(Integer)
    starts: Mapped[str] = mapped_column(Text)
    ends: Mapped[str] = mapped_column(Text)


professionals = Professional.__table__
professional_hours = ProfessionalHours.__table__
