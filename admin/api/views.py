"""The endpoints of `/api/v1`. Each route declares its schemas once, in `documented(...)`; the
view validates with them and the OpenAPI document is generated from the same declarations."""

from __future__ import annotations

from typing import Any

from flask import jsonify
from sqlalchemy import select

from admin.api import services
from admin.api.core import (
    bp,
    caller,
    dump,
    error_response,
    idempotency_key,
    json_body,
    load,
    load_query,
    org_tx,
    page,
    path_id,
    require_key,
)
from admin.api.openapi import documented, openapi_document
from admin.api.schemas import (
    AppointmentIn,
    AppointmentOut,
    AppointmentPage,
    AppointmentQuery,
    ContactIn,
    ContactOut,
    ContactPage,
    ContactQuery,
    EnrollmentDetailOut,
    EnrollmentIn,
    EnrollmentOut,
    EnrollmentPage,
    EnrollmentQuery,
    EventIn,
    EventOut,
    FlowDetailOut,
    FlowDisabledOut,
    FlowDisableIn,
    FlowGraphSchemaOut,
    FlowIn,
    FlowPage,
    FlowPatch,
    FlowQuery,
    FlowRollbackIn,
    IdempotencyHeader,
    MessageIn,
    MessageOut,
    MessagePage,
    MessageQuery,
    VersionListOut,
    VersionOut,
)
from engine.tenants.audit import audit
from engine.flows.contact_events import record_contact_event
from engine.flows import queries, versions
from engine.flows.schema import json_schema
from engine.store.models import appointments, contacts, enrollments, flow_pointers, messages
from gateway.phones import normalize_phone


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
    return dump(ContactOut, out, 201 if created else 200)


@bp.get("/contacts/<int:contact_id>")
@documented("get", "/contacts/{contact_id}", "Get a contact", tag="contacts", path_id="contact_id",
            responses={200: (ContactOut, "The contact")}, errors=(404,))
@require_key
def get_contact(contact_id: int) -> Any:
    with org_tx() as conn:
        row = services.find_contact(conn, caller().org_id, path_id(contact_id))
        out = services.contact_out(conn, row)
    return dump(ContactOut, out)


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
        rows, next_cursor = page(conn, query, contacts.c.id, params)
        data = [services.contact_out(conn, row) for row in rows]
    return dump(ContactPage, {"data": data, "next_cursor": next_cursor})


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
    return dump(AppointmentOut, out, 201 if created else 200)


@bp.get("/appointments/<int:appointment_id>")
@documented("get", "/appointments/{appointment_id}", "Get an appointment", tag="appointments",
            path_id="appointment_id", responses={200: (AppointmentOut, "The appointment")}, errors=(404,))
@require_key
def get_appointment(appointment_id: int) -> Any:
    with org_tx() as conn:
        row = services.find_appointment(conn, caller().org_id, path_id(appointment_id))
    return dump(AppointmentOut, services.appointment_out(row))


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
        rows, next_cursor = page(conn, query, appointments.c.id, params)
    return dump(AppointmentPage, {"data": [services.appointment_out(r) for r in rows], "next_cursor": next_cursor})


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
        rows, next_cursor = page(conn, query, messages.c.id, params)
    return dump(MessagePage, {"data": [services.message_out(r) for r in rows], "next_cursor": next_cursor})


@bp.get("/messages/<int:message_id>")
@documented("get", "/messages/{message_id}", "Get a message (with its text)", tag="messages",
            path_id="message_id", responses={200: (MessageOut, "The message")}, errors=(404,))
@require_key
def get_message(message_id: int) -> Any:
    with org_tx() as conn:
        row = services.find_message(conn, caller().org_id, path_id(message_id))
    return dump(MessageOut, services.message_out(row))


@bp.post("/messages")
@documented("post", "/messages", "Send an ad-hoc message", tag="messages",
            description="Queued in the outbox and sent inside the org's sending window unless `send_now`. "
                        "The same `Idempotency-Key` answers the same message (200); reusing it for a "
                        "different request is a 409. A contact who opted out of `channel_kind`, never "
                        "consented to it, or whose phone or e-mail was refused for it is a 422 whose "
                        "`details` give the reason `{code, field, message, message_en}`; nothing is queued.",
            body=MessageIn, header=IdempotencyHeader,
            responses={201: (MessageOut, "Queued"), 200: (MessageOut, "Already queued with this key")},
            errors=(400, 409, 413, 422))
