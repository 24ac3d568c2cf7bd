"""The bare write: how long PostgreSQL takes to write populate's rows when nothing else is done.

bench/throughput.py runs this after a `--populate-only` run, as the populate counterpart of the
bare wire (bench/wire.py): the reminders populate wrote are copied aside, `messages` and
`message_events` emptied, and the same rows written again, per org, by one `INSERT … SELECT …
ON CONFLICT DO NOTHING` with each row's `queued`/`skipped` event in the same statement (the
statement shape populate uses), on as many connections at a time as populate uses. The schema is
the real one: every index, foreign key and constraint of the two tables is there, so the write
pays what populate's write pays; what it leaves out is populate's own work (which appointments,
rules and channel kinds apply, the plan of each reminder's time, the cancellation of stale ones).

Populate's time beside it says how much of populate is the write itself: the part no change to
populate's queries can take away on this machine while the schema stays as it is.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

#: The columns populate writes (engine/reminders/populate.py, `_insert_reminders`), copied as they are.
COLUMNS = (
    "org_id", "purpose", "contact_id", "channel_kind", "appointment_id", "appointment_starts_at",
    "rule_id", "template_key", "respect_window", "idempotency_key", "status", "nominal_due_at",
    "due_at", "next_attempt_at", "expires_at", "skip_reason", "attempts", "created_at", "updated_at",
)
SOURCE = "bench_bare_write_source"

_WRITE = f"""
WITH ins AS (
    INSERT INTO messages ({", ".join(COLUMNS)})
    SELECT {", ".join(COLUMNS)} FROM {SOURCE} WHERE org_id = %(org)s
    ON CONFLICT (org_id, idempotency_key) DO NOTHING
    RETURNING id, status, skip_reason
), events AS (
    INSERT INTO message_events (org_id, message_id, event, detail, created_at)
    SELECT %(org)s, id, CASE WHEN status = 'pending' THEN 'queued' ELSE 'skipped' END,
           CASE WHEN status = 'skipped' THEN jsonb_build_object('reason', skip_reason) END, now()
    FROM ins WHERE status IN ('pending', 'skipped')
)
SELECT count(*) FROM ins
"""


@dataclass
class BareWrite:
    """What the bare write took."""

    rows: int
    foreign_keys: bool
    seconds: float
    postgresql_cpu_seconds: float
    connections: int


def run(conninfo: str, connections: int, cpu_meter: Callable[[], Callable[[], float]], *,
        foreign_keys: bool = True) -> BareWrite:
    """Write again, into emptied tables, the reminders the database holds (see the module's doc).

    `cpu_meter()` starts counting the CPU time of the database's PostgreSQL processes and returns
    a function that reads it (the write's own backends are connected before it starts and closed
    after it is read). `foreign_keys=False` writes with PostgreSQL's foreign-key triggers off
    (`session_replication_role = replica`, a superuser's setting, for this write's sessions only):
    a measurement of what the checks cost, never what Lembra does. The database is left with the
    same reminders as before (new ids), their events made the same way."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {SOURCE}")
        # Ordered by org, so that each org's rows are read from adjacent pages through the index.
        conn.execute(f"CREATE UNLOGGED TABLE {SOURCE} AS SELECT {', '.join(COLUMNS)} FROM messages "
                     "ORDER BY org_id, id")
        conn.execute(f"CREATE INDEX ON {SOURCE} (org_id)")
        conn.execute(f"ANALYZE {SOURCE}")
        orgs = [row[0] for row in conn.execute(f"SELECT DISTINCT org_id FROM {SOURCE} ORDER BY 1")]
        expected = conn.execute(f"SELECT count(*) FROM {SOURCE}").fetchone()[0]
        # Emptied as populate found them: nothing else refers to a reminder in this benchmark.
        conn.execute("TRUNCATE message_events, messages CASCADE")
        conn.execute("VACUUM ANALYZE messages")
        conn.execute("VACUUM ANALYZE message_events")

    todo: queue.Queue[int] = queue.Queue()
    for org in orgs:
        todo.put(org)
    written: list[int] = []
    failures: list[Exception] = []

    def worker(conn: psycopg.Connection) -> None:
        try:
            while True:
                try:
                    org = todo.get_nowait()
                except queue.Empty:
                    return
                with conn.transaction():
                    written.append(conn.execute(_WRITE, {"org": org}).fetchone()[0])
        except Exception as exc:  # noqa: BLE001 - re-raised by run(), not lost in the thread
            failures.append(exc)

    # Connected before and closed after the measurement: a backend that has exited takes its CPU
    # time with it.
    conns = [psycopg.connect(conninfo) for _ in range(max(1, connections))]
    if not foreign_keys:
        for conn in conns:
            conn.execute("SET session_replication_role = replica")
            conn.commit()
    try:
        cpu_used, started = cpu_meter(), time.perf_counter()
        threads = [threading.Thread(target=worker, args=(conn,), name=f"bare-write-{i}")
                   for i, conn in enumerate(conns)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds, cpu = time.perf_counter() - started, cpu_used()
    finally:
        for conn in conns:
            conn.close()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {SOURCE}")
    if failures:
        raise failures[0]
    if sum(written) != expected:
        raise RuntimeError(f"the bare write wrote {sum(written)} rows of {expected}")
    return BareWrite(rows=expected, foreign_keys=foreign_keys, seconds=seconds, postgresql_cpu_seconds=cpu,
                     connections=len(conns))
