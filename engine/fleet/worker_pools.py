"""A worker's two pools of actor threads: one for sends, one for conversations (patient replies
and follow-up steps).

A follow-up step may wait up to 20 s on an LLM, and a task carries many of them: with one shared
pool a few such tasks would hold every thread and the morning's reminders would wait behind them.
Each pool is its own `dramatiq.Worker` consuming its own queues, so sends always have their
threads. The send pool is small on purpose: a send task's provider calls already run in parallel
on the process's `LEMBRA_SEND_CONCURRENCY` threads, and more actor threads preparing batches only
contend for the interpreter (docs/benchmarks-history.md, "fewer actor threads, larger tasks").

`dramatiq.Worker.start` adds a middleware of its own to the broker, which starts the worker's
consumer of each queue declared on it; a second `Worker` on the same broker adds a second one of
the same type, and Dramatiq warns ("a middleware of the same type twice") at every start. The
pools start without it, and one middleware (`PoolConsumers`) starts each pool's consumers.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # imported late: `engine.fleet.worker_process` sets its signals up before Dramatiq loads
    import dramatiq

#: `lembra worker`'s defaults (the embedded default uses its own `--threads` for both pools).
SEND_THREADS = 2
CONVERSATION_THREADS = 4


@dataclass
class WorkerPools:
    """The started pools of one process."""

    send: dramatiq.Worker
    conversations: dramatiq.Worker
    #: The middleware that starts both pools' consumers (removed from the broker on `stop`).
    consumers: dramatiq.Middleware | None = None

    def join(self) -> None:
        """Wait until both pools have finished the work they hold (tests, the stub broker)."""
        self.send.join()
        self.conversations.join()

    def stop(self, timeout_ms: int = 600_000) -> None:
        """Stop both pools gracefully and at once, so a graceful stop waits `timeout_ms` at most
        rather than once per pool."""
        stoppers = [threading.Thread(target=pool.stop, kwargs={"timeout": timeout_ms}, name=f"stop-{name}")
                    for name, pool in (("send", self.send), ("conversations", self.conversations))]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()
        _remove_middleware(self.send.broker, self.consumers)


def start_pools(broker: dramatiq.Broker, *, send_threads: int = SEND_THREADS,
                conversation_threads: int = CONVERSATION_THREADS) -> WorkerPools:
    """Start the send pool and the conversation pool on `broker` (set up by `setup_broker`)."""
    from dramatiq.common import q_name

    from engine.fleet.actors import SEND_QUEUE

    pool_class, consumers_class = _classes()
    # Every other queue, so an actor added later is consumed without a change here.
    others = {q_name(queue) for queue in broker.get_declared_queues()} - {SEND_QUEUE}
    send = pool_class(broker, queues={SEND_QUEUE}, worker_threads=send_threads)
    conversations = pool_class(broker, queues=others, worker_threads=conversation_threads)
    consumers = None
    send.start()
    try:
        conversations.start()
        consumers = consumers_class((send, conversations))
        # Adding it replays every queue (and delay queue) declared so far to it: the consumers start.
        broker.add_middleware(consumers)
    except BaseException:
        send.stop()
        conversations.stop()
        _remove_middleware(broker, consumers)
        raise
    return WorkerPools(send, conversations, consumers)


def _remove_middleware(broker: dramatiq.Broker, middleware: dramatiq.Middleware | None) -> None:
    # Dramatiq has no call for it: a stopped pool's consumers must not be started again by a
    # queue declared later, and pools started again must not find it there.
    if middleware is not None and middleware in broker.middleware:
        broker.middleware.remove(middleware)


@functools.cache
def _classes() -> tuple[type[Any], type[Any]]:
    """The pool and consumer-starting middleware classes (defined once Dramatiq may be imported)."""
    import dramatiq

    class Pool(dramatiq.Worker):
        """A `dramatiq.Worker` whose `start` is Dramatiq's without adding its middleware:
        `PoolConsumers` starts the consumers."""

        def start(self) -> None:
            self.broker.emit_before("worker_boot", self)
            for _ in range(self.worker_threads):
                self._add_worker()
            self.broker.emit_after("worker_boot", self)

    class PoolConsumers(dramatiq.Middleware):
        """For each queue declared on the broker, a consumer in each pool that takes it (the
        pool's `queues` decide), as one Dramatiq worker middleware per pool would."""

        def __init__(self, pools: Sequence[dramatiq.Worker]) -> None:
            self.pools = tuple(pools)

        def after_declare_queue(self, broker: dramatiq.Broker, queue_name: str) -> None:
            for pool in self.pools:
                pool._add_consumer(queue_name)

        def after_declare_delay_queue(self, broker: dramatiq.Broker, queue_name: str) -> None:
            for pool in self.pools:
                pool._add_consumer(queue_name, delay=True)

    return Pool, PoolConsumers