@require_key
def send_message() -> Any:
    key, data = idempotency_key(json_body(), MessageIn())
    org_id = caller().org_id
    with org_tx() as conn:
        row, created = services.send_adhoc(conn, org_id, key, data)
        if created:
            _audit(conn, "send", "message", row.id, {
                "contact_id": row.contact_id, "channel_kind": data["channel_kind"],
                "idempotency_key": key, "send_now": data["send_now"],
                "text": data["text"], "subject": data.get("subject"),
            })
    return dump(MessageOut, services.message_out(row), 201 if created else 200)


# --- events -----------------------------------------------------------------------------------

@bp.post("/events")
@documented("post", "/events", "Record a hand-off or stage event for the follow-up engine", tag="events",
            description="In the same transaction the follow-up engine acts on it: `handoff_started` pauses "
                        "(or cancels, or lets go on, per each flow's `handoff_policy`) the contact's live "
                        "runs; `handoff_ended` resumes paused runs after the flow's `resume_grace_minutes` "
                        "and starts flows triggered by a hand-off's end; `stage_changed` starts flows "
                        "triggered by that stage. The answer's `started` lists the runs it started.",
            body=EventIn, responses={201: (EventOut, "Recorded")}, errors=(400, 413, 422))
@require_key
def record_event() -> Any:
    data = load(EventIn(), json_body())
    org_id = caller().org_id
    with org_tx() as conn:
        contact_id = services.resolve_contact(conn, org_id, data).id
        event_id, at, created_at = record_contact_event(
            conn, org_id=org_id, contact_id=contact_id, type=data["type"], stage=data.get("stage"),
            at=data.get("at"))
        started = services.runs_started_by_event(conn, org_id, event_id)
        _audit(conn, "record", "contact_event", event_id,
               {"type": data["type"], "contact_id": contact_id, "stage": data.get("stage"),
                "started": [run["enrollment_id"] for run in started]})
    return dump(EventOut, {"id": event_id, "type": data["type"], "contact_id": contact_id,
                            "stage": data.get("stage"), "at": at, "created_at": created_at, "started": started}, 201)


# --- flows ------------------------------------------------------------------------------------

FLOW_422 = ("A bad field is a 422 by field name; a graph or trigger the engine refuses is a 422 whose "
            "`details` lists one `FlowIssue` `{node_id, code, message, message_en}` per broken rule.")


@bp.errorhandler(versions.FlowRejected)
def _flow_rejected(exc: versions.FlowRejected) -> Any:
    return error_response(422, "the flow breaks its rules", [services.issue_out(i) for i in exc.issues])


@bp.errorhandler(versions.FlowNotFound)
def _flow_not_found(exc: versions.FlowNotFound) -> Any:
    return error_response(404)  # like any other id the key's org does not have


@bp.errorhandler(versions.FlowNameTaken)
def _flow_name_taken(exc: versions.FlowNameTaken) -> Any:
    return error_response(409, "a flow with this name already exists")


@bp.get("/flows")
@documented("get", "/flows", "List follow-up flows", tag="flows", query=FlowQuery,
            responses={200: (FlowPage, "A page of flows")}, errors=(422,))
@require_key
def list_flows() -> Any:
    params = load_query(FlowQuery())
    org_id = caller().org_id
    query = queries.flows_query(org_id)
    if params.get("status"):
        query = query.where(flow_pointers.c.status == params["status"])
    with org_tx() as conn:
        rows, next_cursor = page(conn, query, flow_pointers.c.id, params)
        data = services.flows_out(conn, org_id, rows)
    return dump(FlowPage, {"data": data, "next_cursor": next_cursor})


@bp.post("/flows")
@documented("post", "/flows", "Create a follow-up flow (a draft)", tag="flows",
            description="The draft's shape is checked now, its rules when it is published. " + FLOW_422,
            body=FlowIn, responses={201: (FlowDetailOut, "Created")}, errors=(400, 409, 413, 422))
@require_key
def create_flow() -> Any:
    data = load(FlowIn(), json_body())
    org_id = caller().org_id
    with org_tx() as conn:
        flow_id = versions.create_flow(conn, org_id, **data)
        _audit(conn, "create", "flow", flow_id, services.flow_audit(data))
        out = services.flow_detail(conn, org_id, flow_id)
    return dump(FlowDetailOut, out, 201)


