"""Reminder rules as the domain sees them: what a change to a rule does to the queue."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import String, and_, cast, delete, exists, false, insert, literal, not_, or_
from sqlalchemy.engine import Connection

from engine.models import OPEN_STATUSES, messages, reminder_rule_kinds, reminder_rules
from engine.outbox import transition_where
from engine.populate import DEFAULT_HORIZON, PopulateResult, populate_org

#: Why a reminder was cancelled because its rule was switched off or lost that channel kind.
RULE_CHANGED = "rule_changed"


def reflect_rule_changes(conn: Connection, oid: int, rule_ids: Sequence[int],
                         horizon: timedelta = DEFAULT_HORIZON) -> PopulateResult:
    """Make the queue match the rules at once, in the caller's transaction.

    Open reminders of a rule that was switched off, or of a kind the rule no longer has, are
    cancelled (populate never does this by itself, and dispatch does not look at the rule again),
    giving up their idempotency key so that switching the rule back on queues them anew. Then the
    org is populated, as after an appointment change: a rule switched on, or the next kind of a
    rule that lost its first, gets its reminders now rather than at the scheduler's next pass
    (pass the scheduler's horizon, so that this pass covers the appointments that one would).
    """
    result = PopulateResult()
    if rule_ids:
        m, r, rk = messages, reminder_rules, reminder_rule_kinds
        rule_off = exists().where(r.c.id == m.c.rule_id, r.c.org_id == oid, r.c.active == false())
        kind_gone = not_(exists().where(rk.c.rule_id == m.c.rule_id, rk.c.org_id == oid,
                                        rk.c.kind == m.c.channel_kind))
        stale = and_(m.c.rule_id.in_(list(rule_ids)), or_(rule_off, kind_gone))
        # `claimed` is safe to cancel too: the worker moves a row to `sending` only from `claimed`.
        cancelled = transition_where(
            conn, oid, stale, OPEN_STATUSES, "cancelled", "cancelled",
            values={"skip_reason": RULE_CHANGED, "lease_until": None,
                    "idempotency_key": m.c.idempotency_key + literal(f":{RULE_CHANGED}:") + cast(m.c.id, String)},
            detail={"reason": RULE_CHANGED},
        )
        result.cancelled = len(cancelled)
    populated = populate_org(conn, oid, horizon=horizon)
    result.add(populated)
    return result


def write_rule_kinds(conn: Connection, oid: int, rule_id: int, kinds: Sequence[str]) -> None:
    """Replace a rule's channel kinds by `kinds`, in that order of preference."""
    conn.execute(delete(reminder_rule_kinds).where(reminder_rule_kinds.c.org_id == oid,
                                                  reminder_rule_kinds.c.rule_id == rule_id))
    for position, kind in enumerate(kinds):
        conn.execute(insert(reminder_rule_kinds).values(org_id=oid, rule_id=rule_id, kind=kind, position=position))
