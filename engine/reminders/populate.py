"""Populate the reminder queue from appointments × active rules (SPEC §4).

One pass, per org, in one transaction:
1. cancel open reminders whose appointment was cancelled or moved (their key names the old time);
2. insert, set-based, one `new` message per appointment × active rule for the first channel kind
   the contact consented to and the org has a working channel for — `INSERT … SELECT … ON
   CONFLICT DO NOTHING` on `appointment:rule:kind:starts_at`, so running twice, or on two
   processes at once, creates nothing twice;
3. plan every `new` message: compute its nominal time in the appointment's timezone and place it
   inside the org's sending window, or skip it with a reason the admin shows.

Each reminder is written once. A reminder's plan (nominal time, due time, deadline, or its skip
reason) depends only on its rule, its appointment's start and timezone, the org's window and the
pass's instant, so the pass first plans every distinct (rule, start, timezone) of the candidates in
Python — the very same `nominal_and_deadline` + `windows.place` — and the INSERT joins that plan:
rows are inserted `pending` or `skipped` with their times and their event, in the same statement
on PostgreSQL. Only a row the plan does not cover (none today) is inserted `new` and planned
afterwards by `plan_new`, which applies its decisions set-based.

`populate` is the full pass (every upcoming appointment). `populate_changed` is the scheduler's
periodic pass: only appointments (or their contacts and consents) changed since an instant, those
that entered the horizon since then, and a full pass of any org whose rules, channels or window
changed since then. The scheduler still runs a full pass now and then as a safety net.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import lru_cache
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
    insert,
    literal,
    not_,
    or_,
    select,
    true,
    union,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from engine.core import clock, metrics
from engine.store.db import Database
from engine.store.dialect import epoch_seconds, insert_ignore, planner_setting
from engine.store.models import (
    OPEN_STATUSES,
    appointments,
    channels,
    contacts,
    message_events,
    messages,
    orgs,
    preferences,
    reminder_rule_kinds,
    reminder_rules,
)
from engine.queue.outbox import cancel_open, record_events, transition_where
from engine.reminders.populate_plan import (  # noqa: F401 - re-exported (engine/reminders/replan.py)
    AFTER_START_VALIDITY,
    PlanCache,
    apply_decisions,
    decide,
    nominal_and_deadline,
    placement,
    plan_source,
)
from engine.queue.address_optouts import refused_clause
from engine.reminders.windows import WindowPolicy, policy_for

log = logging.getLogger(__name__)

#: How far back populate looks for appointments that never got their reminders, so that an
#: appointment booked too late (or in the past) shows a skipped reminder with its reason.
LOOKBACK = timedelta(days=1)
PLAN_BATCH = 2000
LIVE_STATUSES = ("scheduled", "confirmed")
#: Orgs populated at the same time, each on its own connection (PostgreSQL; SQLite has one writer).
PARALLEL_ORGS = 2
#: Up to this many changed appointments, the periodic pass names them in its cancel statement.
CHANGED_IDS_MAX = 5000


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
    with db.connect() as conn:
        query = select(orgs.c.id).order_by(orgs.c.id)
        if org_id is not None:
            query = query.where(orgs.c.id == org_id)
        org_ids = [row.id for row in conn.execute(query)]
    return _run_orgs(db, {oid: None for oid in org_ids}, horizon=horizon, appointment_id=appointment_id)


def populate_changed(db: Database, *, horizon: timedelta, since: datetime) -> PopulateResult:
    """The periodic pass: what changed since `since` (pass an instant somewhat before the previous
    pass started: a transaction that wrote before that pass but committed after it is seen again).

    Per org: a full pass if one of its rules, channels or its window settings changed since then;
    otherwise only the appointments created or changed since then, those whose contact or consent
    changed, and those that entered the horizon (start after `since + horizon`)."""
    with db.connect() as conn:
        org_rows = conn.execute(select(orgs.c.id, orgs.c.updated_at).order_by(orgs.c.id)).all()
        rules_changed = set(conn.execute(select(reminder_rules.c.org_id).distinct()
                                         .where(reminder_rules.c.updated_at >= since)).scalars())
        channels_changed = set(conn.execute(select(channels.c.org_id).distinct()
                                            .where(channels.c.updated_at >= since)).scalars())
    scopes: dict[int, datetime | None] = {}
    for row in org_rows:
        full = row.updated_at >= since or row.id in rules_changed or row.id in channels_changed
        scopes[row.id] = None if full else since
    return _run_orgs(db, scopes, horizon=horizon)


def _run_orgs(db: Database, scopes: dict[int, datetime | None], *, horizon: timedelta,
              appointment_id: int | None = None) -> PopulateResult:
    """Populate each org (one transaction each; up to PARALLEL_ORGS at a time on PostgreSQL)."""
    total = PopulateResult()
    now = clock.now()
    cache: PlanCache = {}

    def one(oid: int) -> PopulateResult:
        with db.begin() as conn:
            return populate_org(conn, oid, horizon=horizon, appointment_id=appointment_id,
                                changed_since=scopes[oid], now=now, cache=cache)

    if db.is_sqlite or len(scopes) < 2 or PARALLEL_ORGS < 2:
        for oid in scopes:
            total.add(one(oid))
    else:
        with ThreadPoolExecutor(max_workers=PARALLEL_ORGS, thread_name_prefix="populate") as pool:
            for result in pool.map(one, list(scopes)):
                total.add(result)
    if total.created or total.cancelled:
        log.info("populate", extra={"created": total.created, "cancelled": total.cancelled,
                                    "planned": total.planned, "skipped": total.skipped})
    return total


def populate_org(
    conn: Connection, org_id: int, *, horizon: timedelta, appointment_id: int | None = None,
    changed_since: datetime | None = None, now: datetime | None = None, cache: PlanCache | None = None,
) -> PopulateResult:
    """One org's populate pass inside the caller's transaction (only what changed since
    `changed_since`, when given: see `populate_changed`)."""
    now = now or clock.now()
    org = conn.execute(select(orgs).where(orgs.c.id == org_id)).one()
    policy = policy_for(org)
    result = PopulateResult()
    result.cancelled = _cancel_stale(conn, org_id, appointment_id, changed_since)
    created, planned, skipped = _insert_reminders(conn, org_id, now, horizon, appointment_id,
                                                  changed_since=changed_since, policy=policy,
                                                  cache={} if cache is None else cache)
    more_planned, more_skipped = plan_new(conn, org_id, policy=policy)
    result.created = created
    result.planned, result.skipped = planned + more_planned, skipped + more_skipped
    return result


def _cancel_stale(conn: Connection, org_id: int, appointment_id: int | None,
                  changed_since: datetime | None = None) -> int:
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
    if changed_since is not None:
        # Only an appointment's own change (moved, cancelled, finished) makes its reminders stale.
        # The ids first: usually few, and then the messages are found through their index.
        changed = conn.execute(select(a.c.id).where(a.c.org_id == org_id, a.c.updated_at >= changed_since)
                               .limit(CHANGED_IDS_MAX + 1)).scalars().all()
        if not changed:
            return 0
        if len(changed) <= CHANGED_IDS_MAX:
            base = and_(base, messages.c.appointment_id.in_(changed))
        else:
            alias = appointments.alias("changed_appointment")
            base = and_(base, messages.c.appointment_id.in_(
                select(alias.c.id).where(alias.c.org_id == org_id, alias.c.updated_at >= changed_since)))
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
    conn: Connection, org_id: int, now: datetime, horizon: timedelta, appointment_id: int | None,
    *, changed_since: datetime | None = None, policy: WindowPolicy, cache: PlanCache,
) -> tuple[int, int, int]:
    """The set-based insert of every missing reminder of the org (or of one appointment, or of
    what changed since `changed_since`), planned as it is written; returns (created, planned,
    skipped): `created` counts every row written, planned or skipped or left `new`."""
    a, r, rk, c, p = appointments, reminder_rules, reminder_rule_kinds, contacts, preferences
    has_channel = exists().where(
        channels.c.org_id == org_id, channels.c.kind == rk.c.kind, channels.c.status == "active"
    )
    has_address = case((rk.c.kind == "email", c.c.email.is_not(None)), else_=c.c.phone.is_not(None))
    recent = now - LOOKBACK
    # The appointments each trigger applies to.
    applies_to = {
        "before_start": and_(a.c.status.in_(LIVE_STATUSES), a.c.starts_at > recent, a.c.starts_at <= now + horizon),
        "after_start": and_(a.c.status.in_(("scheduled", "confirmed", "completed")),
                            a.c.starts_at > recent, a.c.starts_at <= now + horizon),
        "on_create": and_(a.c.status.in_(LIVE_STATUSES), a.c.created_at > recent, a.c.starts_at > now),
        "on_cancel": and_(a.c.status == "cancelled", a.c.cancelled_at > recent, a.c.starts_at > now,
                          or_(a.c.cancel_source.is_(None), a.c.cancel_source != "patient")),
    }
    # Which appointments this pass looks at (the same for every rule and kind, so the ranking of
    # kinds below is the full pass's).
    scope: list[ColumnElement[bool]] = [a.c.org_id == org_id]
    if appointment_id is not None:
        scope.append(a.c.id == appointment_id)
    if changed_since is not None:
        scope.append(_changed_clause(org_id, changed_since, now, horizon))

    # 1. Plan every (rule, start, timezone) the candidates can have, in Python (a superset of the
    #    candidates: the join below only uses what it needs).
    rules = conn.execute(select(r.c.id, r.c.trigger, r.c.offset_minutes, r.c.respect_window)
                         .where(r.c.org_id == org_id, r.c.active == true())).all()
    if not rules:
        return 0, 0, 0
    # Only the triggers the org's rules have: with one (the usual case) the appointments' part of
    # the condition stands on its own and filters the appointments before they are joined, where
    # an OR over every trigger tied each appointment to a rule's column.
    triggers = sorted({rule.trigger for rule in rules})
    trigger_applies = or_(*[and_(r.c.trigger == trigger, applies_to[trigger]) for trigger in triggers])
    slots = conn.execute(
        select(a.c.starts_at, a.c.timezone).distinct().where(
            *scope, a.c.starts_at > recent,
            or_(a.c.starts_at <= now + horizon, a.c.created_at > recent, a.c.cancelled_at > recent))
    ).all()
    if not slots:
        return 0, 0, 0
    plan_rows = [
        (rule.id, starts, tz, *decide(policy, rule.trigger, rule.offset_minutes, rule.respect_window,
                                      starts, tz, now, cache))
        for rule in rules
        for starts, tz in slots
    ]
    plan = plan_source(conn, plan_rows)

    # 2. Insert, joined with the plan: each row is written once, `pending` at its time or
    #    `skipped` with its reason (`new` only if the plan missed it: plan_new places it then).
    ranked = (
        select(
            a.c.id.label("appointment_id"),
            a.c.contact_id,
            a.c.starts_at,
            a.c.timezone,
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
            *scope,
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
    ranked_sq = ranked.subquery("ranked")
    key = (
        literal("appointment:") + cast(ranked_sq.c.appointment_id, String) + literal(":")
        + cast(ranked_sq.c.rule_id, String) + literal(":") + ranked_sq.c.kind + literal(":")
        + cast(epoch_seconds(ranked_sq.c.starts_at), String)
    )
    planned_status = func.coalesce(plan.c.status, literal("new"))
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
        planned_status.label("status"),
        plan.c.nominal_due_at,
        plan.c.due_at,
        plan.c.due_at.label("next_attempt_at"),
        plan.c.expires_at,
        plan.c.skip_reason,
        literal(0).label("attempts"),
        literal(now, type_=messages.c.created_at.type).label("created_at"),
        literal(now, type_=messages.c.updated_at.type).label("updated_at"),
    ).select_from(
        ranked_sq.outerjoin(plan, and_(plan.c.rule_id == ranked_sq.c.rule_id,
                                       plan.c.starts_at == ranked_sq.c.starts_at,
                                       plan.c.tz == ranked_sq.c.timezone))
    ).where(ranked_sq.c.pref == 1)
    names = [
        "org_id", "purpose", "contact_id", "channel_kind", "appointment_id", "appointment_starts_at",
        "rule_id", "template_key", "respect_window", "idempotency_key", "status", "nominal_due_at",
        "due_at", "next_attempt_at", "expires_at", "skip_reason", "attempts", "created_at", "updated_at",
    ]
    stmt = insert_ignore(conn, messages, ("org_id", "idempotency_key")).from_select(names, chosen)
    with _joined_by_hash(conn, appointment_id is None and changed_since is None):
        counts = _insert_with_events(conn, org_id, stmt, now)
    return sum(counts.values()), counts.get("pending", 0), counts.get("skipped", 0)


def _joined_by_hash(conn: Connection, whole_org: bool) -> AbstractContextManager[None]:
    """PostgreSQL, a pass over a whole org: plan the statement inside without nested loops.

    The planner estimates the appointments × rules × channel kinds × consents join at a row or so
    (the channel, rule and consent conditions are correlated in a way its statistics cannot see)
    where a whole org gives one row per reminder, and then probes an index per row. Joined by
    hash, one org's first pass of 100,000 appointments × 2 rules took 11.6–12.0 s instead of
    12.7–13.5 s, and its repeat pass's insert 1.9–2.0 s instead of 2.5–2.7 s (docs/benchmarks-history.md,
    2026-12-04 (end of day)). A pass over one appointment or over what changed joins a few rows,
    which an index does best: those keep the planner's choice."""
    return planner_setting(conn, "enable_nestloop", "off", when=whole_org)