@bp.get("/flows/schema")
@documented("get", "/flows/schema", "The JSON Schema of a flow graph, for builders", tag="flows",
            description="JSON Schema draft 2020-12 of `draft_graph`: every node type's config, edge "
                        "conditions, condition checks and the trigger config (`$defs.trigger_config`).",
            responses={200: (FlowGraphSchemaOut, "The JSON Schema")})
@require_key
def flow_graph_schema() -> Any:
    return jsonify(json_schema())


@bp.get("/flows/<int:flow_id>")
@documented("get", "/flows/{flow_id}", "Get a flow (with its draft)", tag="flows", path_id="flow_id",
            responses={200: (FlowDetailOut, "The flow")}, errors=(404,))
@require_key
def get_flow(flow_id: int) -> Any:
    with org_tx() as conn:
        out = services.flow_detail(conn, caller().org_id, path_id(flow_id))
    return dump(FlowDetailOut, out)


@bp.patch("/flows/<int:flow_id>")
@documented("patch", "/flows/{flow_id}", "Change a flow's draft and settings", tag="flows", path_id="flow_id",
            description="Only the fields given change. Live runs keep the version they started on; the "
                        "draft goes live when it is published. " + FLOW_422,
            body=FlowPatch, responses={200: (FlowDetailOut, "Updated")}, errors=(400, 404, 409, 413, 422))
@require_key
def update_flow(flow_id: int) -> Any:
    flow_id = path_id(flow_id)
    data = load(FlowPatch(), json_body())
    org_id = caller().org_id
    with org_tx() as conn:
        versions.update_flow(conn, org_id, flow_id, **data)
        if data:
            _audit(conn, "update", "flow", flow_id, services.flow_audit(data))
        out = services.flow_detail(conn, org_id, flow_id)
    return dump(FlowDetailOut, out)


@bp.post("/flows/<int:flow_id>/publish")
@documented("post", "/flows/{flow_id}/publish", "Publish the draft as the flow's new version", tag="flows",
            path_id="flow_id",
            description="Checks every publish rule (docs/flows.md) and freezes the draft as an immutable "
                        "version that new runs start on; the flow becomes `active`. A draft identical to "
                        "the active version re-activates it without a new number. " + FLOW_422,
            responses={200: (VersionOut, "The active version")}, errors=(404, 422))
@require_key
def publish_flow(flow_id: int) -> Any:
    flow_id = path_id(flow_id)
    org_id = caller().org_id
    with org_tx() as conn:
        row = versions.publish(conn, org_id, flow_id, by="api")
        _audit(conn, "publish", "flow", flow_id, {"version": row.version, "version_id": row.id})
    return dump(VersionOut, services.version_out(row))


@bp.post("/flows/<int:flow_id>/disable")
@documented("post", "/flows/{flow_id}/disable", "Stop a flow starting new runs", tag="flows", path_id="flow_id",
            body=FlowDisableIn, responses={200: (FlowDisabledOut, "Disabled")}, errors=(400, 404, 413, 422))
@require_key
def disable_flow(flow_id: int) -> Any:
    flow_id = path_id(flow_id)
    data = load(FlowDisableIn(), json_body())
    org_id = caller().org_id
    with org_tx() as conn:
        cancelled = versions.disable(conn, org_id, flow_id, live=data["live"])
        _audit(conn, "disable", "flow", flow_id, {"live": data["live"], "cancelled": cancelled})
        out = services.flow_detail(conn, org_id, flow_id)
    return dump(FlowDisabledOut, {"flow": out, "cancelled": cancelled})


@bp.post("/flows/<int:flow_id>/rollback")
@documented("post", "/flows/{flow_id}/rollback", "Make an earlier version the active one", tag="flows",
            path_id="flow_id",
            description="New runs start on that version (the flow becomes `active`); live runs keep theirs. "
                        "The draft is left as it is. An unknown version number is a 404.",
            body=FlowRollbackIn, responses={200: (VersionOut, "The active version")},
            errors=(400, 404, 413, 422))
@require_key
def rollback_flow(flow_id: int) -> Any:
    flow_id = path_id(flow_id)
    data = load(FlowRollbackIn(), json_body())
    org_id = caller().org_id
    with org_tx() as conn:
        row = versions.rollback(conn, org_id, flow_id, data["version"])
        _audit(conn, "rollback", "flow", flow_id, {"version": row.version, "version_id": row.id})
    return dump(VersionOut, services.version_out(row))


