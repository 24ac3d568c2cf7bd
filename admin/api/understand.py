"""`POST /api/v1/understand`: how Lembra understands a patient's reply (intent, date, time,
period…), read in the caller's org: its timezone and its own keywords, and optionally one of its
appointments. The flow builder's "Testar" asks it; nothing is sent, written or audited (a read).

A request the reader cannot take is a 422 whose `details` list each problem as
`{code, field, message, message_en}` (the catalogue's sentences), like the template endpoints.

Importing this module adds its route to the API blueprint, like admin/api/privacy.py."""

from __future__ import annotations

from typing import Any

from flask import jsonify
from marshmallow import RAISE, Schema, ValidationError, fields, validate
from sqlalchemy import select

from admin.api import services
from admin.api.core import MAX_FIELD_ERRORS, ApiError, bp, caller, detail, json_body, org_tx, require_key
from admin.api.openapi import documented
from admin.api.schemas import MAX_ID, Id, Instant, Text
from engine.core import clock
from engine.store.models import orgs
from engine.tenants.orgs import reply_reading
from engine.words.catalogue import describe
from engine.words.understanding import MAX_CHARS, STANDARD_INTENTS, Context, understand

#: The fields a conversation may be waiting for (Context.pending).
PENDING_FIELDS = ("date", "time", "period", "choice")
PERIODS = ("morning", "afternoon", "evening")
ENGINES = ("builtin", "llm")

_INSTANT = {"description": "ISO 8601 with a UTC offset, e.g. 2026-12-07T10:00:00-03:00."}


# --- schemas ------------------------------------------------------------------------------------

class UnderstandIn(Schema):
    class Meta:
        unknown = RAISE

    text = Text(required=True, validate=validate.Length(min=1, max=MAX_CHARS),
                metadata={"description": "The patient's reply, as received.", "example": "dá pra ser sexta de manhã?"})
    now = Instant(allow_none=True, metadata={
        "description": _INSTANT["description"] + " The moment the reply is read at (\"amanhã\", \"sexta\"); "
                                                 "the server's clock by default."})
    appointment_id = Id(allow_none=True, metadata={
        "description": "One of the org's appointments: the one the conversation is about (its `starts_at` "
                       "becomes `appointment_at`). Another org's id answers 404."})
    appointment_at = Instant(allow_none=True, metadata={
        "description": _INSTANT["description"] + " The appointment discussed, when it is not stored; "
                                                 "not together with `appointment_id`."})
    intents = fields.List(fields.String(validate=validate.OneOf(STANDARD_INTENTS)),
                          validate=validate.Length(min=1, max=len(STANDARD_INTENTS)),
                          metadata={"description": "The intents the step declares (all standard ones by "
                                                   "default); any other reading answers `other`."})
    pending = fields.List(fields.String(validate=validate.OneOf(PENDING_FIELDS)),
                          validate=validate.Length(max=len(PENDING_FIELDS)),
                          metadata={"description": "The fields the conversation awaits: a bare \"1\" is a menu "
                                                   "answer only when `choice` is among them."})


class UnderstandingFieldsOut(Schema):
    date = fields.String(required=True, allow_none=True, metadata={"format": "date"})
    time = fields.String(required=True, allow_none=True, metadata={"example": "15:30"})
    period = fields.String(required=True, allow_none=True, validate=validate.OneOf(PERIODS))
    time_range = fields.List(fields.String(), validate=validate.Length(equal=2),
                             metadata={"description": "[from, to], e.g. [\"14:00\", \"16:00\"] (\"entre 14 e 16h\")."})
    exclude_weekdays = fields.List(fields.Integer(validate=validate.Range(min=0, max=6)),
                                   metadata={"description": "Monday is 0 (\"qualquer dia menos segunda\")."})
    choice = fields.Integer(metadata={"description": "A menu answer (\"2\", \"a segunda opção\")."})


