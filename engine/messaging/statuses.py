"""Provider statuses (sent, delivered, read, failed) applied to the messages they are about.

A status only moves a message forward: a late `delivered` never overwrites `read`. One can
arrive before Lembra has recorded the send it is about, because a batch's calls are settled
together, after the slowest of them: a Meta `sent` often comes back within the second. Such a
status is parked in `early_statuses` and applied by the scheduler once the send is recorded
(`settle_early`), so a `delivered` or a `failed` is never dropped on the floor.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import delete, exists, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.people.contacts import opt_out
from engine.queue.address_optouts import block_marketing
from engine.store.dialect import insert_ignore
from engine.store.models import early_statuses, messages
from engine.queue.outbox import transition
from engine.store.runtime import Runtime
from gateway.contract import StatusEvent

STATUS_RANK = {"unknown": 0, "sent": 1, "delivered": 2, "read": 3}
STATUS_TIMESTAMP = {"delivered": "delivered_at", "read": "read_at"}

#: A parked status no send has claimed by then is about a message Lembra did not send (one
#: written on the clinic's phone, which Evolution reports too): dropped.
KEEP_UNMATCHED = timedelta(days=1)
#: A message in one of these has its send recorded: a parked status can be applied to it. (A
#: `sending` row swept back to `pending` for a retry is not one yet.)
RECORDED = ("sent", "delivered", "read", "failed", "unknown")
#: Parked statuses applied per scheduler pass.
SETTLE_BATCH = 500


def apply_status(conn: Connection, org_id: int, channel_id: int, event: StatusEvent) -> bool:
    """Move a message forward on a provider status; True if it moved. Duplicates and late
    arrivals change nothing; a status whose send is not recorded yet is parked.

    A status for a message whose send is in flight or whose outcome was `unknown` (the worker
    died mid-call) is found through the reference the provider echoes back: the provider's id is
    written on the row then, so the parked status meets it however the send ends."""
    columns = (messages.c.id, messages.c.status, messages.c.contact_id, messages.c.channel_kind)
    msg = conn.execute(
        select(*columns).where(
            messages.c.org_id == org_id, messages.c.channel_id == channel_id,
            messages.c.provider_message_id == event.provider_message_id,
        )
    ).first()
    if msg is None and event.reference and event.reference.isdigit():
        msg = conn.execute(
            select(*columns).where(messages.c.org_id == org_id, messages.c.channel_id == channel_id,
                                   messages.c.id == int(event.reference),
                                   messages.c.status.in_(("sending", "unknown")),
                                   messages.c.provider_message_id.is_(None))
        ).first()
        if msg is not None:
            conn.execute(update(messages).where(messages.c.org_id == org_id, messages.c.id == msg.id)
                         .values(provider_message_id=event.provider_message_id))
    if msg is None or msg.status == "sending":
        _park(conn, org_id, channel_id, event)
        return False
    if event.opt_out:
        # A complaint or an unsubscribe arrives whatever the message's state (often after
        # `delivered`): the consent change stands even when the status does not move.
        opt_out(conn, org_id, msg.contact_id, kinds=(msg.channel_kind,), source="provider",
                evidence=f"provider status {event.error_code}")
    if event.marketing_opt_out:
        block_marketing(conn, org_id, msg.contact_id)
    if event.status == "failed":
        if msg.status not in ("sent", "unknown"):
            return event.opt_out
        return transition(conn, org_id, msg.id, (msg.status,), "failed", "failed",
                          values={"error_code": event.error_code or "provider_failed", "failed_at": event.timestamp},
                          provider_status="failed", detail={"code": event.error_code})
    if msg.status not in STATUS_RANK or STATUS_RANK[event.status] <= STATUS_RANK[msg.status]:
        return False
    values: dict[str, Any] = {}
    if event.status in STATUS_TIMESTAMP:
        values[STATUS_TIMESTAMP[event.status]] = event.timestamp
    if msg.status == "unknown":
        values["error_code"] = None
    return transition(conn, org_id, msg.id, (msg.status,), event.status, event.status,
                      values=values, provider_status=event.status)


def _park(conn: Connection, org_id: int, channel_id: int, event: StatusEvent) -> None:
    conn.execute(insert_ignore(conn, early_statuses, ("channel_id", "provider_message_id", "status")).values(
        org_id=org_id, channel_id=channel_id, provider_message_id=event.provider_message_id,
        status=event.status, occurred_at=event.timestamp, error_code=event.error_code,
        error_permanent=event.error_permanent, opt_out=event.opt_out, reference=event.reference,
        received_at=clock.now(),
    ))


def settle_early(rt: Runtime, *, limit: int = SETTLE_BATCH) -> int:
    """Apply the parked statuses whose send is now recorded, oldest first, and drop the ones
    kept past KEEP_UNMATCHED; returns how many were applied or found stale.

    Fleet-wide like the claim: each status is applied under its own org. Applying is
    idempotent (forward moves only, each a compare-and-set), so two passes at once are harmless."""
    e, m = early_statuses.c, messages.c
    # Due: a status is applied no sooner than it arrives. A webhook's arrived when it was parked;
    # the sandbox's receipts are parked ahead, to arrive a few seconds later (DbSandboxRecorder).
    recorded = exists().where(m.org_id == e.org_id, m.channel_id == e.channel_id,
                              m.provider_message_id == e.provider_message_id,
                              m.status.in_(RECORDED)) & (e.received_at <= clock.now())
    stale = e.received_at < clock.now() - KEEP_UNMATCHED
    # Looked at first without the write lock (SQLite's is the whole database): most passes find nothing.
    with rt.db.connect() as conn:
        ids = conn.execute(select(e.id).where(recorded).order_by(e.occurred_at, e.id).limit(limit)).scalars().all()
        any_stale = conn.execute(select(e.id).where(stale).limit(1)).first() is not None
    if not ids and not any_stale:
        return 0
    with rt.db.begin() as conn:
        rows = conn.execute(select(early_statuses).where(e.id.in_(ids), recorded).order_by(e.occurred_at, e.id)).all()
        for row in rows:
            apply_status(conn, row.org_id, row.channel_id, StatusEvent(
                provider_message_id=row.provider_message_id, status=row.status, timestamp=row.occurred_at,
                error_code=row.error_code, error_permanent=row.error_permanent, opt_out=row.opt_out,
                reference=row.reference,
            ))
        if rows:
            conn.execute(delete(early_statuses).where(e.id.in_([row.id for row in rows])))
        dropped = conn.execute(delete(early_statuses).where(stale)).rowcount if any_stale else 0
    return len(rows) + max(dropped, 0)
