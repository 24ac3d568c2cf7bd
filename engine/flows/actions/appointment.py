"""The `do` node's effects on the appointment, each run in the step's own transaction once the
run is held for its claim (engine/flows/runtime.py `_hold`): the effect and the step commit
together or not at all, so a worker killed mid-step or a second actor never confirms, moves or
books twice. Every change re-plans the appointment's reminders in the same transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Callable

from sqlalchemy.engine import Connection

from engine.flows.step import Decision, Snapshot
from engine.people import appointments
from engine.people.agenda import Slot, slot_still_free
from engine.reminders.populate import refresh_appointment
from engine.tenants.webhooks import events as webhooks

#: How a step ends: `leave(exit, reason, params=…, values=…)` gives the Decision of that exit.
Exit = Callable[..., Decision]


def confirm(conn: Connection, snap: Snapshot, leave: Exit) -> Decision:
    """scheduled → confirmed (already confirmed is fine); anything else takes `failed`."""
    org_id, appointment_id = snap.org.id, snap.appointment.id
    if appointments.confirm(conn, org_id, appointment_id):
        refresh_appointment(conn, org_id, appointment_id)
        return leave("ok", "do_confirmed")
    if appointments.get(conn, org_id, appointment_id).status == "confirmed":
        return leave("ok", "do_already_confirmed")
    return leave("failed", "do_appointment_not_live")


def cancel(conn: Connection, snap: Snapshot, leave: Exit) -> Decision:
    """The patient's appointment is cancelled (source `patient`: they asked in the conversation)."""
    org_id, appointment_id = snap.org.id, snap.appointment.id
    if appointments.cancel(conn, org_id, appointment_id, source="patient"):
        refresh_appointment(conn, org_id, appointment_id)
        return leave("ok", "do_cancelled")
    if appointments.get(conn, org_id, appointment_id).status == "cancelled":
        return leave("ok", "do_already_cancelled")
    return leave("failed", "do_appointment_not_live")


def _free(conn: Connection, snap: Snapshot, slot: Slot) -> Slot | None:
    """The slot as the agenda has it now, or None when it is no longer free. A clinic that answers
    for its own agenda (an availability webhook) was asked before the transaction began."""
    if snap.org.availability_url:
        return slot
    return slot_still_free(conn, snap.org, slot.starts_at, snap.now, professional_id=slot.professional_id)


def move(conn: Connection, snap: Snapshot, slot: Slot, leave: Exit, key: str) -> Decision:
    """Move the run's appointment to `slot` when it is still free; `unavailable` when it is not."""
    org_id, appointment = snap.org.id, snap.appointment
    free = _free(conn, snap, slot)
    if free is None:
        return leave("unavailable", "do_slot_taken", params={"starts_at": _iso(slot.starts_at)})
    old = appointment.starts_at
    who = (free.professional_id, free.professional) if free.professional_id is not None else None
    if not appointments.reschedule(conn, org_id, appointment.id, free.starts_at, professional=who):
        current = appointments.get(conn, org_id, appointment.id)
        if current.status in appointments.LIVE and current.starts_at == free.starts_at:
            return leave("ok", "do_already_there")
        return leave("failed", "do_appointment_not_live")
    webhooks.appointment_moved(conn, org_id, appointment.id, old_starts_at=old, reason="flow_moved")
    refresh_appointment(conn, org_id, appointment.id)
    return leave("ok", "do_moved", params={"starts_at": _iso(free.starts_at), "key": key})


def book(conn: Connection, snap: Snapshot, slot: Slot, leave: Exit, key: str) -> Decision:
    """Book a new appointment for the patient at `slot` (a no-show's rebooking names the one it
    replaces); the run follows the new appointment from here."""
    org_id = snap.org.id
    free = _free(conn, snap, slot)
    if free is None:
        return leave("unavailable", "do_slot_taken", params={"starts_at": _iso(slot.starts_at)})
    replaced = snap.appointment
    new_id = appointments.create_appointment(
        conn, org_id=org_id, contact_id=snap.contact.id, starts_at=free.starts_at, professional=free.professional,
        professional_id=free.professional_id, timezone=replaced.timezone if replaced is not None else None,
        mode=replaced.mode if replaced is not None else None,
        location=replaced.location if replaced is not None else None)
    webhooks.appointment_booked(conn, org_id, new_id, reason="flow_booked",
                                replaces_appointment_id=replaced.id if replaced is not None else None)
    refresh_appointment(conn, org_id, new_id)
    return leave("ok", "do_booked", params={"starts_at": _iso(free.starts_at), "appointment_id": new_id, "key": key},
                 values={"appointment_id": new_id})


def _iso(instant: datetime) -> str:
    return instant.isoformat()


__all__ = ["Exit", "book", "cancel", "confirm", "move"]


