"""The agenda: professionals, their weekly hours and the free times a flow offers a patient.

Free times come from one of two sources (docs/agenda.md): the built-in agenda (each professional's
weekly hours cut into slots, minus the org's holidays and the booked appointments: the embedded
default), or, when the org set an availability URL, the clinic's own system (`webhook`). Either
way `free_slots` answers the same: up to N zone-aware slots meeting the query, spread over days.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from engine.people.agenda.builtin import builtin_slots, professionals_for
from engine.people.agenda.errors import AgendaError, ProfessionalNotFound
from engine.people.agenda.professionals import (
    Interval,
    Professional,
    create_professional,
    delete_professional,
    get_professional,
    link_appointments,
    list_professionals,
    update_professional,
)
from engine.people.agenda.query import MAX_LIMIT, Slot, SlotQuery, bounds
from engine.people.agenda.webhook import DEFAULT_TIMEOUT, AvailabilityUnavailable, check_url, webhook_slots
from engine.store.models import orgs, professionals
from gateway.egress import STRICT, EgressPolicy

__all__ = [
    "AgendaError", "AvailabilityUnavailable", "Interval", "Professional", "ProfessionalNotFound", "Slot", "SlotQuery",
    "create_professional", "delete_professional", "free_slots", "get_professional", "link_appointments",
    "list_professionals", "org_row", "set_availability_url", "slot_still_free", "update_professional",
]


def org_row(conn: Connection, org_id: int) -> Any:
    """The org's row as `free_slots` reads it (timezone, state, availability URL)."""
    return conn.execute(select(orgs).where(orgs.c.id == org_id)).one()


def set_availability_url(conn: Connection, org_id: int, url: str | None, *, egress: EgressPolicy | None) -> str | None:
    """Set (or clear, with None or "") the org's availability webhook; checked as `webhook.check_url`."""
    clean = check_url(url, egress)
    conn.execute(update(orgs).where(orgs.c.id == org_id).values(availability_url=clean))
    return clean


def free_slots(conn: Connection | None, org: Any, query: SlotQuery, now: datetime, *,
               egress: EgressPolicy = STRICT, timeout: float = DEFAULT_TIMEOUT) -> list[Slot]:
    """Up to `query.limit` free times for the org (its row: `org_row`) meeting `query` at `now`,
    in the org's timezone, in time order.

    With the org's availability URL set, the clinic's system is asked (AvailabilityUnavailable when
    it cannot answer; `conn` is then only read for a professional named by id and may be None
    otherwise, so no transaction needs to stay open during the call); otherwise the built-in agenda
    answers. AgendaError for a query that cannot be asked (ProfessionalNotFound for an unknown
    professional)."""
    query = query if query._checked else query.checked()
    zone = ZoneInfo(org.timezone)
    limits = bounds(query, zone, now)
    if org.availability_url:
        name = query.professional
        if query.professional_id is not None:
            if conn is None:
                raise ValueError("a professional named by id needs a connection")
            name = get_professional(conn, org.id, query.professional_id).name
        return [] if limits is None else webhook_slots(org.availability_url, query, limits, professional=name,
                                                       egress=egress, timeout=timeout)
    if conn is None:
        raise ValueError("the built-in agenda needs a connection")
    chosen = professionals_for(conn, org.id, query)  # ProfessionalNotFound even when the range is empty
    return [] if limits is None else builtin_slots(conn, org, query, chosen, limits)


def slot_still_free(conn: Connection, org: Any, starts_at: datetime, now: datetime, *,
                    professional_id: int | None) -> Slot | None:
    """The built-in agenda's free slot starting at `starts_at` (of that professional, or of any
    when None), or None when it is taken, past, outside the hours or on a holiday. Called in the
    transaction that books it: on PostgreSQL the professionals' rows stay locked until it commits,
    so two bookings of one time cannot both see it free."""
    if conn.dialect.name == "postgresql":
        lock = select(professionals.c.id).where(professionals.c.org_id == org.id)
        if professional_id is not None:
            lock = lock.where(professionals.c.id == professional_id)
        conn.execute(lock.order_by(professionals.c.id).with_for_update()).all()
    local = starts_at.astimezone(ZoneInfo(org.timezone))
    query = SlotQuery(date_from=local.date(), date_to=local.date(), time=local.strftime("%H:%M"),
                      professional_id=professional_id, limit=MAX_LIMIT, lead_minutes=0).checked()
    limits = bounds(query, ZoneInfo(org.timezone), now)
    if limits is None:
        return None
    try:
        chosen = professionals_for(conn, org.id, query)
    except ProfessionalNotFound:
        return None
    by_start = [slot for slot in builtin_slots(conn, org, query, chosen, limits) if slot.starts_at == starts_at]
    return by_start[0] if by_start else None
