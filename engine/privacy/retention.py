"""Retention (SPEC §10, issue 9 point 12): old personal data goes, the counts stay.

Per org (columns on `orgs`, defaults below):

- after `retention_queue_days` (90): the text of finished messages (body, subject, the payload
  but the API's request fingerprint, error details) is removed and the row marked
  `anonymised_at`; the text, sender and button of processed inbound replies are removed; the
  sandbox's copies of sent messages are deleted; the raw (already redacted) webhook bodies are
  removed; the outbound webhook log's finished deliveries are deleted;
- after `retention_events_days` (730, two years): finished messages themselves go (their
  events with them), and so do message events, the events of ended follow-up runs, contact
  events, inbound replies, webhook deliveries and this job's own run log.

What stays: rows younger than that, every row the dashboard counts (its last 30 days: the floor
of `retention_events_days` is 31, and anonymising keeps the row), messages and replies of live
follow-up runs, and the consent record (`preferences`, `address_optouts`, the audit log).

The work is done in batches of `BATCH` rows, each its own short transaction that touches only
rows already finished (`DELETE … WHERE id IN (ids of one batch)`), walking ids upwards so a
batch never rescans what an earlier one passed: the hot rows (due, claimed, sending) are never
locked. The scheduler runs it once a day per org (after `RUN_AFTER` local time; a row in
`retention_runs` per org and local day claims it, and the scheduler's leader lock on PostgreSQL
keeps one scheduler active), with a budget of batches per pass so a first run on a big database
does not hold the dispatch loop; `lembra retention run [--dry-run]` runs it by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Table, and_, delete, exists, func, not_, null, or_, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from engine.core import clock
from engine.store.db import Database
from engine.store.dialect import insert_ignore
from engine.core.errors import DomainError
from engine.flows.lifecycle import LIVE as LIVE_ENROLLMENT
from engine.flows.lifecycle import TERMINAL as ENDED_ENROLLMENT
from engine.store.models import (
    TERMINAL_STATUSES,
    contact_events,
    enrollment_events,
    enrollments,
    inbound_messages,
    inbox_items,
    message_events,
    messages,
    orgs,
    retention_runs,
    sandbox_messages,
    webhook_deliveries,
    webhook_events,
)

log = logging.getLogger(__name__)

DEFAULT_QUEUE_DAYS = 90
DEFAULT_EVENTS_DAYS = 730
#: Texts are kept at least a week (support looks at what went out).
MIN_QUEUE_DAYS = 7
#: Rows are kept longer than the dashboard's 30 days, so its counts never change.
MIN_EVENTS_DAYS = 31
MAX_DAYS = 36_500
BATCH = 1000
#: The org's local time after which the day's run starts (a quiet hour).
RUN_AFTER = time(3, 0)
#: How often the scheduler looks whether a run is due, when none is under way.
CHECK_EVERY = timedelta(minutes=10)
#: Batches one scheduler pass may spend per org; the run continues on the next pass.
PASS_BUDGET = 50

STEPS = ("messages_anonymised", "inbound_anonymised", "sandbox_deleted", "webhook_bodies_removed",
         "messages_deleted", "message_events_deleted", "enrollment_events_deleted", "contact_events_deleted",
         "inbound_deleted", "webhook_events_deleted", "webhook_deliveries_deleted", "retention_runs_deleted")


@dataclass
class RetentionResult:
    """What one run did (or, dry, would do) for one org: rows per step, and whether it finished
    (False when the pass ran out of budget; the next pass goes on)."""

    org_id: int
    counts: dict[str, int] = field(default_factory=dict)
    done: bool = True

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class _Budget:
    """Batches that wrote something, per pass (looking and finding nothing is free, so every
    pass gets further than the one before)."""

    def __init__(self, batches: int | None) -> None:
        self.left = batches

    @property
    def exhausted(self) -> bool:
        return self.left is not None and self.left <= 0

    def spend(self) -> None:
        if self.left is not None:
            self.left -= 1


# --- settings -----------------------------------------------------------------------------------

def set_retention(conn: Connection, org_id: int, *, queue_days: int | None = None,
                  events_days: int | None = None) -> tuple[int, int]:
    """Change an org's retention; returns the (queue_days, events_days) now in force."""
    row = conn.execute(select(orgs.c.retention_queue_days, orgs.c.retention_events_days)
                       .where(orgs.c.id == org_id)).first()
    if row is None:
        raise DomainError("no such org")
    queue = row.retention_queue_days if queue_days is None else queue_days
    events = row.retention_events_days if events_days is None else events_days
    if not MIN_QUEUE_DAYS <= queue <= MAX_DAYS:
        raise DomainError(f"queue retention must be {MIN_QUEUE_DAYS} to {MAX_DAYS} days")
    if not MIN_EVENTS_DAYS <= events <= MAX_DAYS:
        raise DomainError(f"events retention must be {MIN_EVENTS_DAYS} to {MAX_DAYS} days "
                          "(the dashboard counts the last 30)")
    if events < queue:
        raise DomainError("events retention cannot be shorter than queue retention")
    conn.execute(update(orgs).where(orgs.c.id == org_id).values(
        retention_queue_days=queue, retention_events_days=events, updated_at=clock.now()))
    return queue, events


