"""A patient's reply answered by the worker that read it, while replies are few.

A reply that a run reads at once (the org's reply debounce is 0, or the run reads replies
without one) makes the run due now (`replies.on_reply`), and the answers a reply gets at once (a
confirmation's acknowledgement, the goodbye to SAIR) are queued due now. Left to the scheduler,
the patient then waits for two of its passes and two actor hops through the broker: at 2 turns a
second, 249 ms from the reply processed to the `ask`'s step and 270 ms more to its question sent
(p50), for about 30 ms of work (docs/benchmarks-history.md, 2026-12-07, session 11).

So, right after the reply's commit, its worker claims those runs as a scheduler pass would and
advances them (`advance_claimed`), then claims what is due to the patient now and sends it
(`send_batch`): 5.7 ms and 31 ms for those two hops at 2 turns a second; with the scheduler's
default interval of 2 s the turn took 3.4 s (p50) and now 0.14 s.

Only while replies are few: a turn taken alone costs what a scheduler pass shares among the turns
due together (one read per table for a claim, one check for a batch). At 50 turns a second on 2
cores, taking every turn alone cost 2.5 times the CPU a turn and put the inbound queue 34 s
behind. So a process answers at once only while it has read at most BUSY_REPLIES replies in the
last second (a clinic's conversations, not a campaign's answers), and never a reply that waited
in the queue longer than ANSWER_NOW_WITHIN; the others are the scheduler's, batched.

Nothing here is a second way of claiming or sending: each claim is the scheduler's
compare-and-set with a lease, so what a scheduler pass claimed first is not taken again; a worker
killed in between leaves a claim no actor started (the sweep puts it back in the queue, free) or
`claimed` messages (handed out again at no cost), as when the broker loses an actor's message. A
reply an `ask` must wait the debounce for is not due yet, and the scheduler takes it as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from datetime import timedelta
from typing import Callable

from sqlalchemy import select

from engine.core import clock
from engine.flows.runtime import advance_claimed, claim_replied
from engine.messaging.dispatch import claim_for_contact, send_batch
from engine.store.models import inbound_messages
from engine.store.runtime import Runtime

log = logging.getLogger(__name__)

#: A reply stored longer ago than this when its worker is done with it means the inbound queue is
#: behind: the scheduler's batches take it (a scheduler pass comes every 0.2 s by default).
ANSWER_NOW_WITHIN = timedelta(seconds=1)
#: Replies a process may have read in the last second and still answer the next one at once; past
#: it, a scheduler pass finds several runs due together and shares their reads.
BUSY_REPLIES = 3


class RecentReplies:
    """The replies this process read in the last second (instants of `monotonic`)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._seen: deque[float] = deque()

    def quiet(self) -> bool:
        """Count one more reply; whether the process is quiet enough to answer it at once."""
        now = self._monotonic()
        with self._lock:
            self._seen.append(now)
            while self._seen and self._seen[0] < now - 1.0:
                self._seen.popleft()
            return len(self._seen) <= BUSY_REPLIES


recent = RecentReplies()


def answer_now(rt: Runtime, inbound_id: int) -> None:
    """After `process_inbound` acted on `inbound_id`: advance the runs it made due now, then send
    what is due to its contact now, unless this process is busy with replies (BUSY_REPLIES) or
    the reply waited in the queue more than ANSWER_NOW_WITHIN. Never raises: whatever is left undone waits for the scheduler, as it
    would have without this."""
    try:
        with rt.db.connect() as conn:
            reply = conn.execute(
                select(inbound_messages.c.org_id, inbound_messages.c.contact_id, inbound_messages.c.received_at)
                .where(inbound_messages.c.id == inbound_id, inbound_messages.c.processed_at.is_not(None))).first()
        if reply is None or reply.contact_id is None:
            return
        if not recent.quiet() or clock.now() - reply.received_at > ANSWER_NOW_WITHIN:
            return
        claims = claim_replied(rt, reply.org_id, inbound_id)
        if claims:
            advance_claimed(rt, claims)
        due = claim_for_contact(rt, reply.org_id, reply.contact_id)
        if due:
            send_batch(rt, due)
    except Exception:
        log.exception("answering a reply at once failed; the scheduler takes it", extra={"inbound_id": inbound_id})
