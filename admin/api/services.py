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

from admin.api.core import ApiError
from engine import appointments as appointment_ops
from engine import clock
from engine.contacts import create_contact, set_consent
from engine.models import appointments, contacts, messages, preferences
from engine.outbox import enqueue, find_id
from engine.populate import plan_new, refresh_appointment
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


def contact_ref(conn: Connection, org_id: int, contact_id: int, field: str = "contact_id") -> Any:
    """A contact named in a request body: unknown (or another org's) is a 422 on that field."""
    row = conn.execute(select(contacts).where(contacts.c.org_id == org_id, contacts.c.id == contact_id,
                                              contacts.c.erased_at.is_(None))).first()
    if row is None:
        raise ValidationError({field: ["No such contact."]})
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
        except IntegrityError:  # a concurrent request created it first: update that one
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
              "mode", "location", "status", "confirmed_at", "cancelled_at", "cancel_source", "created_at",
              "updated_at")
    return {f: getattr(row, f) for f in fields}


def upsert_appointment(conn: Connection, org_id: int, data: dict[str, Any]) -> tuple[Any, bool, dict[str, Any]]:
    """Create or update the org's appointment with `external_id`; returns (row, created, changes).

    A new time reschedules (`engine.appointments.reschedule`), `cancelled` cancels as the clinic,
    and any change re-populates the appointment's reminders in this transaction. `scheduled` does
    not undo a patient's confirmation of the same time."""
    contact = conn.execute(select(contacts.c.id).where(
        contacts.c.org_id == org_id, contacts.c.external_id == data["contact_external_id"],
        contacts.c.erased_at.is_(None))).first()
    if contact is None:
        raise ValidationError({"contact_external_id": ["No contact with this external_id."]})
    existing = conn.execute(select(appointments).where(appointments.c.org_id == org_id,
                                                       appointments.c.external_id == data["external_id"])).first()
    if existing is None:
        try:
            with conn.begin_nested():
                appointment_id = appointment_ops.create_appointment(
                    conn, org_id=org_id, contact_id=contact.id, starts_at=data["starts_at"],
                    professional=data.get("professional"), timezone=data.get("timezone"), mode=data.get("mode"),
                    location=data.get("location"), external_id=data["external_id"],
                    status=data.get("status") or "scheduled",
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
        raise ValidationError({"contact_external_id": ["An appointment cannot move to another contact."]})
    changes: dict[str, Any] = {}
    plain = {f: data[f] for f in ("professional", "mode", "location") if f in data and data[f] != getattr(existing, f)}
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
        _set_status(conn, org_id, existing.id, status, target)
        changes["status"] = target
    if changes:
        refresh_appointment(conn, org_id, existing.id)
    return find_appointment(conn, org_id, existing.id), False, changes


def _set_status(conn: Connection, org_id: int, appointment_id: int, current: str, target: str) -> None:
    now = clock.now()
    where = (appointments.c.org_id == org_id) & (appointments.c.id == appointment_id)
    if target == "cancelled" and current in LIVE:
        appointment_ops.cancel(conn, org_id, appointment_id, source="clinic")
    elif target == "confirmed" and current == "scheduled":
        appointment_ops.confirm(conn, org_id, appointment_id)
    elif target == "cancelled":
        conn.execute(update(appointments).where(where).values(
            status="cancelled", cancelled_at=now, cancel_source="clinic", updated_at=now))
    elif target in LIVE:  # reopened by the clinic
        conn.execute(update(appointments).where(where).values(
            status=target, confirmed_at=now if target == "confirmed" else None, cancelled_at=None,
            cancel_source=None, updated_at=now))
    else:  # completed, no_show
        conn.execute(update(appointments).where(where).values(status=target, updated_at=now))


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
    out.update(body=body, subject=subject)
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
        contact_ref(conn, org_id, data["contact_id"])
        payload = {"text": data["text"], "request_sha256": request_hash}
        if data.get("subject"):
            payload["subject"] = data["subject"]
        new_id = enqueue(conn, org_id=org_id, contact_id=data["contact_id"], channel_kind=data["channel_kind"],
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