# --- the steps ----------------------------------------------------------------------------------

def _not_in_live_run(column: Any) -> ColumnElement[bool]:
    """The row does not belong to a follow-up run still going (its node may read it)."""
    return or_(column.is_(None), not_(exists().where(
        enrollments.c.id == column, enrollments.c.status.in_(LIVE_ENROLLMENT))))


def _not_pending_reply(inbound_id: Any) -> ColumnElement[bool]:
    return not_(exists().where(enrollments.c.pending_inbound_id == inbound_id))


def _anonymise_messages(conn: Connection, org_id: int, ids: Sequence[int]) -> None:
    anonymise_messages(conn, org_id, messages.c.id.in_(list(ids)))


def anonymise_messages(conn: Connection, org_id: int, where: ColumnElement[bool]) -> int:
    """Remove the text of the org's messages matching `where` (the row and its counts stay; an
    ad-hoc message keeps its request fingerprint, so its Idempotency-Key still answers)."""
    now = clock.now()
    rows = conn.execute(select(messages.c.id, messages.c.payload).where(messages.c.org_id == org_id, where)).all()
    keep = {row.id: {"request_sha256": row.payload["request_sha256"]} for row in rows
            if isinstance(row.payload, dict) and row.payload.get("request_sha256")}
    # `updated_at` stays: the row did not change state, and its age is what retention reads.
    values = {"body": None, "subject": None, "error_detail": None, "anonymised_at": now}
    plain = [row.id for row in rows if row.id not in keep]
    for start in range(0, len(plain), BATCH):
        conn.execute(update(messages).where(messages.c.org_id == org_id, messages.c.id.in_(plain[start:start + BATCH]))
                     .values(**values, payload=null()))
    for message_id, payload in keep.items():
        conn.execute(update(messages).where(messages.c.org_id == org_id, messages.c.id == message_id)
                     .values(**values, payload=payload))
    return len(rows)


def _anonymise_inbound(conn: Connection, org_id: int, ids: Sequence[int]) -> None:
    conn.execute(update(inbound_messages).where(inbound_messages.c.org_id == org_id, inbound_messages.c.id.in_(ids))
                 .values(text=None, from_address=None, button_payload=None, audio=None))


def _delete(table: Table) -> Callable[[Connection, int, Sequence[int]], None]:
    def apply(conn: Connection, org_id: int, ids: Sequence[int]) -> None:
        conn.execute(delete(table).where(table.c.org_id == org_id, table.c.id.in_(ids)))
    return apply


def _remove_webhook_bodies(conn: Connection, org_id: int, ids: Sequence[int]) -> None:
    conn.execute(update(webhook_events).where(webhook_events.c.org_id == org_id, webhook_events.c.id.in_(ids))
                 .values(body=null()))


def _delete_messages(conn: Connection, org_id: int, ids: Sequence[int]) -> None:
    ids = list(ids)
    conn.execute(delete(message_events).where(message_events.c.org_id == org_id,
                                              message_events.c.message_id.in_(ids)))
    conn.execute(update(inbox_items).where(inbox_items.c.org_id == org_id, inbox_items.c.message_id.in_(ids))
                 .values(message_id=None))
    conn.execute(delete(messages).where(messages.c.org_id == org_id, messages.c.id.in_(ids)))


@dataclass(frozen=True)
class _Step:
    name: str
    table: Table
    where: Callable[[datetime, datetime], ColumnElement[bool]]  # (queue cutoff, events cutoff) → rows
    apply: Callable[[Connection, int, Sequence[int]], None]


