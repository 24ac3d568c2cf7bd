"""The marshmallow schemas of `/api/v1`: what each endpoint accepts and answers. The OpenAPI
document is generated from these classes, so the documentation cannot drift from the checks."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from marshmallow import (
    EXCLUDE,
    INCLUDE,
    RAISE,
    Schema,
    ValidationError,
    fields,
    validate,
    validates_schema,
)

from admin.i18n import translate_to
from engine.core.fields import WholeNumber
from engine.flows.queries import ENROLLMENT_STATUSES
from engine.flows.versions import DISABLE_LIVE, HANDOFF_POLICIES, MAX_VERSION
from engine.store.models import APPOINTMENT_STATUSES, CHANNEL_KINDS, MESSAGE_STATUSES
from engine.core.strict_json import find_problem, storable_text
from engine.words.catalogue import describe
from gateway.phones import InvalidPhone, normalize_phone

MAX_ID = 2**63 - 1
EVENT_TYPES = ("handoff_started", "handoff_ended", "stage_changed")
FLOW_STATUSES = ("draft", "active", "disabled")


def _storable(value: str) -> None:
    """Refuse what a database cannot store as text: NUL characters and lone surrogates."""
    if not storable_text(value):
        raise ValidationError("Must not contain NUL characters or lone surrogates.")


class Text(fields.String):
    """A string that PostgreSQL and SQLite can both store."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        result = super()._deserialize(value, attr, data, **kwargs)
        _storable(result)
        return result


class Email(fields.Email):
    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        if isinstance(value, str):
            _storable(value)
        return super()._deserialize(value, attr, data, **kwargs)


