"""Reminder rules as the domain sees them: what a change to a rule or to the window does to the queue."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import String, and_, cast, delete, exists, false, insert, literal, not_, or_
from sqlalchemy.engine import Connection

from engine.store.models import OPEN_STATUSES, messages, reminder_rule_kinds, reminder_rules
from engine.queue.outbox import transition_where
from engine.reminders.populate import DEFAULT_HORIZON, populate_org
from engine.reminders.replan import replace_pending

#: Why a reminder was cancelled because its rule was switched off or lost that channel kind.
RULE_CHANGED = "rule_changed"


@dataclass
class QueueChange:
    """What a change of rules or window did to the queue, as the console's message says it."""

    rescheduled: int = 0  # queued reminders given a new time
    cancelled: int = 0  # queued reminders that will not go (rule or kind switched off, appointment gone)
    created: int = 0  # new reminders queued
    skipped: int = 0  # reminders, new or queued, left without any allowed time (the Fila says why)

    @property
    def changed(self) -> bool:
        """Whether anything in the queue changed."""
        return bool(self.rescheduled or self.cancelled or self.created or self.skipped)


def reflect_rule_changes(conn: Connection, oid: int, rule_ids: Sequence[int],
                         horizon: timedelta = DEFAULT_HORIZON, *, window_changed: bool = False) -> QueueChange:
    """Make the queue match the rules and the org's sending window at once, in the caller's
    transaction: the one function every place that changes them (console grid, rule form, any
    API) calls, so that they cannot disagree.

    1. Open reminders of a rule of `rule_ids` that was switched off, deleted, or no longer has
       the reminder's kind are cancelled, giving up their idempotency key so that switching the
       rule back on queues them anew (populate never does this by itself, and dispatch does not
       look at the rule again).
    2. Queued reminders of those rules (of every rule, when `window_changed`) are re-placed at
       the time the rule and the window now imply (engine/reminders/replan.py).
    3. The org is populated, as after an appointment change: a rule switched on, or the next kind
       of a rule that lost its first, gets its reminders now rather than at the scheduler's next
       pass (pass the scheduler's horizon, so that this pass covers what that one would).
    """
    change = QueueChange()
    if rule_ids:
        m, r, rk = messages, reminder_rules, reminder_rule_kinds
        rule_off = exists().where(r.c.id == m.c.rule_id, r.c.org_id == oid, r.c.active == false())
        kind_gone = not_(exists().where(rk.c.rule_id == m.c.rule_id, rk.c.org_id == oid,
                                        rk.c.kind == m.c.channel_kind))
        stale = and_(m.c.rule_id.in_(list(rule_ids)), or_(rule_off, kind_gone))
        # `claimed` is safe to cancel too: the worker moves a row to `sending` only from `claimed`
        # (a compare-and-set), so "switched off" stops even a reminder the scheduler just picked.
        cancelled = transition_where(
            conn, oid, stale, OPEN_STATUSES, "cancelled", "cancelled",
            values={"skip_reason": RULE_CHANGED, "lease_until": None,
                    "idempotency_key": m.c.idempotency_key + literal(f":{RULE_CHANGED}:") + cast(m.c.id, String)},
            detail={"reason": RULE_CHANGED},
        )
        change.cancelled = len(cancelled)
    replaced = replace_pending(conn, oid, None if window_changed else list(rule_ids))
    populated = populate_org(conn, oid, horizon=horizon)
    change.rescheduled = replaced.retimed  # what a person is told: only reminders whose time changed
    change.cancelled += populated.cancelled
    change.created = populated.planned
    change.skipped = replaced.skipped + populated.skipped
    return change


def write_rule_kinds(conn: Connection, oid: int, rule_id: int, kinds: Sequence[str]) -> None:
    """Replace a rule's channel kinds by `kinds`, in that order of preference."""
    conn.execute(delete(reminder_rule_kinds).where(reminder_rule_kinds.c.org_id == oid,
                                                  reminder_rule_kinds.c.rule_id == rule_id))
    for position, kind in enumerate(kinds):
        conn.execute(insert(reminder_rule_kinds).values(org_id=oid, rule_id=rule_id, kind=kind, position=position))
