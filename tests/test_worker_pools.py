"""A worker's two pools (engine/fleet/worker_pools.py) on one broker: each takes its own queues, and
they start, stop and start again without Dramatiq's "middleware of the same type twice" warning
(which `lembra worker` printed at every start)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import dq_name

from engine.fleet.actors import FLOWS_QUEUE, INBOUND_QUEUE, SEND_QUEUE
from engine.fleet.worker_pools import start_pools


def test_the_two_worker_pools_start_without_adding_a_middleware_twice(caplog):
    caplog.set_level(logging.DEBUG, logger="dramatiq")
    broker = StubBroker()
    ran: dict[str, str] = {}

    def note(queue: str) -> Any:
        def fn() -> None:
            ran[queue] = threading.current_thread().name
        fn.__name__ = f"note_{queue}"
        return dramatiq.actor(fn, queue_name=queue, broker=broker)

    actors = {queue: note(queue) for queue in (SEND_QUEUE, INBOUND_QUEUE, FLOWS_QUEUE)}
    for _ in range(2):  # started, stopped and started again (the embedded default may)
        pools = start_pools(broker, send_threads=1, conversation_threads=2)
        try:
            assert set(pools.send.consumers) == {SEND_QUEUE, dq_name(SEND_QUEUE)}
            assert set(pools.conversations.consumers) == {q for q in (FLOWS_QUEUE, INBOUND_QUEUE)} | \
                {dq_name(FLOWS_QUEUE), dq_name(INBOUND_QUEUE)}
            for actor in actors.values():
                actor.send()
            for queue in actors:
                broker.join(queue)
            pools.join()
        finally:
            pools.stop(timeout_ms=10_000)
        send_threads = {t.name for t in pools.send.workers}
        conversation_threads = {t.name for t in pools.conversations.workers}
        assert ran[SEND_QUEUE] in send_threads
        assert {ran[FLOWS_QUEUE], ran[INBOUND_QUEUE]} <= conversation_threads
        ran.clear()
    twice = [r.getMessage() for r in caplog.records if "same type twice" in r.getMessage()]
    assert twice == []
