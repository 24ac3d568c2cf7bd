"""A worker's side of dispatch: send a batch of claimed messages, each at most once.

1. `prepare` re-checks the batch and marks the messages that may go `sending` — committed
   before any provider call, so a worker that dies mid-call leaves rows the sweep turns into
   `unknown` (never a blind second send).
2. The provider calls run in parallel on a small per-process pool of threads (each provider
   keeps one keep-alive HTTP session), in slot order for paced channels. A call is begun only while
   its lease has LEMBRA_SEND_TIMEOUT left: one that waited longer for a thread or a slot is not
   made (the row goes back to the queue), so a call never outlives its lease in the ordinary case.
3. Every accepted message is marked `sent` in one statement; each failure is settled on its
   own (`outcomes`), and one message's failure or crash never stops the others.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from engine import clock, metrics
from engine.dispatch.checks import Prepared, prepare
from engine.dispatch.outcomes import (
    Sent,
    after_lease_ran_out,
    after_permanent,
    after_transient,
    park_unknown,
    record_sent,
)
from engine.runtime import Runtime
from gateway.errors import ProviderError

log = logging.getLogger(__name__)

#: Messages checked and settled together at most (a larger task is sent in slices). PostgreSQL
#: takes a batch's rows as one array per column, whatever their number: the cap only bounds one
#: transaction's rows, and the rows a worker killed mid-call leaves `unknown`.
MAX_BATCH = 500
#: SQLite binds every row's values one by one (a CASE per column in `update_per_row`), and older
#: builds take at most 999 parameters a statement: a hundred rows fit.
SQLITE_MAX_BATCH = 100


class LeaseRanOut(Exception):
    """Too little of a message's lease was left when its provider call could begin (a slow batch,
    a long wait for a paced slot) for the call to return before the sweep takes the row, so the
    call is not made."""


_pool_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


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
        prepared, outcomes = prepare(rt, ids)
    except Exception:
        if len(ids) == 1:
            raise
        # One bad message must cost only itself: go through the batch one message at a time.
        log.exception("preparing a batch failed; sending its messages one by one", extra={"count": len(ids)})
        return {mid: _send_alone(rt, mid) for mid in ids}
    if not prepared:
        return outcomes
    prepared.sort(key=lambda p: (p.send_at is not None, p.send_at or clock.now()))
    results = _call_all(prepared, rt.settings.send_concurrency)
    sent = [Sent(p, result) for p, result in zip(prepared, results) if not isinstance(result, BaseException)]
    try:
        moved = record_sent(rt, sent)
    except Exception:  # the rows stay `sending`; their lease runs out and the sweep settles them
        log.exception("recording sent messages failed", extra={"count": len(sent)})
        moved = set()
    for p, result in zip(prepared, results):
        if not isinstance(result, BaseException):
            outcomes[p.message_id] = "sent" if p.message_id in moved else "not_claimed"
            continue
        try:
            outcomes[p.message_id] = _settle_failure(rt, p, result)
        except Exception:
            log.exception("settling a failed send crashed", extra={"message_id": p.message_id})
            outcomes[p.message_id] = "crashed"
    return outcomes


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
    against 15 µs this way (docs/benchmarks.md, 2026-12-03). Messages are taken in order, so paced
    ones still go in slot order."""
    width = min(concurrency, len(prepared))
    if width <= 1:
        return [_call(p) for p in prepared]
    results: list[object] = [None] * len(prepared)
    taken = itertools.count()  # next() on it is atomic under the GIL: each index goes to one thread

    def drain() -> None:
        while (index := next(taken)) < len(prepared):
            results[index] = _call(prepared[index])

    for task in [_pool(concurrency).submit(drain) for _ in range(width)]:
        task.result()
    return results


def _call(prepared: Prepared) -> object:
    """The provider's answer, or the exception it raised (so the batch can settle each alone)."""
    try:
        if prepared.send_at is not None:
            # A paced channel: this message holds the number's next slot; wait for it.
            wait = (prepared.send_at - clock.now()).total_seconds()
            if wait > 0:
                time.sleep(wait)
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