class Instant(fields.AwareDateTime):
    """An ISO 8601 instant WITH its UTC offset; naive values are refused, not guessed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(format="iso", **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> datetime:
        if isinstance(value, str):
            _storable(value)
        result = super()._deserialize(value, attr, data, **kwargs)
        try:
            utc = result.astimezone(timezone.utc)
        except (OverflowError, ValueError):
            raise ValidationError("Must be between the years 1900 and 2200.") from None
        if not 1900 <= utc.year <= 2200:
            raise ValidationError("Must be between the years 1900 and 2200.")
        return result


class Flag(fields.Boolean):
    """A JSON `true` or `false`; marshmallow's Boolean would also take 1, "yes" and "on"."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class JsonObject(fields.Dict):
    """A JSON object stored as given (a flow's graph or trigger). Its meaning is the engine's to
    judge (`engine.flows.schema`); here it only has to be storable (`engine.core.strict_json`: no NUL
    characters or lone surrogates, finite numbers within 64 bits, no deeper than MAX_DEPTH). The
    body's parser refuses all of that already; this keeps the schema true for any other caller."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, Any]:
        result = super()._deserialize(value, attr, data, **kwargs)
        problem = find_problem(result)
        if problem is not None:
            raise ValidationError(f"{problem.field()}: {translate_to(problem.detail, 'en')}")
        return result


def _phone(value: str) -> None:
    try:
        normalize_phone(value)
    except (InvalidPhone, ValueError):
        raise ValidationError("Not a valid phone number.") from None


def _timezone(value: str) -> None:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValidationError("Not a known IANA timezone.") from None


def Id(*, strict: bool = True, **kwargs: Any) -> fields.Integer:  # noqa: N802 - a field factory
    """A row id: a JSON integer in bodies (strict), digits in a query string."""
    return fields.Integer(strict=strict, validate=validate.Range(min=1, max=MAX_ID), **kwargs)


class Cursor(fields.String):
    """An opaque pagination cursor: the caller only hands back what `next_cursor` said."""

    def _serialize(self, value: Any, attr: str | None, obj: Any, **kwargs: Any) -> str | None:
        if value is None:
            return None
        raw = json.dumps({"after": int(value)}, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        text = super()._deserialize(value, attr, data, **kwargs)
        try:
            decoded = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            after = decoded["after"]
        except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
            raise ValidationError("Not a valid cursor.") from None
        if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after <= MAX_ID:
            raise ValidationError("Not a valid cursor.")
        return after


def encode_cursor(after: int) -> str:
    return Cursor()._serialize(after, None, None)  # type: ignore[return-value]


# --- input ------------------------------------------------------------------------------------

#: How an appointment happens (`appointments.mode`); each has a label in the catalogue (`mode_<value>`).
APPOINTMENT_MODES = ("in_person", "online", "phone")
#: The labels of APPOINTMENT_MODES as the catalogue (`mode_<value>`) and its English translation say them.
MODE_LABELS = {mode: {"pt_BR": str(describe(f"mode_{mode}")), "en": translate_to(describe(f"mode_{mode}"), "en")}
               for mode in APPOINTMENT_MODES}


class ContactRefIn(Schema):
    """A body that names one of the org's contacts, by Lembra's id or by the clinic's own: exactly
    one of the two (admin/api/services.py `resolve_contact` finds it, the same way everywhere)."""

    contact_id = Id(metadata={"description": "Lembra's id of the contact. Give this or `contact_external_id`."})
    contact_external_id = Text(validate=validate.Length(min=1, max=200), metadata={
        "description": "Your system's id for the contact (its `external_id`). Give this or `contact_id`."})

    @validates_schema(skip_on_field_errors=False, pass_original=True)
    def _exactly_one_contact(self, data: dict[str, Any], original: Any, **kwargs: Any) -> None:
        # Read from what was sent, so a malformed id is its own error and not also "name one".
        given = original if isinstance(original, dict) else {}
        if ("contact_id" in given) == ("contact_external_id" in given):
            raise ValidationError([catalogue_detail("api_contact_ref_one", "contact_id")], "contact_id")


def catalogue_detail(code: str, field: str) -> dict[str, Any]:
    """An error about `field` in the catalogue's words: `{code, field, message, message_en}` (the
    shape of admin/api/core.py `detail`, built here because core imports this module)."""
    text = describe(code)
    return {"code": code, "field": field, "message": str(text), "message_en": translate_to(text, "en")}

class ContactIn(Schema):
    class Meta:
        unknown = RAISE

    external_id = Text(required=True, validate=validate.Length(min=1, max=200),
                       metadata={"description": "Your system's id for the patient; the upsert key."})
    name = Text(allow_none=True, validate=validate.Length(max=200))
    phone = Text(allow_none=True, validate=[validate.Length(max=40), _phone],
                 metadata={"description": "Any common spelling; stored in E.164 (Brazil by default)."})
    email = Email(allow_none=True, validate=validate.Length(max=254))
    locale = Text(allow_none=True, validate=validate.Regexp(r"^[a-z]{2}(_[A-Z]{2})?$"),
                  metadata={"example": "pt_BR"})
    consent = fields.List(fields.String(validate=validate.OneOf(CHANNEL_KINDS)),
                          validate=validate.Length(max=len(CHANNEL_KINDS)),
                          metadata={"description": "Channel kinds the patient agreed to. Never overrides a "
                                                   "patient's own opt-out."})


class AppointmentIn(ContactRefIn):
    class Meta:
        unknown = RAISE

    external_id = Text(required=True, validate=validate.Length(min=1, max=200),
                       metadata={"description": "Your system's id for the appointment; the upsert key."})
    starts_at = Instant(required=True, metadata={"description": "ISO 8601 with a UTC offset, e.g. "
                                                                 "2026-12-03T14:30:00-03:00"})
    timezone = Text(allow_none=True, validate=[validate.Length(max=64), _timezone],
                    metadata={"description": "IANA timezone for the reminder text; the org's by default."})
    professional = Text(allow_none=True, validate=validate.Length(max=200), metadata={
        "description": "The professional's name. With `professional_id` it is that professional's name, whatever "
                       "is given here; a new name without `professional_id` drops the link to a professional."})
    professional_id = Id(allow_none=True, metadata={
        "description": "One of the org's professionals (GET /professionals): the built-in agenda counts the "
                       "appointment as their busy time. Null unlinks."})
    mode = fields.String(allow_none=True, validate=validate.OneOf(APPOINTMENT_MODES), metadata={
        "description": "How it happens: " + ", ".join(
            f"`{m}` ({MODE_LABELS[m]['pt_BR']} / {MODE_LABELS[m]['en']})" for m in APPOINTMENT_MODES) + ".",
        "x-enum-labels": MODE_LABELS})
    location = Text(allow_none=True, validate=validate.Length(max=500))
    status = fields.String(validate=validate.OneOf(APPOINTMENT_STATUSES),
                           metadata={"description": "Omitted: `scheduled` for a new appointment, unchanged "
                                                    "otherwise. `cancelled` cancels the reminders."})


class MessageIn(ContactRefIn):
    class Meta:
        unknown = RAISE

    channel_kind = fields.String(required=True, validate=validate.OneOf(CHANNEL_KINDS))
    text = Text(required=True, validate=validate.Length(min=1, max=4096))
    subject = Text(allow_none=True, validate=validate.Length(max=300))
    send_now = fields.Boolean(load_default=False,
                              metadata={"description": "Send outside the org's sending window too."})

    @validates_schema(skip_on_field_errors=False)
    def _text_not_blank(self, data: dict[str, Any], **kwargs: Any) -> None:
        if isinstance(data.get("text"), str) and not data["text"].strip():
            raise ValidationError("Must not be blank.", "text")


class IdempotencyHeader(Schema):
    class Meta:
        unknown = EXCLUDE

    idempotency_key = fields.String(
        required=True, data_key="Idempotency-Key",
        validate=[validate.Length(min=1, max=200), validate.Regexp(r"^[\x21-\x7e]+$")],
        metadata={"description": "Your unique key for this send: the same key answers the same message."})


class EventIn(ContactRefIn):
    class Meta:
        unknown = RAISE

    type = fields.String(required=True, validate=validate.OneOf(EVENT_TYPES))
    stage = Text(allow_none=True, validate=validate.Length(min=1, max=200),
                 metadata={"description": "Required for stage_changed."})
    at = Instant(allow_none=True, metadata={"description": "When it happened (now by default)."})

    @validates_schema(skip_on_field_errors=False)
    def _stage_for_stage_changed(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data.get("type") == "stage_changed" and not data.get("stage"):
            raise ValidationError("Required for stage_changed.", "stage")


class FlowFields(Schema):
    """A flow's settings as a clinic's software writes them. The graph and the trigger are
    checked by the engine (`engine.flows.schema`, also served as `GET /flows/schema`): a bad
    shape answers 422 with one issue per node."""

    class Meta:
        unknown = RAISE

    name = Text(validate=validate.Length(min=1, max=120), metadata={"description": "Unique in the org."})
    draft_graph = JsonObject(metadata={"description": "The graph being edited: `{nodes, edges}` (see "
                                                      "`GET /flows/schema`). Only its shape is checked here; "
                                                      "publishing checks the rules."})
    trigger_config = JsonObject(metadata={"description": "What starts the flow, e.g. `{\"kind\": \"manual\"}` "
                                                         "or `{\"kind\": \"silence\", \"minutes\": 2880}`."})
    handoff_policy = fields.String(validate=validate.OneOf(HANDOFF_POLICIES),
                                   metadata={"description": "What a hand-off to a person does to live runs."})
    cancel_on_reply = Flag(metadata={"description": "End a live run when the patient writes (unless a node is "
                                                    "waiting for the reply)."})
    # The same limits as engine.flows.versions checks; declared here so the document states them.
    max_steps = WholeNumber(validate=validate.Range(min=1, max=200),
                            metadata={"description": "Steps one run may take before it ends `exhausted`."})
    resume_grace_minutes = WholeNumber(validate=validate.Range(min=0, max=10080),
                                       metadata={"description": "Minutes after a hand-off ends before a paused "
                                                                "run resumes."})

    @validates_schema(skip_on_field_errors=False)
    def _name_not_blank(self, data: dict[str, Any], **kwargs: Any) -> None:
        if isinstance(data.get("name"), str) and not data["name"].strip():
            raise ValidationError("Must not be blank.", "name")


class FlowIn(FlowFields):
    """A new flow, in `draft` until it is published."""

    name = Text(required=True, validate=validate.Length(min=1, max=120), metadata={"description": "Unique in the org."})
    # Without a trigger a flow could never be published; manual is what it means to have none.
    trigger_config = JsonObject(load_default=lambda: {"kind": "manual"},
                                metadata={"description": "What starts the flow (`{\"kind\": \"manual\"}` when "
                                                         "omitted), e.g. `{\"kind\": \"silence\", \"minutes\": "
                                                         "2880}`."})


class FlowPatch(FlowFields):
    """Only the fields given change; live runs keep the version they started on."""


class FlowDisableIn(Schema):
    class Meta:
        unknown = RAISE

    live = fields.String(load_default="finish", validate=validate.OneOf(DISABLE_LIVE),
                         metadata={"description": "`finish`: live runs go on with their version; `cancel`: "
                                                  "they end now."})


class FlowRollbackIn(Schema):
    class Meta:
        unknown = RAISE

    version = WholeNumber(required=True, validate=validate.Range(min=1, max=MAX_VERSION),
                          metadata={"description": "An earlier version number of this flow."})


class EnrollmentIn(ContactRefIn):
    class Meta:
        unknown = RAISE

    flow_id = Id(required=True)
    appointment_id = Id(allow_none=True, metadata={"description": "One of the contact's appointments, for "
                                                                  "flows whose conditions read it."})


class PageQuery(Schema):
    class Meta:
        unknown = RAISE  # a misspelt filter is an error, not a silently unfiltered list

    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=200))
    cursor = Cursor(metadata={"description": "`next_cursor` of the previous page."})


class ContactQuery(PageQuery):
    external_id = Text(validate=validate.Length(min=1, max=200))
    phone = Text(validate=[validate.Length(max=40), _phone])


class AppointmentQuery(PageQuery):
    status = fields.String(validate=validate.OneOf(APPOINTMENT_STATUSES))
    from_ = Instant(data_key="from", metadata={"description": "starts_at at or after this instant"})
    to = Instant(metadata={"description": "starts_at before this instant"})
    contact_id = Id(strict=False)


class MessageQuery(PageQuery):
    status = fields.String(validate=validate.OneOf(MESSAGE_STATUSES))
    purpose = Text(validate=validate.Length(min=1, max=100))
    contact_id = Id(strict=False)


class FlowQuery(PageQuery):
    status = fields.String(validate=validate.OneOf(FLOW_STATUSES))


class EnrollmentQuery(PageQuery):
    flow_id = Id(strict=False)
    status = fields.String(validate=validate.OneOf(ENROLLMENT_STATUSES))
    contact_id = Id(strict=False)


# --- output -----------------------------------------------------------------------------------

def _out_dt(**kwargs: Any) -> fields.DateTime:
    return fields.DateTime(format="iso", **kwargs)


class ContactOut(Schema):
    id = fields.Integer(required=True)
    external_id = fields.String(required=True, allow_none=True)
    name = fields.String(required=True, allow_none=True)
    phone = fields.String(required=True, allow_none=True, metadata={"description": "E.164"})
    email = fields.String(required=True, allow_none=True)
    locale = fields.String(required=True, allow_none=True)
    consent = fields.List(fields.String(validate=validate.OneOf(CHANNEL_KINDS)), required=True,
                          metadata={"description": "Kinds the patient may be messaged on."})
    opted_out = fields.List(fields.String(validate=validate.OneOf(CHANNEL_KINDS)), required=True,
                            metadata={"description": "Kinds the patient refused."})
    address_opted_out = fields.List(fields.String(validate=validate.OneOf(CHANNEL_KINDS)), required=True, metadata={
        "description": "Kinds refused for this contact's phone or e-mail by whichever contact carried it (SAIR, an "
                       "unsubscribe): nothing of those kinds is sent to it, whatever `consent` says."})
    shares_phone_with = fields.List(fields.Integer(), required=True, metadata={
        "description": "Other contacts with the same phone: a duplicate, or a family on one number."})
    created_at = _out_dt(required=True)
    updated_at = _out_dt(required=True)


class AppointmentOut(Schema):
    id = fields.Integer(required=True)
    external_id = fields.String(required=True, allow_none=True)
    contact_id = fields.Integer(required=True)
    contact_external_id = fields.String(required=True, allow_none=True)
    starts_at = _out_dt(required=True)
    timezone = fields.String(required=True)
    professional = fields.String(required=True, allow_none=True)
    professional_id = fields.Integer(required=True, allow_none=True,
                                     metadata={"description": "The org's professional it is linked to, if any."})
    mode = fields.String(required=True, allow_none=True)
    location = fields.String(required=True, allow_none=True)
    status = fields.String(required=True, validate=validate.OneOf(APPOINTMENT_STATUSES))
    confirmed_at = _out_dt(required=True, allow_none=True)
    cancelled_at = _out_dt(required=True, allow_none=True)
    cancel_source = fields.String(required=True, allow_none=True)
    created_at = _out_dt(required=True)
    updated_at = _out_dt(required=True)


class MessageOut(Schema):
    id = fields.Integer(required=True)
    purpose = fields.String(required=True)
    contact_id = fields.Integer(required=True)
    appointment_id = fields.Integer(required=True, allow_none=True)
    channel_kind = fields.String(required=True, validate=validate.OneOf(CHANNEL_KINDS))
    status = fields.String(required=True, validate=validate.OneOf(MESSAGE_STATUSES))
    subject = fields.String(required=True, allow_none=True)
    body = fields.String(required=True, allow_none=True,
                         metadata={"description": "The text as sent (or as queued for an ad-hoc send)."})
    attempts = fields.Integer(required=True)
    due_at = _out_dt(required=True, allow_none=True)
    sent_at = _out_dt(required=True, allow_none=True)
    delivered_at = _out_dt(required=True, allow_none=True)
    read_at = _out_dt(required=True, allow_none=True)
    failed_at = _out_dt(required=True, allow_none=True)
    error_code = fields.String(required=True, allow_none=True,
                               metadata={"description": "Why the last attempt failed (a code)."})
    skip_reason = fields.String(required=True, allow_none=True,
                                metadata={"description": "Why it was cancelled, skipped or expired (a code)."})
    status_text = fields.String(required=True, metadata={"description": "`status` in words, in Portuguese (Brazil)."})
    reason_text = fields.String(required=True, allow_none=True,
                                metadata={"description": "`skip_reason`, else `error_code`, as a sentence in "
                                                         "Portuguese (Brazil) that says what to do."})
    created_at = _out_dt(required=True)
    updated_at = _out_dt(required=True)


class StartedRunOut(Schema):
    """A follow-up run an event started."""

    enrollment_id = fields.Integer(required=True)
    flow_id = fields.Integer(required=True)
    flow_name = fields.String(required=True)


class EventOut(Schema):
    id = fields.Integer(required=True)
    type = fields.String(required=True, validate=validate.OneOf(EVENT_TYPES))
    contact_id = fields.Integer(required=True)
    stage = fields.String(required=True, allow_none=True)
    at = _out_dt(required=True)
    created_at = _out_dt(required=True)
    started = fields.List(fields.Nested(StartedRunOut), required=True,
                          metadata={"description": "The follow-up runs this event started (flows triggered by it)."})


class FlowOut(Schema):
    id = fields.Integer(required=True)
    name = fields.String(required=True)
    status = fields.String(required=True, validate=validate.OneOf(FLOW_STATUSES))
    active_version = fields.Integer(required=True, allow_none=True,
                                    metadata={"description": "The number of the version new runs start on."})
    live_enrollments = fields.Integer(required=True, metadata={"description": "Runs active, waiting for a "
                                                                              "reply or paused by a hand-off."})
    handoff_policy = fields.String(required=True, validate=validate.OneOf(HANDOFF_POLICIES))
    cancel_on_reply = fields.Boolean(required=True)
    max_steps = fields.Integer(required=True)
    resume_grace_minutes = fields.Integer(required=True)
    trigger_config = fields.Dict(required=True)
    created_at = _out_dt(required=True)
    updated_at = _out_dt(required=True)


class FlowDetailOut(FlowOut):
    draft_graph = fields.Dict(required=True)


class VersionOut(Schema):
    id = fields.Integer(required=True)
    version = fields.Integer(required=True)
    created_at = _out_dt(required=True)
    graph = fields.Dict(required=True, metadata={"description": "The frozen graph, every node's config with "
                                                                "its defaults filled in."})


class VersionSummaryOut(Schema):
    id = fields.Integer(required=True)
    version = fields.Integer(required=True)
    created_at = _out_dt(required=True)
    created_by = fields.Integer(required=True, allow_none=True,
                                metadata={"description": "The console user who published it; null through the API."})


class VersionListOut(Schema):
    data = fields.List(fields.Nested(VersionSummaryOut), required=True, metadata={"description": "Newest first."})


class FlowDisabledOut(Schema):
    flow = fields.Nested(FlowOut, required=True)
    cancelled = fields.Integer(required=True, metadata={"description": "Live runs ended (`live: cancel`)."})


class FlowIssueOut(Schema):
    """One broken rule of a flow, as a 422's `details` lists them."""

    node_id = fields.String(required=True, allow_none=True,
                            metadata={"description": "The node to highlight; null for the whole flow."})
    code = fields.String(required=True, metadata={"example": "missing_no_reply"})
    message = fields.String(required=True, metadata={"description": "The sentence in Portuguese (Brazil)."})
    message_en = fields.String(required=True, metadata={"description": "The sentence in English."})