class UnderstandingOut(Schema):
    intent = fields.String(required=True, validate=validate.OneOf(STANDARD_INTENTS))
    fields_ = fields.Nested(UnderstandingFieldsOut, required=True, data_key="fields", attribute="fields")
    confidence = fields.Float(required=True, validate=validate.Range(min=0, max=1))
    engine = fields.String(required=True, validate=validate.OneOf(ENGINES))
    llm_calls = fields.Integer(required=True, validate=validate.Range(min=0))


# --- the request's problems, in the catalogue's words ---------------------------------------------

def _issue(field: str, code: str, **params: Any) -> dict[str, Any]:
    return detail(code, field, describe(code, **params))


def _field_issue(field: str) -> dict[str, Any]:
    """The one sentence for whatever is wrong with `field` (its shape, its range or its values)."""
    if field == "text":
        return _issue(field, "understand_text", max=MAX_CHARS)
    if field in ("now", "appointment_at"):
        return _issue(field, "understand_instant")
    if field == "appointment_id":
        return _issue(field, "detail_integer_range", min=1, max=MAX_ID)
    if field == "intents":
        return _issue(field, "understand_intents", choices=", ".join(STANDARD_INTENTS))
    if field == "pending":
        return _issue(field, "understand_pending", choices=", ".join(PENDING_FIELDS))
    if field == "_schema":
        return _issue("", "understand_body")
    return _issue(field, "detail_unknown_field")


def _read_request(body: Any) -> dict[str, Any]:
    """The body validated; a 422 lists each problem once (the first MAX_FIELD_ERRORS of them)."""
    problems: list[dict[str, Any]] = []
    data: dict[str, Any] = {}
    try:
        data = UnderstandIn().load(body)
    except ValidationError as exc:
        wrong = exc.messages if isinstance(exc.messages, dict) else {"_schema": exc.messages}
        problems = [_field_issue(str(field)) for field in wrong]
    if not problems and isinstance(data.get("text"), str) and not data["text"].strip():
        problems.append(_field_issue("text"))
    if isinstance(body, dict) and body.get("appointment_id") is not None and body.get("appointment_at") is not None:
        problems.append(_issue("appointment_at", "understand_appointment_both"))
    if problems:
        shown = problems[:MAX_FIELD_ERRORS]
        if len(problems) > len(shown):
            shown.append(_issue("", "more_issues", count=len(problems) - len(shown)))
        raise ApiError(422, "the reply cannot be read this way", shown)
    return data


# --- route --------------------------------------------------------------------------------------

@bp.post("/understand")
@documented("post", "/understand", "Understand a patient's reply", tag="understanding", body=UnderstandIn,
            description="How Lembra reads a reply, as a flow would see it: the intent among the declared ones "
                        "(or `other`), the date, time and period it names, and how sure the reading is. Dates "
                        "resolve in the org's timezone and the org's own keywords extend the built-in ones. "
                        "Nothing is sent or stored. A 422's `details` list each problem as "
                        "`{code, field, message, message_en}`.",
            responses={200: (UnderstandingOut, "The reading")}, errors=(400, 404, 413, 422))
@require_key
def understand_reply() -> Any:
    data = _read_request(json_body())
    org_id = caller().org_id
    appointment_at = data.get("appointment_at")
    with org_tx() as conn:
        zone, keywords = reply_reading(conn.execute(select(orgs).where(orgs.c.id == org_id)).one())
        if data.get("appointment_id") is not None:
            appointment_at = services.find_appointment(conn, org_id, data["appointment_id"]).starts_at
    context = Context(now=data.get("now") or clock.now(), timezone=zone, appointment_at=appointment_at,
                      intents=tuple(dict.fromkeys(data.get("intents") or STANDARD_INTENTS)),
                      pending=tuple(dict.fromkeys(data.get("pending") or ())), keywords=keywords or None)
    return jsonify(UnderstandingOut().dump(understand(data["text"], context).as_json()))

