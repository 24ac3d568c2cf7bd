"""The agenda of `/api/v1`: professionals with their weekly hours (`/professionals`) and the free
times a flow would offer (`GET /slots`), from the built-in agenda or the clinic's availability
webhook (docs/agenda.md).

A refusal of the agenda (overlapping hours, a slot length out of range, a date range backwards) is
a 422 whose `details` list `{code, field, message, message_en}` (the catalogue's sentences), a name
the org already uses a 409; another org's professional answers 404 like one that does not exist; a
clinic system that cannot give free times is a 502 saying why, and whether asking again may help
(`transient`).

Importing this module adds its routes to the API blueprint, like admin/api/privacy.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flask import jsonify
from marshmallow import RAISE, Schema, fields, validate

from admin.api.core import (
    bp,
    caller,
    detail,
    error_response,
    finding_detail,
    json_body,
    load,
    load_query,
    org_tx,
    path_id,
    require_key,
    runtime,
)
from admin.api.openapi import documented
from admin.api.schemas import Flag, Id, Text
from engine.core import clock
from engine.core.fields import WholeNumber
from engine.people import agenda
from engine.people.agenda.professionals import MAX_INTERVALS, MAX_NAME, MAX_SLOT_MINUTES, MIN_SLOT_MINUTES
from engine.people.agenda.query import MAX_LIMIT
from engine.tenants.audit import audit
from engine.words.understanding.when import PERIODS

_HHMM = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"
_WEEKDAYS = r"^[0-6](,[0-6]){0,6}$"


# --- schemas ------------------------------------------------------------------------------------

class HoursIn(Schema):
    class Meta:
        unknown = RAISE

    weekday = WholeNumber(required=True, validate=validate.Range(min=0, max=6),
                          metadata={"description": "0 = Monday … 6 = Sunday."})
    starts = fields.String(required=True, validate=validate.Regexp(_HHMM), metadata={"example": "08:00"})
    ends = fields.String(required=True, validate=validate.Regexp(_HHMM), metadata={"example": "12:00"})


class ProfessionalPatch(Schema):
    class Meta:
        unknown = RAISE

    name = Text(validate=validate.Length(min=1, max=MAX_NAME), metadata={"example": "Dra. Beatriz Costa"})
    slot_minutes = WholeNumber(validate=validate.Range(min=MIN_SLOT_MINUTES, max=MAX_SLOT_MINUTES), metadata={
        "description": "The length of one free time and of one appointment with this professional."})
    active = Flag(metadata={"description": "An inactive professional offers no free times."})
    hours = fields.List(fields.Nested(HoursIn), validate=validate.Length(max=MAX_INTERVALS), metadata={
        "description": "The whole week, replaced: intervals of wall-clock time in the org's timezone. Several "
                       "intervals a day make breaks (08:00–12:00 and 13:00–18:00); they may not overlap."})


class ProfessionalIn(ProfessionalPatch):
    name = Text(required=True, validate=validate.Length(min=1, max=MAX_NAME),
                metadata={"example": "Dra. Beatriz Costa", "description": "Unique in the org."})


class HoursOut(Schema):
    weekday = fields.Integer(required=True, validate=validate.Range(min=0, max=6))
    starts = fields.String(required=True)
    ends = fields.String(required=True)


class ProfessionalOut(Schema):
    id = fields.Integer(required=True)
    name = fields.String(required=True)
    slot_minutes = fields.Integer(required=True)
    active = fields.Boolean(required=True)
    hours = fields.List(fields.Nested(HoursOut), required=True)


class ProfessionalQuery(Schema):
    class Meta:
        unknown = RAISE  # a misspelt filter is an error, not a silently unfiltered list

    active = fields.Boolean(metadata={"description": "Only the active (true) or inactive (false) ones."})


class ProfessionalPageOut(Schema):
    data = fields.List(fields.Nested(ProfessionalOut), required=True)


class SlotQueryIn(Schema):
    class Meta:
        unknown = RAISE

    date = fields.Date(metadata={"description": "One local day (YYYY-MM-DD); the same as date_from = date_to."})
    date_from = fields.Date(metadata={"description": "The first local day searched (default: today)."})
    date_to = fields.Date(metadata={"description": "The last local day searched (default: the horizon, 60 days)."})
    period = fields.String(validate=validate.OneOf(tuple(PERIODS)), metadata={
        "description": "morning 06:00–12:00, afternoon 12:00–18:00, evening 18:00–23:00 (by a slot's start)."})
    time = fields.String(validate=validate.Regexp(_HHMM), metadata={
        "description": "HH:MM: that time, or the nearest free ones.", "example": "15:00"})
    exclude_weekdays = fields.String(validate=validate.Regexp(_WEEKDAYS), metadata={
        "description": "Weekdays left out, comma-separated (0 = Monday).", "example": "0,4"})
    professional_id = Id(strict=False, metadata={"description": "Only this professional's free times."})
    professional = Text(validate=validate.Length(min=1, max=MAX_NAME), metadata={
        "description": "Only the free times of the professional of this name."})
    limit = fields.Integer(load_default=3, validate=validate.Range(min=1, max=MAX_LIMIT))


class SlotOut(Schema):
    starts_at = fields.String(required=True, metadata={"format": "date-time", "description": "In the org's timezone."})
    ends_at = fields.String(required=True, metadata={"format": "date-time"})
    professional = fields.String(required=True, allow_none=True)
    professional_id = fields.Integer(required=True, allow_none=True,
                                     metadata={"description": "Null for the clinic's own system's free times."})


class SlotPageOut(Schema):
    data = fields.List(fields.Nested(SlotOut), required=True)
    source = fields.String(required=True, validate=validate.OneOf(("builtin", "webhook")),
                           metadata={"description": "The built-in agenda, or the clinic's availability webhook."})


# --- errors -------------------------------------------------------------------------------------

@bp.errorhandler(agenda.AgendaError)
def _agenda_refused(exc: agenda.AgendaError) -> Any:
    if isinstance(exc, agenda.ProfessionalNotFound):
        return error_response(404)  # another org's professional answers like one that does not exist
    if exc.code == "agenda_name_taken":
        return error_response(409, "the org already has a professional with this name", [finding_detail(exc.finding)])
    return error_response(422, "the agenda refused this", [finding_detail(exc.finding)])


@bp.errorhandler(agenda.AvailabilityUnavailable)
def _unavailable(exc: agenda.AvailabilityUnavailable) -> Any:
    return error_response(502, "the clinic's system could not give free times", [{
        **detail(exc.code, "", exc.text), "transient": not exc.permanent}])


# --- routes -------------------------------------------------------------------------------------

def _saved(conn: Any, action: str, professional: agenda.Professional, changes: dict[str, Any]) -> Any:
    audit(conn, org_id=professional.org_id, api_key_id=caller().id, action=action, entity="professionals",
          entity_id=professional.id, changes={k: v for k, v in changes.items() if k != "hours"} or None)
    return ProfessionalOut().dump(professional.as_json())


@bp.get("/professionals")
@documented("get", "/professionals", "List the agenda's professionals with their weekly hours", tag="agenda",
            query=ProfessionalQuery, errors=(422,),
            responses={200: (ProfessionalPageOut, "Every professional of the org, by name")})
@require_key
def list_professionals() -> Any:
    params = load_query(ProfessionalQuery())
    with org_tx() as conn:
        found = agenda.list_professionals(conn, caller().org_id)
    if "active" in params:
        found = [p for p in found if p.active == params["active"]]
    return jsonify(ProfessionalPageOut().dump({"data": [p.as_json() for p in found]}))


@bp.post("/professionals")
@documented("post", "/professionals", "Add a professional with their weekly hours", tag="agenda",
            description="Hours are intervals of a weekday in the org's wall-clock time; several a day make "
                        "breaks. Overlapping intervals, a slot length outside 5–480 minutes or a name the org "
                        "already uses (409): nothing written.",
            body=ProfessionalIn, responses={201: (ProfessionalOut, "Created")}, errors=(400, 409, 413, 422))
@require_key
def create_professional() -> Any:
    data = load(ProfessionalIn(), json_body())
    with org_tx() as conn:
        made = agenda.create_professional(conn, caller().org_id, **data)
        out = _saved(conn, "create", made, data)
    response = jsonify(out)
    response.status_code = 201
    return response


@bp.get("/professionals/<int:professional_id>")
@documented("get", "/professionals/{professional_id}", "Get a professional with their weekly hours", tag="agenda",
            path_id="professional_id", responses={200: (ProfessionalOut, "The professional")}, errors=(404,))
@require_key
def get_professional(professional_id: int) -> Any:
    with org_tx() as conn:
        found = agenda.get_professional(conn, caller().org_id, path_id(professional_id))
    return jsonify(ProfessionalOut().dump(found.as_json()))


@bp.patch("/professionals/<int:professional_id>")
@documented("patch", "/professionals/{professional_id}", "Change a professional or their weekly hours",
            tag="agenda", path_id="professional_id",
            description="Only the fields given change; `hours` replaces the whole week. Checked as on create: a "
                        "refusal changes nothing.",
            body=ProfessionalPatch, responses={200: (ProfessionalOut, "Saved")}, errors=(400, 404, 409, 413, 422))
@require_key
def update_professional(professional_id: int) -> Any:
    professional_id = path_id(professional_id)
    data = load(ProfessionalPatch(), json_body())
    with org_tx() as conn:
        changed = agenda.update_professional(conn, caller().org_id, professional_id, **data)
        out = _saved(conn, "update", changed, data)
    return jsonify(out)


@bp.delete("/professionals/<int:professional_id>")
@documented("delete", "/professionals/{professional_id}", "Remove a professional and their hours", tag="agenda",
            path_id="professional_id",
            description="Their appointments stay, with the professional's name as text and without the link. "
                        "To stop offering their times but keep them, set `active` to false instead.",
            responses={200: (ProfessionalOut, "Removed (as it was)")}, errors=(404,))
@require_key
def delete_professional(professional_id: int) -> Any:
    with org_tx() as conn:
        gone = agenda.delete_professional(conn, caller().org_id, path_id(professional_id))
        out = _saved(conn, "delete", gone, {})
    return jsonify(out)


@bp.get("/slots")
@documented("get", "/slots", "Free times, as a flow would offer them", tag="agenda", query=SlotQueryIn,
            description="Up to `limit` free times meeting the constraints, in the org's timezone, spread over "
                        "days (one a day first, earliest days first; with `time`, the nearest to it). Never in "
                        "the past, sooner than 2 hours from now, beyond 60 days, on the org's holidays or over "
                        "an appointment. From the built-in agenda, or from the clinic's availability webhook when "
                        "the org set one (502 when it cannot answer: `details[0].transient` says whether asking "
                        "again may help). Another org's `professional_id` answers 404.",
            responses={200: (SlotPageOut, "The free times, in time order")}, errors=(404, 422, 502))
@require_key
def free_slots() -> Any:
    params = load_query(SlotQueryIn())
    day = params.pop("date", None)
    weekdays = params.pop("exclude_weekdays", None)
    query = agenda.SlotQuery(
        date_from=params.get("date_from") or day, date_to=params.get("date_to") or day, period=params.get("period"),
        time=params.get("time"), exclude_weekdays=tuple(int(d) for d in weekdays.split(",")) if weekdays else (),
        professional_id=params.get("professional_id"), professional=params.get("professional"),
        limit=params["limit"]).checked()
    with org_tx() as conn:
        org = agenda.org_row(conn, caller().org_id)
        if org.availability_url is None:
            found = agenda.free_slots(conn, org, query, clock.now())
        elif query.professional_id is not None:  # the clinic's system knows professionals by name
            name = agenda.get_professional(conn, org.id, query.professional_id).name
            query = replace(query, professional_id=None, professional=name)
    if org.availability_url is not None:  # asked outside the transaction: the clinic may take seconds
        found = agenda.free_slots(None, org, query, clock.now(), egress=runtime().settings.egress)
    source = "builtin" if org.availability_url is None else "webhook"
    return jsonify(SlotPageOut().dump({"data": [s.as_json() for s in found], "source": source}))
