"""What a patient's reply, an opt-out and a hand-off do to live enrollments.

These run inside the transaction that stored the inbound or the contact event. They never move
an enrollment from node to node (only `runtime.advance` does); they hand a reply to the node
that waits for one (making the enrollment due now), end enrollments, or pause and resume them.
Every change bumps the revision, so a claim taken before it becomes a stale wake. A reply a
node took is marked on its `inbound_messages` row, and `reply_read` (called by the step that
reads it) records what the flow made of it, for Conversas.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Sequence, cast

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError, SettingRefused
from engine.flows import lifecycle
from engine.flows.conversation import floor
from engine.people.contacts import opted_out_everywhere
from engine.flows.entry import entry
from engine.flows.versions import graph_of
from engine.store.models import enrollments, flow_pointers, inbound_messages, messages, orgs
from engine.queue.outbox import cancel_open


def _pointer(conn: Connection, org_id: int, pointer_id: int) -> Any:
    return conn.execute(select(flow_pointers).where(flow_pointers.c.org_id == org_id,
                                                    flow_pointers.c.id == pointer_id)).one()


def _reader(conn: Connection, org_id: int, row: Any) -> str | None:
    """The type of the enrollment's current node when it reads a reply now (a waiting classify or
    ask, or a wait with a `replied` edge), else None."""
    graph = graph_of(conn, org_id, row.version_id)
    node_type = graph.type(row.current_node_id)
    if node_type in ("ai_classify", "ask", "do"):  # a `do` waits only for the pick of an offer
        return node_type if row.status == "waiting_reply" else None
    return node_type if node_type == "wait" and graph.target(row.current_node_id, "replied") is not None else None


#: The org's reply debounce may be 0 (each message read on its own) up to two minutes, in seconds
#: (the column's CHECK says the same).
MAX_REPLY_DEBOUNCE_SECONDS = 120


def set_reply_debounce(conn: Connection, org_id: int, seconds: int) -> int:
    """Change how long an `ask` waits for more fragments of a patient's turn before reading them
    together (0: each message on its own). Takes effect from the next reply; SettingRefused
    outside 0 to MAX_REPLY_DEBOUNCE_SECONDS."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= MAX_REPLY_DEBOUNCE_SECONDS:
        raise SettingRefused("reply_debounce_seconds", "detail_integer_range",
                             f"the reply debounce must be 0 to {MAX_REPLY_DEBOUNCE_SECONDS} seconds",
                             min=0, max=MAX_REPLY_DEBOUNCE_SECONDS)
    if not conn.execute(update(orgs).where(orgs.c.id == org_id).values(reply_debounce_seconds=seconds,
                                                                        updated_at=clock.now())).rowcount:
        raise DomainError("no such org")
    return seconds


def on_reply(conn: Connection, org: Any, contact_ids: Sequence[int], inbound_id: int) -> dict[str, int]:
    """A contact wrote (not an opt-out) to `org` (its `orgs` row, which the caller has read: its
    reply debounce is not read again). Returns how many enrollments took the reply, ended
    `replied`, or only counted it, and how many of those that took it hold a conversation with
    the patient (an `ask`, or a `do` waiting for a pick): the reply is theirs to read."""
    now = clock.now()
    org_id = int(org.id)
    result = {"routed": 0, "ended": 0, "counted": 0, "conversing": 0}
    debounce = timedelta(seconds=int(org.reply_debounce_seconds or 0))
    # Locked: a reply that races the step reading the one before it (a pick being booked) waits
    # for that step and sees where the run went, instead of finding its revision gone and being lost.
    live = lifecycle.live_ids(conn, org_id, contact_ids, lock=True)
    asking = floor.holder(live)
    for row in live:
        counters = {"replies": enrollments.c.replies + 1, "last_reply_at": now, "updated_at": now}
        base = (enrollments.c.org_id == org_id, enrollments.c.id == row.id, enrollments.c.revision == row.revision)
        reader = _reader(conn, org_id, row) if row.status != "paused_handoff" else None
        if asking is not None and row.id != asking.id:
            reader = None  # the run that asked has the floor: the answer is its alone
        turn = reader in ("ask", "do")  # read as a turn: fragments within the debounce together
        if reader is not None and (row.pending_inbound_id is None or turn):
            # The node reads it when it runs: due now, and any claim taken before is now stale. An
            # `ask` reads a turn: it waits the org's debounce, which each fragment starts again,
            # and then reads every message from the first one on (turns.turn_fragments).
            due = now + debounce if turn else now
            first = inbound_id if row.pending_inbound_id is None else row.pending_inbound_id
            moved = conn.execute(update(enrollments).where(*base).values(
                **counters, pending_inbound_id=first, next_eval_at=due, lease_until=None,
                revision=enrollments.c.revision + 1)).rowcount
            if moved:
                lifecycle.record_event(conn, org_id, row.id, "reply", f"reply:{inbound_id}",
                                       node_id=row.current_node_id, payload={"inbound_id": inbound_id, "taken": True})
                # In the transaction that stores the reply's outcome: Conversas never shows a reply
                # a run holds as one to answer, not even before the run reads it.
                conn.execute(update(inbound_messages).where(
                    inbound_messages.c.org_id == org_id, inbound_messages.c.id == inbound_id,
                    inbound_messages.c.flow_enrollment_id.is_(None)).values(flow_enrollment_id=row.id))
                result["routed"] += 1
                result["conversing"] += turn
            continue
        if row.status != "paused_handoff" and _pointer(conn, org_id, row.pointer_id).cancel_on_reply:
            conn.execute(update(enrollments).where(*base).values(**counters))
            result["ended"] += len(lifecycle.end_live(conn, org_id, enrollments.c.id == row.id, status="cancelled",
                                                      outcome="replied", reason="replied"))
            continue
        conn.execute(update(enrollments).where(*base).values(**counters))
        lifecycle.record_event(conn, org_id, row.id, "reply", f"reply:{inbound_id}", node_id=row.current_node_id,
                               payload={"inbound_id": inbound_id, "taken": False})
        result["counted"] += 1
    return result


