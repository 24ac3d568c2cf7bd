"""The scheduler's side of dispatch: claim what is due with a lease, and recover expired leases."""

from __future__ import annotations

import functools
import logging
import os
import socket
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.store.dialect import claim_first_due, planner_setting
from engine.queue.inbox import open_inbox_item
from engine.store.models import channels, messages
from engine.queue.outbox import record_event_rows, transition
from engine.store.runtime import Runtime
from gateway import registry

log = logging.getLogger(__name__)

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


def _index_scans(conn: Connection, *, restore: bool = True) -> AbstractContextManager[None]:
    """PostgreSQL: read the queue's partial indexes (`messages_leased`, `messages_due`) by index
    scan, not bitmap scan, whatever the statistics say.

    Every `claimed` and `sending` version of a message leaves an entry in `messages_leased` until
    VACUUM removes it. A bitmap scan visits the heap for every entry, dead or not, on every
    dispatch tick; an index scan marks an entry it finds dead once and skips it after that. With
    900,000 messages sent since the last vacuum, counting the messages in flight took 217–253 ms
    by bitmap and 3.9 ms by index once the dead entries were marked (272 ms the first time);
    the sweep's read, 212 ms and 0.8 ms (docs/benchmarks-history.md, 2026-12-05). The claim's `ORDER BY
    … LIMIT` is read through `messages_due` in its order, never as a bitmap scan and a sort of
    every due row (how the same SELECT without its row locks was planned on statistics taken
    before a big populate: 685 ms with 762,000 rows due)."""
    return planner_setting(conn, "enable_bitmapscan", "off", restore=restore)


def claim_due(rt: Runtime, *, limit: int, max_in_flight: int | None = None, task: int | None = None) -> list[int]:
    """Claim up to `limit` due messages (all orgs) with a lease; returns their ids in due order.

    `FOR UPDATE SKIP LOCKED` lets several claimers run at once on PostgreSQL without waiting on
    each other or taking the same row; SQLite serialises writers, which gives the same result.
    With `max_in_flight`, no more than that many are leased at once; with `task` too (how many
    ids a worker task takes), a claim the cap cuts short takes whole tasks only.
    """
    now = clock.now()
    # The claim's transaction is its own: the setting holds to its end, nothing to restore.
    with rt.db.begin() as conn, _index_scans(conn, restore=False):
        if max_in_flight is not None:
            in_flight = conn.execute(
                select(func.count()).select_from(messages).where(messages.c.status.in_(("claimed", "sending")))
            ).scalar_one()
            free = max(max_in_flight - in_flight, 0)
            if free < limit:
                limit = free
                if task and in_flight and task <= max_in_flight // 2:
                    # The workers free a few at a time while thousands are in flight: a task of a
                    # few costs a whole task's statements and commits, so the rest waits a tick.
                    limit -= limit % task
            if limit == 0:
                return []
        return _claim(conn, rt, _claim_statement(conn.dialect.name == "postgresql"), now, {"limit": limit})


def claim_for_contact(rt: Runtime, org_id: int, contact_id: int) -> list[int]:
    """Claim, as `claim_due` does, the messages due now to one contact of `org_id` (the answer to
    what they just wrote, for the worker that read it to send at once: engine/messaging/turn.py);
    returns their ids in due order. A message a scheduler pass claimed first is not taken twice:
    the same compare-and-set decides."""
    now = clock.now()
    with rt.db.begin() as conn:
        return _claim(conn, rt, _claim_statement(conn.dialect.name == "postgresql", contact=True), now,
                      {"limit": MAX_FOR_CONTACT, "of_org_id": org_id, "of_contact_id": contact_id})


#: The messages due to one contact that one claim takes at most.
MAX_FOR_CONTACT = 20


def _claim(conn: Connection, rt: Runtime, statement: Any, now: datetime, params: dict[str, Any]) -> list[int]:
    """Run a claim statement at `now`, with its `claimed` events; the claimed ids in due order."""
    rows = conn.execute(statement, {"now": now, "claim_lease_until": now + rt.settings.lease, **params}).all()
    record_event_rows(conn, [
        {"org_id": row.org_id, "message_id": row.id, "event": "claimed", "attempt": None,
         "provider_status": None, "detail": None, "created_at": now}
        for row in rows])
    return [row.id for row in sorted(rows, key=lambda r: (r.next_attempt_at, r.id))]


@functools.lru_cache(maxsize=4)
def _claim_statement(postgresql: bool, *, contact: bool = False) -> Any:
    """`claim_due`'s statement, built once (the scheduler claims several times a second): lease
    up to `:limit` messages due at `:now` until `:claim_lease_until`. With `contact`, only those
    to `:of_contact_id` of `:of_org_id` (`claim_for_contact`)."""
    only = (messages.c.org_id == bindparam("of_org_id"), messages.c.contact_id == bindparam("of_contact_id")) \
        if contact else ()
    return claim_first_due(
        messages, due=(*only, messages.c.status == "pending", messages.c.next_attempt_at <= bindparam("now")),
        order_by=(messages.c.next_attempt_at, messages.c.id), still=messages.c.status == "pending",
        values={"status": "claimed", "lease_until": bindparam("claim_lease_until"), "claimed_by": WORKER_ID,
                "updated_at": bindparam("now")},
        returning=(messages.c.id, messages.c.org_id, messages.c.next_attempt_at), postgresql=postgresql)


def sweep_leases(rt: Runtime) -> tuple[int, int]:
    """Recover rows whose lease ran out; returns (reclaimed, unknown)."""
    now = clock.now()
    reclaimed = unknown = 0
    with rt.db.begin() as conn:
        with _index_scans(conn):
            expired = conn.execute(
                select(messages.c.id, messages.c.org_id, messages.c.status, messages.c.attempts, channels.c.provider)
                .select_from(messages.outerjoin(channels, channels.c.id == messages.c.channel_id))
                .where(messages.c.status.in_(("claimed", "sending")), messages.c.lease_until < now)
            ).all()
        for row in expired:
            if row.status == "claimed":
                if transition(conn, row.org_id, row.id, ("claimed",), "pending", "reclaimed",
                              values={"lease_until": None, "claimed_by": None},
                              detail={"reason": "lease_expired"}):
                    reclaimed += 1
                continue
            if row.provider and honours_idempotency(row.provider):
                # The provider drops a repeated idempotency key, so trying again is safe.
                if transition(conn, row.org_id, row.id, ("sending",), "pending", "retried",
                              values={"lease_until": None, "next_attempt_at": now, "error_code": "lease_expired"},
                              detail={"reason": "lease_expired"}, attempt=row.attempts):
                    reclaimed += 1
                continue
            if transition(conn, row.org_id, row.id, ("sending",), "unknown", "unknown",
                          values={"lease_until": None, "error_code": "worker_lost"},
                          detail={"reason": "worker stopped during the provider call"}, attempt=row.attempts):
                unknown += 1
                open_inbox_item(conn, row.org_id, "message_unknown", f"message:{row.id}:unknown",
                                message_id=row.id, detail="outcome unknown: worker stopped during the provider call")
    if reclaimed or unknown:
        log.warning("leases swept", extra={"reclaimed": reclaimed, "unknown": unknown})
    return reclaimed, unknown


def honours_idempotency(provider: str) -> bool:
    """Whether the named provider drops a repeated idempotency key (so a lost call may be retried)."""
    try:
        return registry.load(provider).honours_idempotency
    except registry.UnknownProvider:
        return False