@bp.get("/flows/<int:flow_id>/versions")
@documented("get", "/flows/{flow_id}/versions", "List a flow's published versions", tag="flows",
            path_id="flow_id", responses={200: (VersionListOut, "Newest first")}, errors=(404,))
@require_key
def list_flow_versions(flow_id: int) -> Any:
    with org_tx() as conn:
        rows = versions.list_versions(conn, caller().org_id, path_id(flow_id))
    return dump(VersionListOut, {"data": [services.version_summary_out(r) for r in rows]})


# --- enrollments ------------------------------------------------------------------------------

@bp.get("/enrollments")
@documented("get", "/enrollments", "List follow-up runs", tag="enrollments", query=EnrollmentQuery,
            responses={200: (EnrollmentPage, "A page of enrollments")}, errors=(422,))
@require_key
def list_enrollments() -> Any:
    params = load_query(EnrollmentQuery())
    query = queries.enrollments_query(caller().org_id, flow_id=params.get("flow_id"), status=params.get("status"),
                                      contact_id=params.get("contact_id"))
    with org_tx() as conn:
        rows, next_cursor = page(conn, query, enrollments.c.id, params)
    return dump(EnrollmentPage, {"data": [services.enrollment_out(r) for r in rows], "next_cursor": next_cursor})


@bp.get("/enrollments/<int:enrollment_id>")
@documented("get", "/enrollments/{enrollment_id}", "Get a follow-up run with its timeline", tag="enrollments",
            path_id="enrollment_id", responses={200: (EnrollmentDetailOut, "The enrollment")}, errors=(404,))
@require_key
def get_enrollment(enrollment_id: int) -> Any:
    org_id = caller().org_id
    with org_tx() as conn:
        row = services.find_enrollment(conn, org_id, path_id(enrollment_id))
        out = services.enrollment_detail(conn, org_id, row)
    return dump(EnrollmentDetailOut, out)


@bp.post("/enrollments")
@documented("post", "/enrollments", "Start a flow for a contact by hand", tag="enrollments",
            description="Starts the flow's active version now, whatever its trigger and repeat policy. "
                        "The same `Idempotency-Key` for the same flow answers the same enrollment (200), "
                        "for another contact or appointment it is a 409. A flow or contact the key's org "
                        "does not have is a 422 on that field; a refusal (flow not active, contact opted "
                        "out, already in the flow) is a 409 with `details: {reason, message}`.",
            body=EnrollmentIn, header=IdempotencyHeader,
            responses={201: (EnrollmentOut, "Enrolled"), 200: (EnrollmentOut, "Already enrolled with this key")},
            errors=(400, 409, 413, 422))
@require_key
def create_enrollment() -> Any:
    key, data = idempotency_key(json_body(), EnrollmentIn())
    org_id = caller().org_id
    with org_tx() as conn:
        row, created = services.enroll_manual(conn, org_id, key, data)
        if created:
            _audit(conn, "enroll", "enrollment", row.id, {
                "flow_id": data["flow_id"], "contact_id": row.contact_id,
                "appointment_id": data.get("appointment_id"), "idempotency_key": key})
    return dump(EnrollmentOut, services.enrollment_out(row), 201 if created else 200)


@bp.post("/enrollments/<int:enrollment_id>/cancel")
@documented("post", "/enrollments/{enrollment_id}/cancel", "End a live run as the clinic", tag="enrollments",
            path_id="enrollment_id",
            description="The run ends `cancelled` (reason `cancelled_by_clinic`) and its follow-ups not yet "
                        "sent are cancelled. A run that already ended is a 409.",
            responses={200: (EnrollmentOut, "Cancelled")}, errors=(404, 409))
@require_key
def cancel_enrollment(enrollment_id: int) -> Any:
    enrollment_id = path_id(enrollment_id)
    with org_tx() as conn:
        row = services.cancel_enrollment(conn, caller().org_id, enrollment_id)
        _audit(conn, "cancel", "enrollment", enrollment_id, {"reason": "cancelled_by_clinic"})
    return dump(EnrollmentOut, services.enrollment_out(row))


# --- the document -----------------------------------------------------------------------------

@bp.get("/openapi.json")
def openapi() -> Any:
    return jsonify(openapi_document())
