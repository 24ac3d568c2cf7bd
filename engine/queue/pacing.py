"""The database side of send pacing: one `channel_pacing` row per paced channel holds the next
free send slot and the day's count, so every worker on every machine shares them."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.store.dialect import insert_ignore
from engine.store.models import channel_pacing
from gateway.pacing import PacingPolicy, Reservation

#: A worker waits for a slot at most this long; a later slot sends the message back to the queue.
MAX_WAIT = timedelta(seconds=30)


class DbPacingStore:
    """`PacingStore` over the caller's transaction (row lock on PostgreSQL, write lock on SQLite)."""

    def __init__(self, conn: Connection, org_id: int) -> None:
        self.conn = conn
        self.org_id = org_id

    def reserve(self, channel_id: int, policy: PacingPolicy, now: datetime, day: str,
                next_day_start: datetime) -> Reservation:
        conn = self.conn
        conn.execute(insert_ignore(conn, channel_pacing, ("channel_id",)).values(
            channel_id=channel_id, org_id=self.org_id, next_slot_at=now, day=day, sent_today=0))
        query = select(channel_pacing).where(channel_pacing.c.channel_id == channel_id,
                                             channel_pacing.c.org_id == self.org_id)
        if conn.dialect.name == "postgresql":
            query = query.with_for_update()
        row = conn.execute(query).one()
        # Read the clock again now that the row is locked: waiting for the lock must not leave
        # this reservation anchored in the past, or the next slot would come too soon.
        now = max(now, clock.now())
        sent_today = row.sent_today if row.day == day else 0
        if policy.daily_cap and sent_today >= policy.daily_cap:
            return Reservation(at=next_day_start, over_cap=True)
        slot = max(now, row.next_slot_at)
        if slot - now > MAX_WAIT:
            return Reservation(at=slot)
        conn.execute(
            update(channel_pacing)
            .where(channel_pacing.c.channel_id == channel_id, channel_pacing.c.org_id == self.org_id)
            .values(next_slot_at=slot + policy.next_gap(), day=day, sent_today=sent_today + 1)
        )
        return Reservation(at=slot)
