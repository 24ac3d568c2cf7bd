"""Populate's planning: when a reminder goes (or why it is skipped), decided once per distinct
(rule, appointment start, appointment timezone) and joined into the INSERT as a small table.

A reminder's plan is a pure function of its rule (trigger, offset, whether it respects the
window), its appointment's start and timezone, the org's window and the instant it is created,
so a pass over a million appointments plans only the few thousand distinct start times they have,
with exactly the code that planned each row before (`nominal_and_deadline`, `windows.place`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, Sequence

from sqlalchemy import BigInteger, Column, MetaData, Table, Text, bindparam, column, insert, text, update
from sqlalchemy.engine import Connection

from engine.store.db import UTCDateTime
from engine.store.models import messages
from engine.reminders.windows import WindowPolicy, nominal_due, place

#: After-start messages (a follow-up after the session) may still go out this long after due.
AFTER_START_VALIDITY = timedelta(days=1)

#: (status, nominal_due_at, due_at, expires_at, skip_reason) of one planned reminder.
Decision = tuple[str, datetime, datetime | None, datetime | None, str | None]
#: Decisions already taken in this pass, shared by its orgs (same window, same rule, same start).
PlanCache = dict[tuple[Any, ...], Decision]

_PLAN_COLUMNS = ("rule_id", "starts_at", "tz", "status", "nominal_due_at", "due_at", "expires_at", "skip_reason")

#: SQLite's plan table (per connection, emptied at every use). PostgreSQL reads arrays instead.
_sqlite_plan = Table(
    "populate_plan", MetaData(),
    Column("rule_id", BigInteger), Column("starts_at", UTCDateTime()), Column("tz", Text),
    Column("status", Text), Column("nominal_due_at", UTCDateTime()), Column("due_at", UTCDateTime()),
    Column("expires_at", UTCDateTime()), Column("skip_reason", Text),
    prefixes=["TEMPORARY"],
)


def nominal_and_deadline(row: Any, org_timezone: str) -> tuple[datetime, datetime | None]:
    """When a message is meant to go, and after when it is useless (shared with engine/reminders/replan.py).

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


def placement(policy: WindowPolicy, nominal: datetime, created_at: datetime, deadline: datetime | None,
              respect_window: bool) -> tuple[datetime | None, str | None]:
    """(due_at, None) for a reminder that goes, (None, skip reason) for one that cannot."""
    if respect_window:
        placed = place(policy, nominal, created_at, deadline)
        return placed.due_at, placed.skip_reason
    if deadline is not None and nominal >= deadline:
        return None, "too_late"
    return max(nominal, created_at), None


def decide(policy: WindowPolicy, trigger: str, offset_minutes: int, respect_window: bool,
           starts_at: datetime, tz: str | None, created_at: datetime, cache: PlanCache) -> Decision:
    """The plan of a reminder of that rule for an appointment starting then, created now."""
    key = (policy, trigger, offset_minutes, bool(respect_window), starts_at, tz, created_at)
    found = cache.get(key)
    if found is not None:
        return found
    row = SimpleNamespace(appointment_starts_at=starts_at, created_at=created_at, nominal_due_at=None,
                          expires_at=None, trigger=trigger, offset_minutes=offset_minutes, timezone=tz)
    nominal, deadline = nominal_and_deadline(row, policy.timezone)
    due, reason = placement(policy, nominal, created_at, deadline, bool(respect_window))
    decision: Decision = ("skipped" if due is None else "pending", nominal, due, deadline, reason)
    cache[key] = decision
    return decision


def plan_source(conn: Connection, rows: Sequence[tuple[Any, ...]]) -> Any:
    """The plan rows (`_PLAN_COLUMNS`) as a selectable named `plan`, for the INSERT to join."""
    if conn.dialect.name == "postgresql":
        columns = list(zip(*rows)) if rows else [()] * len(_PLAN_COLUMNS)
        types = ("bigint", "timestamptz", "text", "text", "timestamptz", "timestamptz", "timestamptz", "text")
        args = ", ".join(f"CAST(:p_{name} AS {kind}[])" for name, kind in zip(_PLAN_COLUMNS, types))
        stmt = text(f"SELECT * FROM unnest({args}) AS plan({', '.join(_PLAN_COLUMNS)})").bindparams(
            *[bindparam(f"p_{name}", list(values)) for name, values in zip(_PLAN_COLUMNS, columns)])
        return stmt.columns(*[column(c.name, c.type) for c in _sqlite_plan.columns]).subquery("plan")
    conn.exec_driver_sql(
        "CREATE TEMP TABLE IF NOT EXISTS populate_plan (rule_id INTEGER, starts_at DATETIME, tz TEXT, status TEXT, "
        "nominal_due_at DATETIME, due_at DATETIME, expires_at DATETIME, skip_reason TEXT)")
    conn.execute(_sqlite_plan.delete())
    if rows:
        conn.execute(insert(_sqlite_plan), [dict(zip(_PLAN_COLUMNS, row)) for row in rows])
    return _sqlite_plan.alias("plan")


def apply_decisions(conn: Connection, placed: list[dict[str, Any]], skips: list[dict[str, Any]],
                    now: datetime) -> tuple[list[int], list[int]]:
    """Move `new` rows to `pending` (`placed`: mid, nominal, due, expires) or `skipped` (`skips`:
    mid, nominal, expires, reason), each a compare-and-set on `new`, one statement per batch on
    PostgreSQL; returns the ids that moved, (placed, skipped)."""
    if conn.dialect.name == "postgresql":
        return _apply_pg(conn, placed, "pending", now), _apply_pg(conn, skips, "skipped", now)
    done: list[list[int]] = []
    for batch, status in ((placed, "pending"), (skips, "skipped")):
        ids = []
        for row in batch:  # SQLite runs in-process: a statement per row costs microseconds
            values: dict[str, Any] = {"status": status, "nominal_due_at": row["nominal"],
                                      "expires_at": row["expires"], "updated_at": now}
            if status == "pending":
                values.update(due_at=row["due"], next_attempt_at=row["due"])
            else:
                values["skip_reason"] = row["reason"]
            moved = conn.execute(update(messages).where(messages.c.id == row["mid"], messages.c.status == "new")
                                 .values(**values)).rowcount
            if moved:
                ids.append(row["mid"])
        done.append(ids)
    return done[0], done[1]


def _apply_pg(conn: Connection, rows: list[dict[str, Any]], status: str, now: datetime) -> list[int]:
    """One `UPDATE … FROM unnest(…)` for the batch."""
    if not rows:
        return []
    due = [row.get("due") for row in rows]
    stmt = text(
        "UPDATE messages AS m SET status = :status, nominal_due_at = d.nominal, due_at = d.due, "
        "next_attempt_at = d.due, expires_at = d.expires, "
        "skip_reason = CASE WHEN :status = 'skipped' THEN d.reason ELSE m.skip_reason END, updated_at = :now "
        "FROM unnest(CAST(:mids AS bigint[]), CAST(:nominals AS timestamptz[]), CAST(:dues AS timestamptz[]), "
        "CAST(:expires AS timestamptz[]), CAST(:reasons AS text[])) AS d(mid, nominal, due, expires, reason) "
        "WHERE m.id = d.mid AND m.status = 'new' RETURNING m.id"
    )
    result = conn.execute(stmt, {
        "status": status, "now": now, "mids": [row["mid"] for row in rows],
        "nominals": [row["nominal"] for row in rows], "dues": due,
        "expires": [row["expires"] for row in rows], "reasons": [row.get("reason") for row in rows],
    })
    return [r[0] for r in result]
