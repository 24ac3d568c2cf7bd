"""What the API's writes do: upserts by external id, status changes that go through the
engine's own functions, and the rows as the API shows them. Everything runs in the caller's
transaction, so an appointment's reminders change in the same commit as the appointment."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from marshmallow import ValidationError
from sqlalchemy import select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from admin.api.core import ApiError, detail, finding_detail
from admin.api.schemas import catalogue_detail
from admin.i18n import translate_to
from engine.people import agenda
from engine.people import appointments as appointment_ops
from engine.core import clock
from engine.people.contacts import ExternalIdTaken, create_contact, set_consent
from engine.flows import lifecycle, queries, triggers
from engine.flows.issues import FlowIssue
from engine.store.models import appointments, contacts, enrollments, flow_pointers, messages, preferences
from engine.queue.outbox import enqueue, find_id
from engine.queue import address_optouts as addresses
from engine.reminders.populate import plan_new, refresh_appointment
from engine.words.catalogue import describe
from engine.words.reasons import row_reason, status_label
from engine.messaging.dispatch.batch import refusal as dispatch_refusal
from gateway.phones import normalize_phone

LIVE = appointment_ops.LIVE
ADHOC_PURPOSE = "adhoc"


# --- contacts ---------------------------------------------------------------------------------

def find_contact(conn: Connection, org_id: int, contact_id: int) -> Any:
    """The org's (not erased) contact, or a 404 that does not say whether it exists elsewhere."""
    row = conn.execute(select(contacts).where(contacts.c.org_id == org_id, contacts.c.id == contact_id,
                                              contacts.c.erased_at.is_(None))).first()
    if row is None:
        raise ApiError(404)
    return row


def resolve_contact(conn: Connection, org_id: int, data: dict[str, Any]) -> Any:
    """The org's (not erased) contact a body names by `contact_id` or `contact_external_id` (the
    schema let exactly one through). Unknown, erased or another org's is the same 422 on the
    field given, in the catalogue's words, so a key never learns what another org holds."""
    field = "contact_id" if data.get("contact_id") is not None else "contact_external_id"
    column = contacts.c.id if field == "contact_id" else contacts.c.external_id
    row = conn.execute(select(contacts).where(contacts.c.org_id == org_id, column == data[field],
                                              contacts.c.erased_at.is_(None))).first()
    if row is None:
        raise ValidationError({field: [catalogue_detail("api_contact_not_found", field)]})
    return row


def contact_out(conn: Connection, row: Any) -> dict[str, Any]:
    prefs = conn.execute(select(preferences.c.kind, preferences.c.opted_in, preferences.c.opted_out_at)
                         .where(preferences.c.org_id == row.org_id, preferences.c.contact_id == row.id)).all()
    return {
        "id": row.id, "external_id": row.external_id, "name": row.name, "phone": row.phone, "email": row.email,
        "locale": row.locale,
        "consent": sorted(p.kind for p in prefs if p.opted_in and p.opted_out_at is None),
        "opted_out": sorted(p.kind for p in prefs if p.opted_out_at is not None),
        "created_at": row.created_at, "updated_at": row.updated_at,
        **addresses.contact_fields(conn, row),
    }


def upsert_contact(conn: Connection, org_id: int, data: dict[str, Any]) -> tuple[Any, bool, dict[str, Any]]:
    """Create or update the org's contact with `external_id`; returns (row, created, changes).

    Only the fields present in `data` change. Consent given here never overrides a patient's own
    opt-out (SAIR): that kind stays refused until the patient opts in again."""
    existing = _contact_by_external_id(conn, org_id, data["external_id"])
    if existing is None:
        try:
            with conn.begin_nested():
                contact_id = create_contact(
                    conn, org_id=org_id, name=data.get("name"), phone=data.get("phone"), email=data.get("email"),
                    external_id=data["external_id"], locale=data.get("locale"), consent=data.get("consent") or (),
                    consent_source="api",
                )
        except (IntegrityError, ExternalIdTaken):  # a concurrent request created it first: update that one
            existing = _contact_by_external_id(conn, org_id, data["external_id"])
            if existing is None:
                raise
        else:
            row = conn.execute(select(contacts).where(contacts.c.id == contact_id)).one()
            return row, True, {k: v for k, v in data.items()}
    if existing.erased_at is not None:
        raise ApiError(409, "this contact was erased and cannot be written again")
    wanted: dict[str, Any] = {}
    for field in ("name", "phone", "email", "locale"):
        if field not in data:
            continue
        value = data[field]
        if field == "phone" and value:
            value = normalize_phone(value)
        if field == "email" and value:
            value = value.strip().lower()
        if value != getattr(existing, field):
            wanted[field] = value
    if wanted:
        conn.execute(update(contacts).where(contacts.c.org_id == org_id, contacts.c.id == existing.id)
                     .values(**wanted, updated_at=clock.now()))
    granted = []
    for kind in data.get("consent") or ():
        pref = conn.execute(select(preferences.c.opted_in, preferences.c.opted_out_at).where(
            preferences.c.org_id == org_id, preferences.c.contact_id == existing.id, preferences.c.kind == kind)).first()
        if pref is not None and (pref.opted_out_at is not None or pref.opted_in):
            continue  # already consented, or refused by the patient: the patient's word stands
        set_consent(conn, org_id, existing.id, kind, source="api")
        granted.append(kind)
    changes = dict(wanted)
    if granted:
        changes["consent"] = sorted(granted)
    row = conn.execute(select(contacts).where(contacts.c.id == existing.id)).one()
    return row, False, changes


