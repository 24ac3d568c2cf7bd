"""The follow-up runtime: claim due enrollments, sweep lost claims, and `advance()`, the one
function that moves enrollments.

The life of a step: the scheduler claims enrollments whose `next_eval_at` has come (a lease,
the revision bumped) and hands `[id, revision]` pairs, a claim at a time, to the
`advance_enrollments` actor. `advance` reads the claim's enrollments and everything their nodes
read (one query per table), runs each current node (`nodes.decide`, which may call the AI) and
then, in one transaction, writes each enrollment's next node, clock, counters and follow-up
outbox row, each guarded by its own compare-and-set on (id, revision, status, node), and the
steps' events in one insert. An actor that runs twice, or a claim overtaken by a reply, finds
the revision moved on: a stale wake, recorded and otherwise ignored.

A claim's lease runs out in two ways, which the sweep tells apart by `claim_started_at` (set by
the actor as it begins, one statement per claim; cleared by each claim). A worker killed mid-step
started it: a failed attempt, backed off. A claim that never reached a worker (the broker was down,
lost it in a flush or restart, or held it past its lease) goes back to the queue at no cost, as a
claimed message does (engine/messaging/dispatch/claim.py); so does a claim the scheduler could not hand to
the broker at all, at once (`release_unhanded`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from sqlalchemy import func, select, tuple_, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.flows import lifecycle, nodes, replies
from engine.flows.entry import entry
from engine.flows.contact_events import record_contact_event
from engine.flows.conversation import floor
from engine.flows.ai.base import AI
from engine.flows.ai.factory import ai_for
from engine.flows.facts import humans_holding
from engine.flows.versions import graph_of
from engine.queue.inbox import open_inbox_item
from engine.store.models import agents, appointments, contacts, enrollments, flow_pointers, inbound_messages, orgs
from engine.queue.outbox import enqueue
from engine.reminders.populate import plan_new
from engine.store.runtime import Runtime
from engine.tenants.webhooks import events as webhooks

log = logging.getLogger(__name__)

#: Node failures back off this much, attempt by attempt; one more failure and the run is dead.
BACKOFF = (timedelta(seconds=30), timedelta(minutes=1), timedelta(minutes=5), timedelta(minutes=15),
           timedelta(hours=1))
#: Steps one actor run may chain while the next node is due at once (trigger → condition →
#: action), so a run does not wait a scheduler pass per instantaneous node.
MAX_HOPS = 10
#: A follow-up that the sending window holds back for longer than this is no longer useful.
FOLLOWUP_TTL = timedelta(days=2)
FOLLOWUP_PURPOSE = "followup"


@dataclass(frozen=True)
class Step:
    """What one `advance` did: the step's status (ok, skipped, failed, waiting, stale, …), its
    reason code, and the revision to continue with when the next node is due at once."""

    status: str
    reason: str
    continue_with: int | None = None


def claim_due(rt: Runtime, *, limit: int, max_in_flight: int | None = None) -> list[tuple[int, int]]:
    """Claim up to `limit` due enrollments (all orgs) with a lease; returns (id, revision) pairs.
    With `max_in_flight`, no more than that many are leased at once: a claim waits in the broker
    while its lease runs (one that runs out before a worker starts it is swept back, free)."""
    now = clock.now()
    with rt.db.begin() as conn:
        if max_in_flight is not None:
            in_flight = conn.execute(select(func.count()).select_from(enrollments)
                                     .where(enrollments.c.lease_until.is_not(None))).scalar_one()
            limit = min(limit, max(max_in_flight - in_flight, 0))
            if limit == 0:
                return []
        due = (
            select(enrollments.c.id)
            .where(enrollments.c.status.in_(lifecycle.CLOCKED), enrollments.c.next_eval_at <= now,
                   enrollments.c.lease_until.is_(None))
            .order_by(enrollments.c.next_eval_at, enrollments.c.id)
            .limit(limit)
        )
        if conn.dialect.name == "postgresql":
            due = due.with_for_update(skip_locked=True)
        # A locking CTE runs once (an IN subquery with SKIP LOCKED may run per row; see dispatch).
        due_cte = due.cte("due")
        rows = conn.execute(
            update(enrollments)
            .where(enrollments.c.id.in_(select(due_cte.c.id)), enrollments.c.lease_until.is_(None))
            .values(lease_until=now + rt.settings.lease, revision=enrollments.c.revision + 1, claim_started_at=None)
            .returning(enrollments.c.id, enrollments.c.revision, enrollments.c.next_eval_at)
        ).all()
    return [(row.id, row.revision) for row in sorted(rows, key=lambda r: (r.next_eval_at, r.id))]


class Swept(NamedTuple):
    """What one sweep did with the claims whose lease ran out."""

    #: Steps a worker started and did not finish: a failed attempt each.
    lost: int
    #: Claims no worker started: back in the queue, due as before, attempts unchanged.
    requeued: int


def sweep_lost(rt: Runtime, *, limit: int | None = None) -> Swept:
    """Claims whose lease ran out. A step the actor started (its worker died mid-step) counts as a
    failed attempt; a claim no actor started goes back to the queue free, with a `requeued` event.
    With `limit`, at most that many per call: one transaction holds the row locks of all it sweeps."""
    now = clock.now()
    lost = 0
    with rt.db.begin() as conn:
        query = (select(enrollments).where(enrollments.c.status.in_(lifecycle.CLOCKED), enrollments.c.lease_until < now)
                 .order_by(enrollments.c.lease_until, enrollments.c.id))
        rows = conn.execute(query.limit(limit) if limit is not None else query).all()
        journal = lifecycle.Journal()
        unstarted = [(row.id, row.revision) for row in rows if row.claim_started_at is None]
        # An actor that starts one of them meanwhile wins: the hand-back skips a started claim.
        requeued = _hand_back(conn, unstarted, unstarted_only=True)
        for row in requeued:
            journal.add(row.org_id, row.id, "requeued", f"requeued:{row.revision - 1}", node_id=row.current_node_id,
                        at=now, payload=dict(reason="claim_not_started"))
        for row in rows:
            if row.claim_started_at is not None and _fail(conn, journal, row, now, reason="claim_expired",
                                                          kind=_node_type(conn, row), llm_calls=0, params={}):
                lost += 1
        journal.flush(conn)
    if lost:
        log.warning("lost enrollment claims swept", extra={"count": lost})
    if requeued:
        log.warning("enrollment claims no worker started put back in the queue", extra={"count": len(requeued)})
    return Swept(lost=lost, requeued=len(requeued))


def release_unhanded(rt: Runtime, claims: Sequence[Sequence[int]]) -> int:
    """Put back at once, free, claims the scheduler could not hand to the broker (its enqueue
    failed): still due, no longer leased, attempts unchanged. A claim an actor has started (its
    message did reach the broker after all) keeps its lease. Returns how many were released."""
    pairs = [(int(pair[0]), int(pair[1])) for pair in claims]
    if not pairs:
        return 0
    with rt.db.begin() as conn:
        return len(_hand_back(conn, pairs, unstarted_only=True))


def start_claims(rt: Runtime, claims: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The actor begins on these claims: mark them started, with a fresh lease for the work (the
    time a claim waited in the broker does not count against it). One statement for the claim;
    from here, a lease that runs out is a failed attempt. Returns the claims to work on: all of
    them, unless that statement fails; then each is marked alone and one whose row refuses the
    write is left to the sweep (never started: back in the queue, free), not its claim-mates."""
    if not claims:
        return []
    now = clock.now()

    def mark(some: Sequence[tuple[int, int]]) -> None:
        with rt.db.begin() as conn:
            conn.execute(update(enrollments).where(tuple_(enrollments.c.id, enrollments.c.revision).in_(list(some)))
                         .values(claim_started_at=now, lease_until=now + rt.settings.lease))

    try:
        mark(claims)
        return list(claims)
    except Exception:
        log.exception("starting a claim together failed; starting its enrollments one by one",
                      extra={"enrollments": len(claims)})
    started = []
    for claim in claims:
        try:
            mark([claim])
        except Exception:
            log.exception("starting a claim failed", extra={"enrollment_id": claim[0]})
        else:
            started.append(claim)
    return started