#: The reasons of a step that read a reply and understood it: a class matched, or a wait's
#: `replied` edge. Any other reading (the fallback edge, a run ended at its step limit) leaves
#: the reply to a person.
UNDERSTOOD = ("classified", "wait_replied", "ask_question", "ask_value_refused", "ask_complete", "do_slots_offered",
              "do_slot_picked")


def reply_read(conn: Connection, row: Any, inbound_id: int, *, reason: str, label: str | None,
               next_node: str | None) -> None:
    """The run let go of the reply its node held (runtime.advance, in the step's transaction):
    record what the flow made of it — codes and node ids, never the text — and, when it
    understood it and went on, that the flow handled it (Conversas no longer asks a person to
    answer it). A reply another run already understood keeps that reading."""
    result: dict[str, Any] = {"reason": reason, "node": row.current_node_id}
    if label is not None:
        result["class"] = label
    if next_node is not None:
        result["next"] = next_node
    values: dict[str, Any] = {"flow_enrollment_id": row.id, "flow_result": result}
    if reason in UNDERSTOOD and next_node is not None:
        values["flow_handled_at"] = clock.now()
    conn.execute(update(inbound_messages).where(
        inbound_messages.c.org_id == row.org_id, inbound_messages.c.id == inbound_id,
        inbound_messages.c.flow_handled_at.is_(None)).values(**values))


@opted_out_everywhere.connect
def on_opt_out(conn: Connection, org_id: int, contact_ids: Sequence[int]) -> list[int]:
    """The contact refused every message: every live enrollment ends `opted_out`."""
    return lifecycle.end_live(conn, org_id, enrollments.c.contact_id.in_(list(contact_ids)), status="cancelled",
                              outcome="opted_out", reason="opted_out")


