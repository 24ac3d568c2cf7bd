"""What a send's three compare-and-set transitions cost PostgreSQL, per message, on two layouts.

    .venv/bin/python bench/transitions.py --messages 50000 --rounds 2

Builds the benchmark's data (bench/throughput.py: orgs, COPY'd contacts and appointments, the
engine's populate: one `pending` row in `messages` per appointment), then, on a fresh copy of that
database for each run, replays in SQL what the engine's statements do to PostgreSQL for every
message, in batches of 100 ids with one commit per step, as the scheduler and the workers do:

- `messages` (the layout in use): `pending` → `claimed` → `sending` → `sent`, three updates of the
  wide `messages` row (none can be HOT: `status` is in an index), each with its `message_events` row;
- `queue` (a narrow table of open messages, not in the engine): `claimed` and `sending` update a
  five-column row in a table of its own, `sent` deletes it and updates `messages` once;
- `events`: the three batches of `message_events` rows alone;
- `updates`: the three updates of `messages` alone.

It prints the backend's CPU time per message (read from /proc, so PostgreSQL must run on this
machine) and the wall time. Everything else the pipeline asks of PostgreSQL (the reads before a
send, the claim's search, autovacuum) is left out on purpose: this measures the writes a layout
decides. The statements mirror engine/messaging/dispatch/claim.py, checks.py `_mark_sending` and
outcomes.py `record_sent`; they are written out here, so a change to those must be copied here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.store.db import Database  # noqa: E402
from engine.core.logs import configure as configure_logs  # noqa: E402
from engine.store.migrate import upgrade  # noqa: E402
from engine.reminders.populate import populate  # noqa: E402
from gateway.crypto import Keyring  # noqa: E402
from throughput import (  # noqa: E402
    HORIZON, LoadPlan, bulk_load, create_database, create_orgs, drop_database, pick_timezone, sqlalchemy_url,
)

UTC = timezone.utc
BATCH = 100
BODY = "Olá, Maria! Lembrete: sua consulta na Clínica Exemplo é amanhã, 10/12, às 14:30."

EVENTS = """INSERT INTO message_events (org_id, message_id, event, attempt, provider_status, detail, created_at)
            SELECT org_id, id, %s, attempts, NULL, NULL, now() FROM messages WHERE id = ANY(%s::bigint[])"""
CLAIM = """UPDATE messages SET status = 'claimed', lease_until = now() + interval '5 min', claimed_by = 'bench',
           updated_at = now() WHERE id = ANY(%s::bigint[]) AND status = 'pending'"""
SENDING = """UPDATE messages SET status = 'sending', attempts = attempts + 1, claimed_by = 'bench', channel_id = channel_id,
             subject = NULL, body = %s, lease_until = now() + interval '5 min', updated_at = now()
             WHERE id = ANY(%s::bigint[]) AND status = 'claimed'"""
SENT = """UPDATE messages SET status = 'sent', sent_at = now(), provider_message_id = 'wamid.' || id,
          lease_until = NULL, error_code = NULL, error_detail = NULL, updated_at = now()
          WHERE id = ANY(%s::bigint[]) AND status = 'sending'"""

QUEUE_DDL = (
    """CREATE TABLE message_queue (message_id bigint PRIMARY KEY REFERENCES messages (id),
       org_id bigint NOT NULL REFERENCES orgs (id), status text NOT NULL, due_at timestamptz,
       lease_until timestamptz) WITH (fillfactor = 50)""",
    "CREATE INDEX message_queue_due ON message_queue (due_at) WHERE status = 'pending'",
    "CREATE INDEX message_queue_leased ON message_queue (lease_until) WHERE status IN ('claimed', 'sending')",
    "INSERT INTO message_queue SELECT id, org_id, 'pending', next_attempt_at, NULL FROM messages",
    "ANALYZE message_queue",
)
Q_CLAIM = """UPDATE message_queue SET status = 'claimed', lease_until = now() + interval '5 min'
             WHERE message_id = ANY(%s::bigint[]) AND status = 'pending'"""
Q_SENDING = """UPDATE message_queue SET status = 'sending', lease_until = now() + interval '5 min'
               WHERE message_id = ANY(%s::bigint[]) AND status = 'claimed'"""
Q_DONE = "DELETE FROM message_queue WHERE message_id = ANY(%s::bigint[]) AND status = 'sending'"
Q_SENT = """UPDATE messages SET status = 'sent', attempts = attempts + 1, body = %s, sent_at = now(),
            provider_message_id = 'wamid.' || id, updated_at = now()
            WHERE id = ANY(%s::bigint[]) AND status = 'pending'"""

Step = Callable[[psycopg.Cursor, str], None]


def _messages_layout(cur: psycopg.Cursor, ids: str) -> None:
    cur.execute(CLAIM, (ids,))
    cur.execute(EVENTS, ("claimed", ids))
    cur.connection.commit()
    cur.execute(SENDING, (BODY, ids))
    cur.execute(EVENTS, ("sending", ids))
    cur.connection.commit()
    cur.execute(SENT, (ids,))
    cur.execute(EVENTS, ("sent", ids))
    cur.connection.commit()


def _queue_layout(cur: psycopg.Cursor, ids: str) -> None:
    cur.execute(Q_CLAIM, (ids,))
    cur.execute(EVENTS, ("claimed", ids))
    cur.connection.commit()
    cur.execute(Q_SENDING, (ids,))
    cur.execute(EVENTS, ("sending", ids))
    cur.connection.commit()
    cur.execute(Q_DONE, (ids,))
    cur.execute(Q_SENT, (BODY, ids))
    cur.execute(EVENTS, ("sent", ids))
    cur.connection.commit()


def _events_only(cur: psycopg.Cursor, ids: str) -> None:
    for event in ("claimed", "sending", "sent"):
        cur.execute(EVENTS, (event, ids))
        cur.connection.commit()


def _updates_only(cur: psycopg.Cursor, ids: str) -> None:
    for statement, params in ((CLAIM, (ids,)), (SENDING, (BODY, ids)), (SENT, (ids,))):
        cur.execute(statement, params)
        cur.connection.commit()


VARIANTS: dict[str, Step] = {
    "messages": _messages_layout, "queue": _queue_layout, "events": _events_only, "updates": _updates_only,
}


def _backend_cpu(pid: int) -> float:
    """User + system CPU seconds of one PostgreSQL backend (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_variant(conninfo: str, variant: str) -> dict[str, float]:
    """Replay one layout over every message of the database; returns CPU and wall ms per message."""
    with psycopg.connect(conninfo) as conn:
        cur = conn.cursor()
        pid = cur.execute("SELECT pg_backend_pid()").fetchone()[0]
        ids = [row[0] for row in cur.execute("SELECT id FROM messages WHERE status = 'pending' ORDER BY id")]
        if variant == "queue":
            for statement in QUEUE_DDL:
                cur.execute(statement)
        conn.commit()
        step = VARIANTS[variant]
        cpu0, wall0 = _backend_cpu(pid), time.perf_counter()
        for start in range(0, len(ids), BATCH):
            step(cur, "{" + ",".join(map(str, ids[start:start + BATCH])) + "}")
        cpu, wall = _backend_cpu(pid) - cpu0, time.perf_counter() - wall0
        statuses = dict(cur.execute("SELECT status, count(*) FROM messages GROUP BY status").fetchall())
    expected = {"events": {"pending": len(ids)}, "updates": {"sent": len(ids)}}.get(variant, {"sent": len(ids)})
    if statuses != expected:
        raise SystemExit(f"{variant}: rows ended {statuses}, expected {expected}")
    return {"messages": len(ids), "cpu_ms": 1000 * cpu / len(ids), "wall_ms": 1000 * wall / len(ids)}


def build(pg: str, name: str, messages: int, orgs: int) -> None:
    """A database holding `messages` pending reminders, as bench/throughput.py loads them."""
    create_database(pg, name)
    url = sqlalchemy_url(pg, name)
    upgrade(url)
    db = Database(url)
    try:
        tz = pick_timezone()
        org_ids = create_orgs(db, Keyring.parse(Keyring.generate_spec()), orgs, tz, realistic_window=False)
        plan = LoadPlan(org_ids=org_ids, appointments=messages, contacts_per_appointment=0.5, tz=tz,
                        due_from=datetime.now(UTC) + timedelta(hours=1), spread=60.0)
        bulk_load(f"{pg} dbname={name}", plan)
        populate(db, horizon=HORIZON)
    finally:
        db.dispose()
    with psycopg.connect(f"{pg} dbname={name}", autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--orgs", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2, help="runs of every variant, interleaved")
    p.add_argument("--variants", default="messages,queue,events,updates")
    p.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres")
    p.add_argument("--db-name", default="lembra_bench_transitions")
    args = p.parse_args()
    if not args.db_name.startswith("lembra_bench"):
        p.error("--db-name must start with lembra_bench (the database is dropped)")
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    configure_logs("WARNING", "text")
    template, copy = args.db_name, f"{args.db_name}_run"
    build(args.pg, template, args.messages, args.orgs)
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    try:
        for round_ in range(1, args.rounds + 1):
            for variant in variants:
                with psycopg.connect(f"{args.pg} dbname=postgres", autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')
                    conn.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{template}"')
                out = run_variant(f"{args.pg} dbname={copy}", variant)
                results[variant].append(out)
                print(f"round {round_} {variant:<9} {out['messages']:,} messages: backend CPU "
                      f"{out['cpu_ms']:.3f} ms/message, wall {out['wall_ms']:.3f} ms/message", flush=True)
    finally:
        drop_database(args.pg, copy)
        drop_database(args.pg, template)
    print("\nbackend CPU per message, each round (ms):")
    for variant, runs in results.items():
        print(f"  {variant:<9} " + " / ".join(f"{r['cpu_ms']:.3f}" for r in runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
