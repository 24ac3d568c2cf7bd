"""Real processes over one database: several workers, a worker killed mid-batch, a flushed broker.

On PostgreSQL + Redis these run `lembra scheduler` and `lembra worker` processes; on SQLite with
the in-process broker each `lembra scheduler` process carries its own workers, so two of them
compete for the same rows through the database alone.
"""

from __future__ import annotations

import signal
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import func, select, update

from engine.models import channels, inbox_items, messages, sandbox_messages
from engine.outbox import enqueue
from tests.conftest import BROKER_URL, IS_POSTGRES
from tests.factories import World
from tests.processes import Processes, lembra_env, wait_until

REAL_BROKER = not BROKER_URL.startswith("stub")
OPEN = ("new", "pending", "claimed", "sending")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    processes = Processes(tmp_path)
    yield processes
    processes.stop_all()


@pytest.fixture
def backlog(rt, clock):
    """An org with a sandbox channel and a function that queues N messages due now (real time)."""
    clock.set(datetime.now(timezone.utc))
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    channel_id = world.channel("whatsapp")

    def make(count: int) -> list[int]:
        ids = []
        contacts = [world.contact(name=f"Paciente {i}", phone=f"+551199{i:07d}", consent=("whatsapp",))
                    for i in range(min(count, 20))]
        with rt.db.begin() as conn:
            for i in range(count):
                ids.append(enqueue(
                    conn, org_id=world.org_id, contact_id=contacts[i % len(contacts)], channel_kind="whatsapp",
                    purpose="notice", idempotency_key=f"bench:{i}", payload={"text": f"Mensagem {i}"},
                    due_at=clock.now() - timedelta(seconds=1), respect_window=False,
                ))
        return ids

    make.world = world  # type: ignore[attr-defined]
    make.channel_id = channel_id  # type: ignore[attr-defined]
    return make


def _set_sandbox(rt, channel_id: int, **settings) -> None:
    with rt.db.begin() as conn:
        conn.execute(update(channels).where(channels.c.id == channel_id)
                     .values(settings=settings, updated_at=datetime.now(timezone.utc)))


def _status_counts(rt) -> Counter:
    with rt.db.connect() as conn:
        return Counter(dict(conn.execute(select(messages.c.status, func.count()).group_by(messages.c.status)).all()))


def _sandbox_counts(rt) -> Counter:
    with rt.db.connect() as conn:
        return Counter(dict(conn.execute(
            select(sandbox_messages.c.idempotency_key, func.count()).group_by(sandbox_messages.c.idempotency_key)
        ).all()))


def _start_workers(procs: Processes, database_url: str, count: int, **env: str) -> list:
    """`count` independent consumers: worker processes (real broker) or embedded schedulers."""
    started = []
    if REAL_BROKER:
        for i in range(count):
            started.append(procs.start(f"worker{i}", ["worker", "--processes", "1", "--threads", "4"],
                                       lembra_env(database_url, **env)))
    else:
        for i in range(count):
            started.append(procs.start(f"embedded{i}", ["scheduler"], lembra_env(database_url, **env)))
    return started


def _start_scheduler(procs: Processes, database_url: str, **env: str):
    if REAL_BROKER:
        return procs.start("scheduler", ["scheduler"], lembra_env(database_url, **env))
    return None


