"""A worker's side of dispatch: send a batch of claimed messages, each at most once.

1. `check` re-checks the whole batch in one transaction; the messages that may go stay `claimed`.
2. They go in waves of at most LEMBRA_SEND_CONCURRENCY messages, the provider calls a worker
   process has in flight. A wave is marked `sending` (committed) just before its calls begin, so
   `sending` means "this call may have started": a worker killed mid-batch leaves at most one
   wave `sending`, which the sweep turns into `unknown` (never a blind second send), while the
   later waves' rows are still `claimed` and the sweep hands them out again at no cost.
3. A wave's calls run in parallel on a small per-process pool of threads (each provider keeps one
   keep-alive HTTP session), in slot order for paced channels. The send tasks a process runs at
   once share its LEMBRA_SEND_CONCURRENCY places (`CallSlots`), so the rows a process has
   `sending` are never more than the calls it has in flight. A call is begun only while its lease
   has LEMBRA_SEND_TIMEOUT left: one that waited longer for its paced slot is not made (the row
   goes back to the queue), so a call never outlives its lease in the ordinary case.
4. After each wave, one transaction marks its accepted messages `sent` and the next wave
   `sending`, with their events (`waves`: one statement on PostgreSQL); each failure is settled
   on its own before it (`outcomes`), and one message's failure or crash never stops the others.
   A batch of B messages costs ⌈B/N⌉ + 2 transactions (its checks' one included; one
   more when some of them wait for their recipient's slot) and ⌈B/N⌉ + 1
   writes on PostgreSQL, N being the calls in flight, against 2 transactions and 4 writes when a
   whole batch was marked at once: 27 and 26 for a task of 200 at the default 8
   (docs/benchmarks-history.md, 2026-12-06).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Sequence

from engine.core import clock, metrics
from engine.messaging.dispatch.checks import check
from engine.messaging.dispatch.ready import Prepared, Ready
from engine.messaging.dispatch.outcomes import after_lease_ran_out, after_permanent, after_transient, park_unknown
from engine.messaging.dispatch.waves import Sent, observe_sent, settle_wave
from engine.store.runtime import Runtime
from gateway.errors import ProviderError

log = logging.getLogger(__name__)

#: Messages checked together at most (a larger task is sent in slices). PostgreSQL takes a
#: batch's rows as one array per column, whatever their number: the cap only bounds one
#: transaction's rows.
MAX_BATCH = 500
#: SQLite binds every row's values one by one (a CASE per column in `update_per_row`), and older
#: builds take at most 999 parameters a statement: a hundred rows fit.
SQLITE_MAX_BATCH = 100


class LeaseRanOut(Exception):
    """Too little of a message's lease was left when its provider call could begin (a slow batch,
    a long wait for a paced slot) for the call to return before the sweep takes the row, so the
    call is not made."""


class CallSlots:
    """The provider calls a worker process may have in flight, shared by its send tasks.

    A task takes the places of its first wave (its largest) and keeps them until its last wave's
    calls have returned, giving back what a smaller last wave does not need: it never waits for
    more places while holding some, so two tasks cannot each hold part of what the other waits for.
    Keeping its places between waves, a task records one wave and marks the next in one
    transaction while no other task's wave is `sending`."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = size
        self._changed = threading.Condition()

    def take(self, count: int) -> int:
        """Wait until `count` places (at most all of them) are free and take them; returns how many."""
        count = min(count, self.size)
        with self._changed:
            self._changed.wait_for(lambda: self._free >= count)
            self._free -= count
        return count

    def give_back(self, count: int) -> None:
        """Free `count` places taken before."""
        if count <= 0:
            return
        with self._changed:
            self._free += count
            self._changed.notify_all()


_pool_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}
_slots: dict[int, CallSlots] = {}


