"""After the provider call (or instead of it): settle a message as sent, retried, failed, dead,
expired, unknown or reclaimed, each a compare-and-set with its event.

Successes are the common case and are settled together, a wave of calls at a time, in the
statement that marks the next wave `sending` (engine/messaging/dispatch/waves.py); failures are rare and
each is settled on its own here, so one that goes wrong never holds the others back.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.tenants.channels import default_channel
from engine.queue.inbox import open_inbox_item
from engine.queue.address_optouts import MARKETING_OPTED_OUT, block_marketing
from engine.store.models import channels, contacts, messages, reminder_rule_kinds
from engine.queue.outbox import transition, transition_where
from engine.store.runtime import Runtime
from engine.queue import recipient_pacing
from gateway.errors import ProviderError, RateLimited

if TYPE_CHECKING:
    from engine.messaging.dispatch.ready import Prepared


def park_unknown(rt: Runtime, prepared: "Prepared", code: str, reason: str) -> str:
    """The call may or may not have delivered: never send blindly again, show the operator."""
    with rt.db.begin() as conn:
        transition(conn, prepared.org_id, prepared.message_id, ("sending",), "unknown", "unknown",
                   values={"lease_until": None, "error_code": code, "error_detail": reason[:300]},
                   attempt=prepared.attempt, detail={"code": code})
        open_inbox_item(conn, prepared.org_id, "message_unknown", f"message:{prepared.message_id}:unknown",
                        message_id=prepared.message_id, detail=f"outcome unknown: {reason[:200]}")
    return "unknown"


def after_lease_ran_out(rt: Runtime, prepared: "Prepared") -> str:
    """Too little of the lease was left for the provider call, so it was not made: the message goes
    back to `pending` at once and the attempt does not count. A row the sweep already took stays
    the sweep's: as `unknown` an operator may already have acted on it."""
    now = clock.now()
    with rt.db.begin() as conn:
        moved = transition_where(
            conn, prepared.org_id, and_(messages.c.id == prepared.message_id, messages.c.attempts == prepared.attempt),
            ("sending",), "pending", "reclaimed",
            values={"lease_until": None, "claimed_by": None, "next_attempt_at": now,
                    "attempts": prepared.attempt - 1, "error_code": "lease_expired_before_call"},
            detail={"reason": "lease_expired_before_call"}, attempt=prepared.attempt)
    return "reclaimed" if moved else "not_claimed"


def after_transient(rt: Runtime, prepared: "Prepared", exc: ProviderError) -> str:
    """A failure worth another attempt: back to `pending` on the backoff schedule (or given up)."""
    now = clock.now()
    with rt.db.begin() as conn:
        msg = _message(conn, prepared)
        if msg.status != "sending":
            return msg.status
        _maybe_break_channel(conn, prepared, exc)
        wait = None
        if isinstance(exc, RateLimited):
            # Refused for its rate, not its content: slow the recipient (or the whole number) down
            # for every worker, and try this message again when the provider said, not on the
            # backoff schedule (which starts at minutes).
            wait = timedelta(seconds=exc.retry_after or 0)
            if exc.scope == "channel":
                recipient_pacing.pause_channel(conn, prepared.org_id, prepared.channel.id, now + wait)
            else:
                recipient_pacing.push_back(conn, recipient_pacing.RecipientHasher(rt.keyring), prepared.org_id,
                                           prepared.channel.id, prepared.rendered.outbound.to, now + wait)
        return retry_or_give_up(conn, rt, msg, prepared.attempt, exc.code or "transient", exc.retry_after, now,
                                from_status="sending", wait=wait)


def after_permanent(rt: Runtime, prepared: "Prepared", exc: ProviderError) -> str:
    """A refusal that will not mend itself: `failed`, the operator told, the next channel tried."""
    now = clock.now()
    with rt.db.begin() as conn:
        msg = _message(conn, prepared)
        moved = transition(conn, prepared.org_id, prepared.message_id, ("sending",), "failed", "failed",
                           values={"lease_until": None, "error_code": exc.code or "permanent",
                                   "error_detail": exc.reason[:300], "failed_at": now},
                           detail={"code": exc.code}, attempt=prepared.attempt)
        if not moved:
            return msg.status
        _maybe_break_channel(conn, prepared, exc)
        if exc.code == MARKETING_OPTED_OUT:
            # Meta's 131050: marketing only; the person's utility reminders still go.
            block_marketing(conn, prepared.org_id, msg.contact_id)
        elif exc.opt_out:
            from engine.people.contacts import opt_out

            opt_out(conn, prepared.org_id, msg.contact_id, kinds=(msg.channel_kind,),
                    source="provider", evidence=f"provider error {exc.code}")
        else:
            _report_failure(conn, prepared.org_id, prepared.message_id, exc.code or "permanent")
            _fallback(conn, msg)
    return "failed"


def _message(conn: Connection, prepared: "Prepared") -> Any:
    return conn.execute(select(messages).where(messages.c.org_id == prepared.org_id,
                                               messages.c.id == prepared.message_id)).one()


