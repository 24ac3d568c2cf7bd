"""The endpoints of `/api/v1`. Each route declares its schemas once, in `documented(...)`; the
view validates with them and the OpenAPI document is generated from the same declarations."""

from __future__ import annotations

from typing import Any

from flask import jsonify, request
from marshmallow import Schema, ValidationError
from sqlalchemy import select

from admin.api import services
from admin.api.core import (
    ApiError,
    bp,
    caller,
    json_body,
    load,
    load_query,
    org_tx,
    require_key,
)
from admin.api.openapi import documented, openapi_document
from admin.api.schemas import (
    MAX_ID,
    AppointmentIn,
    AppointmentOut,
    AppointmentPage,
    AppointmentQuery,
    ContactIn,
    ContactOut,
    ContactPage,
    ContactQuery,
    EventIn,
    EventOut,
    IdempotencyHeader,
    MessageIn,
    MessageOut,
    MessagePage,
    MessageQuery,
    encode_cursor,
)
from engine.api_events import audit, record_contact_event
from engine.models import appointments, contacts, messages
from gateway.phones import normalize_phone


def _dump(schema: type[Schema], obj: Any, status: int = 200) -> Any:
    response = jsonify(schema().dump(obj))
    response.status_code = status
    return response


def _path_id(value: int) -> int:
    if not 1 <= value <= MAX_ID:
        raise ApiError(404)
    return value


def _page(conn: Any, query: Any, id_column: Any, params: dict[str, Any]) -> tuple[list[Any], str | None]:
    """One page of `query` in id order after the cursor, and the cursor of the next page."""
    limit = params["limit"]
    if params.get("cursor") is not None:
        query = query.where(id_column > params["cursor"])
    rows = list(conn.execute(query.order_by(id_column).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1].id) if more else None


def _audit(conn: Any, action: str, entity: str, entity_id: int, changes: dict[str, Any]) -> None:
    who = caller()
    audit(conn, org_id=who.org_id, api_key_id=who.id, action=action, entity=entity, entity_id=entity_id,
          changes=changes)


# --- contacts ---------------------------------------------------------------------------------

@bp.post("/contacts")
@documented("post", "/contacts", "Create or update a contact by external_id", tag="contacts",
            body=ContactIn, responses={201: (ContactOut, "Created"), 200: (ContactOut, "Updated")},
            errors=(400, 409, 413, 422))
@require_key
def upsert_contact() -> Any:
    data = load(ContactIn(), json_body())
    org_id = caller().org_id
    with org_tx() as conn:
        row, created, changes = services.upsert_contact(conn, org_id, data)
        if created or changes:
            _audit(conn, "create" if created else "update", "contact", row.id, changes)
        out = services.contact_out(conn, row)
    return _dump(ContactOut, out, 201 if created else 200)


@bp.get("/contacts/<int:contact_id>")
@documented("get", "/contacts/{contact_id}", "Get a contact", tag="contacts", path_id="contact_id",
            responses={200: (ContactOut, "The contact")}, errors=(404,))
@require_key
def get_contact(contact_id: int) -> Any:
    with org_tx() as conn:
        row = services.find_contact(conn, caller().org_id, _path_id(contact_id))
        out = services.contact_out(conn, row)
    return _dump(ContactOut, out)


@bp.get("/contacts")
@documented("get", "/contacts", "List contacts", tag="contacts", query=ContactQuery,
            responses={200: (ContactPage, "A page of contacts")}, errors=(422,))
@require_key
def list_contacts() -> Any:
    params = load_query(ContactQuery())
    org_id = caller().org_id
    query = select(contacts).where(contacts.c.org_id == org_id, contacts.c.erased_at.is_(None))
    if params.get("external_id") is not None:
        query = query.where(contacts.c.external_id == params["external_id"])
    if params.get("phone") is not None:
        query = query.where(contacts.c.phone == normalize_phone(params["phone"]))
    with org_tx() as conn:
        rows, next_cursor = _page(conn, query, contacts.c.id, params)
        data = [services.contact_out(conn, row) for row in rows]
    return _dump(ContactPage, {"data": data, "next_cursor": next_cursor})


# --- appointments -----------------------------------------------------------------------------

@bp.post("/appointments")
@documented("post", "/appointments", "Create or update an appointment by external_id", tag="appointments",
            description="A new `starts_at` reschedules and a `cancelled` status cancels; the appointment's "
                        "reminders are re-planned in the same transaction. `scheduled` does not undo the "
                        "patient's confirmation of an unchanged time.",
            body=AppointmentIn, responses={201: (AppointmentOut, "Created"), 200: (AppointmentOut, "Updated")},
            errors=(400, 413, 422))
@require_key
def upsert_appointment() -> Any:
    data = load(AppointmentIn(), json_body())
    org_id = caller().org_id
    with org_tx() as conn:
        row, created, changes = services.upsert_appointment(conn, org_id, data)
        if created or changes:
            _audit(conn, "create" if created else "update", "appointment", row.id, changes)
        out = services.appointment_out(row)
    return _dump(AppointmentOut, out, 201 if created else 200)


