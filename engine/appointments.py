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
    return int(conn.execute(
        insert(appointments).values(
            org_id=org_id, contact_id=contact_id, starts_at=starts_at, professional=professional,
            timezone=timezone, mode=mode, location=location, external_id=external_id, status=status,
            created_at=now, updated_at=now,
        ).returning(appointments.c.id)
    ).scalar_one())


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
    return result.rowcount == 1