def _hand_back(conn: Connection, claims: Sequence[tuple[int, int]], *, unstarted_only: bool = False) -> list[Any]:
    """Drop the lease of these claims (id, revision), still due, in one statement; the revision
    moves on, so a message of theirs still in the broker finds a stale wake. Returns the rows."""
    if not claims:
        return []
    where = [tuple_(enrollments.c.id, enrollments.c.revision).in_(list(claims))]
    if unstarted_only:
        where.append(enrollments.c.claim_started_at.is_(None))
    return conn.execute(update(enrollments).where(*where)
                        .values(lease_until=None, revision=enrollments.c.revision + 1)
                        .returning(enrollments.c.id, enrollments.c.org_id, enrollments.c.current_node_id,
                                   enrollments.c.revision)).all()


class _Heartbeat:
    """Keeps a claim's leases while the actor works on it. A claim's reads and nodes (an agenda
    search per run, a model's answer per run) can outlast one lease on a busy machine; the sweep
    would then count every run of the claim a lost step while the worker is still on it, and the
    next claim the same: a claim that never ends. So, every third of a lease, the leases of the
    claim's runs are pushed on, without moving their revision (a stale wake stays stale)."""

    def __init__(self, rt: Runtime, claims: Sequence[tuple[int, int]]) -> None:
        self.rt, self.claims = rt, list(claims)
        self.every = rt.settings.lease / 3
        self.last = clock.now()

    def beat(self) -> None:
        """Renew the leases if a third of a lease has gone by since the last renewal."""
        if not self.claims or clock.now() - self.last < self.every:
            return
        self.last = clock.now()
        try:
            with self.rt.db.begin() as conn:
                conn.execute(update(enrollments)
                             .where(tuple_(enrollments.c.id, enrollments.c.revision).in_(self.claims),
                                    enrollments.c.lease_until.is_not(None))
                             .values(lease_until=clock.now() + self.rt.settings.lease))
        except Exception:  # the step goes on; at worst its lease runs out as before
            log.exception("renewing a claim's leases failed", extra={"enrollments": len(self.claims)})


