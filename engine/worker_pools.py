"""A worker's two pools of actor threads: one for sends, one for conversations (patient replies
and follow-up steps).

A follow-up step may wait up to 20 s on an LLM, and a task carries many of them: with one shared
pool a few such tasks would hold every thread and the morning's reminders would wait behind them.
Each pool is its own `dramatiq.Worker` consuming its own queues, so sends always have their
threads. The send pool is small on purpose: a send task's provider calls already run in parallel
on the process's `LEMBRA_SEND_CONCURRENCY` threads, and more actor threads preparing batches only
contend for the interpreter (docs/benchmarks.md, "fewer actor threads, larger tasks").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported late: `engine.worker_process` sets its signals up before Dramatiq loads
    import dramatiq

#: `lembra worker`'s defaults (the embedded default uses its own `--threads` for both pools).
SEND_THREADS = 2
CONVERSATION_THREADS = 4


@dataclass
class WorkerPools:
    """The started pools of one process."""

    send: dramatiq.Worker
    conversations: dramatiq.Worker

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


def start_pools(broker: dramatiq.Broker, *, send_threads: int = SEND_THREADS,
                conversation_threads: int = CONVERSATION_THREADS) -> WorkerPools:
    """Start the send pool and the conversation pool on `broker` (set up by `setup_broker`)."""
    import dramatiq
    from dramatiq.common import q_name

    from engine.actors import SEND_QUEUE

    # Every other queue, so an actor added later is consumed without a change here.
    others = {q_name(queue) for queue in broker.get_declared_queues()} - {SEND_QUEUE}
    send = dramatiq.Worker(broker, queues={SEND_QUEUE}, worker_threads=send_threads)
    conversations = dramatiq.Worker(broker, queues=others, worker_threads=conversation_threads)
    send.start()
    try:
        conversations.start()
    except BaseException:
        send.stop()
        raise
    return WorkerPools(send, conversations)
