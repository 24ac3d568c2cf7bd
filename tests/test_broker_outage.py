"""A broker outage as the scheduler lives it, on the engine clock: claims the broker did not take
are released at once and cost nothing, nothing more is claimed until the broker answers, and the
outage is logged once, then once a minute, then at its end.

The scheduler hands its tasks to callables (`lembra scheduler` passes the actors' `send`); here they
raise what the Redis client raises when the server is gone. The same with real processes and a
real Redis stopped and started again: tests/test_flow_processes.py."""

from __future__ import annotations

import dataclasses
import logging
import threading
from datetime import timedelta
from typing import Any, Sequence

import pytest
import redis
from sqlalchemy import select

from engine.fleet.broker import BrokerUnavailable
from engine.flows import runtime as flows_runtime
from engine.store.models import enrollments
from engine.store.runtime import Runtime
from engine.fleet.scheduler import Scheduler
from tests.factories import World
from tests.flows.helpers import Flows, linear, node


class Broker:
    """What the scheduler's callables meet: a broker that is up, or down (`down`), as the Redis
    client reports it."""

    def __init__(self) -> None:
        self.down = False
        self.flows: list[list[list[int]]] = []
        self.messages: list[list[int]] = []
        self.probes = 0

    def _check(self) -> None:
        if self.down:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

    def enqueue(self, ids: Sequence[int]) -> None:
        self._check()
        self.messages.append(list(ids))

    def enqueue_flows(self, pairs: Sequence[Sequence[int]]) -> None:
        self._check()
        self.flows.append([list(p) for p in pairs])

    def probe(self) -> None:
        self.probes += 1
        if self.down:
            raise BrokerUnavailable("cannot connect to redis at 127.0.0.1:6390 (ConnectionError)")


@pytest.fixture
def quiet_rt(settings, clock) -> Any:
    """A runtime whose scheduler never populates (nothing here needs it, and a pass of the loop
    would start one in a thread)."""
    runtime = Runtime.build(dataclasses.replace(settings, populate_interval=10**9))
    yield runtime
    runtime.close()


@pytest.fixture
def due(quiet_rt) -> list[int]:
    """Three enrollments due now, at a trigger followed by a template follow-up."""
    world = World(quiet_rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    world.channel("whatsapp")
    flows = Flows(world)
    pointer = flows.flow(linear(node("inicio", "trigger"),
                                node("msg", "action", mode="template", template="followup_checkin"),
                                node("fim", "end", outcome="exhausted")))
    return [flows.enroll(pointer, world.contact()) for _ in range(3)]


def _one_pass(sched: Scheduler) -> None:
    """One pass of the scheduler's loop, with the loop's own handling of a failed pass."""
    stop = threading.Event()

    def holding() -> bool:
        stop.set()
        return True

    sched._loop(stop, holding)


def _runs(rt, ids: Sequence[int]) -> dict[int, Any]:
    with rt.db.connect() as conn:
        return {row.id: row for row in conn.execute(select(enrollments).where(enrollments.c.id.in_(list(ids))))}


def _scheduler(rt, broker: Broker) -> Scheduler:
    return Scheduler(rt, broker.enqueue, broker.enqueue_flows, probe=broker.probe)


def test_claims_the_broker_did_not_take_are_released_free_and_nothing_is_claimed_while_it_is_down(
        quiet_rt, due, clock):
    rt = quiet_rt
    broker = Broker()
    sched = _scheduler(rt, broker)
    broker.down = True
    _one_pass(sched)
    runs = _runs(rt, due)
    assert {(r.lease_until, r.attempts, r.revision) for r in runs.values()} == {(None, 0, 2)}, \
        "the claims the broker did not take are released at once, at no cost"
    with pytest.raises(BrokerUnavailable):
        sched.tick()

    for _ in range(10):  # the outage lasts, longer than the whole backoff ladder
        clock.advance(timedelta(minutes=15))
        _one_pass(sched)
    runs = _runs(rt, due)
    assert {(r.status, r.lease_until, r.attempts, r.revision) for r in runs.values()} == {("active", None, 0, 2)}, \
        "nothing is claimed while the broker does not answer"
    assert broker.probes == 11 and broker.flows == []

    broker.down = False
    tick = sched.tick()
    assert (tick.advanced, broker.probes) == (3, 12)
    assert sorted(p[0] for task in broker.flows for p in task) == sorted(due)
    assert all(r.lease_until is not None for r in _runs(rt, due).values())
    flows_runtime.advance_claimed(rt, [p for task in broker.flows for p in task])
    runs = _runs(rt, due)
    assert {(r.status, r.steps, r.messages_sent, r.attempts) for r in runs.values()} == {("completed", 2, 1, 0)}


def test_a_message_hand_over_that_fails_claims_no_enrollment(quiet_rt, due, clock):
    from engine.queue.outbox import enqueue

    rt = quiet_rt
    run = _runs(rt, due)[due[0]]
    with rt.db.begin() as conn:
        enqueue(conn, org_id=run.org_id, contact_id=run.contact_id, channel_kind="whatsapp", purpose="notice",
                idempotency_key="aviso", payload={"text": "Olá"}, due_at=clock.now(), respect_window=False)
    broker = Broker()
    broker.down = True
    with pytest.raises(BrokerUnavailable):
        _scheduler(rt, broker).tick()
    assert {(r.lease_until, r.revision) for r in _runs(rt, due).values()} == {(None, 0)}


def test_an_outage_is_logged_once_then_once_a_minute_then_its_end(quiet_rt, due, clock, caplog):
    """130 passes over 100 s of outage: one line when it begins, one a minute later, one when it
    ends; never a traceback."""
    caplog.set_level(logging.INFO, logger="engine")
    broker = Broker()
    sched = _scheduler(quiet_rt, broker)
    broker.down = True
    for _ in range(130):
        _one_pass(sched)
        clock.advance(timedelta(seconds=100 / 130))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "engine.fleet.scheduler"]
    assert lines == [(logging.ERROR, "broker unreachable: due work waits in the database until it answers again"),
                     (logging.ERROR, "broker still unreachable")], lines
    reminder = [r for r in caplog.records if r.getMessage() == "broker still unreachable"][0]
    assert (reminder.down_seconds, reminder.failed_attempts) == (60, 79)
    assert not [r for r in caplog.records if r.exc_info], "no traceback during an outage"

    caplog.clear()
    broker.down = False
    for _ in range(3):
        _one_pass(sched)
        clock.advance(timedelta(seconds=1))
    records = [r for r in caplog.records if r.name == "engine.fleet.scheduler"]
    assert [(r.levelno, r.getMessage()) for r in records] == [(logging.WARNING, "broker reachable again")]
    assert records[0].down_seconds == 100

    caplog.clear()
    broker.down = True  # the next outage is said again, once
    flows_runtime.release_unhanded(quiet_rt, [p for task in broker.flows for p in task])
    with quiet_rt.db.begin() as conn:  # the claims handed over were lost: due again, unclaimed
        conn.execute(enrollments.update().where(enrollments.c.id.in_(due))
                     .values(lease_until=None, revision=enrollments.c.revision + 1))
    for _ in range(3):
        _one_pass(sched)
    assert [r.getMessage() for r in caplog.records if r.name == "engine.fleet.scheduler"] == \
        ["broker unreachable: due work waits in the database until it answers again"]