def test_two_workers_send_every_message_exactly_once(rt, backlog, procs, database_url):
    # Each send takes a little while outside any transaction, so neither process can keep the
    # (SQLite) write lock to itself.
    _set_sandbox(rt, backlog.channel_id, delay_ms=40)
    # Small claims and small tasks, so the backlog is shared instead of taken in one pass.
    small = {"LEMBRA_CLAIM_BATCH": "20", "LEMBRA_SEND_BATCH": "5", "LEMBRA_MAX_IN_FLIGHT": "20",
             "LEMBRA_LOG_LEVEL": "INFO"}
    for proc in _start_workers(procs, database_url, 2, **small):
        procs.wait_ready(proc)
    _start_scheduler(procs, database_url, **small)
    ids = backlog(400)

    wait_until(lambda: _status_counts(rt).get("sent", 0) == len(ids), timeout=120,
               what="all messages sent", on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")
    counts = _sandbox_counts(rt)
    assert len(counts) == len(ids)
    assert set(counts.values()) == {1}, "a message reached the sandbox twice"
    with rt.db.connect() as conn:
        senders = conn.execute(select(messages.c.claimed_by).distinct()).scalars().all()
    assert len(senders) == 2, f"expected both worker processes to send, got {senders}"


def test_worker_killed_mid_batch_loses_nothing_and_sends_nothing_twice(rt, backlog, procs, database_url):
    ids = backlog(80)
    _set_sandbox(rt, backlog.channel_id, delay_ms=150)
    short_lease = {"LEMBRA_LEASE_SECONDS": "3"}
    [victim] = _start_workers(procs, database_url, 1, **short_lease)
    scheduler = _start_scheduler(procs, database_url, **short_lease)

    # After a few went out, make the provider hang, so that the kill surely finds sends in flight
    # (a kill timed against 150 ms sends can land between two of them on a loaded machine).
    wait_until(lambda: _status_counts(rt).get("sent", 0) >= 10, timeout=120, what="the first sends",
               on_fail=procs.logs)
    _set_sandbox(rt, backlog.channel_id, delay_ms=600_000)
    wait_until(lambda: _status_counts(rt).get("sending", 0) >= 1, timeout=120, what="a send in flight",
               on_fail=procs.logs)
    procs.kill(victim, signal.SIGKILL)
    if scheduler is not None:
        procs.kill(scheduler, signal.SIGKILL)
    in_flight = _status_counts(rt)
    assert in_flight.get("sending", 0) >= 1, f"the kill caught nothing mid-send: {in_flight}"

    _set_sandbox(rt, backlog.channel_id, delay_ms=150)
    _start_workers(procs, database_url, 1, **short_lease)
    _start_scheduler(procs, database_url, **short_lease)
    wait_until(lambda: not any(_status_counts(rt).get(s, 0) for s in OPEN), timeout=180,
               what="the backlog to settle", on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")

    final = _status_counts(rt)
    assert final["sent"] + final["unknown"] == len(ids), final
    assert final["unknown"] == in_flight["sending"], "every row caught mid-send is unknown, no other"
    counts = _sandbox_counts(rt)
    assert all(n == 1 for n in counts.values()), "a message reached the sandbox twice"
    with rt.db.connect() as conn:
        sent_keys = conn.execute(select(messages.c.idempotency_key).where(messages.c.status == "sent")).scalars().all()
        unknown_ids = conn.execute(select(messages.c.id).where(messages.c.status == "unknown")).scalars().all()
        inbox = conn.execute(select(inbox_items.c.message_id).where(inbox_items.c.kind == "message_unknown")).scalars().all()
    assert all(counts[key] == 1 for key in sent_keys), "a sent message is missing from the sandbox"
    assert sorted(inbox) == sorted(unknown_ids), "every unknown outcome is in front of the operator"


@pytest.mark.skipif(not (IS_POSTGRES and REAL_BROKER and BROKER_URL.startswith("redis")),
                    reason="needs PostgreSQL and Redis")
def test_flushing_redis_mid_run_loses_nothing(rt, backlog, procs, database_url):
    import redis

    ids = backlog(300)
    _set_sandbox(rt, backlog.channel_id, delay_ms=10)
    short_lease = {"LEMBRA_LEASE_SECONDS": "3"}
    _start_workers(procs, database_url, 1, **short_lease)
    _start_scheduler(procs, database_url, **short_lease)
    wait_until(lambda: _status_counts(rt).get("sent", 0) >= 30, timeout=120, what="the first sends",
               on_fail=procs.logs)
    redis.Redis.from_url(BROKER_URL).flushdb()
    wait_until(lambda: _status_counts(rt).get("sent", 0) == len(ids), timeout=180,
               what="every message sent after the flush", on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")
    counts = _sandbox_counts(rt)
    assert len(counts) == len(ids) and set(counts.values()) == {1}