def _changed_clause(org_id: int, since: datetime, now: datetime, horizon: timedelta) -> ColumnElement[bool]:
    """Appointments the periodic pass looks at: changed since `since` (a new one's `updated_at` is
    its `created_at`), whose contact or one of its consents changed since then, or that entered the
    horizon since then.

    A union of ids, each part read through its own index (migration 0016), so that a pass with
    little new costs little however many appointments the org has (an OR of the same conditions
    made PostgreSQL read every appointment of the org)."""
    a = appointments.alias("changed_appointment")
    c, p = contacts.alias("changed_contact"), preferences.alias("changed_preference")
    changed = union(
        select(a.c.id).where(a.c.org_id == org_id, a.c.updated_at >= since),
        select(a.c.id).where(a.c.org_id == org_id, a.c.starts_at > since + horizon, a.c.starts_at <= now + horizon),
        select(a.c.id).join(c, and_(c.c.org_id == org_id, c.c.id == a.c.contact_id))
        .where(a.c.org_id == org_id, c.c.updated_at >= since),
        select(a.c.id).join(p, and_(p.c.org_id == org_id, p.c.contact_id == a.c.contact_id))
        .where(a.c.org_id == org_id, p.c.updated_at >= since),
    )
    return appointments.c.id.in_(changed.scalar_subquery())