def _contact_by_external_id(conn: Connection, org_id: int, external_id: str) -> Any:
    return conn.execute(select(contacts).where(contacts.c.org_id == org_id,
                                               contacts.c.external_id == external_id)).first()


# --- appointments -----------------------------------------------------------------------------

def find_appointment(conn: Connection, org_id: int, appointment_id: int) -> Any:
    row = conn.execute(_appointment_query(org_id).where(appointments.c.id == appointment_id)).first()
    if row is None:
        raise ApiError(404)
    return row


def _appointment_query(org_id: int) -> Any:
    return (select(appointments, contacts.c.external_id.label("contact_external_id"))
            .join(contacts, (contacts.c.id == appointments.c.contact_id) & (contacts.c.org_id == org_id))
            .where(appointments.c.org_id == org_id))


def appointment_query(org_id: int) -> Any:
    return _appointment_query(org_id)


def appointment_out(row: Any) -> dict[str, Any]:
    fields = ("id", "external_id", "contact_id", "contact_external_id", "starts_at", "timezone", "professional",
              "professional_id", "mode", "location", "status", "confirmed_at", "cancelled_at", "cancel_source",
              "created_at", "updated_at")
    return {f: getattr(row, f) for f in fields}


def upsert_appointment(conn: Connection, org_id: int, data: dict[str, Any]) -> tuple[Any, bool, dict[str, Any]]:
    """Create or update the org's appointment with `external_id`; returns (row, created, changes).

    A new time reschedules (`engine.people.appointments.reschedule`), `cancelled` cancels as the clinic,
    and any change re-populates the appointment's reminders in this transaction. `scheduled` does
    not undo a patient's confirmation of the same time."""
    contact = resolve_contact(conn, org_id, data)
    data = _with_professional(conn, org_id, data)
    existing = conn.execute(select(appointments).where(appointments.c.org_id == org_id,
                                                       appointments.c.external_id == data["external_id"])).first()
    if existing is None:
        try:
            with conn.begin_nested():
                appointment_id = appointment_ops.create_appointment(
                    conn, org_id=org_id, contact_id=contact.id, starts_at=data["starts_at"],
                    professional=data.get("professional"), timezone=data.get("timezone"), mode=data.get("mode"),
                    location=data.get("location"), external_id=data["external_id"],
                    status=data.get("status") or "scheduled", professional_id=data.get("professional_id"),
                )
        except IntegrityError:
            existing = conn.execute(select(appointments).where(
                appointments.c.org_id == org_id, appointments.c.external_id == data["external_id"])).first()
            if existing is None:
                raise
        else:
            refresh_appointment(conn, org_id, appointment_id)
            return find_appointment(conn, org_id, appointment_id), True, dict(data)
    if existing.contact_id != contact.id:
        field = "contact_id" if data.get("contact_id") is not None else "contact_external_id"
        raise ValidationError({field: ["An appointment cannot move to another contact."]})
    changes: dict[str, Any] = {}
    plain = {f: data[f] for f in ("professional", "professional_id", "mode", "location")
             if f in data and data[f] != getattr(existing, f)}
    if "professional" in plain and "professional_id" not in data and existing.professional_id is not None:
        # A new name without an id names someone else: the old link would keep the agenda counting
        # the appointment as the old professional's, so it goes and the name counts (docs/agenda.md).
        plain["professional_id"] = None
    if data.get("timezone") and data["timezone"] != existing.timezone:
        plain["timezone"] = data["timezone"]
    now = clock.now()
    if plain:
        conn.execute(update(appointments).where(appointments.c.org_id == org_id, appointments.c.id == existing.id)
                     .values(**plain, updated_at=now))
        changes.update(plain)
    status = existing.status
    if data["starts_at"] != existing.starts_at:
        if status in LIVE:
            appointment_ops.reschedule(conn, org_id, existing.id, data["starts_at"])
            status = "scheduled"
        else:
            conn.execute(update(appointments).where(appointments.c.org_id == org_id, appointments.c.id == existing.id)
                         .values(starts_at=data["starts_at"], updated_at=now))
        changes["starts_at"] = data["starts_at"]
    target = data.get("status")
    if target and target != status and not (target == "scheduled" and status == "confirmed"):
        appointment_ops.set_status(conn, org_id, existing.id, status, target)
        changes["status"] = target
    if changes:
        refresh_appointment(conn, org_id, existing.id)
    return find_appointment(conn, org_id, existing.id), False, changes


