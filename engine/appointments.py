"""Appointments: the one place they are created, moved, confirmed and cancelled. Every change
re-populates that appointment's reminders at once (SPEC §4)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from engine import clock
from engine.models import APPOINTMENT_STATUSES, appointments, contacts, orgs
from engine.orgs import DomainError

LIVE = ("scheduled", "confirmed")


def _check_timezone(name: str) -> None:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise DomainError(f"unknown timezone: {name}") from None


def create_appointment(
    conn: Connection,
    *,
    org_id: int,
    contact_id: int,
    starts_at: datetime,
    professional: str | None = None,
    timezone: str | None = None,
    mode: str | None = None,
    location: str | None = None,
    external_id: str | None = None,
    status: str = "scheduled",
) -> int:
    """Create an appointment (its reminders follow on the next populate of this appointment)."""
    if starts_at.tzinfo is None:
        raise DomainError("starts_at needs a timezone offset")
    if status not in APPOINTMENT_STATUSES:
        raise DomainError(f"status must be one of {', '.join(APPOINTMENT_STATUSES)}")
    if conn.execute(select(contacts.c.id).where(contacts.c.org_id == org_id, contacts.c.id == contact_id)).first() is None:
        raise DomainError("no such contact")
    if timezone is None:
        timezone = conn.execute(select(orgs.c.timezone).where(orgs.c.id == org_id)).scalar_one()
    _check_timezone(timezone)
    now = clock.now()
    appointment_id = int(conn.execute(
        insert(appointments).values(
            org_id=org_id, contact_id=contact_id, starts_at=starts_at, professional=professional,
            timezone=timezone, mode=mode, location=location, external_id=external_id, status=status,
            created_at=now, updated_at=now,
        ).returning(appointments.c.id)
    ).scalar_one())
    _event(conn, org_id, appointment_id, "created")
    return appointment_id


def _event(conn: Connection, org_id: int, appointment_id: int, event: str) -> None:
    """Start the follow-up flows that wait for this appointment event (same transaction)."""
    from engine.flows.triggers import on_appointment_event

    on_appointment_event(conn, org_id, appointment_id, event)


def get(conn: Connection, org_id: int, appointment_id: int) -> Any:
    """The org's appointment; DomainError when it is not the org's or does not exist."""
    row = conn.execute(
        select(appointments).where(appointments.c.org_id == org_id, appointments.c.id == appointment_id)
    ).first()
    if row is None:
        raise DomainError("no such appointment")
    return row


def reschedule(conn: Connection, org_id: int, appointment_id: int, starts_at: datetime) -> bool:
    """Move an appointment; its reminders for the old time are cancelled on the next populate."""
    if starts_at.tzinfo is None:
        raise DomainError("starts_at needs a timezone offset")
    get(conn, org_id, appointment_id)
    result = conn.execute(
        update(appointments)
        .where(appointments.c.org_id == org_id, appointments.c.id == appointment_id,
               appointments.c.status.in_(LIVE), appointments.c.starts_at != starts_at)
        .values(starts_at=starts_at, status="scheduled", confirmed_at=None, updated_at=clock.now())
    )
    return result.rowcount == 1


def confirm(conn: Connection, org_id: int, appointment_id: int) -> bool:
    """scheduled → confirmed; False when it was not scheduled (already confirmed, cancelled…)."""
    now = clock.now()
    result = conn.execute(
        update(appointments)
        .where(appointments.c.org_id == org_id, appointments.c.id == appointment_id,
               appointments.c.status == "scheduled")
        .values(status="confirmed", confirmed_at=now, updated_at=now)
    )
    if result.rowcount == 1:
        _event(conn, org_id, appointment_id, "confirmed")
    return result.rowcount == 1


def cancel(conn: Connection, org_id: int, appointment_id: int, *, source: str) -> bool:
    """scheduled/confirmed → cancelled, remembering who cancelled (patient or clinic)."""
    now = clock.now()
    result = conn.execute(
        update(appointments)
        .where(appointments.c.org_id == org_id, appointments.c.id == appointment_id,
               appointments.c.status.in_(LIVE))
        .values(status="cancelled", cancelled_at=now, cancel_source=source, updated_at=now)
    )
    if result.rowcount == 1:
        _event(conn, org_id, appointment_id, "cancelled")
    return result.rowcount == 1


def set_status(conn: Connection, org_id: int, appointment_id: int, current: str, target: str) -> None:
    """The clinic sets an appointment's status (API, CSV import): confirm and cancel go through
    `confirm`/`cancel`; a cancelled one may be reopened; completed and no-show are recorded."""
    now = clock.now()
    where = (appointments.c.org_id == org_id) & (appointments.c.id == appointment_id)
    if target == "cancelled" and current in LIVE:
        cancel(conn, org_id, appointment_id, source="clinic")
    elif target == "confirmed" and current == "scheduled":
        confirm(conn, org_id, appointment_id)
    elif target == "cancelled":
        conn.execute(update(appointments).where(where).values(
            status="cancelled", cancelled_at=now, cancel_source="clinic", updated_at=now))
    elif target in LIVE:  # reopened by the clinic
        conn.execute(update(appointments).where(where).values(
            status=target, confirmed_at=now if target == "confirmed" else None, cancelled_at=None,
            cancel_source=None, updated_at=now))
    else:  # completed, no_show
        conn.execute(update(appointments).where(where).values(status=target, updated_at=now))
        _event(conn, org_id, appointment_id, target)
