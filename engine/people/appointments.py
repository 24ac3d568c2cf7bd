"""Appointments: the one place they are created, moved, confirmed and cancelled. Every change
re-populates that appointment's reminders at once (SPEC §4)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError
from engine.core.hooks import Hook
from engine.store.models import (
    APPOINTMENT_STATUSES,
    appointments,
    channels,
    contacts,
    messages,
    orgs,
    preferences,
    reminder_rule_kinds,
    reminder_rules,
)
from engine.queue import address_optouts as addresses
from engine.tenants.webhooks import events as webhooks

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
    professional_id: int | None = None,
    timezone: str | None = None,
    mode: str | None = None,
    location: str | None = None,
    external_id: str | None = None,
    status: str = "scheduled",
) -> int:
    """Create an appointment (its reminders follow on the next populate of this appointment).
    `professional_id` links it to one of the org's professionals; the caller checks it is the org's
    and gives their name as `professional` (engine/people/agenda reads both)."""
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
            professional_id=professional_id, timezone=timezone, mode=mode, location=location,
            external_id=external_id, status=status, created_at=now, updated_at=now,
        ).returning(appointments.c.id)
    ).scalar_one())
    _event(conn, org_id, appointment_id, "created")
    return appointment_id


#: An appointment was created, confirmed, cancelled, completed or missed: (conn, org_id,
#: appointment_id, event). The flows that wait for it start in the caller's transaction.
appointment_event: Hook[Callable[[Connection, int, int, str], Any]] = Hook(
    "appointment_event", "engine.flows.triggers")


def _event(conn: Connection, org_id: int, appointment_id: int, event: str) -> None:
    """Start the follow-up flows that wait for this appointment event (same transaction)."""
    appointment_event.fire(conn, org_id, appointment_id, event)


def get(conn: Connection, org_id: int, appointment_id: int) -> Any:
    """The org's appointment; DomainError when it is not the org's or does not exist."""
    row = conn.execute(
        select(appointments).where(appointments.c.org_id == org_id, appointments.c.id == appointment_id)
    ).first()
    if row is None:
        raise DomainError("no such appointment")
    return row


def reschedule(conn: Connection, org_id: int, appointment_id: int, starts_at: datetime, *,
               professional: tuple[int | None, str | None] | None = None) -> bool:
    """Move an appointment (with `professional`, (id, name), to that professional too); its
    reminders for the old time are cancelled on the next populate."""
    if starts_at.tzinfo is None:
        raise DomainError("starts_at needs a timezone offset")
    get(conn, org_id, appointment_id)
    values: dict[str, Any] = {"starts_at": starts_at, "status": "scheduled", "confirmed_at": None,
                              "updated_at": clock.now()}
    if professional is not None:
        values.update(professional_id=professional[0], professional=professional[1])
    result = conn.execute(
        update(appointments)
        .where(appointments.c.org_id == org_id, appointments.c.id == appointment_id,
               appointments.c.status.in_(LIVE), appointments.c.starts_at != starts_at)
        .values(**values)
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
        webhooks.appointment_confirmed(conn, org_id, appointment_id)
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
        webhooks.appointment_cancelled(conn, org_id, appointment_id, source=source)
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
        if conn.execute(update(appointments).where(where, appointments.c.status != "cancelled").values(
                status="cancelled", cancelled_at=now, cancel_source="clinic", updated_at=now)).rowcount:
            webhooks.appointment_cancelled(conn, org_id, appointment_id, source="clinic")
    elif target in LIVE:  # reopened by the clinic
        conn.execute(update(appointments).where(where).values(
            status=target, confirmed_at=now if target == "confirmed" else None, cancelled_at=None,
            cancel_source=None, updated_at=now))
    else:  # completed, no_show
        conn.execute(update(appointments).where(where).values(status=target, updated_at=now))
        _event(conn, org_id, appointment_id, target)


# --- what an appointment's reminders will do -------------------------------------------------
#: Rules whose reminder is expected as soon as the appointment is booked (after-start and
#: cancellation notices are about later events).
_BOOKING_TRIGGERS = ("before_start", "on_create")
#: Messages of a rule that mean "this reminder goes (or went)".
GOING = ("new", "pending", "claimed", "sending", "sent", "delivered", "read", "unknown")


@dataclass(frozen=True)
class SkippedReminder:
    """An active rule that sends nothing for the appointment's current time, and why
    (`reason` is a code of engine/words/catalogue.py)."""

    rule_id: int
    rule_name: str
    trigger: str
    offset_minutes: int
    reason: str


@dataclass(frozen=True)
class ReminderOutlook:
    """What the appointment's reminders will do, for the person who just booked or moved it."""

    queued: int
    skipped: list[SkippedReminder]
    in_past: bool


