"""Where a worker's time goes: send N reminders in this process, one thread, under cProfile.

    .venv/bin/python bench/profile_send.py --messages 2000

Builds the same data as bench/throughput.py (fresh `lembra_bench_profile` database, sandbox
WhatsApp channel, 120-minute rule), populates, claims everything with `dispatch.claim_due`, then
calls `dispatch.send_batch` on batches of LEMBRA_SEND_BATCH ids as the `send_messages` actor does, counting
SQL statements and transactions and measuring wall and CPU time per message. No broker, no
threads, no other process: the figures are the engine's own per-message cost.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sqlalchemy import event  # noqa: E402

from engine.messaging import dispatch  # noqa: E402
from engine.core.config import Settings  # noqa: E402
from engine.store.db import Database  # noqa: E402
from engine.core.logs import configure as configure_logs  # noqa: E402
from engine.store.migrate import upgrade  # noqa: E402
from engine.reminders.populate import populate  # noqa: E402
from engine.store.runtime import Runtime  # noqa: E402
from gateway.crypto import Keyring  # noqa: E402
from throughput import (  # noqa: E402
    HORIZON, LoadPlan, bulk_load, create_database, create_orgs, drop_database, pick_timezone, sqlalchemy_url,
)

UTC = timezone.utc


#: Engine functions whose inclusive time per message is shown (file suffix, function name).
ENGINE_FUNCS = (
    ("engine/messaging/dispatch/send.py", "send_batch"), ("engine/messaging/dispatch/checks.py", "prepare"),
    ("engine/messaging/dispatch/batch.py", "load"), ("engine/messaging/dispatch/outcomes.py", "record_sent"),
    ("engine/queue/outbox.py", "transition"),
    ("engine/queue/outbox.py", "record_events"), ("engine/messaging/templates.py", "render_message"),
    ("engine/messaging/templates.py", "find_template"), ("engine/messaging/render.py", "reminder_variables"),
    ("engine/messaging/render.py", "render_text"), ("engine/tenants/channels.py", "record"), ("engine/tenants/channels.py", "default_channel"),
    ("engine/tenants/channels.py", "get"), ("engine/tenants/orgs.py", "policy_for"),
    ("engine/reminders/windows.py", "is_allowed"), ("engine/store/db.py", "begin"),
    ("sqlalchemy/engine/base.py", "_commit_impl"), ("sqlalchemy/pool/base.py", "_checkout"),
    ("sqlalchemy/engine/default.py", "do_ping"), ("psycopg/connection.py", "wait"),
)


def _library(path: str) -> str:
    for marker in ("sqlalchemy", "psycopg", "jinja2", "babel", "holidays", "zoneinfo", "uuid"):
        if marker in path:
            return marker
    for marker, name in (("/engine/", "lembra engine"), ("/gateway/", "lembra gateway"),
                         ("/providers/", "lembra providers")):
        if marker in path:
            return name
    return "other" if path != "~" else "builtins (C)"


def print_breakdown(stats: pstats.Stats, n: int) -> None:
    """Own time per library, and inclusive time of the engine's steps, in ms per message."""
    own: Counter[str] = Counter()
    wait = 0.0
    for (path, _line, func), (_cc, _nc, tottime, _cum, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if path.endswith("psycopg/connection.py") and func == "wait":
            wait += tottime  # blocked on the socket, mostly: PostgreSQL working or the round trip
            continue
        own[_library(path)] += tottime
    total = sum(own.values()) + wait
    print(f"under cProfile, ms per message (profiler overhead inflates Python time ~2x): total {1000 * total / n:.2f}")
    print(f"  psycopg Connection.wait (waiting for PostgreSQL): {1000 * wait / n:.2f}")
    for lib, t in own.most_common():
        print(f"  {lib}: {1000 * t / n:.2f}")
    print("inclusive ms per message of the engine's steps (under cProfile):")
    for suffix, name in ENGINE_FUNCS:
        cum = sum(v[3] for (path, _l, func), v in stats.stats.items()  # type: ignore[attr-defined]
                  if path.endswith(suffix) and func == name)
        calls = sum(v[1] for (path, _l, func), v in stats.stats.items()  # type: ignore[attr-defined]
                    if path.endswith(suffix) and func == name)
        print(f"  {suffix}:{name}: {1000 * cum / n:.2f} ms ({calls / n:.1f} calls)")


def micro(rt: Runtime, message_id: int, rounds: int = 2000) -> None:
    """Unprofiled costs of single pieces, per call (this machine, this load)."""
    from sqlalchemy import select, text

    from engine.store.models import messages
    from engine.messaging.render import render_text, reminder_variables

    def timed(label: str, fn, k: int = rounds) -> None:  # type: ignore[no-untyped-def]
        fn()
        w, c = time.perf_counter(), time.process_time()
        for _ in range(k):
            fn()
        print(f"  {label}: wall {1e6 * (time.perf_counter() - w) / k:.0f} us, "
              f"CPU {1e6 * (time.process_time() - c) / k:.0f} us")

    print("micro-benchmarks, per call, unprofiled:")
    starts = datetime(2026, 3, 21, 17, 0, tzinfo=UTC)
    variables = reminder_variables(contact_name="Ana Souza", professional="Dra. Beatriz", starts_at=starts,
                                   timezone="America/Sao_Paulo", mode="in_person", location="Rua 1",
                                   org_name="Clínica")
    with rt.db.connect() as conn:
        body = conn.execute(text("SELECT body FROM templates WHERE key = 'session_reminder' "
                                 "AND channel_kind = 'whatsapp' AND org_id IS NULL")).scalar_one()
    timed("reminder_variables (babel dates)", lambda: reminder_variables(
        contact_name="Ana Souza", professional="Dra. Beatriz", starts_at=starts, timezone="America/Sao_Paulo",
        mode="in_person", location="Rua 1", org_name="Clínica"))
    timed("render_text (jinja sandbox, cached compile)", lambda: render_text(body, variables))

    def empty_tx() -> None:
        with rt.db.begin():
            pass
    timed("empty db.begin() transaction (pool checkout + pre-ping + commit)", empty_tx)

    def sa_select() -> None:
        with rt.db.connect() as conn:
            conn.execute(select(messages).where(messages.c.id == message_id)).first()
    timed("SQLAlchemy Core select(messages) by id, on a pooled connection", sa_select)
    raw = rt.db.engine.raw_connection()
    try:
        cur = raw.cursor()

        def psycopg_select() -> None:
            cur.execute("SELECT * FROM messages WHERE id = %s", (message_id,))
            cur.fetchone()
        timed("the same select with a raw psycopg cursor", psycopg_select)

        def psycopg_ping() -> None:
            cur.execute("SELECT 1")
            cur.fetchone()
        timed("SELECT 1 round trip, raw psycopg", psycopg_ping)
        raw.rollback()
    finally:
        raw.close()


def send_all(rt: Runtime, ids: list[int]) -> Counter[str]:
    """Send `ids` in the actor's batches; returns how many ended each way."""
    size = rt.settings.send_batch
    outcomes: Counter[str] = Counter()
    for start in range(0, len(ids), size):
        outcomes.update(dispatch.send_batch(rt, ids[start:start + size]).values())
    return outcomes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--orgs", type=int, default=10)
    p.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres")
    p.add_argument("--db-name", default="lembra_bench_profile")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    if not args.db_name.startswith("lembra_bench"):
        p.error("--db-name must start with lembra_bench (the database is dropped)")
    configure_logs("WARNING", "text")
    url = sqlalchemy_url(args.pg, args.db_name)
    create_database(args.pg, args.db_name)
    try:
        upgrade(url)
        spec = Keyring.generate_spec()
        db = Database(url)
        org_ids = create_orgs(db, Keyring.parse(spec), args.orgs, pick_timezone(), realistic_window=False)
        # Due a few seconds from now, so claim_due takes them all at once.
        plan = LoadPlan(org_ids=org_ids, appointments=args.messages, contacts_per_appointment=0.5,
                        tz=pick_timezone(), due_from=datetime.now(UTC) + timedelta(seconds=5), spread=0.0)
        bulk_load(f"{args.pg} dbname={args.db_name}", plan)
        populate(db, horizon=HORIZON)
        db.dispose()
        rt = Runtime.build(Settings(database_url=url, broker_url="stub://", secret_keys=spec))
        time.sleep(6)
        ids: list[int] = []
        while True:
            batch = dispatch.claim_due(rt, limit=1000)
            ids += batch
            if len(batch) < 1000:
                break
        print(f"claimed {len(ids)} messages")

        statements: Counter[str] = Counter()
        cache: Counter[str] = Counter()
        transactions = [0]

        @event.listens_for(rt.db.engine, "before_cursor_execute")
        def _count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            statements[statement.split(None, 1)[0].upper()] += 1
            # Whether SQLAlchemy reused the compiled statement or compiled it again (a statement
            # whose cache key changes from call to call is compiled every time).
            cache[f"{statement.split(None, 1)[0].upper()} {getattr(context, 'cache_hit', None)}"] += 1

        @event.listens_for(rt.db.engine, "commit")
        def _commit(conn):  # type: ignore[no-untyped-def]
            transactions[0] += 1

        # Warm up (first use of the channel, template compile, statement caches) outside the profile.
        warm, ids = ids[:50], ids[50:]
        send_all(rt, warm)
        statements.clear()
        cache.clear()
        transactions[0] = 0

        # Half without the profiler (the true per-message cost), half under it (where it goes).
        plain, ids = ids[: len(ids) // 2], ids[len(ids) // 2:]
        wall0, cpu0 = time.perf_counter(), time.process_time()
        send_all(rt, plain)
        plain_wall, plain_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        print("SQLAlchemy compiled cache, statements without the profiler: "
              + ", ".join(f"{k} {v}" for k, v in sorted(cache.items())))
        statements.clear()
        transactions[0] = 0

        profiler = cProfile.Profile()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        profiler.enable()
        outcomes = send_all(rt, ids)
        profiler.disable()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0

        n = len(ids)
        print(f"\nwithout profiler: {len(plain)} messages, wall {1000 * plain_wall / len(plain):.2f} ms/message, "
              f"CPU (this process) {1000 * plain_cpu / len(plain):.2f} ms/message "
              f"= {len(plain) / plain_wall:.0f} messages/s on one thread")
        print(f"under cProfile: {n} messages: {dict(outcomes)}")
        print(f"profiled: wall {1000 * wall / n:.2f} ms/message, CPU (this process) {1000 * cpu / n:.2f} ms/message")
        print(f"SQL statements per message: {sum(statements.values()) / n:.1f} "
              f"({', '.join(f'{k} {v / n:.1f}' for k, v in statements.most_common())}); "
              f"transactions per message: {transactions[0] / n:.1f}")
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        print_breakdown(stats, n)
        micro(rt, ids[0])
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())
        rt.close()
    finally:
        if not args.keep:
            drop_database(args.pg, args.db_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