def _with_professional(conn: Connection, org_id: int, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with `professional` set to the name of the professional `professional_id` names, so
    the agenda's busy-time rule and the reminder's text see them; another org's (or no such)
    professional is a 422 on `professional_id`, raised before anything is written."""
    professional_id = data.get("professional_id")
    if professional_id is None:
        return data
    try:
        found = agenda.get_professional(conn, org_id, professional_id)
    except agenda.ProfessionalNotFound as exc:
        raise ApiError(422, "no such professional", [finding_detail(exc.finding)]) from None
    return {**data, "professional": found.name}


# --- messages ---------------------------------------------------------------------------------

def find_message(conn: Connection, org_id: int, message_id: int) -> Any:
    row = conn.execute(select(messages).where(messages.c.org_id == org_id, messages.c.id == message_id)).first()
    if row is None:
        raise ApiError(404)
    return row


def message_out(row: Any) -> dict[str, Any]:
    payload = row.payload if isinstance(row.payload, dict) else {}
    body, subject = row.body, row.subject
    if row.template_key is None:  # an ad-hoc message: its text is known before it is sent
        body = body if body is not None else payload.get("text")
        subject = subject if subject is not None else payload.get("subject")
    fields = ("id", "purpose", "contact_id", "appointment_id", "channel_kind", "status", "attempts", "due_at",
              "sent_at", "delivered_at", "read_at", "failed_at", "error_code", "skip_reason", "created_at",
              "updated_at")
    out = {f: getattr(row, f) for f in fields}
    # The codes stay for machines; the words are the catalogue's, in pt-BR like `reason_text`
    # of an enrollment.
    reason = row_reason(row.error_code, row.skip_reason, kind=row.channel_kind)
    out.update(body=body, subject=subject, status_text=str(status_label(row.status)),
               reason_text=str(reason) if reason is not None else None)
    return out


def fingerprint(data: dict[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def send_adhoc(conn: Connection, org_id: int, key: str, data: dict[str, Any]) -> tuple[Any, bool]:
    """Queue an ad-hoc message under the caller's idempotency key; returns (row, created).

    The same key with the same request answers the message queued the first time; the same key
    with a different request is a 409."""
    idempotency_key = f"api:{key}"
    request_hash = fingerprint(data)
    existing_id = find_id(conn, org_id, idempotency_key)
    if existing_id is None:
        contact = resolve_contact(conn, org_id, data)
        refused = send_refusal(conn, org_id, contact.id, data["channel_kind"])
        if refused is not None:
            raise ApiError(422, "the contact may not be messaged on this channel",
                           [detail(refused, "channel_kind", describe(refused))])
        payload = {"text": data["text"], "request_sha256": request_hash}
        if data.get("subject"):
            payload["subject"] = data["subject"]
        new_id = enqueue(conn, org_id=org_id, contact_id=contact.id, channel_kind=data["channel_kind"],
                         purpose=ADHOC_PURPOSE, idempotency_key=idempotency_key, payload=payload,
                         respect_window=not data.get("send_now"))
        if new_id is not None:
            plan_new(conn, org_id)
            return find_message(conn, org_id, new_id), True
        existing_id = find_id(conn, org_id, idempotency_key)
    row = find_message(conn, org_id, int(existing_id))  # type: ignore[arg-type]
    stored = row.payload.get("request_sha256") if isinstance(row.payload, dict) else None
    if stored != request_hash:
        raise ApiError(409, "this Idempotency-Key was already used for a different request")
    return row, False


def send_refusal(conn: Connection, org_id: int, contact_id: int, kind: str) -> str | None:
    """Why a message of `kind` may not go to the contact, as a catalogue code, or None: the
    patient's opt-out, no consent for that kind, or a refusal of one of their addresses. The
    dispatcher's own check (engine/messaging/dispatch/batch.py `refusal`) decides the address part;
    this only tells an opt-out from a consent never given, which it counts alike."""
    pref = conn.execute(select(preferences.c.opted_in, preferences.c.opted_out_at).where(
        preferences.c.org_id == org_id, preferences.c.contact_id == contact_id, preferences.c.kind == kind)).first()
    if pref is not None and pref.opted_out_at is not None:
        return "api_message_opted_out"
    if pref is None or not pref.opted_in:
        return "api_message_no_consent"
    if dispatch_refusal(conn, org_id, contact_id, kind) is not None:
        return "api_message_address_opted_out"
    return None


# --- flows ------------------------------------------------------------------------------------

FLOW_FIELDS = ("id", "name", "status", "active_version", "handoff_policy", "cancel_on_reply", "max_steps",
               "resume_grace_minutes", "trigger_config", "created_at", "updated_at")


def find_flow(conn: Connection, org_id: int, flow_id: int) -> Any:
    """The org's flow with its active version number; 404 otherwise."""
    row = queries.find_flow(conn, org_id, flow_id)
    if row is None:
        raise ApiError(404)
    return row


def flow_out(row: Any, live: int, *, detail: bool = False) -> dict[str, Any]:
    """A flow as the API shows it; `detail` adds the draft graph (lists leave it out)."""
    out = {f: getattr(row, f) for f in FLOW_FIELDS}
    out["trigger_config"] = out["trigger_config"] or {}
    out["live_enrollments"] = live
    if detail:
        out["draft_graph"] = row.draft_graph
    return out


def flows_out(conn: Connection, org_id: int, rows: list[Any]) -> list[dict[str, Any]]:
    """A page of flows with their live counts, counted in one query."""
    counts = queries.live_counts(conn, org_id, [row.id for row in rows])
    return [flow_out(row, counts.get(row.id, 0)) for row in rows]


def flow_detail(conn: Connection, org_id: int, flow_id: int) -> dict[str, Any]:
    row = find_flow(conn, org_id, flow_id)
    return flow_out(row, queries.live_counts(conn, org_id, [flow_id]).get(flow_id, 0), detail=True)


def flow_audit(data: dict[str, Any]) -> dict[str, Any]:
    """A flow write as the audit trail keeps it: the settings, and the graph as a fingerprint
    (a graph can be large, and the diff is the version history's job)."""
    changes = {k: v for k, v in data.items() if k != "draft_graph"}
    if "draft_graph" in data:
        changes["draft_graph_sha256"] = fingerprint(data["draft_graph"])
    return changes


def issue_out(issue: FlowIssue) -> dict[str, Any]:
    """A broken rule for a 422's details, in both of the console's languages."""
    text = queries.sentence(issue.code, issue.params)
    if text is None:  # a code missing from the catalogue is a bug, but not the caller's
        return {"node_id": issue.node_id, "code": issue.code, "message": issue.code, "message_en": issue.code}
    return {"node_id": issue.node_id, "code": issue.code, "message": str(text), "message_en": translate_to(text, "en")}


def version_out(row: Any) -> dict[str, Any]:
    return {"id": row.id, "version": row.version, "created_at": row.created_at, "graph": row.graph}


def version_summary_out(row: Any) -> dict[str, Any]:
    return {"id": row.id, "version": row.version, "created_at": row.created_at, "created_by": row.created_by}


# --- enrollments ------------------------------------------------------------------------------

def find_enrollment(conn: Connection, org_id: int, enrollment_id: int) -> Any:
    row = queries.find_enrollment(conn, org_id, enrollment_id)
    if row is None:
        raise ApiError(404)
    return row


def _sentence(code: str | None) -> str | None:
    text = queries.sentence(code)
    return str(text) if text is not None else None


def enrollment_out(row: Any) -> dict[str, Any]:
    """An enrollment as the API shows it: counters, clock, codes and the values its conversation
    collected (by field slug); never the text the patient wrote."""
    reason = queries.reason_code(row)
    return {
        "id": row.id, "flow_id": row.pointer_id, "version": row.version_number, "contact_id": row.contact_id,
        "appointment_id": row.appointment_id, "status": row.status, "current_node": row.current_node_id,
        "next_eval_at": row.next_eval_at, "attempts": row.attempts, "steps": row.steps, "llm_calls": row.llm_calls,
        "messages_sent": row.messages_sent, "replies": row.replies, "outcome": row.outcome, "reason": reason,
        "reason_text": _sentence(reason), "created_at": row.created_at, "updated_at": row.updated_at,
        "ended_at": row.ended_at, "data": dict(row.data or {}),
    }


def enrollment_detail(conn: Connection, org_id: int, row: Any) -> dict[str, Any]:
    """The enrollment with its timeline."""
    out = enrollment_out(row)
    out["timeline"] = [
        {"at": step.at, "node_id": step.node_id, "event": step.event, "status": step.status, "reason": step.reason,
         "reason_text": str(step.reason_text) if step.reason_text is not None else None, "next": step.next,
         "until": step.until, "llm_calls": step.llm_calls}
        for step in queries.run_steps(conn, org_id, row.id)
    ]
    return out


def _appointment_ref(conn: Connection, org_id: int, appointment_id: int, contact_id: int) -> str | None:
    row = conn.execute(select(appointments.c.contact_id).where(appointments.c.org_id == org_id,
                                                               appointments.c.id == appointment_id)).first()
    if row is None:
        return "No such appointment."
    if row.contact_id != contact_id:
        return "Not an appointment of this contact."
    return None


def enroll_manual(conn: Connection, org_id: int, key: str, data: dict[str, Any]) -> tuple[Any, bool]:
    """Start `data["flow_id"]` for the contact by hand, under the caller's idempotency key;
    returns (enrollment row, created).

    Names of rows that are not the org's are a 422 on their field (all listed at once); the
    engine's refusals (flow not active, contact opted out, already in the flow, …) a 409 with the
    reason's code and sentence. The same key for the same flow answers the same enrollment; for
    another contact or appointment it is a 409."""
    errors: dict[str, list[Any]] = {}
    if queries.find_flow(conn, org_id, data["flow_id"]) is None:
        errors["flow_id"] = ["No such flow."]
    contact_id = 0
    try:
        contact_id = resolve_contact(conn, org_id, data).id
    except ValidationError as exc:
        errors.update(exc.messages)  # type: ignore[arg-type]
    else:
        if data.get("appointment_id") is not None:
            problem = _appointment_ref(conn, org_id, data["appointment_id"], contact_id)
            if problem:
                errors["appointment_id"] = [problem]
    if errors:
        raise ValidationError(errors)

    def attempt() -> triggers.Enrolled:
        return triggers.enroll(conn, org_id, data["flow_id"], contact_id, trigger_kind="manual",
                               trigger_key=f"api:{key}", caller_key=f"api:{key}",
                               appointment_id=data.get("appointment_id"), automatic=False)

    result = attempt()
    if result.reason == "repeat_policy":
        # A concurrent request with the same key took the claim between enroll's look-up and its
        # insert; now that it has committed, asking again answers its enrollment.
        result = attempt()
    if result.enrollment_id is None:
        raise ApiError(409, "the contact was not enrolled",
                       {"reason": result.reason, "message": _sentence(result.reason) or result.reason})
    row = find_enrollment(conn, org_id, result.enrollment_id)
    if not result.created and (row.contact_id, row.appointment_id) != (contact_id, data.get("appointment_id")):
        raise ApiError(409, "this Idempotency-Key was already used for a different request")
    return row, result.created


def runs_started_by_event(conn: Connection, org_id: int, event_id: int) -> list[dict[str, Any]]:
    """The runs the contact event started (engine/flows/triggers.py `on_contact_event` keys each
    one `event:<id>`), with their flow's id and name."""
    rows = conn.execute(
        select(enrollments.c.id, enrollments.c.pointer_id, flow_pointers.c.name)
        .join(flow_pointers, (flow_pointers.c.id == enrollments.c.pointer_id) & (flow_pointers.c.org_id == org_id))
        .where(enrollments.c.org_id == org_id, enrollments.c.trigger_key == f"event:{event_id}")
        .order_by(enrollments.c.id)).all()
    return [{"enrollment_id": r.id, "flow_id": r.pointer_id, "flow_name": r.name} for r in rows]


def cancel_enrollment(conn: Connection, org_id: int, enrollment_id: int) -> Any:
    """End a live run as the clinic; 404 when it is not the org's, 409 when it already ended."""
    row = find_enrollment(conn, org_id, enrollment_id)
    ended = lifecycle.end_live(conn, org_id, enrollments.c.id == enrollment_id, status="cancelled", outcome=None,
                               reason="cancelled_by_clinic")
    if not ended:
        raise ApiError(409, "the enrollment is not live", {"status": row.status})
    return find_enrollment(conn, org_id, enrollment_id)
