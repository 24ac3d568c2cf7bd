"""Dispatch: claim due messages, send each at most once, retry or fail, sweep expired leases.

The life of a message: `pending` → (scheduler claims, with a lease) `claimed` → (a worker
re-checks everything and marks it just before the provider call) `sending` → `sent`, or back to
`pending` with a later attempt (transient failure), or `failed` (permanent), `dead` (out of
attempts), `expired` (a retry would land after it is useful). A lease that expires on a
`claimed` row hands it out again; one that expires on a `sending` row means the worker died
mid-call, so the outcome is `unknown` and it is not sent blindly again.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from datetime import time as dt_time
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection

from engine import clock, metrics
from engine.channels import default_channel
from engine.inbox import open_inbox_item
from engine.models import (
    appointments,
    channels,
    contacts,
    enrollments,
    inbound_messages,
    messages,
    orgs,
    preferences,
    reminder_rule_kinds,
    reminder_rules,
)
from engine.optout_links import OptOutTarget, make_url
from engine.orgs import policy_for
from engine.outbox import record_events, transition
from engine.pacing import MAX_WAIT as MAX_PACING_WAIT
from engine.pacing import DbPacingStore
from engine.privacy import addresses
from engine.render import TemplateError
from engine.runtime import Runtime
from engine.templates import MissingAddress, RenderedMessage, render_message
from engine.windows import earliest_allowed_after, is_allowed
from gateway import registry
from gateway.contract import Provider
from gateway.crypto import CryptoError
from gateway.errors import ProviderError
from gateway.pacing import PacingPolicy, Reservation

log = logging.getLogger(__name__)

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
LIVE_APPOINTMENT = ("scheduled", "confirmed")
#: Messages that must reach a contact even though they just opted out (the goodbye).
OPT_OUT_EXEMPT = ("optout_confirmation",)


def claim_due(rt: Runtime, *, limit: int, max_in_flight: int | None = None) -> list[int]:
    """Claim up to `limit` due messages (all orgs) with a lease; returns their ids in due order.

    `FOR UPDATE SKIP LOCKED` lets several claimers run at once on PostgreSQL without waiting on
    each other or taking the same row; SQLite serialises writers, which gives the same result.
    """
    now = clock.now()
    with rt.db.begin() as conn:
        if max_in_flight is not None:
            in_flight = conn.execute(
                select(func.count()).select_from(messages).where(messages.c.status.in_(("claimed", "sending")))
            ).scalar_one()
            limit = min(limit, max(max_in_flight - in_flight, 0))
            if limit == 0:
                return []
        due = (
            select(messages.c.id)
            .where(messages.c.status == "pending", messages.c.next_attempt_at <= now)
            .order_by(messages.c.next_attempt_at, messages.c.id)
            .limit(limit)
        )
        if conn.dialect.name == "postgresql":
            due = due.with_for_update(skip_locked=True)
        # A CTE, not `IN (subquery)`: PostgreSQL may run a LIMIT … SKIP LOCKED subquery once per
        # candidate row, and then claims far more than `limit` rows. A locking CTE runs once.
        due_cte = due.cte("due")
        rows = conn.execute(
            update(messages)
            .where(messages.c.id.in_(select(due_cte.c.id)), messages.c.status == "pending")
            .values(status="claimed", lease_until=now + rt.settings.lease, claimed_by=WORKER_ID, updated_at=now)
            .returning(messages.c.id, messages.c.org_id, messages.c.next_attempt_at)
        ).all()
        by_org: dict[int, list[int]] = defaultdict(list)
        for row in rows:
            by_org[row.org_id].append(row.id)
        for org_id, ids in by_org.items():
            record_events(conn, org_id, ids, "claimed", at=now)
    return [row.id for row in sorted(rows, key=lambda r: (r.next_attempt_at, r.id))]


def sweep_leases(rt: Runtime) -> tuple[int, int]:
    """Recover rows whose lease ran out; returns (reclaimed, unknown)."""
    now = clock.now()
    reclaimed = unknown = 0
    with rt.db.begin() as conn:
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
            if row.provider and _honours_idempotency(row.provider):
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


def _honours_idempotency(provider: str) -> bool:
    try:
        return registry.load(provider).honours_idempotency
    except registry.UnknownProvider:
        return False


#: The Meta customer-service window: free text only within this long after the patient wrote.
CONVERSATION_WINDOW = timedelta(hours=24)


@dataclass
class _Prepared:
    org_id: int
    message_id: int
    attempt: int
    channel: Any
    rendered: RenderedMessage
    provider: Provider
    send_at: datetime | None = None


def send_one(rt: Runtime, message_id: int) -> str:
    """Send one claimed message, at most once; returns what became of it (for logs and tests)."""
    prepared_or_outcome = _prepare(rt, message_id)
    if isinstance(prepared_or_outcome, str):
        return prepared_or_outcome
    prepared = prepared_or_outcome
    provider = prepared.provider
    try:
        if prepared.send_at is not None:
            # A paced channel: this worker holds the number's next slot; wait for it.
            wait = (prepared.send_at - clock.now()).total_seconds()
            if wait > 0:
                time.sleep(wait)
        result = metrics.provider_call(prepared.channel.provider, provider.send, prepared.rendered.outbound)
    except ProviderError as exc:
        if exc.outcome_unknown and not type(provider).honours_idempotency:
            return _park_unknown(rt, prepared, exc.code or "outcome_unknown", exc.reason)
        if exc.permanent:
            return _after_permanent(rt, prepared, exc)
        return _after_transient(rt, prepared, exc)
    except Exception as exc:  # a provider bug: the request may or may not have gone out
        log.error("provider raised unexpectedly", extra={"message_id": message_id, "error": type(exc).__name__})
        return _park_unknown(rt, prepared, "unexpected_error", f"provider raised {type(exc).__name__}")
    now = clock.now()
    with rt.db.begin() as conn:
        # `unknown` too: a slow call may finish after its lease was swept.
        transition(conn, prepared.org_id, message_id, ("sending", "unknown"), "sent", "sent",
                   values={"provider_message_id": result.provider_message_id, "sent_at": now,
                           "lease_until": None, "error_code": None, "error_detail": None},
                   provider_status=result.provider_status, attempt=prepared.attempt)
        metrics.lateness(conn, message_id, now, prepared.channel.kind)
    return "sent"


def _park_unknown(rt: Runtime, prepared: _Prepared, code: str, reason: str) -> str:
    """The call may or may not have delivered: never send blindly again, show the operator."""
    with rt.db.begin() as conn:
        transition(conn, prepared.org_id, prepared.message_id, ("sending",), "unknown", "unknown",
                   values={"lease_until": None, "error_code": code, "error_detail": reason[:300]},
                   attempt=prepared.attempt, detail={"code": code})
        open_inbox_item(conn, prepared.org_id, "message_unknown", f"message:{prepared.message_id}:unknown",
                        message_id=prepared.message_id, detail=f"outcome unknown: {reason[:200]}")
    return "unknown"


def _prepare(rt: Runtime, message_id: int) -> _Prepared | str:
    """Re-check a claimed message and mark it `sending`, or settle it without sending."""
    now = clock.now()
    with rt.db.begin() as conn:
        msg = conn.execute(select(messages).where(messages.c.id == message_id)).first()
        if msg is None or msg.status != "claimed":
            return "not_claimed"
        org_id = msg.org_id
        org = conn.execute(select(orgs).where(orgs.c.id == org_id)).one()
        contact = conn.execute(
            select(contacts).where(contacts.c.org_id == org_id, contacts.c.id == msg.contact_id)
        ).one()
        appointment = None
        if msg.appointment_id is not None:
            appointment = conn.execute(
                select(appointments).where(appointments.c.org_id == org_id, appointments.c.id == msg.appointment_id)
            ).one()

        def settle(status: str, event: str, reason: str, **values: Any) -> str:
            transition(conn, org_id, message_id, ("claimed",), status, event,
                       values={"lease_until": None, "skip_reason": reason, **values}, detail={"reason": reason})
            return status

        if contact.erased_at is not None:
            return settle("cancelled", "cancelled", "contact_erased")
        refusal = None if msg.purpose in OPT_OUT_EXEMPT else \
            _refusal(conn, org_id, msg.contact_id, msg.channel_kind, keyring=rt.keyring)
        if refusal is not None:
            return settle("cancelled", "cancelled", refusal)
        if appointment is not None and msg.rule_id is not None:
            trigger = conn.execute(
                select(reminder_rules.c.trigger).where(reminder_rules.c.org_id == org_id,
                                                       reminder_rules.c.id == msg.rule_id)
            ).scalar()
            if trigger != "on_cancel" and appointment.status not in LIVE_APPOINTMENT + ("completed",):
                return settle("cancelled", "cancelled", "appointment_cancelled")
            if msg.appointment_starts_at is not None and appointment.starts_at != msg.appointment_starts_at:
                # Give the key (which names the old time) up, as populate does for moved appointments.
                return settle("cancelled", "cancelled", "appointment_moved",
                              idempotency_key=f"{msg.idempotency_key}:moved:{msg.id}")
        if msg.enrollment_id is not None:
            # A follow-up whose run was stopped (opt-out, a person took over, cancelled) stays unsent.
            run_status = conn.execute(select(enrollments.c.status).where(
                enrollments.c.org_id == org_id, enrollments.c.id == msg.enrollment_id)).scalar()
            if run_status in ("cancelled", "paused_handoff"):
                return settle("cancelled", "cancelled", "enrollment_stopped")
        if msg.expires_at is not None and now >= msg.expires_at:
            return settle("expired", "expired", "expired_before_send")
        if msg.respect_window:
            policy = policy_for(org)
            if not is_allowed(policy, now):
                later = earliest_allowed_after(policy, now, msg.expires_at) if msg.expires_at else \
                    earliest_allowed_after(policy, now, now + timedelta(days=400))
                if later is None:
                    return settle("skipped", "skipped", "no_allowed_instant")
                transition(conn, org_id, message_id, ("claimed",), "pending", "deferred",
                           values={"lease_until": None, "next_attempt_at": later},
                           detail={"reason": "outside_sending_window"})
                return "deferred"

        channel = default_channel(conn, org_id, msg.channel_kind)
        if channel is None:
            broken = conn.execute(
                select(channels.c.id).where(channels.c.org_id == org_id, channels.c.kind == msg.channel_kind)
            ).first()
            if broken is None:
                return _fail_in_tx(conn, msg, "no_channel", "the org has no channel of this kind")
            # A channel exists but is broken or disabled: wait for the operator, like a transient error.
            return _retry_or_give_up(conn, rt, msg, msg.attempts + 1, "channel_unavailable", None, now)
        optout_url = None
        if msg.channel_kind == "email":
            optout_url = make_url(rt.keyring, rt.settings.public_url,
                                  OptOutTarget(org_id=org_id, contact_id=contact.id, kind="email"))
        try:
            rendered = render_message(conn, org=org, contact=contact, appointment=appointment, message=msg,
                                      conversation_open=conversation_open(conn, org_id, channel.id, contact.id, now),
                                      optout_url=optout_url)
        except TemplateError as exc:
            return _fail_in_tx(conn, msg, "template_error", str(exc))
        except MissingAddress:
            return _fail_in_tx(conn, msg, "no_address", "the contact has no address for this channel")
        try:
            # Built (and cached) before any slot is reserved: a cold start must not sit between
            # the reserved instant and the moment on the wire.
            provider = rt.providers.get(channel)
        except (CryptoError, registry.UnknownProvider):
            return _retry_or_give_up(conn, rt, msg, msg.attempts + 1, "channel_misconfigured", None, now)
        # Reserve the number's slot last, right before the row is marked sending, so the
        # reserved instant and the moment on the wire stay close.
        send_at = None
        policy = PacingPolicy.from_channel(channel.min_interval_ms, channel.daily_cap)
        if policy is not None:
            reservation = _reserve_slot(conn, org, channel, policy, now)
            if reservation.over_cap or reservation.at - now > MAX_PACING_WAIT:
                reason = "daily_cap" if reservation.over_cap else "pacing"
                transition(conn, org_id, message_id, ("claimed",), "pending", "deferred",
                           values={"lease_until": None, "next_attempt_at": reservation.at},
                           detail={"reason": reason})
                return "deferred"
            send_at = reservation.at
        attempt = msg.attempts + 1
        moved = transition(conn, org_id, message_id, ("claimed",), "sending", "sending",
                           values={"attempts": attempt, "channel_id": channel.id,
                                   "lease_until": (send_at or now) + rt.settings.lease, "claimed_by": WORKER_ID,
                                   "subject": rendered.outbound.subject, "body": rendered.outbound.text},
                           attempt=attempt, detail={"slot": send_at.isoformat()} if send_at else None)
        if not moved:
            return "not_claimed"
    return _Prepared(org_id=org_id, message_id=message_id, attempt=attempt, channel=channel, rendered=rendered,
                     provider=provider, send_at=send_at)


def _reserve_slot(conn: Connection, org: Any, channel: Any, policy: PacingPolicy, now: datetime) -> Reservation:
    """The channel's next send slot; days (for the daily cap) are the org's local days."""
    tz = ZoneInfo(org.timezone)
    today = now.astimezone(tz).date()
    next_day = datetime.combine(today + timedelta(days=1), dt_time(0), tzinfo=tz).astimezone(timezone.utc)
    return DbPacingStore(conn, org.id).reserve(channel.id, policy, now, today.isoformat(), next_day)


def conversation_open(conn: Connection, org_id: int, channel_id: int, contact_id: int, now: datetime) -> bool:
    """Whether the patient wrote on this channel within the last 24 hours."""
    last = conn.execute(
        select(func.max(inbound_messages.c.received_at)).where(
            inbound_messages.c.org_id == org_id, inbound_messages.c.channel_id == channel_id,
            inbound_messages.c.contact_id == contact_id)
    ).scalar()
    return last is not None and now - last < CONVERSATION_WINDOW


def _consented(conn: Connection, org_id: int, contact_id: int, kind: str) -> bool:
    return _refusal(conn, org_id, contact_id, kind) is None


def _refusal(conn: Connection, org_id: int, contact_id: int, kind: str, *, keyring: Any = None) -> str | None:
    """Why the contact may not get a message of `kind`: no consent or their own opt-out
    (`opted_out`), or a refusal of one of their addresses by whichever contact carried it
    (`address_opted_out`, engine/privacy/addresses.py); None when it may go."""
    row = conn.execute(
        select(preferences.c.opted_in, preferences.c.opted_out_at).where(
            preferences.c.org_id == org_id, preferences.c.contact_id == contact_id, preferences.c.kind == kind
        )
    ).first()
    if not (row and row.opted_in and row.opted_out_at is None):
        return "opted_out"
    if kind in addresses.contact_refused_kinds(conn, org_id, contact_id, keyring=keyring):
        return "address_opted_out"
    return None


def _fail_in_tx(conn: Connection, msg: Any, code: str, detail: str) -> str:
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


def _retry_or_give_up(
    conn: Connection, rt: Runtime, msg: Any, attempt: int, code: str | None, retry_after: float | None,
    now: datetime, from_status: str = "claimed",
) -> str:
    """After a transient failure: next attempt on the backoff schedule, or expired, or dead."""
    delays = rt.settings.retry_delays
    base = {"lease_until": None, "error_code": code, "attempts": attempt}
    if attempt > len(delays):
        transition(conn, msg.org_id, msg.id, (from_status,), "dead", "dead",
                   values={**base, "failed_at": now}, detail={"code": code}, attempt=attempt)
        open_inbox_item(conn, msg.org_id, "message_dead", f"message:{msg.id}:dead", message_id=msg.id,
                        detail=f"gave up after {attempt} attempts (last error: {code})")
        return "dead"
    delay = delays[attempt - 1]
    if retry_after:
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


def _after_transient(rt: Runtime, prepared: _Prepared, exc: ProviderError) -> str:
    now = clock.now()
    with rt.db.begin() as conn:
        msg = conn.execute(select(messages).where(messages.c.org_id == prepared.org_id,
                                                  messages.c.id == prepared.message_id)).one()
        if msg.status != "sending":
            return msg.status
        _maybe_break_channel(conn, prepared, exc)
        return _retry_or_give_up(conn, rt, msg, prepared.attempt, exc.code or "transient", exc.retry_after, now,
                                 from_status="sending")


def _after_permanent(rt: Runtime, prepared: _Prepared, exc: ProviderError) -> str:
    now = clock.now()
    with rt.db.begin() as conn:
        msg = conn.execute(select(messages).where(messages.c.org_id == prepared.org_id,
                                                  messages.c.id == prepared.message_id)).one()
        moved = transition(conn, prepared.org_id, prepared.message_id, ("sending",), "failed", "failed",
                           values={"lease_until": None, "error_code": exc.code or "permanent",
                                   "error_detail": exc.reason[:300], "failed_at": now},
                           detail={"code": exc.code}, attempt=prepared.attempt)
        if not moved:
            return msg.status
        _maybe_break_channel(conn, prepared, exc)
        if exc.opt_out:
            from engine.contacts import opt_out

            opt_out(conn, prepared.org_id, msg.contact_id, kinds=(msg.channel_kind,),
                    source="provider", evidence=f"provider error {exc.code}")
        else:
            _report_failure(conn, prepared.org_id, prepared.message_id, exc.code or "permanent")
            _fallback(conn, msg)
    return "failed"


def _maybe_break_channel(conn: Connection, prepared: _Prepared, exc: ProviderError) -> None:
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
    from engine.outbox import enqueue
    from engine.populate import plan_new

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
        if not has_address or not _consented(conn, msg.org_id, msg.contact_id, kind):
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
