"""Re-place the reminders already queued after a rule or the org's sending window changed.

populate decides a reminder's time once, when it plans the `new` row; a later change of the
rule's offset, trigger or window flag, or of the org's quiet hours, Sundays, holidays or state,
would otherwise leave the queue with times the clinic no longer asked for. `replace_pending`
recomputes, set-based and in the caller's transaction, the time of every reminder that is still
`pending` and never tried, of an appointment still ahead: with the same code populate uses
(`nominal_and_deadline`, then `windows.place`), except that the earliest instant is now (a
reminder cannot be re-placed into the past, and one whose new time has already gone by goes
at the first allowed instant still before the session instead of being dropped).

Left alone, on purpose: rows `claimed` or `sending` (a worker has them; dispatch re-checks the
window at send time anyway), rows with attempts (a retry keeps its backoff), and reminders of
appointments that moved, ended or already started (populate cancels or keeps those itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, literal, or_, select, true, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.store.models import appointments, messages, orgs, reminder_rules
from engine.queue.outbox import record_events
from engine.reminders.populate import LIVE_STATUSES, PLAN_BATCH, nominal_and_deadline
from engine.reminders.windows import place, policy_for

#: The reason a re-placed reminder's `planned` event carries (engine/words/catalogue.py says it).
REPLANNED = "replanned"


@dataclass
class ReplaceResult:
    """What one re-placement did: reminders rewritten (`moved`), those of them whose send time
    actually changed (`retimed`: a row rewritten only because the rule's window flag changed keeps
    its time, and a person is told only of times that changed), and those left without any time."""

    moved: int = 0
    retimed: int = 0
    skipped: int = 0


def replace_pending(conn: Connection, org_id: int, rule_ids: Sequence[int] | None = None) -> ReplaceResult:
    """Give every queued reminder of the org (of `rule_ids` only, if given) the time its rule and
    the org's window now imply; a reminder that has no allowed instant left is skipped with its
    reason. Each change is a compare-and-set on (`pending`, never tried) with its event row."""
    result = ReplaceResult()
    if rule_ids is not None and not rule_ids:
        return result
    org = conn.execute(select(orgs).where(orgs.c.id == org_id)).one()
    policy = policy_for(org)
    now = clock.now()
    m, r, a = messages, reminder_rules, appointments
    scope = and_(
        m.c.org_id == org_id,
        m.c.status == "pending",
        m.c.attempts == 0,
        m.c.rule_id.is_not(None),
        a.c.starts_at > now,
        # A moved appointment's reminders name its old time: populate cancels them, not this.
        a.c.starts_at == m.c.appointment_starts_at,
        or_(r.c.trigger == "on_cancel", a.c.status.in_(LIVE_STATUSES + ("completed",))),
    )
    if rule_ids is not None:
        scope = and_(scope, m.c.rule_id.in_(list(rule_ids)))
    last_id = 0
    while True:
        query = (
            select(
                m.c.id, m.c.created_at, m.c.due_at, m.c.expires_at, m.c.appointment_starts_at,
                m.c.respect_window.label("queued_respect_window"),
                # The rule's flag, not the copy the row took when it was queued: it may have changed
                # (and dispatch reads the row's copy at send time, so the copy follows it).
                r.c.respect_window,
                # Not the row's own nominal time: that one was computed from the old rule, and
                # nominal_and_deadline would read it as a fallback's later time and keep it.
                literal(None).label("nominal_due_at"),
                r.c.trigger, r.c.offset_minutes, a.c.timezone,
            )
            .select_from(
                m.join(r, and_(r.c.id == m.c.rule_id, r.c.org_id == org_id, r.c.active == true()))
                .join(a, and_(a.c.id == m.c.appointment_id, a.c.org_id == org_id))
            )
            .where(scope, m.c.id > last_id)
            .order_by(m.c.id)
            .limit(PLAN_BATCH)
        )
        if conn.dialect.name == "postgresql":
            # A row the scheduler is claiming right now is locked: it is about to go, leave it.
            query = query.with_for_update(of=m, skip_locked=True)
        rows = conn.execute(query).all()
        if not rows:
            return result
        last_id = rows[-1].id
        moved, skips = _decide(rows, policy, now)
        _write(conn, org_id, [{k: v for k, v in row.items() if k != "retimed"} for row in moved], skips, now)
        result.moved += len(moved)
        result.retimed += sum(1 for row in moved if row["retimed"])
        result.skipped += len(skips)


def _decide(rows: Sequence[Any], policy: Any, now: datetime) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows whose time changes (with the new one) and those that can no longer go."""
    moved: list[dict[str, Any]] = []
    skips: list[dict[str, Any]] = []
    for row in rows:
        nominal, deadline = nominal_and_deadline(row, policy.timezone)
        earliest = max(nominal, now)
        if row.respect_window:
            placement = place(policy, earliest, now, deadline)
            due, reason = placement.due_at, placement.skip_reason
        elif deadline is not None and earliest >= deadline:
            due, reason = None, "too_late"
        else:
            due, reason = earliest, None
        if due is None:
            skips.append({"mid": row.id, "reason": reason})
        else:
            # Both "due now" is no move: the scheduler claims it at its next tick either way.
            retimed = due != row.due_at and not (due <= now and row.due_at is not None and row.due_at <= now)
            if retimed or row.respect_window != row.queued_respect_window:
                moved.append({"mid": row.id, "nominal": nominal, "due": due, "expires": deadline,
                              "respect_window": bool(row.respect_window), "retimed": retimed})
    return moved, skips


def _write(conn: Connection, org_id: int, moved: list[dict[str, Any]], skips: list[dict[str, Any]],
           now: datetime) -> None:
    """Apply one batch's decisions; the rows are locked (PostgreSQL) or the writer is alone (SQLite)."""
    m = messages
    cas = and_(m.c.org_id == org_id, m.c.id == bindparam("mid"), m.c.status == "pending", m.c.attempts == 0)
    if moved:
        conn.execute(
            update(m).where(cas).values(
                nominal_due_at=bindparam("nominal", type_=m.c.nominal_due_at.type),
                due_at=bindparam("due", type_=m.c.due_at.type),
                next_attempt_at=bindparam("due", type_=m.c.next_attempt_at.type),
                expires_at=bindparam("expires", type_=m.c.expires_at.type),
                respect_window=bindparam("respect_window", type_=m.c.respect_window.type),
                updated_at=now),
            moved,
        )
        record_events(conn, org_id, [row["mid"] for row in moved], "planned", detail={"reason": REPLANNED}, at=now)
    if skips:
        conn.execute(update(m).where(cas).values(status="skipped", skip_reason=bindparam("reason"),
                                                 next_attempt_at=None, updated_at=now), skips)
        for reason in sorted({row["reason"] for row in skips}):
            record_events(conn, org_id, [row["mid"] for row in skips if row["reason"] == reason], "skipped",
                          detail={"reason": reason}, at=now)