def send_batch(rt: Runtime, message_ids: Sequence[int]) -> dict[int, str]:
    """Send the claimed messages among `message_ids`; returns what became of each id (for logs
    and tests): `sent`, `retried`, `failed`, `unknown`, `reclaimed`, `cancelled`, `deferred`, `not_claimed`…"""
    ids = [int(mid) for mid in dict.fromkeys(message_ids)]
    cap = SQLITE_MAX_BATCH if rt.db.is_sqlite else MAX_BATCH
    if len(ids) > cap:
        outcomes: dict[int, str] = {}
        for start in range(0, len(ids), cap):
            outcomes.update(send_batch(rt, ids[start:start + cap]))
        return outcomes
    try:
        ready, outcomes = check(rt, ids)
    except Exception:
        if len(ids) == 1:
            raise
        # One bad message must cost only itself: go through the batch one message at a time.
        log.exception("preparing a batch failed; sending its messages one by one", extra={"count": len(ids)})
        return {mid: _send_alone(rt, mid) for mid in ids}
    if ready:
        ready.sort(key=lambda r: (r.send_at is not None, r.send_at or clock.now()))
        _send_in_waves(rt, ready, outcomes)
    return outcomes


def _send_in_waves(rt: Runtime, ready: list[Ready], outcomes: dict[int, str]) -> None:
    """Mark, call and settle `ready` a wave of at most LEMBRA_SEND_CONCURRENCY at a time, noting
    in `outcomes` what became of each."""
    width = rt.settings.send_concurrency
    slots = _call_slots(width)
    held = slots.take(len(ready))
    landed: list[tuple[Prepared, object]] = []
    try:
        for start in range(0, len(ready), width):
            wave = ready[start:start + width]
            if len(wave) < held:  # the last wave: another task may use the rest
                slots.give_back(held - len(wave))
                held = len(wave)
            slot = _first_slot(wave)
            if slot is not None and slot > clock.now():
                # Settle the last wave before a wait that may be long, then mark this one as its
                # first slot comes rather than while its calls cannot begin.
                _record_and_mark(rt, landed, [], outcomes)
                landed = []
                _wait_until(slot)
            prepared = _record_and_mark(rt, landed, wave, outcomes)
            landed = list(zip(prepared, _call_all(prepared, width)))
            _settle_failures(rt, landed, outcomes)
    finally:
        slots.give_back(held)
    _record_and_mark(rt, landed, [], outcomes)


def _record_and_mark(rt: Runtime, landed: list[tuple[Prepared, object]], wave: list[Ready],
                     outcomes: dict[int, str]) -> list[Prepared]:
    """In one transaction, the accepted calls of the wave that `landed` `sent` and the next `wave`
    `sending` (`waves.settle_wave`); returns the messages of `wave` now `sending`."""
    sent = [Sent(p, result) for p, result in landed if not isinstance(result, BaseException)]
    if not sent and not wave:
        return []
    now = clock.now()
    try:
        with rt.db.begin() as conn:
            moved, prepared = settle_wave(conn, rt, sent, wave, now)
    except Exception:
        # Nothing of it is written: the accepted calls' rows stay `sending` (their lease runs out
        # and the sweep settles them), the wave's stay `claimed` (handed out again at no cost).
        log.exception("recording a wave of sends failed", extra={"count": len(sent) + len(wave)})
        outcomes.update({s.prepared.message_id: "not_claimed" for s in sent})
        outcomes.update({item.msg.id: "crashed" for item in wave})
        return []
    observe_sent(sent, moved, now)
    outcomes.update({s.prepared.message_id: "sent" if s.prepared.message_id in moved else "not_claimed"
                     for s in sent})
    marked = {p.message_id for p in prepared}
    outcomes.update({item.msg.id: "not_claimed" for item in wave if item.msg.id not in marked})
    return prepared


def _settle_failures(rt: Runtime, landed: list[tuple[Prepared, object]], outcomes: dict[int, str]) -> None:
    for p, result in landed:
        if not isinstance(result, BaseException):
            continue
        try:
            outcomes[p.message_id] = _settle_failure(rt, p, result)
        except Exception:
            log.exception("settling a failed send crashed", extra={"message_id": p.message_id})
            outcomes[p.message_id] = "crashed"


def _first_slot(wave: list[Ready]) -> datetime | None:
    """The first paced slot of a wave whose every message is paced (else None)."""
    if all(item.send_at is not None for item in wave):
        return wave[0].send_at
    return None


def _wait_until(moment: datetime | None) -> None:
    if moment is not None:
        wait = (moment - clock.now()).total_seconds()
        if wait > 0:
            time.sleep(wait)


