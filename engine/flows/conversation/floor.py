"""The floor: at most one run is asking a contact something at a time.

A run holds the floor from the question its `ask` (or an `offer_slots` list) sends until that
node is left: it is waiting for the answer (`waiting_reply`) with its place in the conversation
kept (`enrollments.ask_state`). Another run of the same contact that reaches a question waits,
looking again every `RECHECK`, and asks once the floor is free; its waits and messages that ask
nothing go on meanwhile. While a run holds the floor, the contact's replies go to it alone.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Sequence

from sqlalchemy import select
from sqlalchemy.engine import Connection

from engine.store.models import enrollments

#: How often a run waiting for the floor looks again.
RECHECK = timedelta(minutes=1)
#: The statuses of a run that holds the floor: asked and waiting, or handed to a person mid-question.
HOLDING = ("waiting_reply", "paused_handoff")


def holds_floor(row: Any) -> bool:
    """Whether this live run is in the middle of a question (its node asked and awaits the answer)."""
    return row.status in HOLDING and row.ask_state is not None


def taken_by_other(conn: Connection, org_id: int, contact_id: int, enrollment_id: int) -> int | None:
    """The run of this contact, other than `enrollment_id`, that holds the floor, or None."""
    return conn.execute(select(enrollments.c.id).where(
        enrollments.c.org_id == org_id, enrollments.c.contact_id == contact_id, enrollments.c.id != enrollment_id,
        enrollments.c.status.in_(HOLDING), enrollments.c.ask_state.is_not(None))
        .order_by(enrollments.c.id).limit(1)).scalar()


def holder(rows: Sequence[Any]) -> Any | None:
    """Among a contact's live runs (with `status` and `ask_state`), the one holding the floor."""
    return next((row for row in rows if holds_floor(row)), None)
