"""The follow-up runtime: claim due enrollments, sweep lost claims, and `advance()`, the one
function that moves enrollments.

The life of a step: the scheduler claims enrollments whose `next_eval_at` has come (a lease,
the revision bumped) and hands `[id, revision]` pairs, a claim at a time, to the
`advance_enrollments` actor. `advance` reads the claim's enrollments and everything their nodes
read (one query per table), runs each current node (`nodes.decide`, which may call the AI) and
then, in one transaction, writes each enrollment's next node, clock, counters and follow-up
outbox row, each guarded by its own compare-and-set on (id, revision, status, node): the plain
moves of the whole claim in one statement on PostgreSQL (`_write_moves`), and the steps' events in
one insert. An actor that runs twice, or a claim overtaken by a reply, finds
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
import functools
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from sqlalchemy import JSON, bindparam, func, select, text, update
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.elements import ClauseElement, TextClause

from engine.core import clock
from engine.flows import lifecycle, nodes, replies
from engine.flows.entry import entry
from engine.flows.contact_events import record_contact_event
from engine.flows.conversation import floor
from engine.flows.ai.base import AI
from engine.flows.ai.factory import ai_for
from engine.flows.facts import humans_holding
from engine.flows.reach import Reach
from engine.flows.versions import graph_of
from engine.queue.inbox import open_inbox_item
from engine.store.models import agents, appointments, contacts, enrollments, flow_pointers, inbound_messages, orgs
from engine.queue.outbox import Outgoing, enqueue_many
from engine.reminders.populate import plan_new
from engine.reminders.windows import policy_for
from engine.store.db import require_aware
from engine.store.dialect import claim_first_due, in_pairs, in_values
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
        rows = conn.execute(_claim_statement(conn.dialect.name == "postgresql"),
                            {"now": now, "limit": limit, "claim_lease_until": now + rt.settings.lease}).all()
    return [(row.id, row.revision) for row in sorted(rows, key=lambda r: (r.next_eval_at, r.id))]


def claim_replied(rt: Runtime, org_id: int, inbound_id: int) -> list[tuple[int, int]]:
    """Claim, as `claim_due` does, the org's runs that the reply `inbound_id` made due now, for the
    worker that read it to advance them at once (engine/messaging/turn.py); returns (id,
    revision) pairs. Nothing when the reply is not theirs to read yet (an `ask` waits the org's
    debounce) or a scheduler pass claimed them first: the same compare-and-set decides."""
    now = clock.now()
    with rt.db.begin() as conn:
        rows = conn.execute(_claim_statement(conn.dialect.name == "postgresql", replied=True),
                            {"now": now, "limit": MAX_REPLIED, "claim_lease_until": now + rt.settings.lease,
                             "of_org_id": org_id, "of_inbound_id": inbound_id}).all()
    return [(row.id, row.revision) for row in sorted(rows, key=lambda r: (r.next_eval_at, r.id))]


#: The runs one reply may make due at once (contacts sharing a number, each with a live run).
MAX_REPLIED = 20


@functools.lru_cache(maxsize=4)
def _claim_statement(postgresql: bool, *, replied: bool = False) -> Any:
    """`claim_due`'s statement, built once (the scheduler claims several times a second): lease
    up to `:limit` enrollments due at `:now` until `:claim_lease_until`, bumping their revision.
    With `replied`, only the runs of `:of_org_id` holding the reply `:of_inbound_id` (`claim_replied`)."""
    only = (enrollments.c.org_id == bindparam("of_org_id"),
            enrollments.c.pending_inbound_id == bindparam("of_inbound_id")) if replied else ()
    return claim_first_due(
        enrollments, due=(*only, enrollments.c.status.in_(lifecycle.CLOCKED),
                          enrollments.c.next_eval_at <= bindparam("now"), enrollments.c.lease_until.is_(None)),
        order_by=(enrollments.c.next_eval_at, enrollments.c.id), still=enrollments.c.lease_until.is_(None),
        values={"lease_until": bindparam("claim_lease_until"), "revision": enrollments.c.revision + 1,
                "claim_started_at": None},
        returning=(enrollments.c.id, enrollments.c.revision, enrollments.c.next_eval_at), postgresql=postgresql)


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
        listeners = webhooks.Listeners(conn)  # a run that dies here tells the clinic: one read per org
        for row in rows:
            if row.claim_started_at is not None and _fail(conn, journal, row, now, reason="claim_expired",
                                                          kind=_node_type(conn, row), llm_calls=0, params={},
                                                          listeners=listeners):
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
            conn.execute(update(enrollments).where(_claimed(conn, some))
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


def _claimed(conn: Connection, claims: Iterable[tuple[int, int]]) -> Any:
    """The enrollments of these claims (id, revision) at that revision. One statement text for
    any claim size: an IN list of 200 pairs was rendered again, and split into placeholders again
    by psycopg, for every claim (a tenth of a worker's samples in bench/flows.py --py-spy)."""
    return in_pairs(conn, (enrollments.c.id, enrollments.c.revision), ((int(i), int(r)) for i, r in claims))


def _hand_back(conn: Connection, claims: Sequence[tuple[int, int]], *, unstarted_only: bool = False) -> list[Any]:
    """Drop the lease of these claims (id, revision), still due, in one statement; the revision
    moves on, so a message of theirs still in the broker finds a stale wake. Returns the rows."""
    if not claims:
        return []
    where = [_claimed(conn, claims)]
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
                             .where(_claimed(conn, self.claims),
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
    # By primary key, one array of ids (one statement text for any claim): pairs joined from
    # arrays made the planner hash every contact of the table against a claim's 200.
    rows = conn.execute(select(table).where(in_values(conn, table.c.id, [key[1] for key in wanted]),
                                            in_values(conn, table.c.org_id, {key[0] for key in wanted})))
    found = {(row.org_id, row.id): row for row in rows}
    return {key: found[key] for key in wanted if key in found}


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
    reach = Reach((key[0], contact) for key, contact in people.items())
    out = {}
    for row in rows:
        org_id = row.org_id
        out[row.id] = nodes.Snapshot(
            enrollment=row, graph=graph_of(conn, org_id, row.version_id), pointer=pointers[(org_id, row.pointer_id)],
            org=org_rows[org_id], contact=people[(org_id, row.contact_id)],
            appointment=booked.get((org_id, row.appointment_id)), reply=replies.get((org_id, row.pending_inbound_id)),
            agent=staff.get((org_id, row.agent_id)), now=now, human=(org_id, row.contact_id) in held, egress=egress,
            reach=reach)
    return out


def advance(rt: Runtime, claims: Sequence[tuple[int, int]], *,
            ai: Callable[[Any], AI] | None = None) -> dict[int, Step]:
    """Move each claimed enrollment (id, revision) one node, at most once for its claim.

    The reads for the whole claim come first (one query per table, then each node's own), then,
    with the connection released, the AI calls the nodes asked for (a model that takes its
    whole deadline holds no transaction, nor a pooled connection), then one transaction writes
    every step, each guarded by its own compare-and-set: the steps with an effect, a failure or a
    hand-off one by one, then the plain moves together (`_write_moves`), and what follows each
    move only once its compare-and-set held.
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
        found = {row.id: row for row in conn.execute(select(enrollments).where(in_values(conn, enrollments.c.id, ids)))}
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
        listeners = webhooks.Listeners(conn)
        outbox = _Outbox()
        written: dict[int, Step] = {}
        for row, revision in stale:
            _record_stale(conn, journal, row, revision, llm_calls=0)
            written[row.id] = Step("stale", "stale_wake")
        # Steps with an effect, a failure or consequences for other runs first, one by one; then
        # the plain moves (most steps) together, and what follows each one that moved.
        for snap, revision, decision in items:
            if _alone(decision):
                written[snap.enrollment.id] = _apply(conn, journal, rt, snap, revision, decision, now, listeners,
                                                     outbox)
        planned = [_plan(rt, snap, revision, decision, now) for snap, revision, decision in items
                   if not _alone(decision)]
        moved = _write_moves(conn, planned)
        for move in planned:
            row = move.snap.enrollment
            if row.id in moved:
                written[row.id] = _follow(conn, journal, move, now, listeners, outbox)
            else:
                _record_stale(conn, journal, row, move.revision, llm_calls=move.decision.llm_calls)
                written[row.id] = Step("stale", "stale_wake")
        outbox.flush(conn)
        journal.flush(conn)
        # The planner places every new outbox row of the org: once per org and claim, in the
        # sending window of the org row the claim's snapshots read (not read again).
        sending = {snap.enrollment.org_id: snap.org for snap, _, decision in items if decision.send is not None}
        for org_id in sorted(sending):
            plan_new(conn, org_id, policy=policy_for(sending[org_id]))
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
           decision: nodes.Decision, now: datetime, listeners: webhooks.Listeners | None,
           outbox: _Outbox) -> Step:
    """Write one step alone: its effect first when it has one (`act`), a failure's back-off, or
    the planned move under its own compare-and-set, then what follows the move."""
    row = snap.enrollment
    if decision.act is not None:
        # The effect (a booking, a confirmation…) and the step commit together or not at all, and
        # only the claim that still holds the run makes it: a second actor finds a stale wake.
        if not _hold(conn, row, revision):
            _record_stale(conn, journal, row, revision, llm_calls=decision.llm_calls)
            return Step("stale", "stale_wake")
        decision = decision.act(conn)
    if decision.failed:
        if not _fail(conn, journal, row, now, reason=decision.reason, kind=snap.graph.type(row.current_node_id),
                     llm_calls=decision.llm_calls, params=decision.params, revision=revision, listeners=listeners):
            _record_stale(conn, journal, row, revision, llm_calls=decision.llm_calls)
            return Step("stale", "stale_wake")
        return Step("failed", decision.reason)
    move = _plan(rt, snap, revision, decision, now)
    if not _write_moves(conn, [move]):
        _record_stale(conn, journal, row, revision, llm_calls=move.decision.llm_calls)
        return Step("stale", "stale_wake")
    return _follow(conn, journal, move, now, listeners, outbox)


def _alone(decision: nodes.Decision) -> bool:
    """Whether a step is written on its own, before the claim's plain moves: an effect on the
    clinic's records (`act`, which holds the row first), a failure's back-off, or a step whose
    consequences reach the contact's other runs (`then`: an opt-out ends them; a hand-off pauses
    them). Those runs may be claim-mates: written first, it leaves them a stale wake, never a
    move (and a follow-up queued) after the opt-out that ended them."""
    return decision.act is not None or decision.failed or decision.then is not None or decision.handoff


@dataclass
class _Move:
    """One step planned before it is written: the columns its compare-and-set sets, the counters
    it adds to (relative to the row: a stale wake may have added LLM calls meanwhile), and what
    its event and its follow-up read once the write moved the row."""

    snap: nodes.Snapshot
    revision: int
    decision: nodes.Decision
    values: dict[str, Any]
    increments: dict[str, int]
    target: str | None
    until: datetime | None
    ended: tuple[str, str | None] | None
    step_key: str
    continue_with: int | None

    @property
    def columns(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What the write sets and adds to: moves alike share one statement."""
        return tuple(sorted(self.values)), tuple(sorted(self.increments))


def _plan(rt: Runtime, snap: nodes.Snapshot, revision: int, decision: nodes.Decision, now: datetime) -> _Move:
    """What a step that moves the run (no failure, no effect left to run) writes. Reads nothing."""
    row = snap.enrollment
    values: dict[str, Any] = {"attempts": 0, "last_error": None, "updated_at": now, **decision.values}
    increments = {"llm_calls": decision.llm_calls, "revision": 1}
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
        increments["steps"] = 1
        values.update(status="waiting_reply", next_eval_at=until, lease_until=None, pending_inbound_id=None)
    elif ended is None:
        assert target is not None
        plan = decision.values.get("timing_plan", row.timing_plan)
        start = entry(snap.graph, target, now, plan)
        increments["steps"] = 1
        values.update(current_node_id=target, node_entered_at=now, status=start.status,
                      next_eval_at=start.next_eval_at)
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
        increments["messages_sent"] = 1
        values.update(last_outbound_at=now)
    return _Move(snap=snap, revision=revision, decision=decision, values=values, increments=increments,
                 target=target, until=until, ended=ended, step_key=step_key, continue_with=continue_with)


def _follow(conn: Connection, journal: lifecycle.Journal, move: _Move, now: datetime,
            listeners: webhooks.Listeners | None, outbox: _Outbox) -> Step:
    """What follows a step whose compare-and-set moved the row, in the step's transaction: the
    `run.ended` webhook, the follow-up's outbox row, the replies it let go of, the hand-off, the
    step's event and a dead run's Pendências item."""
    snap, decision, values, ended, target = move.snap, move.decision, move.values, move.ended, move.target
    row = snap.enrollment
    if values.get("status") in lifecycle.TERMINAL:  # the clinic's system hears that the run ended
        webhooks.run_ended(conn, row.org_id, row.id, status=values["status"], outcome=values.get("outcome"),
                           reason=values.get("cancel_reason") or (decision.reason if ended else "ended"),
                           listeners=listeners)
    if decision.send is not None:
        outbox.add(snap, decision.send, now)
    if decision.then is not None:
        # What `then` does may reach queued messages (an opt-out cancels the contact's): the
        # claim's follow-ups so far are in the outbox first, as they were queued first.
        outbox.flush(conn)
        decision.then(conn)
    if snap.reply is not None and "pending_inbound_id" in values:  # the run let go of the reply it held
        for inbound_id in (snap.reply.id, *decision.also_read):
            replies.reply_read(conn, row, inbound_id, reason=decision.reason, label=decision.params.get("class"),
                               next_node=target if ended is None else None)
    if decision.handoff:
        # In this step's transaction: the run (and the contact's others) follow the hand-off policy.
        record_contact_event(conn, org_id=row.org_id, contact_id=row.contact_id, type="handoff_started")
        open_inbox_item(conn, row.org_id, "handoff_requested", f"enrollment:{row.id}:handoff:{move.revision}",
                        enrollment_id=row.id, detail="the patient asked for a person")
    journal.add(row.org_id, row.id, "step", move.step_key, node_id=row.current_node_id, at=now,
                payload=lifecycle.step_payload(kind=snap.graph.type(row.current_node_id), status=decision.status,
                                               reason=decision.reason, next_node=target if ended is None else None,
                                               until=move.until, llm_calls=decision.llm_calls, params=decision.params,
                                               exit=decision.exit if ended is None and not decision.stay else None))
    if ended is not None and ended[0] == "dead":
        _open_dead_item(conn, row, decision.reason)
    return Step(decision.status, decision.reason, move.continue_with)


#: Moves per statement: the JSON of a claim's worth stays small.
_MOVES_PER_STATEMENT = 500


def _write_moves(conn: Connection, moves: Sequence[_Move]) -> set[int]:
    """Write planned steps, each under its own compare-and-set on (org_id, id, revision, status,
    node); returns the ids of the enrollments that moved (the others are stale wakes).

    On PostgreSQL, one `UPDATE enrollments … FROM jsonb_to_recordset(…) AS v … RETURNING id` per
    group of moves that set the same columns (`_moves_sql`): one statement for a claim's steps
    instead of one per enrollment (with the per-row statements, `bench/flows.py --inline` measured
    2.04 statements and 2.1 ms of CPU per wait → end advance; with this, 0.04 and 0.4 ms). SQLite has no such function: one UPDATE per step there, as on PostgreSQL
    for a move whose values hold SQL expressions."""
    moved: set[int] = set()
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[_Move]] = {}
    for move in moves:
        if conn.dialect.name == "postgresql" and not any(isinstance(v, ClauseElement) for v in move.values.values()):
            groups.setdefault(move.columns, []).append(move)
        else:
            row = move.snap.enrollment
            counters = {name: enrollments.c[name] + n for name, n in move.increments.items()}
            if conn.execute(update(enrollments).where(*_cas(row, move.revision))
                            .values(**move.values, **counters)).rowcount:
                moved.add(row.id)
    for (names, counted), group in groups.items():
        statement = _moves_sql(conn.dialect, names, counted)
        for at in range(0, len(group), _MOVES_PER_STATEMENT):
            some = group[at:at + _MOVES_PER_STATEMENT]
            rows = json.dumps([_move_row(m, names) for m in some], separators=(",", ":"))
            moved.update(conn.execute(statement, {"rows": rows, "ids": [m.snap.enrollment.id for m in some]})
                         .scalars())
    return moved


