"""The scheduler survives losing its database connection: a PostgreSQL restart or failover
must not stop it; it takes the leader lock again on a new connection."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from engine.fleet.scheduler import LEADER_LOCK, Scheduler
from tests.conftest import IS_POSTGRES
from tests.processes import wait_until

pytestmark = pytest.mark.skipif(not IS_POSTGRES, reason="the leader lock is a PostgreSQL advisory lock")


def _holder(rt) -> int | None:
    with rt.db.connect() as conn:
        return conn.execute(text(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = :k AND granted"
        ), {"k": LEADER_LOCK}).scalar()


def test_scheduler_takes_the_lock_again_after_its_connection_is_killed(rt):
    stop = threading.Event()
    scheduler = Scheduler(rt, lambda ids: None)
    thread = threading.Thread(target=scheduler.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: _holder(rt) is not None, timeout=30, what="the scheduler to take the lock")
        first = _holder(rt)
        with rt.db.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        wait_until(lambda: _holder(rt) not in (None, first), timeout=60,
                   what="the scheduler to take the lock on a new connection")
        assert thread.is_alive(), "the scheduler stopped after losing its connection"
    finally:
        stop.set()
        thread.join(timeout=30)