def _node_type(conn: Connection, row: Any) -> str:
    return graph_of(conn, row.org_id, row.version_id).type(row.current_node_id)


def _by_key(conn: Connection, table: Any, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], Any]:
    """Rows of an org-scoped table by (org_id, id), in one query for the whole claim."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    rows = conn.execute(select(table).where(tuple_(table.c.org_id, table.c.id).in_(wanted)))
    return {(row.org_id, row.id): row for row in rows}


def _snapshots(conn: Connection, rows: Sequence[Any], now: datetime, egress: Any = None) -> dict[int, nodes.Snapshot]:
    """What the nodes read for each claimed enrollment: one query per table for all of them, not
    five per enrollment (the round trips were most of a step's cost, see docs/benchmarks-history.md,
    "Follow-up flows")."""
    def keys(column: str) -> list[tuple[int, int]]:
        return [(row.org_id, getattr(row, column)) for row in rows if getattr(row, column) is not None]

    org_rows = {row.id: row for row in conn.execute(select(orgs).where(orgs.c.id.in_({r.org_id for r in rows})))}
    people = _by_key(conn, contacts, keys("contact_id"))
    pointers = _by_key(conn, flow_pointers, keys("pointer_id"))
    booked = _by_key(conn, appointments, keys("appointment_id"))
    replies = _by_key(conn, inbound_messages, keys("pending_inbound_id"))
    staff = _by_key(conn, agents, keys("agent_id"))
    held = humans_holding(conn, keys("contact_id"))
    out = {}
    for row in rows:
        org_id = row.org_id
        out[row.id] = nodes.Snapshot(
            enrollment=row, graph=graph_of(conn, org_id, row.version_id), pointer=pointers[(org_id, row.pointer_id)],
            org=org_rows[org_id], contact=people[(org_id, row.contact_id)],
            appointment=booked.get((org_id, row.appointment_id)), reply=replies.get((org_id, row.pending_inbound_id)),
            agent=staff.get((org_id, row.agent_id)), now=now, human=(org_id, row.contact_id) in held, egress=egress)
    return out


def advance(rt: Runtime, claims: Sequence[tuple[int, int]], *,
            ai: Callable[[Any], AI] | None = None) -> dict[int, Step]:
    """Move each claimed enrollment (id, revision) one node, at most once for its claim.

    The reads for the whole claim come first (one query per table, then each node's own), then,
    with the connection released, the AI calls the nodes asked for (a model that takes its
    whole deadline holds no transaction, nor a pooled connection), then one transaction writes
    every step, each guarded by its own compare-and-set.
    If that transaction fails, the steps are written again one by one, so one
    enrollment's bad write never costs the others theirs; a step that fails alone leaves its
    lease to expire (the sweep counts a failed attempt)."""
    now = clock.now()
    make_ai = ai or (lambda agent: ai_for(agent, rt.keyring, egress=rt.settings.egress))
    steps: dict[int, Step] = {}
    stale: list[tuple[Any, int]] = []
    outcomes: list[tuple[nodes.Snapshot, int, nodes.Decision | nodes.Ask]] = []
    with rt.db.connect() as conn:
        ids = sorted({int(enrollment_id) for enrollment_id, _ in claims})
        found = {row.id: row for row in conn.execute(select(enrollments).where(enrollments.c.id.in_(ids)))}
        live = []
        for enrollment_id, revision in claims:
            row = found.get(enrollment_id)
            if row is None:
                steps[enrollment_id] = Step("stale", "stale_wake")
            elif row.revision != revision or row.lease_until is None or row.status not in lifecycle.CLOCKED:
                stale.append((row, revision))
            else:
                live.append((row, revision))
        snaps = _snapshots(conn, [row for row, _ in live], now, rt.settings.egress) if live else {}
        heartbeat = _Heartbeat(rt, [(row.id, revision) for row, revision in live])
        for row, revision in live:
            heartbeat.beat()
            snap = snaps[row.id]
            try:
                outcome: nodes.Decision | nodes.Ask = nodes.decide(conn, snap, make_ai(snap.agent))
            except Exception as exc:  # a bug in a node must back off like any failure, not wedge the run
                outcome = _crashed(row.id, exc)
            outcomes.append((snap, revision, outcome))
        conn.rollback()
    # The connection is back in the pool: the model's answer, however slow, holds no transaction.
    decided: list[tuple[nodes.Snapshot, int, nodes.Decision]] = []
    for snap, revision, outcome in outcomes:
        if isinstance(outcome, nodes.Ask):
            heartbeat.beat()
            try:
                outcome = outcome.run()
            except Exception as exc:
                outcome = _crashed(snap.enrollment.id, exc)
        decided.append((snap, revision, outcome))

    def write(conn: Connection, stale: Sequence[tuple[Any, int]],
              items: Sequence[tuple[nodes.Snapshot, int, nodes.Decision]]) -> dict[int, Step]:
        journal = lifecycle.Journal()
        written: dict[int, Step] = {}
        for row, revision in stale:
            _record_stale(conn, journal, row, revision, llm_calls=0)
            written[row.id] = Step("stale", "stale_wake")
        for snap, revision, decision in items:
            written[snap.enrollment.id] = _apply(conn, journal, rt, snap, revision, decision, now)
        journal.flush(conn)
        # The planner places every new outbox row of the org: once per org and claim.
        for org_id in sorted({snap.enrollment.org_id for snap, _, decision in items if decision.send is not None}):
            plan_new(conn, org_id)
        return written

    try:
        with rt.db.begin() as conn:
            steps.update(write(conn, stale, decided))
    except Exception:
        # (The metrics already counted the rolled-back events; the retry below counts them again.)
        log.exception("advancing a claim together failed; writing its steps one by one",
                      extra={"enrollments": len(claims)})
        alone = [(row.id, [(row, revision)], []) for row, revision in stale]
        alone += [(item[0].enrollment.id, [], [item]) for item in decided]
        for enrollment_id, one_stale, one in alone:
            try:
                with rt.db.begin() as conn:
                    steps.update(write(conn, one_stale, one))
            except Exception:  # its lease expires and the sweep counts a failed attempt
                log.exception("advance crashed", extra={"enrollment_id": enrollment_id})
    return steps


def _crashed(enrollment_id: int, exc: Exception) -> nodes.Decision:
    log.error("flow node crashed", extra={"enrollment_id": enrollment_id, "error": type(exc).__name__})
    return nodes.Decision("failed", "node_error", failed=True, params={"error": type(exc).__name__})


def _record_stale(conn: Connection, journal: lifecycle.Journal, row: Any, revision: int, *, llm_calls: int) -> None:
    if llm_calls:
        conn.execute(update(enrollments).where(enrollments.c.org_id == row.org_id, enrollments.c.id == row.id)
                     .values(llm_calls=enrollments.c.llm_calls + llm_calls))
    journal.add(row.org_id, row.id, "step", f"stale:{revision}", node_id=row.current_node_id,
                payload=lifecycle.step_payload(kind="wake", status="stale", reason="stale_wake", llm_calls=llm_calls))


def _cas(row: Any, revision: int) -> tuple[Any, ...]:
    # No lease predicate: every write that drops a lease bumps the revision, so the revision says
    # the claim still holds; `lease_until IS NOT NULL` made PostgreSQL pick the partial
    # `enrollments_leased` index (its statistics say few rows are leased) and scan every claim.
    return (enrollments.c.org_id == row.org_id, enrollments.c.id == row.id, enrollments.c.revision == revision,
            enrollments.c.status == row.status, enrollments.c.current_node_id == row.current_node_id)


def _hold(conn: Connection, row: Any, revision: int) -> bool:
    """Whether this claim still holds the run, locking its row (PostgreSQL) until the step commits."""
    query = select(enrollments.c.id).where(*_cas(row, revision))
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return conn.execute(query).first() is not None


def _apply(conn: Connection, journal: lifecycle.Journal, rt: Runtime, snap: nodes.Snapshot, revision: int,
           decision: nodes.Decision, now: datetime) -> Step:
    row = snap.enrollment
    kind = snap.graph.type(row.current_node_id)
    if decision.act is not None:
        # The effect (a booking, a confirmation…) and the step commit together or not at all, and
        # only the claim that still holds the run makes it: a second actor finds a stale wake.
        if not _hold(conn, row, revision):
            _record_stale(conn, journal, row, revision, llm_calls=decision.llm_calls)
            return Step("stale", "stale_wake")
        decision = decision.act(conn)
    if decision.failed:
        if not _fail(conn, journal, row, now, reason=decision.reason, kind=kind, llm_calls=decision.llm_calls,
                     params=decision.params, revision=revision):
            _record_stale(conn, journal, row, revision, llm_calls=decision.llm_calls)
            return Step("stale", "stale_wake")
        return Step("failed", decision.reason)
    values: dict[str, Any] = {
        "llm_calls": enrollments.c.llm_calls + decision.llm_calls, "attempts": 0, "last_error": None,
        "updated_at": now, "revision": enrollments.c.revision + 1, **decision.values,
    }
    if decision.consumed_reply:
        values["pending_inbound_id"] = None
    target = decision.next_node
    until = None
    continue_with = None
    ended = decision.end
    if ended is None and target is None and not (decision.stay or decision.wait_floor):
        ended = ("dead", None)  # a published graph always has the edge; an old one may not
        decision = nodes.Decision("failed", "missing_edge", llm_calls=decision.llm_calls)
    if ended is None and row.steps + 1 > snap.pointer.max_steps:
        ended, decision = ("completed", "exhausted"), nodes.Decision("skipped", "max_steps",
                                                                     llm_calls=decision.llm_calls)
    step_key = f"step:{revision}"
    if ended is None and decision.wait_floor:
        # The floor is another run's: stay, look again soon, and say so once per visit.
        target = row.current_node_id
        until = now + floor.RECHECK
        values.update(next_eval_at=until, lease_until=None)
        step_key = f"floor:{row.node_entered_at.isoformat() if row.node_entered_at else revision}"
    elif ended is None and decision.stay:
        # The node asked again: the run stays on it and waits its grace for the next reply.
        target = row.current_node_id
        until = now + timedelta(minutes=snap.graph.config(target)["grace_minutes"])
        values.update(steps=enrollments.c.steps + 1, status="waiting_reply", next_eval_at=until, lease_until=None,
                      pending_inbound_id=None)
    elif ended is None:
        assert target is not None
        plan = decision.values.get("timing_plan", row.timing_plan)
        start = entry(snap.graph, target, now, plan)
        values.update(current_node_id=target, node_entered_at=now, steps=enrollments.c.steps + 1,
                      status=start.status, next_eval_at=start.next_eval_at)
        if decision.keep_reply and snap.reply is not None:
            # The next node reads the reply the run holds: a node that waits for one reads it now.
            if start.status == "waiting_reply":
                start = dataclasses.replace(start, next_eval_at=now)
            values.update(next_eval_at=start.next_eval_at)
        else:
            values.update(pending_inbound_id=None)
        if start.status == "completed":
            values.update(outcome=start.outcome, ended_at=now, lease_until=None)
        elif start.next_eval_at is not None and start.next_eval_at <= now:
            # Due at once: keep the claim and go on in this actor run.
            values.update(lease_until=now + rt.settings.lease)
            continue_with = revision + 1
        else:
            values.update(lease_until=None)
            until = start.next_eval_at
    else:
        status, outcome = ended
        values.update(status=status, outcome=outcome, next_eval_at=None, lease_until=None, ended_at=now,
                      cancel_reason=decision.reason if status != "completed" else None, pending_inbound_id=None)
    if decision.send is not None:
        values.update(messages_sent=enrollments.c.messages_sent + 1, last_outbound_at=now)
    moved = conn.execute(update(enrollments).where(*_cas(row, revision)).values(**values)).rowcount
    if not moved:
        _record_stale(conn, journal, row, revision, llm_calls=decision.llm_calls)
        return Step("stale", "stale_wake")
    if values.get("status") in lifecycle.TERMINAL:  # the clinic's system hears that the run ended
        webhooks.run_ended(conn, row.org_id, row.id, status=values["status"], outcome=values.get("outcome"),
                           reason=values.get("cancel_reason") or (decision.reason if ended else "ended"))
    if decision.send is not None:
        _enqueue(conn, snap, decision.send, now)
    if decision.then is not None:
        decision.then(conn)
    if snap.reply is not None and "pending_inbound_id" in values:  # the run let go of the reply it held
        for inbound_id in (snap.reply.id, *decision.also_read):
            replies.reply_read(conn, row, inbound_id, reason=decision.reason, label=decision.params.get("class"),
                               next_node=target if ended is None else None)
    if decision.handoff:
        # In this step's transaction: the run (and the contact's others) follow the hand-off policy.
        record_contact_event(conn, org_id=row.org_id, contact_id=row.contact_id, type="handoff_started")
        open_inbox_item(conn, row.org_id, "handoff_requested", f"enrollment:{row.id}:handoff:{revision}",
                        enrollment_id=row.id, detail="the patient asked for a person")
    journal.add(row.org_id, row.id, "step", step_key, node_id=row.current_node_id, at=now,
                payload=lifecycle.step_payload(kind=kind, status=decision.status, reason=decision.reason,
                                               next_node=target if ended is None else None, until=until,
                                               llm_calls=decision.llm_calls, params=decision.params,
                                               exit=decision.exit if ended is None and not decision.stay else None))
    if ended is not None and ended[0] == "dead":
        _open_dead_item(conn, row, decision.reason)
    return Step(decision.status, decision.reason, continue_with)


def _enqueue(conn: Connection, snap: nodes.Snapshot, send: nodes.Send, now: datetime) -> None:
    row = snap.enrollment
    payload = {"text": send.text} if send.text else None
    enqueue(
        conn, org_id=row.org_id, contact_id=row.contact_id, channel_kind=send.channel_kind, purpose=FOLLOWUP_PURPOSE,
        idempotency_key=f"enrollment:{row.id}:node:{row.current_node_id}:attempt:{row.steps}",
        template_key=send.template_key, payload=payload, appointment_id=row.appointment_id, enrollment_id=row.id,
        respect_window=True, expires_at=now + FOLLOWUP_TTL,
    )


def _fail(conn: Connection, journal: lifecycle.Journal, row: Any, now: datetime, *, reason: str, kind: str,
          llm_calls: int,
          params: dict[str, Any], revision: int | None = None) -> bool:
    """A failed attempt: back off, or `dead` with a Pendências item after the last one."""
    attempts = row.attempts + 1
    where = _cas(row, revision) if revision is not None else (  # the revision says which lease (see _cas)
        enrollments.c.org_id == row.org_id, enrollments.c.id == row.id, enrollments.c.revision == row.revision)
    common = {"attempts": attempts, "last_error": reason, "lease_until": None, "updated_at": now,
              "llm_calls": enrollments.c.llm_calls + llm_calls, "revision": enrollments.c.revision + 1}
    if attempts > len(BACKOFF) or attempts > row.max_attempts:
        values = {**common, "status": "dead", "next_eval_at": None, "ended_at": now, "cancel_reason": reason}
        until = None
    else:
        until = now + BACKOFF[attempts - 1]
        values = {**common, "next_eval_at": until}
    if not conn.execute(update(enrollments).where(*where).values(**values)).rowcount:
        return False
    if until is None:
        webhooks.run_ended(conn, row.org_id, row.id, status="dead", outcome=None, reason=reason)
    key_revision = revision if revision is not None else f"lost:{row.revision}"
    journal.add(row.org_id, row.id, "step", f"step:{key_revision}", node_id=row.current_node_id, at=now,
                payload=lifecycle.step_payload(kind=kind, status="failed" if until is None else "deferred",
                                               reason=reason, until=until, llm_calls=llm_calls,
                                               params={**params, "attempt": attempts}))
    if until is None:
        _open_dead_item(conn, row, reason)
    return True


def _open_dead_item(conn: Connection, row: Any, reason: str) -> None:
    open_inbox_item(conn, row.org_id, "enrollment_dead", f"enrollment:{row.id}:dead", enrollment_id=row.id,
                    detail=reason)


def advance_claimed(rt: Runtime, pairs: Sequence[Sequence[int]], *, ai: Callable[[Any], AI] | None = None) -> int:
    """The actor's body: mark the claims started, then advance the claimed enrollments together,
    chaining the steps that are due at once (up to MAX_HOPS per enrollment). Returns the steps taken."""
    claims = start_claims(rt, [(int(pair[0]), int(pair[1])) for pair in pairs])
    taken = 0
    for _hop in range(MAX_HOPS):
        if not claims:
            return taken
        done = advance(rt, claims, ai=ai)
        taken += len(done)
        claims = [(enrollment_id, step.continue_with) for enrollment_id, step in done.items()
                  if step.continue_with is not None]
    _release(rt, claims)
    return taken


def _release(rt: Runtime, claims: Sequence[tuple[int, int]]) -> None:
    """Hand runs that used their hops back to the scheduler (still due, no longer claimed)."""
    if claims:
        with rt.db.begin() as conn:
            _hand_back(conn, claims)

