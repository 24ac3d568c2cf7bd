"""Populate the reminder queue from appointments × active rules (SPEC §4).

One pass, per org, in one transaction:
1. cancel open reminders whose appointment was cancelled or moved (their key names the old time);
2. insert, set-based, one `new` message per appointment × active rule for the first channel kind
   the contact consented to and the org has a working channel for — `INSERT … SELECT … ON
   CONFLICT DO NOTHING` on `appointment:rule:kind:starts_at`, so running twice, or on two
   processes at once, creates nothing twice;
3. plan every `new` message: compute its nominal time in the appointment's timezone and place it
   inside the org's sending window, or skip it with a reason the admin shows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    String,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    not_,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.engine import Connection

from engine import clock
from engine.db import Database
from engine.dialect import epoch_seconds, insert_ignore
from engine.models import (
    OPEN_STATUSES,
    appointments,
    channels,
    contacts,
    messages,
    orgs,
    preferences,
    reminder_rule_kinds,
    reminder_rules,
)
from engine.orgs import policy_for
from engine.outbox import cancel_open, record_events, transition_where
from engine.privacy.addresses import refused_clause
from engine.windows import nominal_due, place

log = logging.getLogger(__name__)

#: How far back populate looks for appointments that never got their reminders, so that an
#: appointment booked too late (or in the past) shows a skipped reminder with its reason.
LOOKBACK = timedelta(days=1)
#: After-start messages (a follow-up after the session) may still go out this long after due.
AFTER_START_VALIDITY = timedelta(days=1)
PLAN_BATCH = 2000
LIVE_STATUSES = ("scheduled", "confirmed")


@dataclass
class PopulateResult:
    """What one pass did, summed over orgs."""

    cancelled: int = 0
    created: int = 0
    planned: int = 0
    skipped: int = 0

    def add(self, other: "PopulateResult") -> None:
        self.cancelled += other.cancelled
        self.created += other.created
        self.planned += other.planned
        self.skipped += other.skipped


def populate(
    db: Database,
    *,
    horizon: timedelta,
    org_id: int | None = None,
    appointment_id: int | None = None,
) -> PopulateResult:
    """Run one populate pass for every org, or one org, or one appointment of one org."""
    total = PopulateResult()
    with db.connect() as conn:
        query = select(orgs.c.id).order_by(orgs.c.id)
        if org_id is not None:
            query = query.where(orgs.c.id == org_id)
        org_ids = [row.id for row in conn.execute(query)]
    for oid in org_ids:
        with db.begin() as conn:
            result = populate_org(conn, oid, horizon=horizon, appointment_id=appointment_id)
        total.add(result)
    if total.created or total.cancelled:
        log.info("populate", extra={"created": total.created, "cancelled": total.cancelled,
                                    "planned": total.planned, "skipped": total.skipped})
    return total


def populate_org(
    conn: Connection, org_id: int, *, horizon: timedelta, appointment_id: int | None = None
) -> PopulateResult:
    """One org's populate pass inside the caller's transaction."""
    now = clock.now()
    result = PopulateResult()
    result.cancelled = _cancel_stale(conn, org_id, appointment_id)
    result.created = _insert_reminders(conn, org_id, now, horizon, appointment_id)
    planned, skipped = plan_new(conn, org_id)
    result.planned, result.skipped = planned, skipped
    return result


def _cancel_stale(conn: Connection, org_id: int, appointment_id: int | None) -> int:
    """Cancel open reminders of cancelled/finished appointments and of the old time of moved ones."""
    a = appointments
    rule_is_cancel_notice = exists().where(
        reminder_rules.c.id == messages.c.rule_id,
        reminder_rules.c.org_id == org_id,
        reminder_rules.c.trigger == "on_cancel",
    )
    moved = exists().where(
        a.c.id == messages.c.appointment_id,
        a.c.org_id == org_id,
        a.c.starts_at != messages.c.appointment_starts_at,
    )
    ended = exists().where(
        a.c.id == messages.c.appointment_id,
        a.c.org_id == org_id,
        a.c.status.not_in(LIVE_STATUSES),
        not_(rule_is_cancel_notice),
    )
    base = and_(messages.c.appointment_id.is_not(None), messages.c.rule_id.is_not(None))
    if appointment_id is not None:
        base = and_(base, messages.c.appointment_id == appointment_id)
    # A moved appointment's reminders name its old time in their key; the cancelled row gives that
    # key up, so that moving the appointment back to that time gets reminders again.
    cancelled = transition_where(
        conn, org_id, and_(base, moved), OPEN_STATUSES, "cancelled", "cancelled",
        values={"skip_reason": "appointment_changed", "lease_until": None,
                "idempotency_key": messages.c.idempotency_key + literal(":moved:") + cast(messages.c.id, String)},
        detail={"reason": "appointment_changed"},
    )
    cancelled += cancel_open(conn, org_id, and_(base, ended), "appointment_changed")
    return len(cancelled)


def _insert_reminders(
    conn: Connection, org_id: int, now: datetime, horizon: timedelta, appointment_id: int | None
) -> int:
    """The set-based insert of every missing reminder of the org (or of one appointment)."""
    a, r, rk, c, p = appointments, reminder_rules, reminder_rule_kinds, contacts, preferences
    has_channel = exists().where(
        channels.c.org_id == org_id, channels.c.kind == rk.c.kind, channels.c.status == "active"
    )
    has_address = case((rk.c.kind == "email", c.c.email.is_not(None)), else_=c.c.phone.is_not(None))
    recent = now - LOOKBACK
    trigger_applies = or_(
        and_(r.c.trigger == "before_start", a.c.status.in_(LIVE_STATUSES),
             a.c.starts_at > recent, a.c.starts_at <= now + horizon),
        and_(r.c.trigger == "after_start", a.c.status.in_(("scheduled", "confirmed", "completed")),
             a.c.starts_at > recent - timedelta(minutes=0), a.c.starts_at <= now + horizon),
        and_(r.c.trigger == "on_create", a.c.status.in_(LIVE_STATUSES),
             a.c.created_at > recent, a.c.starts_at > now),
        and_(r.c.trigger == "on_cancel", a.c.status == "cancelled", a.c.cancelled_at > recent,
             a.c.starts_at > now, or_(a.c.cancel_source.is_(None), a.c.cancel_source != "patient")),
    )
    ranked = (
        select(
            a.c.id.label("appointment_id"),
            a.c.contact_id,
            a.c.starts_at,
            r.c.id.label("rule_id"),
            r.c.purpose,
            r.c.template_key,
            r.c.respect_window,
            rk.c.kind,
            func.row_number().over(partition_by=(a.c.id, r.c.id), order_by=rk.c.position).label("pref"),
        )
        .select_from(
            a.join(c, and_(c.c.id == a.c.contact_id, c.c.org_id == org_id))
            .join(r, r.c.org_id == org_id)
            .join(rk, and_(rk.c.rule_id == r.c.id, rk.c.org_id == org_id))
            .join(p, and_(p.c.org_id == org_id, p.c.contact_id == c.c.id, p.c.kind == rk.c.kind))
        )
        .where(
            a.c.org_id == org_id,
            r.c.active == true(),
            c.c.erased_at.is_(None),
            p.c.opted_in == true(),
            p.c.opted_out_at.is_(None),
            # The kind's refusal follows the address, whichever contact row carries it.
            not_(refused_clause(org_id, rk.c.kind, c.c.phone, c.c.email)),
            has_address,
            has_channel,
            trigger_applies,
        )
    )
    if appointment_id is not None:
        ranked = ranked.where(a.c.id == appointment_id)
    ranked_sq = ranked.subquery("ranked")
    key = (
        literal("appointment:") + cast(ranked_sq.c.appointment_id, String) + literal(":")
        + cast(ranked_sq.c.rule_id, String) + literal(":") + ranked_sq.c.kind + literal(":")
        + cast(epoch_seconds(ranked_sq.c.starts_at), String)
    )
    chosen = select(
        literal(org_id).label("org_id"),
        ranked_sq.c.purpose,
        ranked_sq.c.contact_id,
        ranked_sq.c.kind.label("channel_kind"),
        ranked_sq.c.appointment_id,
        ranked_sq.c.starts_at.label("appointment_starts_at"),
        ranked_sq.c.rule_id,
        ranked_sq.c.template_key,
        ranked_sq.c.respect_window,
        key.label("idempotency_key"),
        literal("new").label("status"),
        literal(0).label("attempts"),
        literal(now, type_=messages.c.created_at.type).label("created_at"),
        literal(now, type_=messages.c.updated_at.type).label("updated_at"),
    ).where(ranked_sq.c.pref == 1)
    names = [
        "org_id", "purpose", "contact_id", "channel_kind", "appointment_id", "appointment_starts_at",
        "rule_id", "template_key", "respect_window", "idempotency_key", "status", "attempts",
        "created_at", "updated_at",
    ]
    stmt = insert_ignore(conn, messages, ("org_id", "idempotency_key")).from_select(names, chosen)
    return len(conn.execute(stmt.returning(messages.c.id)).all())


def plan_new(conn: Connection, org_id: int) -> tuple[int, int]:
    """Place every `new` message of the org in its sending window; returns (planned, skipped)."""
    org = conn.execute(select(orgs).where(orgs.c.id == org_id)).one()
    policy = policy_for(org)
    planned = skipped = 0
    last_id = 0
    while True:
        query = (
            select(
                messages.c.id, messages.c.created_at, messages.c.nominal_due_at, messages.c.expires_at,
                messages.c.respect_window, messages.c.appointment_starts_at,
                reminder_rules.c.trigger, reminder_rules.c.offset_minutes,
                appointments.c.timezone, appointments.c.cancelled_at,
            )
            .select_from(
                messages.outerjoin(reminder_rules, and_(reminder_rules.c.id == messages.c.rule_id,
                                                        reminder_rules.c.org_id == org_id))
                .outerjoin(appointments, and_(appointments.c.id == messages.c.appointment_id,
                                              appointments.c.org_id == org_id))
            )
            .where(messages.c.org_id == org_id, messages.c.status == "new", messages.c.id > last_id)
            .order_by(messages.c.id)
            .limit(PLAN_BATCH)
        )
        if conn.dialect.name == "postgresql":
            query = query.with_for_update(of=messages, skip_locked=True)
        rows = conn.execute(query).all()
        if not rows:
            return planned, skipped
        last_id = rows[-1].id
        placed: list[dict[str, Any]] = []
        skips: list[dict[str, Any]] = []
        for row in rows:
            nominal, deadline = nominal_and_deadline(row, policy.timezone)
            if row.respect_window:
                placement = place(policy, nominal, row.created_at, deadline)
                due, reason = placement.due_at, placement.skip_reason
            elif deadline is not None and nominal >= deadline:
                due, reason = None, "too_late"
            else:
                due, reason = max(nominal, row.created_at), None
            if due is None:
                skips.append({"mid": row.id, "nominal": nominal, "expires": deadline, "reason": reason})
            else:
                placed.append({"mid": row.id, "nominal": nominal, "due": due, "expires": deadline})
        now = clock.now()
        if placed:
            conn.execute(
                update(messages)
                .where(messages.c.id == _bind("mid"), messages.c.status == "new")
                .values(status="pending", nominal_due_at=_bind("nominal", messages.c.nominal_due_at),
                        due_at=_bind("due", messages.c.due_at), next_attempt_at=_bind("due", messages.c.due_at),
                        expires_at=_bind("expires", messages.c.expires_at), updated_at=now),
                placed,
            )
            record_events(conn, org_id, [p["mid"] for p in placed], "queued", at=now)
        if skips:
            conn.execute(
                update(messages)
                .where(messages.c.id == _bind("mid"), messages.c.status == "new")
                .values(status="skipped", nominal_due_at=_bind("nominal", messages.c.nominal_due_at),
                        expires_at=_bind("expires", messages.c.expires_at),
                        skip_reason=_bind("reason"), updated_at=now),
                skips,
            )
            for s in skips:
                record_events(conn, org_id, [s["mid"]], "skipped", detail={"reason": s["reason"]}, at=now)
        planned += len(placed)
        skipped += len(skips)


def _bind(name: str, column: Any = None) -> Any:
    """A named parameter for executemany, typed like `column` so datetimes are converted."""
    return bindparam(name, type_=column.type if column is not None else None)


def nominal_and_deadline(row: Any, org_timezone: str) -> tuple[datetime, datetime | None]:
    """When a message is meant to go, and after when it is useless (shared with engine/replan.py).

    `row` carries the message's `appointment_starts_at`, `created_at`, `nominal_due_at` and
    `expires_at`, its rule's `trigger` and `offset_minutes`, and its appointment's `timezone`.
    """
    starts = row.appointment_starts_at
    tz = row.timezone or org_timezone
    trigger = row.trigger
    # A row queued with its own later nominal time is a fallback to the rule's next channel kind,
    # queued when the first kind failed (maybe after retries or a deferral): it is meant for then,
    # not for the rule's original time (which would make it "too late" at once).
    queued_for = row.nominal_due_at
    if trigger == "before_start" and starts is not None:
        nominal = nominal_due(starts, row.offset_minutes, tz)
        if queued_for is not None and queued_for > nominal:
            nominal = queued_for
        return nominal, starts
    if trigger == "after_start" and starts is not None:
        nominal = nominal_due(starts, -row.offset_minutes, tz)
        deadline = nominal + AFTER_START_VALIDITY
        if queued_for is not None and queued_for > nominal:
            nominal = queued_for
        return nominal, deadline
    if trigger in ("on_create", "on_cancel") and starts is not None:
        return row.created_at, starts
    nominal = row.nominal_due_at or row.created_at
    return nominal, row.expires_at


#: Horizon used when an appointment change re-populates at once (the scheduler passes its own).
DEFAULT_HORIZON = timedelta(days=8)


def refresh_appointment(conn: Connection, org_id: int, appointment_id: int,
                        horizon: timedelta = DEFAULT_HORIZON) -> PopulateResult:
    """Re-populate one appointment inside the caller's transaction, right after it changed."""
    return populate_org(conn, org_id, horizon=horizon, appointment_id=appointment_id)