def prepare(rt: Runtime, message_ids: Sequence[int]) -> tuple[list[Prepared], dict[int, str]]:
    """`check` the claimed messages among `message_ids` and mark those that may go `sending` at
    once, as one wave; returns those now `sending` (in order) and what became of every other id.
    For as many messages as a worker has calls in flight: `send_batch` marks a larger batch wave
    by wave, and makes the calls."""
    ready, outcomes = check(rt, message_ids)
    now = clock.now()
    with rt.db.begin() as conn:
        _, prepared = settle_wave(conn, rt, [], ready, now)
    marked = {p.message_id for p in prepared}
    outcomes.update({item.msg.id: "not_claimed" for item in ready if item.msg.id not in marked})
    return prepared, outcomes


def send_one(rt: Runtime, message_id: int) -> str:
    """Send one claimed message, at most once; returns what became of it."""
    return send_batch(rt, [message_id])[int(message_id)]


def _send_alone(rt: Runtime, message_id: int) -> str:
    try:
        return send_one(rt, message_id)
    except Exception:  # the row's lease will expire and the sweep recovers it
        log.exception("send crashed", extra={"message_id": message_id})
        return "crashed"


def _call_all(prepared: list[Prepared], concurrency: int) -> list[object]:
    """Every call's answer (or exception), in order, with at most `concurrency` in flight.

    The pool gets one task per thread, each taking the next message until none is left, rather
    than one task per message: a Future, its lock and its wake-up per message cost 51 µs of CPU
    against 15 µs this way (docs/benchmarks-history.md, 2026-12-03); the calling thread drains too, one
    hand-off fewer per wave. Messages are taken in order, so paced ones still go in slot order."""
    width = min(concurrency, len(prepared))
    if width <= 1:
        return [_call(p) for p in prepared]
    results: list[object] = [None] * len(prepared)
    taken = itertools.count()  # next() on it is atomic under the GIL: each index goes to one thread

    def drain() -> None:
        while (index := next(taken)) < len(prepared):
            results[index] = _call(prepared[index])

    helpers = [_pool(concurrency).submit(drain) for _ in range(width - 1)]
    drain()
    for task in helpers:
        task.result()
    return results


def _call(prepared: Prepared) -> object:
    """The provider's answer, or the exception it raised (so the batch can settle each alone)."""
    try:
        # A paced channel: this message holds the number's next slot; wait for it.
        _wait_until(prepared.send_at)
        if clock.now() > prepared.start_by:
            return LeaseRanOut()
        return metrics.provider_call(prepared.channel.provider, prepared.provider.send, prepared.rendered.outbound)
    except Exception as exc:
        return exc


def _settle_failure(rt: Runtime, prepared: Prepared, exc: BaseException) -> str:
    provider = prepared.provider
    if isinstance(exc, LeaseRanOut):
        log.warning("too little of the lease was left for the provider call; the call was not made",
                    extra={"message_id": prepared.message_id})
        return after_lease_ran_out(rt, prepared)
    if not isinstance(exc, ProviderError):  # a provider bug: the request may or may not have gone out
        log.error("provider raised unexpectedly",
                  extra={"message_id": prepared.message_id, "error": type(exc).__name__})
        return park_unknown(rt, prepared, "unexpected_error", f"provider raised {type(exc).__name__}")
    if exc.outcome_unknown and not type(provider).honours_idempotency:
        return park_unknown(rt, prepared, exc.code or "outcome_unknown", exc.reason)
    if exc.permanent:
        return after_permanent(rt, prepared, exc)
    return after_transient(rt, prepared, exc)


def _pool(size: int) -> ThreadPoolExecutor:
    """The process's pool for provider calls (one per size, made on first use)."""
    with _pool_lock:
        pool = _pools.get(size)
        if pool is None:
            pool = _pools[size] = ThreadPoolExecutor(max_workers=size, thread_name_prefix="lembra-send")
        return pool


def _call_slots(size: int) -> CallSlots:
    """The process's places for provider calls in flight (one set per size, made on first use)."""
    with _pool_lock:
        slots = _slots.get(size)
        if slots is None:
            slots = _slots[size] = CallSlots(size)
        return slots