def _insert_with_events(conn: Connection, org_id: int, stmt: Any, now: datetime) -> dict[str, int]:
    """Run the reminders' INSERT and write the `queued` (or `skipped`, with its reason) event of
    every row it wrote; returns the number of rows written per status."""
    e = message_events
    if conn.dialect.name == "postgresql":
        # One statement: the rows and their events, without the ids travelling to Python.
        ins = stmt.returning(messages.c.id, messages.c.status, messages.c.skip_reason).cte("ins")
        events = insert(e).from_select(
            ["org_id", "message_id", "event", "detail", "created_at"],
            select(
                literal(org_id), ins.c.id,
                case((ins.c.status == "pending", literal("queued")), else_=literal("skipped")),
                case((ins.c.status == "skipped", func.jsonb_build_object("reason", ins.c.skip_reason)),
                     else_=None),
                literal(now, type_=e.c.created_at.type),
            ).where(ins.c.status.in_(("pending", "skipped"))),
        ).cte("events")
        rows = conn.execute(select(ins.c.status, func.count()).group_by(ins.c.status).add_cte(events)).all()
        counts = {status: int(n) for status, n in rows}
        for event, status in (("queued", "pending"), ("skipped", "skipped")):
            metrics.message_events(event, counts.get(status, 0))
        return counts
    rows = conn.execute(stmt.returning(messages.c.id, messages.c.status, messages.c.skip_reason)).all()
    counts: dict[str, int] = {}
    queued, skipped_by_reason = [], {}  # type: ignore[var-annotated]
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
        if row.status == "pending":
            queued.append(row.id)
        elif row.status == "skipped":
            skipped_by_reason.setdefault(row.skip_reason, []).append(row.id)
    record_events(conn, org_id, queued, "queued", at=now)
    for reason, ids in skipped_by_reason.items():
        record_events(conn, org_id, ids, "skipped", detail={"reason": reason}, at=now)
    return counts