def on_handoff_started(conn: Connection, org_id: int, contact_id: int) -> dict[str, int]:
    """A person took the conversation over: each live enrollment follows its flow's policy —
    `pause` (no clock, follow-ups not yet sent cancelled), `cancel` (ends `handoff`), `allow`.
    A pause keeps the clock it stopped (`paused_next_eval_at`), for the resume."""
    now = clock.now()
    result = {"paused": 0, "cancelled": 0, "allowed": 0}
    for row in lifecycle.live_ids(conn, org_id, [contact_id]):
        if row.status == "paused_handoff":
            continue
        policy = _pointer(conn, org_id, row.pointer_id).handoff_policy
        if policy == "cancel":
            result["cancelled"] += len(lifecycle.end_live(conn, org_id, enrollments.c.id == row.id,
                                                          status="cancelled", outcome="handoff", reason="handoff"))
        elif policy == "pause":
            # SET's right-hand sides read the row as it was: the clock is kept, then stopped.
            paused = conn.execute(update(enrollments).where(
                enrollments.c.org_id == org_id, enrollments.c.id == row.id, enrollments.c.revision == row.revision,
            ).values(status="paused_handoff", paused_status=row.status, paused_next_eval_at=enrollments.c.next_eval_at,
                     next_eval_at=None, lease_until=None, revision=enrollments.c.revision + 1, updated_at=now)
                .returning(enrollments.c.paused_next_eval_at)).first()
            if paused is not None:
                cancel_open(conn, org_id, messages.c.enrollment_id == row.id, "handoff")
                payload: dict[str, Any] = {"reason": "handoff"}
                if paused.paused_next_eval_at is not None:
                    payload["deadline"] = paused.paused_next_eval_at.isoformat()
                lifecycle.record_event(conn, org_id, row.id, "paused", f"paused:{row.revision + 1}",
                                       node_id=row.current_node_id, payload=payload, at=now)
                result["paused"] += 1
        else:
            lifecycle.record_event(conn, org_id, row.id, "handoff_allowed", f"handoff_allowed:{row.revision}",
                                   node_id=row.current_node_id, at=now)
            result["allowed"] += 1
    return result


def _own_deadline(conn: Connection, org_id: int, paused: Any) -> datetime | None:
    """When the paused node was due: the clock the pause kept. A run paused before that clock was
    kept (an older release) has it worked out from its node, entered at `node_entered_at`: a wait
    its duration later, a classify its grace later, any other node at once."""
    if paused.paused_next_eval_at is not None:
        return cast(datetime, paused.paused_next_eval_at)
    if paused.node_entered_at is None:
        return None
    graph = graph_of(conn, org_id, paused.version_id)
    return entry(graph, paused.current_node_id, paused.node_entered_at, paused.timing_plan).next_eval_at


def resume_at(own_deadline: datetime | None, now: datetime, grace_minutes: int) -> tuple[datetime, str]:
    """When a run paused by a hand-off resumes, and the reason code the timeline says it with:
    at the later of its node's own deadline and the flow's grace after the hand-off's end. A
    resume never shortens the time a patient had left to answer, nor stretches a wait that would
    end after the grace."""
    grace = now + timedelta(minutes=grace_minutes)
    if own_deadline is not None and own_deadline > grace:
        return own_deadline, "resumed_node_deadline"
    return grace, "resumed_after_grace"


def on_handoff_ended(conn: Connection, org_id: int, contact_id: int) -> int:
    """The person handed the conversation back: paused enrollments resume at the node where they
    paused, at the later of that node's own deadline and the flow's grace (`resume_at`), and say
    which on the run's timeline. Returns how many resumed."""
    now = clock.now()
    resumed = 0
    for row in lifecycle.live_ids(conn, org_id, [contact_id]):
        if row.status != "paused_handoff":
            continue
        pointer = _pointer(conn, org_id, row.pointer_id)
        paused = conn.execute(select(
            enrollments.c.paused_status, enrollments.c.paused_next_eval_at, enrollments.c.node_entered_at,
            enrollments.c.timing_plan, enrollments.c.version_id, enrollments.c.current_node_id,
        ).where(enrollments.c.org_id == org_id, enrollments.c.id == row.id)).one()
        deadline = _own_deadline(conn, org_id, paused)
        at, reason = resume_at(deadline, now, pointer.resume_grace_minutes)
        status = paused.paused_status or "active"
        if floor.holds_floor(row) and status == "waiting_reply" and (deadline is None or deadline <= now):
            # A question whose time to answer ran out while a person held the conversation is asked
            # again after the grace, instead of leaving by no_reply for a patient who was talking.
            status, reason = "active", "resumed_ask_again"
        moved = conn.execute(update(enrollments).where(
            enrollments.c.org_id == org_id, enrollments.c.id == row.id, enrollments.c.revision == row.revision,
        ).values(status=status, paused_status=None, paused_next_eval_at=None,
                 next_eval_at=at, lease_until=None, revision=enrollments.c.revision + 1, updated_at=now)).rowcount
        if moved:
            lifecycle.record_event(conn, org_id, row.id, "resumed", f"resumed:{row.revision + 1}",
                                   node_id=row.current_node_id, at=now, payload={
                                       "at": at.isoformat(), "reason": reason,
                                       "deadline": deadline.isoformat() if deadline is not None else None,
                                       "params": {"minutes": pointer.resume_grace_minutes}})
            resumed += 1
    return resumed
