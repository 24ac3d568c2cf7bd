"""`/api/v1/fields`: the conversation fields an org's flows may ask a patient for (a date, a period
of the day, a choice…), declared once per org (engine/flows/conversation/fields.py).

The schemas below check shapes; the engine checks meaning (a free slug, options only on a choice, a
boolean read only when asked, a template that exists) and refuses a save whole: a 422 whose
`details` list each problem as `{code, field, message, message_en}`, nothing written. Another org's
field answers 404, like one that does not exist.

Importing this module adds its routes to the API blueprint, like admin/api/privacy.py."""

from __future__ import annotations

from typing import Any

from flask import jsonify
from marshmallow import RAISE, Schema, fields, validate

from admin.api.core import (
    bp,
    caller,
    error_response,
    finding_detail,
    json_body,
    load,
    load_query,
    org_tx,
    path_id,
    require_key,
)
from admin.api.openapi import documented
from admin.api.schemas import Text
from engine.flows.conversation import fields as conversation_fields
from engine.flows.conversation.fields import FIELD_TYPES, HARVEST, MAPS_TO, FieldNotFound, FieldRejected
from engine.tenants.audit import audit

_TYPES = {"description": "text, number, date (YYYY-MM-DD), time (HH:MM), period (morning, afternoon, evening), "
                         "boolean, choice (one of `options`), phone (E.164), email."}
_HARVEST = {"description": "`any_reply`: taken from whatever the patient writes; `when_asked`: only from the answer "
                           "to this field's own question (always so for a boolean). By default `any_reply` for "
                           "date, time, period, phone and email, `when_asked` for the others."}


# --- schemas ------------------------------------------------------------------------------------

class OptionIn(Schema):
    class Meta:
        unknown = RAISE

    value = Text(required=True, validate=validate.Length(min=1, max=conversation_fields.MAX_OPTION))
    label = Text(validate=validate.Length(min=1, max=conversation_fields.MAX_OPTION),
                 metadata={"description": "What the patient reads; the value by default."})


class FieldPatch(Schema):
    """Only the settings given change; the field is checked whole."""

    class Meta:
        unknown = RAISE

    slug = Text(validate=validate.Length(min=1, max=conversation_fields.MAX_SLUG),
                metadata={"description": "The key of the value in a run's data: lower-case letters, digits, _.",
                          "example": "data_preferida"})
    label = Text(validate=validate.Length(min=1, max=conversation_fields.MAX_LABEL), metadata={"example": "Data"})
    type = fields.String(validate=validate.OneOf(FIELD_TYPES), metadata=_TYPES)
    options = fields.List(fields.Nested(OptionIn), validate=validate.Length(max=conversation_fields.MAX_OPTIONS),
                          metadata={"description": "A choice field's answers, 2 or more, in the order offered."})
    question = Text(validate=validate.Length(min=1, max=conversation_fields.MAX_QUESTION),
                    metadata={"description": "The sentence that asks for it (pt-BR).",
                              "example": "Qual dia fica melhor para você?"})
    template_key = Text(allow_none=True, validate=validate.Length(min=1, max=conversation_fields.MAX_LABEL),
                        metadata={"description": "A template of the org sent instead of `question` when one is "
                                                 "needed (WhatsApp's 24-hour window has closed)."})
    harvest = fields.String(validate=validate.OneOf(HARVEST), metadata=_HARVEST)
    maps_to = fields.String(allow_none=True, validate=validate.OneOf(tuple(MAPS_TO)),
                            metadata={"description": "Where the collected value is also written."})


class FieldIn(FieldPatch):
    slug = Text(required=True, validate=validate.Length(min=1, max=conversation_fields.MAX_SLUG),
                metadata={"description": "The key of the value in a run's data: lower-case letters, digits, _.",
                          "example": "data_preferida"})
    label = Text(required=True, validate=validate.Length(min=1, max=conversation_fields.MAX_LABEL),
                 metadata={"example": "Data"})
    type = fields.String(required=True, validate=validate.OneOf(FIELD_TYPES), metadata=_TYPES)
    question = Text(required=True, validate=validate.Length(min=1, max=conversation_fields.MAX_QUESTION),
                    metadata={"description": "The sentence that asks for it (pt-BR).",
                              "example": "Qual dia fica melhor para você?"})


class FieldQuery(Schema):
    """Filters of the list; an unknown one is a 422, not ignored (a misspelt filter must not
    answer every field as if it had matched)."""

    class Meta:
        unknown = RAISE

    type = fields.String(validate=validate.OneOf(FIELD_TYPES))


class OptionOut(Schema):
    value = fields.String(required=True)
    label = fields.String(required=True)