def reminder_outlook(conn: Connection, org_id: int, appointment_id: int, *, horizon: timedelta) -> ReminderOutlook:
    """After a populate of the appointment (engine.reminders.populate.refresh_appointment): how many of its
    reminders for the current time are queued, and each active rule that sends nothing, with
    the reason — the time it was meant for has passed, no consent, no working channel, no
    address. A rule whose reminder is simply not due yet (beyond `horizon`) is not skipped."""
    appt = get(conn, org_id, appointment_id)
    now = clock.now()
    in_past = appt.starts_at <= now
    if appt.status not in LIVE:
        return ReminderOutlook(0, [], in_past)
    rules = conn.execute(select(reminder_rules).where(
        reminder_rules.c.org_id == org_id, reminder_rules.c.active.is_(True)).order_by(reminder_rules.c.id)).all()
    sent = conn.execute(select(messages.c.rule_id, messages.c.status, messages.c.skip_reason).where(
        messages.c.org_id == org_id, messages.c.appointment_id == appointment_id,
        messages.c.appointment_starts_at == appt.starts_at, messages.c.rule_id.is_not(None))
        .order_by(messages.c.id)).all()
    going = {m.rule_id for m in sent if m.status in GOING}
    skip_reason = {m.rule_id: m.skip_reason for m in sent if m.status == "skipped" and m.skip_reason}
    why_not = _WhyNot(conn, org_id, appt)
    skipped: list[SkippedReminder] = []
    for rule in rules:
        if rule.id in going:
            continue
        reason = skip_reason.get(rule.id)
        if reason is None and rule.trigger in _BOOKING_TRIGGERS:
            if in_past:
                reason = "appointment_in_past"
            elif appt.starts_at <= now + horizon:
                reason = why_not.reason(rule.id)
        if reason is not None:
            skipped.append(SkippedReminder(rule.id, rule.name, rule.trigger, rule.offset_minutes, reason))
    return ReminderOutlook(len(going), skipped, in_past)


class _WhyNot:
    """Why populate chose no channel kind for a rule of this appointment (same conditions as
    engine.reminders.populate._insert_reminders, asked one by one to name the one that failed)."""

    def __init__(self, conn: Connection, org_id: int, appt: Any) -> None:
        contact = conn.execute(select(contacts).where(contacts.c.org_id == org_id,
                                                      contacts.c.id == appt.contact_id)).one()
        refused = addresses.refused_kinds_for(conn, org_id, addresses.addresses_of(contact.phone, contact.email))
        self.consented = {p.kind for p in conn.execute(select(preferences.c.kind).where(
            preferences.c.org_id == org_id, preferences.c.contact_id == contact.id,
            preferences.c.opted_in.is_(True), preferences.c.opted_out_at.is_(None)))} - refused
        self.working = set(conn.execute(select(channels.c.kind).where(
            channels.c.org_id == org_id, channels.c.status == "active")).scalars())
        self.reachable = {k for k in ("whatsapp", "sms") if contact.phone} | ({"email"} if contact.email else set())
        self.kinds: dict[int, set[str]] = {}
        for row in conn.execute(select(reminder_rule_kinds.c.rule_id, reminder_rule_kinds.c.kind)
                                .where(reminder_rule_kinds.c.org_id == org_id)):
            self.kinds.setdefault(int(row.rule_id), set()).add(row.kind)

    def reason(self, rule_id: int) -> str | None:
        agreed = self.kinds.get(int(rule_id), set()) & self.consented
        if not agreed:
            return "reminder_no_consent"
        if not agreed & self.working:
            return "reminder_no_channel"
        if not agreed & self.working & self.reachable:
            return "reminder_no_address"
        return None