class FlowGraphSchemaOut(Schema):
    """A JSON Schema document (draft 2020-12); only its frame is described here."""

    class Meta:
        unknown = INCLUDE

    schema = fields.String(required=True, data_key="$schema")
    title = fields.String(required=True)
    defs = fields.Dict(required=True, data_key="$defs")


class EnrollmentOut(Schema):
    id = fields.Integer(required=True)
    flow_id = fields.Integer(required=True)
    version = fields.Integer(required=True, metadata={"description": "The version number the run started on "
                                                                     "(and keeps)."})
    contact_id = fields.Integer(required=True)
    appointment_id = fields.Integer(required=True, allow_none=True)
    status = fields.String(required=True, validate=validate.OneOf(ENROLLMENT_STATUSES))
    current_node = fields.String(required=True)
    next_eval_at = _out_dt(required=True, allow_none=True, metadata={"description": "When the run is next due."})
    attempts = fields.Integer(required=True, metadata={"description": "Failed attempts of the current step."})
    steps = fields.Integer(required=True, metadata={"description": "Steps taken."})
    llm_calls = fields.Integer(required=True)
    messages_sent = fields.Integer(required=True)
    replies = fields.Integer(required=True)
    data = fields.Dict(keys=fields.String(), required=True,
                       metadata={"description": "What the run's conversation collected, by field slug (`/fields`): "
                                                "a date as YYYY-MM-DD, a time as HH:MM, a period, a choice's value…"})
    outcome = fields.String(required=True, allow_none=True)
    reason = fields.String(required=True, allow_none=True,
                           metadata={"description": "Why it ended, or why its last step failed (a code)."})
    reason_text = fields.String(required=True, allow_none=True,
                                metadata={"description": "`reason` as a sentence in Portuguese (Brazil)."})
    created_at = _out_dt(required=True)
    updated_at = _out_dt(required=True)
    ended_at = _out_dt(required=True, allow_none=True)