def plan_new(conn: Connection, org_id: int, *, policy: WindowPolicy | None = None) -> tuple[int, int]:
    """Place every `new` message of the org in its sending window; returns (planned, skipped)."""
    if policy is None:
        policy = policy_for(conn.execute(select(orgs).where(orgs.c.id == org_id)).one())
    planned = skipped = 0
    last_id = 0
    query = _new_messages(conn.dialect.name == "postgresql")
    while True:
        rows = conn.execute(query, {"org_id": org_id, "last_id": last_id}).all()
        if not rows:
            return planned, skipped
        last_id = rows[-1].id
        placed: list[dict[str, Any]] = []
        skips: list[dict[str, Any]] = []
        for row in rows:
            nominal, deadline = nominal_and_deadline(row, policy.timezone)
            due, reason = placement(policy, nominal, row.created_at, deadline, row.respect_window)
            if due is None:
                skips.append({"mid": row.id, "nominal": nominal, "expires": deadline, "reason": reason})
            else:
                placed.append({"mid": row.id, "nominal": nominal, "due": due, "expires": deadline})
        now = clock.now()
        placed_ids, skipped_ids = apply_decisions(conn, placed, skips, now)
        record_events(conn, org_id, placed_ids, "queued", at=now)
        reasons = {s["mid"]: s["reason"] for s in skips}
        for reason in sorted({reasons[mid] for mid in skipped_ids}):
            record_events(conn, org_id, [mid for mid in skipped_ids if reasons[mid] == reason], "skipped",
                          detail={"reason": reason}, at=now)
        planned += len(placed_ids)
        skipped += len(skipped_ids)
        if len(rows) < PLAN_BATCH:
            # That read found every `new` row of the org this transaction can take: no read more
            # (one per flow step that queued a message). A row another transaction commits
            # meanwhile is placed by that transaction's own plan_new, or by the next pass's.
            return planned, skipped


@lru_cache(maxsize=2)
def _new_messages(postgresql: bool) -> Any:
    """`plan_new`'s read of the org's `new` messages after `:last_id` (locked on PostgreSQL, the
    ones another planner holds skipped), built once: a flow step that queues a follow-up plans it."""
    org_id = bindparam("org_id")
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
        .where(messages.c.org_id == org_id, messages.c.status == "new", messages.c.id > bindparam("last_id"))
        .order_by(messages.c.id)
        .limit(PLAN_BATCH)
    )
    return query.with_for_update(of=messages, skip_locked=True) if postgresql else query


#: Horizon used when an appointment change re-populates at once (the scheduler passes its own).
DEFAULT_HORIZON = timedelta(days=8)


def refresh_appointment(conn: Connection, org_id: int, appointment_id: int,
                        horizon: timedelta = DEFAULT_HORIZON) -> PopulateResult:
    """Re-populate one appointment inside the caller's transaction, right after it changed."""
    return populate_org(conn, org_id, horizon=horizon, appointment_id=appointment_id)