@bp.get("/appointments/<int:appointment_id>")
@documented("get", "/appointments/{appointment_id}", "Get an appointment", tag="appointments",
            path_id="appointment_id", responses={200: (AppointmentOut, "The appointment")}, errors=(404,))
@require_key
def get_appointment(appointment_id: int) -> Any:
    with org_tx() as conn:
        row = services.find_appointment(conn, caller().org_id, _path_id(appointment_id))
    return _dump(AppointmentOut, services.appointment_out(row))


@bp.get("/appointments")
@documented("get", "/appointments", "List appointments", tag="appointments", query=AppointmentQuery,
            responses={200: (AppointmentPage, "A page of appointments")}, errors=(422,))
@require_key
def list_appointments() -> Any:
    params = load_query(AppointmentQuery())
    query = services.appointment_query(caller().org_id)
    if params.get("status"):
        query = query.where(appointments.c.status == params["status"])
    if params.get("from_") is not None:
        query = query.where(appointments.c.starts_at >= params["from_"])
    if params.get("to") is not None:
        query = query.where(appointments.c.starts_at < params["to"])
    if params.get("contact_id") is not None:
        query = query.where(appointments.c.contact_id == params["contact_id"])
    with org_tx() as conn:
        rows, next_cursor = _page(conn, query, appointments.c.id, params)
    return _dump(AppointmentPage, {"data": [services.appointment_out(r) for r in rows], "next_cursor": next_cursor})


# --- messages ---------------------------------------------------------------------------------

@bp.get("/messages")
@documented("get", "/messages", "List messages", tag="messages", query=MessageQuery,
            responses={200: (MessagePage, "A page of messages")}, errors=(422,))
@require_key
def list_messages() -> Any:
    params = load_query(MessageQuery())
    query = select(messages).where(messages.c.org_id == caller().org_id)
    for field in ("status", "purpose", "contact_id"):
        if params.get(field) is not None:
            query = query.where(messages.c[field] == params[field])
    with org_tx() as conn:
        rows, next_cursor = _page(conn, query, messages.c.id, params)
    return _dump(MessagePage, {"data": [services.message_out(r) for r in rows], "next_cursor": next_cursor})


@bp.get("/messages/<int:message_id>")
@documented("get", "/messages/{message_id}", "Get a message (with its text)", tag="messages",
            path_id="message_id", responses={200: (MessageOut, "The message")}, errors=(404,))
@require_key
def get_message(message_id: int) -> Any:
    with org_tx() as conn:
        row = services.find_message(conn, caller().org_id, _path_id(message_id))
    return _dump(MessageOut, services.message_out(row))


@bp.post("/messages")
@documented("post", "/messages", "Send an ad-hoc message", tag="messages",
            description="Queued in the outbox and sent inside the org's sending window unless `send_now`. "
                        "The same `Idempotency-Key` answers the same message (200); reusing it for a "
                        "different request is a 409.",
            body=MessageIn, header=IdempotencyHeader,
            responses={201: (MessageOut, "Queued"), 200: (MessageOut, "Already queued with this key")},
            errors=(400, 409, 413, 422))
@require_key
def send_message() -> Any:
    header_errors: dict[str, Any] = {}
    key = None
    try:
        key = load(IdempotencyHeader(), {"Idempotency-Key": request.headers.get("Idempotency-Key")})
    except ValidationError as exc:  # listed together with the body's errors
        header_errors = exc.messages if isinstance(exc.messages, dict) else {"Idempotency-Key": exc.messages}
    data = load(MessageIn(), json_body(), header_errors)
    assert key is not None
    org_id = caller().org_id
    with org_tx() as conn:
        row, created = services.send_adhoc(conn, org_id, key["idempotency_key"], data)
        if created:
            _audit(conn, "send", "message", row.id, {
                "contact_id": data["contact_id"], "channel_kind": data["channel_kind"],
                "idempotency_key": key["idempotency_key"], "send_now": data["send_now"],
                "text": data["text"], "subject": data.get("subject"),
            })
    return _dump(MessageOut, services.message_out(row), 201 if created else 200)


# --- events -----------------------------------------------------------------------------------

@bp.post("/events")
@documented("post", "/events", "Record a hand-off or stage event for the follow-up engine", tag="events",
            body=EventIn, responses={201: (EventOut, "Recorded")}, errors=(400, 413, 422))
@require_key
def record_event() -> Any:
    data = load(EventIn(), json_body())
    org_id = caller().org_id
    with org_tx() as conn:
        services.contact_ref(conn, org_id, data["contact_id"])
        event_id, at, created_at = record_contact_event(
            conn, org_id=org_id, contact_id=data["contact_id"], type=data["type"], stage=data.get("stage"),
            at=data.get("at"))
        _audit(conn, "record", "contact_event", event_id,
               {"type": data["type"], "contact_id": data["contact_id"], "stage": data.get("stage")})
    return _dump(EventOut, {"id": event_id, "type": data["type"], "contact_id": data["contact_id"],
                            "stage": data.get("stage"), "at": at, "created_at": created_at}, 201)


# --- the document -----------------------------------------------------------------------------

@bp.get("/openapi.json")
def openapi() -> Any:
    return jsonify(openapi_document())