class FieldOut(Schema):
    id = fields.Integer(required=True)
    slug = fields.String(required=True)
    label = fields.String(required=True)
    type = fields.String(required=True, validate=validate.OneOf(FIELD_TYPES))
    options = fields.List(fields.Nested(OptionOut), required=True)
    question = fields.String(required=True)
    template_key = fields.String(required=True, allow_none=True)
    harvest = fields.String(required=True, validate=validate.OneOf(HARVEST))
    maps_to = fields.String(required=True, allow_none=True)


class FieldPageOut(Schema):
    data = fields.List(fields.Nested(FieldOut), required=True)


# --- routes -------------------------------------------------------------------------------------

@bp.errorhandler(FieldNotFound)
def _field_not_found(exc: FieldNotFound) -> Any:
    return error_response(404)


@bp.errorhandler(FieldRejected)
def _field_rejected(exc: FieldRejected) -> Any:
    taken = [f for f in exc.findings if f.code == "field_slug_taken"]
    details = [finding_detail(f) for f in exc.findings]
    if taken and len(taken) == len(exc.findings):
        return error_response(409, "the org already has a field with this slug", details)
    return error_response(422, "the field cannot be saved this way", details)


def _audited(conn: Any, action: str, field: conversation_fields.Field, changes: dict[str, Any]) -> None:
    who = caller()
    audit(conn, org_id=who.org_id, api_key_id=who.id, action=action, entity="conversation_fields",
          entity_id=field.id, changes=changes)


@bp.get("/fields")
@documented("get", "/fields", "List the org's conversation fields", tag="fields", query=FieldQuery,
            description="What the org's flows may ask a patient for, by slug.",
            responses={200: (FieldPageOut, "Every field")}, errors=(422,))
@require_key
def list_fields() -> Any:
    params = load_query(FieldQuery())
    with org_tx() as conn:
        data = [f.as_dict() for f in conversation_fields.list_fields(conn, caller().org_id)
                if params.get("type") in (None, f.type)]
    return jsonify(FieldPageOut().dump({"data": data}))


@bp.get("/fields/<int:field_id>")
@documented("get", "/fields/{field_id}", "Get a conversation field", tag="fields", path_id="field_id",
            responses={200: (FieldOut, "The field")}, errors=(404,))
@require_key
def get_field(field_id: int) -> Any:
    with org_tx() as conn:
        field = conversation_fields.get_field(conn, caller().org_id, path_id(field_id))
    return jsonify(FieldOut().dump(field.as_dict()))


@bp.post("/fields")
@documented("post", "/fields", "Declare a conversation field", tag="fields", body=FieldIn,
            description="A 409 when the org has a field with this slug; a 422 lists every problem (options on a "
                        "field that is not a choice, a boolean read from any reply, an unknown template…), and "
                        "nothing is written.",
            responses={201: (FieldOut, "Declared")}, errors=(400, 409, 413, 422))
@require_key
def create_field() -> Any:
    data = load(FieldIn(), json_body())
    with org_tx() as conn:
        field = conversation_fields.create_field(conn, caller().org_id, data)
        _audited(conn, "create", field, {k: v for k, v in field.as_dict().items() if k != "id"})
    response = jsonify(FieldOut().dump(field.as_dict()))
    response.status_code = 201
    return response


@bp.patch("/fields/<int:field_id>")
@documented("patch", "/fields/{field_id}", "Change a conversation field", tag="fields", path_id="field_id",
            body=FieldPatch,
            description="Only the settings given change; the field is checked whole, as on create. A new type "
                        "brings its own default harvest and drops the options unless they are given again.",
            responses={200: (FieldOut, "Saved")}, errors=(400, 404, 409, 413, 422))
@require_key
def update_field(field_id: int) -> Any:
    field_id = path_id(field_id)
    data = load(FieldPatch(), json_body())
    with org_tx() as conn:
        field = conversation_fields.update_field(conn, caller().org_id, field_id, data)
        _audited(conn, "update", field, data)
    return jsonify(FieldOut().dump(field.as_dict()))


@bp.delete("/fields/<int:field_id>")
@documented("delete", "/fields/{field_id}", "Delete a conversation field", tag="fields", path_id="field_id",
            description="Runs that collected it keep their values; a flow that still asks for it is refused at "
                        "its next publish.",
            responses={204: (None, "Deleted")}, errors=(404,))
@require_key
def delete_field(field_id: int) -> Any:
    field_id = path_id(field_id)
    with org_tx() as conn:
        field = conversation_fields.get_field(conn, caller().org_id, field_id)
        conversation_fields.delete_field(conn, caller().org_id, field_id)
        _audited(conn, "delete", field, {"slug": field.slug})
    return "", 204