@functools.lru_cache(maxsize=256)
def _moves_sql(dialect: Dialect, names: tuple[str, ...], counted: tuple[str, ...]) -> TextClause:
    """The PostgreSQL statement that writes moves setting `names` and adding to `counted`:

        UPDATE enrollments SET <name> = v.set_<name>, <counter> = enrollments.<counter> + v.add_<counter>
        FROM jsonb_to_recordset(:rows) AS v(k_org_id bigint, …, set_<name> <its column's type>, …)
        WHERE enrollments.id = ANY(:ids) AND <each row's compare-and-set against v> RETURNING enrollments.id

    Why a JSON parameter and not `UPDATE … FROM (VALUES …)`: SQLAlchemy compiles a VALUES list
    of literal rows again for every claim (its bind parameters are part of the statement; that
    compile was most of a claim's CPU in bench/flows.py --inline-profile), and the driver binds
    each of its thousands of parameters. This text is the same for every claim of its columns
    (cached here, compiled once) and binds two parameters; the record's column list gives each
    value its column's type. JSON columns travel as their JSON text (`_move_row`), cast to
    jsonb: a None is JSON `null`, as the one-row UPDATE writes it. `enrollments.id = ANY(:ids)`
    keeps the planner on the primary key: without it, guessing few rows from the function, it
    may merge-join with the whole index, reading every enrollment up to the claim's highest id."""
    quote = dialect.identifier_preparer.quote
    c = enrollments.c

    def sql_type(name: str) -> str:
        return "text" if _is_json(name) else str(c[name].type.compile(dialect=dialect))

    record = [f"k_org_id {sql_type('org_id')}", f"k_id {sql_type('id')}", f"k_revision {sql_type('revision')}",
              f"k_status {sql_type('status')}", f"k_node {sql_type('current_node_id')}"]
    record += [f"set_{name} {sql_type(name)}" for name in names] + [f"add_{name} integer" for name in counted]
    sets = [f"{quote(name)} = " + (f"CAST(v.set_{name} AS jsonb)" if _is_json(name) else f"v.set_{name}")
            for name in names]
    sets += [f"{quote(name)} = enrollments.{quote(name)} + v.add_{name}" for name in counted]
    return text(
        f"UPDATE enrollments SET {', '.join(sets)} "
        f"FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS v({', '.join(record)}) "
        "WHERE enrollments.id = ANY(CAST(:ids AS bigint[])) AND enrollments.org_id = v.k_org_id "
        "AND enrollments.id = v.k_id AND enrollments.revision = v.k_revision AND enrollments.status = v.k_status "
        "AND enrollments.current_node_id = v.k_node RETURNING enrollments.id")