def _steps() -> list[_Step]:
    m, i, w = messages.c, inbound_messages.c, webhook_events.c
    finished = m.status.in_(TERMINAL_STATUSES)
    return [
        _Step("messages_anonymised", messages,
              lambda q, e: and_(finished, m.anonymised_at.is_(None), m.created_at < q, m.updated_at < q,
                                _not_in_live_run(m.enrollment_id)),
              _anonymise_messages),
        _Step("inbound_anonymised", inbound_messages,
              lambda q, e: and_(i.received_at < q, i.processed_at.is_not(None),
                                or_(i.text.is_not(None), i.from_address.is_not(None), i.button_payload.is_not(None),
                                    i.audio.is_not(None)),
                                _not_pending_reply(i.id)),
              _anonymise_inbound),
        _Step("sandbox_deleted", sandbox_messages, lambda q, e: sandbox_messages.c.created_at < q,
              _delete(sandbox_messages)),
        _Step("webhook_bodies_removed", webhook_events, lambda q, e: and_(w.received_at < q, w.body.is_not(None)),
              _remove_webhook_bodies),
        _Step("messages_deleted", messages,
              lambda q, e: and_(finished, m.created_at < e, m.updated_at < e, _not_in_live_run(m.enrollment_id)),
              _delete_messages),
        _Step("message_events_deleted", message_events, lambda q, e: message_events.c.created_at < e,
              _delete(message_events)),
        _Step("enrollment_events_deleted", enrollment_events,
              lambda q, e: and_(enrollment_events.c.created_at < e, exists().where(
                  enrollments.c.id == enrollment_events.c.enrollment_id, enrollments.c.status.in_(ENDED_ENROLLMENT))),
              _delete(enrollment_events)),
        _Step("contact_events_deleted", contact_events, lambda q, e: contact_events.c.created_at < e,
              _delete(contact_events)),
        _Step("inbound_deleted", inbound_messages,
              lambda q, e: and_(i.received_at < e, i.processed_at.is_not(None), _not_pending_reply(i.id)),
              _delete(inbound_messages)),
        _Step("webhook_events_deleted", webhook_events, lambda q, e: w.received_at < e, _delete(webhook_events)),
        # The outbound webhook log: finished deliveries go with the texts (it is an operator's log,
        # and its payloads are ids only); pending ones stay until they are delivered or given up.
        _Step("webhook_deliveries_deleted", webhook_deliveries,
              lambda q, e: and_(webhook_deliveries.c.status.in_(("delivered", "dead")),
                                webhook_deliveries.c.created_at < q),
              _delete(webhook_deliveries)),
        _Step("retention_runs_deleted", retention_runs, lambda q, e: retention_runs.c.started_at < e,
              _delete(retention_runs)),
    ]


# --- running ------------------------------------------------------------------------------------

def _declare(conn: Connection, org_id: int) -> None:
    """On PostgreSQL, row-level security backs up every statement's own org filter."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT set_config('lembra.org_id', :o, true)"), {"o": str(org_id)})


def _run_step(db: Database, org_id: int, step: _Step, where: ColumnElement[bool], *, dry_run: bool,
              batch: int, budget: _Budget) -> tuple[int, bool]:
    """(rows, finished) for one step of one org."""
    table = step.table
    scoped = and_(table.c.org_id == org_id, where)
    if dry_run:
        with db.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(table).where(scoped)).scalar_one()), True
    done, last = 0, 0
    while True:
        if budget.exhausted:
            return done, False
        with db.begin() as conn:
            _declare(conn, org_id)
            ids = list(conn.execute(select(table.c.id).where(scoped, table.c.id > last)
                                    .order_by(table.c.id).limit(batch)).scalars())
            if ids:
                step.apply(conn, org_id, ids)
                budget.spend()
        done += len(ids)
        if len(ids) < batch:
            return done, True
        last = ids[-1]


def run_org(db: Database, org_id: int, *, dry_run: bool = False, batch: int = BATCH,
            max_batches: int | None = None) -> RetentionResult:
    """One org's retention, every step in order; see the module doc."""
    with db.connect() as conn:
        org = conn.execute(select(orgs.c.retention_queue_days, orgs.c.retention_events_days)
                           .where(orgs.c.id == org_id)).first()
    if org is None:
        raise DomainError("no such org")
    now = clock.now()
    queue_cutoff = now - timedelta(days=max(org.retention_queue_days, MIN_QUEUE_DAYS))
    events_cutoff = now - timedelta(days=max(org.retention_events_days, MIN_EVENTS_DAYS))
    budget = _Budget(max_batches)
    result = RetentionResult(org_id=org_id)
    for step in _steps():
        rows, finished = _run_step(db, org_id, step, step.where(queue_cutoff, events_cutoff), dry_run=dry_run,
                                   batch=batch, budget=budget)
        result.counts[step.name] = result.counts.get(step.name, 0) + rows
        if not finished:
            result.done = False
            break
    return result