class StepOut(Schema):
    """One event of a run: codes, node ids and instants, never the patient's words."""

    at = _out_dt(required=True)
    node_id = fields.String(required=True, allow_none=True)
    event = fields.String(required=True, metadata={"example": "step"})
    status = fields.String(required=True, allow_none=True)
    reason = fields.String(required=True, allow_none=True)
    reason_text = fields.String(required=True, allow_none=True)
    next = fields.String(required=True, allow_none=True, metadata={"description": "The node it moved to."})
    until = _out_dt(required=True, allow_none=True, metadata={"description": "When it is due again."})
    llm_calls = fields.Integer(required=True)


class EnrollmentDetailOut(EnrollmentOut):
    timeline = fields.List(fields.Nested(StepOut), required=True, metadata={"description": "Oldest first."})


def page_schema(item: type[Schema], name: str) -> type[Schema]:
    """`{data: [item…], next_cursor}` for a list endpoint."""
    return Schema.from_dict({
        "data": fields.List(fields.Nested(item), required=True),
        "next_cursor": fields.String(required=True, allow_none=True,
                                     metadata={"description": "Pass as `cursor` for the next page; null "
                                                              "on the last page."}),
    }, name=name)


ContactPage = page_schema(ContactOut, "ContactPage")
AppointmentPage = page_schema(AppointmentOut, "AppointmentPage")
MessagePage = page_schema(MessageOut, "MessagePage")
FlowPage = page_schema(FlowOut, "FlowPage")
EnrollmentPage = page_schema(EnrollmentOut, "EnrollmentPage")


class ErrorOut(Schema):
    error = fields.String(required=True, metadata={"description": "What went wrong, in one line."})
    details = fields.Raw(required=True, allow_none=True,
                         metadata={"description": "For 422: every field's errors, by field name (the first 50, "
                                                  "then `_more` with their `count`). For a body that is refused "
                                                  "before its fields are read (400 not JSON or nested too deep, "
                                                  "413 too large, 422 a value no database stores: NaN, Infinity, "
                                                  "numbers past 64 bits, NUL or a lone surrogate): `{code, "
                                                  "field, message, message_en}`."})