def fail_in_tx(conn: Connection, msg: Any, code: str, detail: str) -> str:
    """A claimed message that cannot be sent at all (no channel, no address, a broken template)."""
    transition(conn, msg.org_id, msg.id, ("claimed",), "failed", "failed",
               values={"lease_until": None, "error_code": code, "error_detail": detail[:300],
                       "failed_at": clock.now()},
               detail={"code": code})
    _report_failure(conn, msg.org_id, msg.id, code)
    _fallback(conn, msg)
    return "failed"


def _report_failure(conn: Connection, org_id: int, message_id: int, code: str | None) -> None:
    """A message that failed for good is in Pendências: a wrong number or a template the
    provider refuses does not mend itself, and without a person the patient is never told."""
    open_inbox_item(conn, org_id, "message_failed", f"message:{message_id}:failed", message_id=message_id,
                    detail=code or "permanent")


def retry_or_give_up(
    conn: Connection, rt: Runtime, msg: Any, attempt: int, code: str | None, retry_after: float | None,
    now: datetime, from_status: str = "claimed", wait: timedelta | None = None,
) -> str:
    """After a transient failure: next attempt on the backoff schedule (or after `wait`, when the
    provider said how long), or expired, or dead."""
    delays = rt.settings.retry_delays
    base = {"lease_until": None, "error_code": code, "attempts": attempt}
    if attempt > len(delays):
        transition(conn, msg.org_id, msg.id, (from_status,), "dead", "dead",
                   values={**base, "failed_at": now}, detail={"code": code}, attempt=attempt)
        open_inbox_item(conn, msg.org_id, "message_dead", f"message:{msg.id}:dead", message_id=msg.id,
                        detail=f"gave up after {attempt} attempts (last error: {code})")
        return "dead"
    delay = delays[attempt - 1]
    if wait is not None:
        delay = wait
    elif retry_after:
        delay = max(delay, timedelta(seconds=retry_after))
    next_at = now + delay
    if msg.expires_at is not None and next_at >= msg.expires_at:
        transition(conn, msg.org_id, msg.id, (from_status,), "expired", "expired",
                   values={**base, "skip_reason": "retry_after_expiry"}, detail={"code": code}, attempt=attempt)
        return "expired"
    transition(conn, msg.org_id, msg.id, (from_status,), "pending", "retried",
               values={**base, "next_attempt_at": next_at},
               detail={"code": code, "delay_s": int(delay.total_seconds())}, attempt=attempt)
    return "retried"


def _maybe_break_channel(conn: Connection, prepared: "Prepared", exc: ProviderError) -> None:
    if not exc.channel_broken:
        return
    conn.execute(
        update(channels).where(channels.c.org_id == prepared.org_id, channels.c.id == prepared.channel.id)
        .values(status="broken", status_detail=(exc.code or "broken")[:100], updated_at=clock.now())
    )
    open_inbox_item(conn, prepared.org_id, "channel_broken", f"channel:{prepared.channel.id}:broken",
                    channel_id=prepared.channel.id, detail=f"channel stopped working ({exc.code})")


def _fallback(conn: Connection, msg: Any) -> int | None:
    """After a permanent failure of a rule's message, queue the rule's next usable channel kind."""
    if msg.rule_id is None or msg.appointment_id is None or msg.appointment_starts_at is None:
        return None
    from engine.messaging.dispatch.batch import refusal
    from engine.queue.outbox import enqueue
    from engine.reminders.populate import plan_new

    kinds = conn.execute(
        select(reminder_rule_kinds.c.kind).where(reminder_rule_kinds.c.org_id == msg.org_id,
                                                 reminder_rule_kinds.c.rule_id == msg.rule_id)
        .order_by(reminder_rule_kinds.c.position)
    ).scalars().all()
    if msg.channel_kind not in kinds:
        return None
    contact = conn.execute(select(contacts).where(contacts.c.org_id == msg.org_id,
                                                  contacts.c.id == msg.contact_id)).one()
    for kind in kinds[kinds.index(msg.channel_kind) + 1:]:
        has_address = contact.email if kind == "email" else contact.phone
        if not has_address or refusal(conn, msg.org_id, msg.contact_id, kind) is not None:
            continue
        if default_channel(conn, msg.org_id, kind) is None:
            continue
        epoch = int(msg.appointment_starts_at.timestamp())
        new_id = enqueue(
            conn, org_id=msg.org_id, contact_id=msg.contact_id, channel_kind=kind, purpose=msg.purpose,
            idempotency_key=f"appointment:{msg.appointment_id}:{msg.rule_id}:{kind}:{epoch}",
            template_key=msg.template_key, appointment_id=msg.appointment_id,
            appointment_starts_at=msg.appointment_starts_at, rule_id=msg.rule_id,
            respect_window=msg.respect_window,
        )
        if new_id is not None:
            plan_new(conn, msg.org_id)
        return new_id
    return None