def run(db: Database, *, org_id: int | None = None, dry_run: bool = False, batch: int = BATCH) -> list[RetentionResult]:
    """Retention for every org (or one), to the end: what `lembra retention run` does."""
    with db.connect() as conn:
        query = select(orgs.c.id).order_by(orgs.c.id)
        if org_id is not None:
            query = query.where(orgs.c.id == org_id)
        org_ids = list(conn.execute(query).scalars())
    results = [run_org(db, oid, dry_run=dry_run, batch=batch) for oid in org_ids]
    if not dry_run:
        for result in results:
            if result.total:
                log.info("retention", extra={"org_id": result.org_id, **result.counts})
    return results


class DailyRetention:
    """The scheduler's daily run: once per org and local day, after `RUN_AFTER`, claimed by a
    `retention_runs` row (so a restart, a second scheduler or a standby taking over the leader
    lock never runs a day twice); a run that ran out of its pass budget goes on at the next pass."""

    def __init__(self, db: Database, *, budget: int = PASS_BUDGET, batch: int = BATCH) -> None:
        self.db = db
        self.budget = budget
        self.batch = batch
        self._checked_at: datetime | None = None
        self._unfinished = False

    def maybe_run(self) -> int:
        """Run what is due now; returns the rows touched (0 most passes: a cheap check)."""
        now = clock.now()
        if not self._unfinished and self._checked_at is not None and now - self._checked_at < CHECK_EVERY:
            return 0
        self._checked_at = now
        self._unfinished = False
        touched = 0
        with self.db.connect() as conn:
            org_rows = conn.execute(select(orgs.c.id, orgs.c.timezone).order_by(orgs.c.id)).all()
        for org in org_rows:
            local = now.astimezone(ZoneInfo(org.timezone))
            if local.time() < RUN_AFTER:
                continue
            run_id = self._claim(org.id, local.date().isoformat(), now)
            if run_id is None:
                continue
            try:
                result = run_org(self.db, org.id, batch=self.batch, max_batches=self.budget)
            except Exception:
                log.exception("retention failed", extra={"org_id": org.id})
                self._finish(org.id, run_id, {"error": 1})
                continue
            touched += result.total
            self._add(org.id, run_id, result)
            if result.done:
                self._finish(org.id, run_id, None)
                if result.total:
                    log.info("retention", extra={"org_id": org.id, "rows": result.total})
            else:
                self._unfinished = True
        return touched

    def _claim(self, org_id: int, day: str, now: datetime) -> int | None:
        """Today's run of the org if it is not finished yet (claimed now, or under way)."""
        with self.db.begin() as conn:
            conn.execute(insert_ignore(conn, retention_runs, ("org_id", "day")).values(
                org_id=org_id, day=day, started_at=now, counts={}))
            row = conn.execute(select(retention_runs.c.id, retention_runs.c.finished_at).where(
                retention_runs.c.org_id == org_id, retention_runs.c.day == day)).one()
        return None if row.finished_at is not None else int(row.id)

    def _add(self, org_id: int, run_id: int, result: RetentionResult) -> None:
        with self.db.begin() as conn:
            stored = conn.execute(select(retention_runs.c.counts).where(
                retention_runs.c.org_id == org_id, retention_runs.c.id == run_id)).scalar() or {}
            counts = dict(stored)
            for name, rows in result.counts.items():
                counts[name] = int(counts.get(name, 0)) + rows
            conn.execute(update(retention_runs).where(retention_runs.c.org_id == org_id, retention_runs.c.id == run_id)
                         .values(counts=counts))

    def _finish(self, org_id: int, run_id: int, extra: dict[str, Any] | None) -> None:
        with self.db.begin() as conn:
            values: dict[str, Any] = {"finished_at": clock.now()}
            if extra:
                stored = conn.execute(select(retention_runs.c.counts).where(retention_runs.c.id == run_id)).scalar()
                values["counts"] = {**(stored or {}), **extra}
            conn.execute(update(retention_runs).where(retention_runs.c.org_id == org_id, retention_runs.c.id == run_id)
                         .values(**values))


def last_runs(conn: Connection, org_id: int, limit: int = 7) -> list[Any]:
    """The org's latest daily runs, newest first."""
    return conn.execute(select(retention_runs).where(retention_runs.c.org_id == org_id)
                        .order_by(retention_runs.c.day.desc()).limit(limit)).all()
