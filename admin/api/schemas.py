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
    RAISE,
    Schema,
    ValidationError,
    fields,
    validate,
    validates_schema,
)

from engine.models import APPOINTMENT_STATUSES, CHANNEL_KINDS, MESSAGE_STATUSES
from gateway.phones import InvalidPhone, normalize_phone

MAX_ID = 2**63 - 1
EVENT_TYPES = ("handoff_started", "handoff_ended", "stage_changed")


def _storable(value: str) -> None:
    """Refuse what a database cannot store as text: NUL bytes and lone surrogates."""
    if "\x00" in value:
        raise ValidationError("Must not contain NUL characters.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError("Must be valid Unicode text.") from None


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


class AppointmentIn(Schema):
    class Meta:
        unknown = RAISE

    external_id = Text(required=True, validate=validate.Length(min=1, max=200),
                       metadata={"description": "Your system's id for the appointment; the upsert key."})
    contact_external_id = Text(required=True, validate=validate.Length(min=1, max=200))
    starts_at = Instant(required=True, metadata={"description": "ISO 8601 with a UTC offset, e.g. "
                                                                 "2026-12-03T14:30:00-03:00"})
    timezone = Text(allow_none=True, validate=[validate.Length(max=64), _timezone],
                    metadata={"description": "IANA timezone for the reminder text; the org's by default."})
    professional = Text(allow_none=True, validate=validate.Length(max=200))
    mode = Text(allow_none=True, validate=validate.Length(max=40), metadata={"example": "in_person"})
    location = Text(allow_none=True, validate=validate.Length(max=500))
    status = fields.String(validate=validate.OneOf(APPOINTMENT_STATUSES),
                           metadata={"description": "Omitted: `scheduled` for a new appointment, unchanged "
                                                    "otherwise. `cancelled` cancels the reminders."})


class MessageIn(Schema):
    class Meta:
        unknown = RAISE

    contact_id = Id(required=True)
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


class EventIn(Schema):
    class Meta:
        unknown = RAISE

    type = fields.String(required=True, validate=validate.OneOf(EVENT_TYPES))
    contact_id = Id(required=True)
    stage = Text(allow_none=True, validate=validate.Length(min=1, max=200),
                 metadata={"description": "Required for stage_changed."})
    at = Instant(allow_none=True, metadata={"description": "When it happened (now by default)."})

    @validates_schema(skip_on_field_errors=False)
    def _stage_for_stage_changed(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data.get("type") == "stage_changed" and not data.get("stage"):
            raise ValidationError("Required for stage_changed.", "stage")


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
    error_code = fields.String(required=True, allow_none=True)
    skip_reason = fields.String(required=True, allow_none=True)
    created_at = _out_dt(required=True)
    updated_at = _out_dt(required=True)


class EventOut(Schema):
    id = fields.Integer(required=True)
    type = fields.String(required=True, validate=validate.OneOf(EVENT_TYPES))
    contact_id = fields.Integer(required=True)
    stage = fields.String(required=True, allow_none=True)
    at = _out_dt(required=True)
    created_at = _out_dt(required=True)


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


class ErrorOut(Schema):
    error = fields.String(required=True, metadata={"description": "What went wrong, in one line."})
    details = fields.Raw(required=True, allow_none=True,
                         metadata={"description": "For 422: every field's errors, by field name."})