def _is_json(name: str) -> bool:
    return isinstance(enrollments.c[name].type, JSON)


def _move_row(move: _Move, names: Sequence[str]) -> dict[str, Any]:
    """One move as a record of `_moves_sql`: its compare-and-set keys, what it sets (instants in
    UTC ISO 8601, JSON columns as their JSON text) and what it adds."""
    row = move.snap.enrollment
    record: dict[str, Any] = {"k_org_id": row.org_id, "k_id": row.id, "k_revision": move.revision,
                              "k_status": row.status, "k_node": row.current_node_id}
    for name in names:
        value = move.values[name]
        if _is_json(name):
            value = json.dumps(value)
        elif isinstance(value, datetime):
            value = require_aware(value).astimezone(timezone.utc).isoformat()
        record[f"set_{name}"] = value
    for name, n in move.increments.items():
        record[f"add_{name}"] = n
    return record


class _Outbox:
    """The follow-ups a claim's steps queue, put in the outbox together (`enqueue_many`: one
    statement for the messages and one for their events), not a statement and an event per step
    (profiled at 3 ms of a template step's 7 ms in `bench/flows.py --with-send --inline-profile`)."""

    def __init__(self) -> None:
        self.waiting: list[Outgoing] = []

    def add(self, snap: nodes.Snapshot, send: nodes.Send, now: datetime) -> None:
        """Queue a step's follow-up; `flush` writes it, in the step's transaction."""
        row = snap.enrollment
        self.waiting.append(Outgoing(
            org_id=row.org_id, contact_id=row.contact_id, channel_kind=send.channel_kind, purpose=FOLLOWUP_PURPOSE,
            idempotency_key=f"enrollment:{row.id}:node:{row.current_node_id}:attempt:{row.steps}",
            template_key=send.template_key, payload={"text": send.text} if send.text else None,
            appointment_id=row.appointment_id, enrollment_id=row.id, respect_window=True,
            expires_at=now + FOLLOWUP_TTL))

    def flush(self, conn: Connection) -> None:
        """Write the follow-ups queued so far."""
        if self.waiting:
            enqueue_many(conn, self.waiting)
            self.waiting = []


def _fail(conn: Connection, journal: lifecycle.Journal, row: Any, now: datetime, *, reason: str, kind: str,
          llm_calls: int,
          params: dict[str, Any], revision: int | None = None, listeners: webhooks.Listeners | None = None) -> bool:
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
        webhooks.run_ended(conn, row.org_id, row.id, status="dead", outcome=None, reason=reason, listeners=listeners)
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

