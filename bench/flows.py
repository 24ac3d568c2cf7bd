"""Follow-up flows benchmark: N live enrollments due at once, advanced by real worker processes.

    .venv/bin/python bench/flows.py --enrollments 100000 --workers 2 --threads 8
    .venv/bin/python bench/flows.py --enrollments 20000 --with-send
    .venv/bin/python bench/flows.py --enrollments 0 --inline 2000          # statement counts only

What it does (see docs/benchmarks.md for the current figures, and docs/benchmarks-history.md,
"Follow-up flows", for the runs and how to read them):

1. creates a fresh PostgreSQL database (default `lembra_bench_flows`), applies the migrations and
   creates one clinic through the engine's functions: a 00:00-23:59 window with no Sunday or holiday
   skipping, a sandbox WhatsApp channel, and a manual flow published through
   `engine.flows.versions`: `trigger → wait(fixed 60) → end`, or with `--with-send`
   `trigger → wait(fixed 60) → action(template followup_checkin) → end` (outbox + sandbox);
2. COPYs N contacts with WhatsApp consent and N enrollments sitting at the wait, each entered an
   hour before its due instant, all due at the same instant `--lead` seconds after the load;
3. starts `lembra worker --processes W --threads T --conversation-threads C` (flow steps run on the
   C threads of the conversation pool, sends on the T of the send pool) and, once every worker process polls Redis,
   one `lembra scheduler`; waits until no enrollment is due or claimed (and, with `--with-send`, no
   message is open), and stops them;
4. samples RSS and CPU of the workers, the scheduler and PostgreSQL (bench/throughput.py's sampler);
5. prints enrollments advanced per second, lateness (the `step` event's `created_at` minus the
   due instant) percentiles computed in SQL, the checks (one `ok` step per enrollment at the wait,
   what else the steps recorded, statuses), PostgreSQL counters per advance (commits, rows
   written, WAL; pg_stat_statements is not loaded on the server, so no per-statement counts from
   there), peak RSS, CPU per advance, the machine and the commit;
6. `--inline K` then loads K more due enrollments and advances them inside this process with
   `engine.flows.runtime.advance_claimed`, in claims of `--send-batch` as the actor gets them, counting
   every SQL statement (SQLAlchemy `before_cursor_execute`) and transaction, and timing CPU and wall
   per advance; with `--with-send` it also sends what they queued with `dispatch.send_batch` and
   counts those statements apart. `--inline-profile` runs the inline advances under cProfile and
   prints the share of time per library.

`--py-spy SECONDS` records one worker process with py-spy (`--gil`) once advancing starts (py-spy is
not a project dependency: `pip install py-spy` into the venv first).

The exit status is 1 when an enrollment was advanced twice at the wait or never (lost), a key
reached the sandbox twice, a follow-up was not sent (`--with-send`), in the process run or inline,
or the run timed out.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import redis  # noqa: E402
from sqlalchemy import event, select  # noqa: E402

from bench.throughput import (  # noqa: E402
    FakeProcess,
    fake_channel_credentials,
    fake_checks,
    Children,
    Sampler,
    _library,
    _terminated,
    code_version,
    create_database,
    drop_database,
    log,
    machine_info,
    pick_timezone,
    sqlalchemy_url,
    start_py_spy,
    summarize_collapsed,
    wait_for_workers,
)
from engine.tenants.channels import create_channel  # noqa: E402
from engine.core.config import Settings  # noqa: E402
from engine.store.db import Database  # noqa: E402
from engine.flows import versions  # noqa: E402
from engine.core.logs import configure as configure_logs  # noqa: E402
from engine.store.migrate import upgrade  # noqa: E402
from engine.store.models import flow_pointers  # noqa: E402
from engine.tenants.orgs import create_org  # noqa: E402
from gateway.crypto import Keyring  # noqa: E402

UTC = timezone.utc
WAIT_NODE = "espera"
WAIT_MINUTES = 60


def graph(with_send: bool) -> dict[str, Any]:
    nodes = [{"id": "inicio", "type": "trigger", "config": {}},
             {"id": WAIT_NODE, "type": "wait", "config": {"mode": "fixed", "minutes": WAIT_MINUTES}}]
    if with_send:
        nodes.append({"id": "checkin", "type": "action",
                      "config": {"mode": "template", "template": "followup_checkin", "channel_kinds": ["whatsapp"]}})
    nodes.append({"id": "fim", "type": "end", "config": {"outcome": "exhausted"}})
    edges = [{"source": a["id"], "target": b["id"], "condition": {"type": "always"}} for a, b in zip(nodes, nodes[1:])]
    return {"nodes": nodes, "edges": edges}


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def create_clinic(db: Database, keyring: Keyring, tz: str, with_send: bool,
                  fake_base_url: str | None = None) -> dict[str, int]:
    """One org, its channel (sandbox, or Meta at the loopback fake with `fake_base_url`) and the
    published flow, through the engine's functions."""
    with db.begin() as conn:
        org_id = create_org(conn, slug="bench-flows", name="Clínica Bench Flows", timezone=tz, state="SP",
                            quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
        if fake_base_url is not None:
            create_channel(conn, keyring, org_id=org_id, kind="whatsapp", provider="meta",
                           name="WhatsApp (Meta, loopback fake)", credentials=fake_channel_credentials(0, fake_base_url),
                           is_default=True)
        else:
            create_channel(conn, keyring, org_id=org_id, kind="whatsapp", provider="sandbox",
                           name="WhatsApp (sandbox)", credentials={"token": "bench"}, is_default=True)
        pointer_id = versions.create_flow(conn, org_id, name="Retorno (bench)", draft_graph=graph(with_send),
                                          trigger_config={"kind": "manual"})
        version = versions.publish(conn, org_id, pointer_id)
        assert conn.execute(select(flow_pointers.c.status).where(flow_pointers.c.id == pointer_id)).scalar() == "active"
    return {"org_id": org_id, "pointer_id": pointer_id, "version_id": int(version.id)}


def load_contacts(conninfo: str, org_id: int, count: int) -> float:
    """COPY `count` contacts (ids 1..count) with WhatsApp consent."""
    now = datetime.now(UTC)
    started = time.perf_counter()
    with psycopg.connect(conninfo) as conn:
        with conn.cursor().copy("COPY contacts (id, org_id, name, phone, email, created_at, updated_at) "
                                "FROM STDIN") as copy:
            for cid in range(1, count + 1):
                copy.write_row((cid, org_id, f"Paciente {cid}", f"+55119{cid:08d}", None, now, now))
        with conn.cursor().copy("COPY preferences (org_id, contact_id, kind, opted_in, opted_in_at, source, evidence, "
                                "updated_at) FROM STDIN") as copy:
            for cid in range(1, count + 1):
                copy.write_row((org_id, cid, "whatsapp", True, now, "import", "bench", now))
        conn.execute("SELECT setval(pg_get_serial_sequence('contacts', 'id'), (SELECT max(id) FROM contacts))")
    return time.perf_counter() - started


def load_enrollments(conninfo: str, clinic: dict[str, int], contact_ids: range, due: datetime) -> float:
    """COPY one live enrollment per contact, at the wait entered an hour before `due`."""
    now = datetime.now(UTC)
    entered = due - timedelta(minutes=WAIT_MINUTES)
    started = time.perf_counter()
    with psycopg.connect(conninfo) as conn:
        with conn.cursor().copy(
            "COPY enrollments (org_id, pointer_id, version_id, contact_id, current_node_id, status, next_eval_at, "
            "node_entered_at, steps, trigger_kind, trigger_key, created_at, updated_at) FROM STDIN"
        ) as copy:
            for cid in contact_ids:
                copy.write_row((clinic["org_id"], clinic["pointer_id"], clinic["version_id"], cid, WAIT_NODE, "active",
                                due, entered, 1, "manual", f"manual:bench:{cid}", now, now))
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE contacts, preferences, enrollments")
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


def pg_counters(conn: psycopg.Connection) -> dict[str, int]:
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(
        "SELECT d.xact_commit, d.tup_inserted, d.tup_updated, d.tup_returned + d.tup_fetched, "
        "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, t.n_tup_upd, t.n_tup_hot_upd "
        "FROM pg_stat_database d, pg_stat_user_tables t "
        "WHERE d.datname = current_database() AND t.relname = 'enrollments'"
    ).fetchone()
    return dict(zip(("commits", "tuples_inserted", "tuples_updated", "tuples_read", "wal_bytes",
                     "enrollments_updates", "enrollments_hot_updates"), row))


def table_reads(conn: psycopg.Connection) -> dict[str, tuple[int, int, int, int]]:
    """Per table: (sequential scans, rows they read, index scans, rows fetched through indexes)."""
    return {name: (seq or 0, seq_rows or 0, idx or 0, idx_rows or 0) for name, seq, seq_rows, idx, idx_rows in
            conn.execute("SELECT relname, seq_scan, seq_tup_read, idx_scan, idx_tup_fetch FROM pg_stat_user_tables")}


def reads_per(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]], per: int) -> dict[str, Any]:
    """The tables most read between two snapshots, per unit: seq scans, rows seq-read, index scans, rows fetched."""
    rows = []
    for name, now in after.items():
        was = before.get(name, (0, 0, 0, 0))
        delta = [a - b for a, b in zip(now, was)]
        if any(delta):
            rows.append((delta[1] + delta[3], name, delta))
    return {name: {"seq_scans": round(d[0] / per, 2), "seq_rows": round(d[1] / per, 1),
                   "index_scans": round(d[2] / per, 2), "index_rows": round(d[3] / per, 1)}
            for _total, name, d in sorted(rows, reverse=True)[:6]}


def progress(conn: psycopg.Connection) -> dict[str, int]:
    due, leased, live, dead = conn.execute(
        "SELECT count(*) FILTER (WHERE next_eval_at <= now()), count(*) FILTER (WHERE lease_until IS NOT NULL), "
        "count(*), (SELECT count(*) FROM enrollments WHERE status = 'dead') "
        "FROM enrollments WHERE status IN ('active', 'waiting_reply')"
    ).fetchone()
    open_messages = conn.execute(
        "SELECT count(*) FROM messages WHERE status IN ('new', 'pending', 'claimed', 'sending')").fetchone()[0]
    return {"due": due, "leased": leased, "live": live, "dead": dead, "open_messages": open_messages}


def results(conn: psycopg.Connection, due: datetime, with_send: bool) -> dict[str, Any]:
    ok_at_wait = ("event_type = 'step' AND node_id = %s AND payload->>'status' = 'ok'")
    advanced, first, last = conn.execute(
        f"SELECT count(*), min(created_at), max(created_at) FROM enrollment_events WHERE {ok_at_wait}",
        (WAIT_NODE,)).fetchone()
    out: dict[str, Any] = {"advanced": advanced, "due_at": due.isoformat()}
    out["steps_by_node_status_reason"] = {
        f"{n} {s} {r}": c for n, s, r, c in conn.execute(
            "SELECT node_id, payload->>'status', payload->>'reason', count(*) FROM enrollment_events "
            "WHERE event_type = 'step' GROUP BY 1, 2, 3 ORDER BY 4 DESC").fetchall()}
    out["enrollments_by_status"] = dict(conn.execute(
        "SELECT status || coalesce(' ' || outcome, ''), count(*) FROM enrollments GROUP BY 1").fetchall())
    out["enrollments_with_attempts"] = conn.execute(
        "SELECT count(*) FROM enrollments WHERE attempts > 0").fetchone()[0]
    out["advanced_twice_at_wait"] = conn.execute(
        f"SELECT count(*) FROM (SELECT enrollment_id FROM enrollment_events WHERE {ok_at_wait} "
        "GROUP BY 1 HAVING count(*) > 1) d", (WAIT_NODE,)).fetchone()[0]
    if with_send:
        out["messages_by_status"] = dict(conn.execute("SELECT status, count(*) FROM messages GROUP BY 1").fetchall())
        out["sandbox_duplicate_keys"] = conn.execute(
            "SELECT count(*) FROM (SELECT idempotency_key FROM sandbox_messages GROUP BY 1 HAVING count(*) > 1) d"
        ).fetchone()[0]
        out["sandbox_rows"] = conn.execute("SELECT count(*) FROM sandbox_messages").fetchone()[0]
        sent, first_sent, last_sent = conn.execute(
            "SELECT count(*), min(sent_at), max(sent_at) FROM messages WHERE status = 'sent'").fetchone()
        if sent:
            # The goal's figure: enrollments through the wait, the step and the wire, from the due
            # instant to the last follow-up sent.
            out["enrollments_per_s_due_to_last_sent"] = round(sent / max((last_sent - due).total_seconds(), 1e-9), 1)
        if sent > 1:
            out["messages_per_s_first_to_last_sent"] = round((sent - 1) / max((last_sent - first_sent).total_seconds(),
                                                                              1e-9), 1)
            out["send_lateness_s_p50_p99"] = [round(x, 2) for x in conn.execute(
                "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at) - %s) "
                "FROM messages WHERE status = 'sent'", (due.timestamp(),)).fetchone()[0]]
    if advanced:
        lat = conn.execute(
            "SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY l), max(l), min(l) FROM "
            f"(SELECT extract(epoch FROM created_at)::float8 - %s AS l FROM enrollment_events WHERE {ok_at_wait}) s",
            (due.timestamp(), WAIT_NODE)).fetchone()
        per_second = [row[0] for row in conn.execute(
            f"SELECT count(*) FROM enrollment_events WHERE {ok_at_wait} GROUP BY date_trunc('second', created_at) "
            "ORDER BY date_trunc('second', created_at)", (WAIT_NODE,)).fetchall()]
        busy = per_second[1:-1] or per_second
        start = max(due, first)
        out.update({
            "first_step_after_due_s": round((first - due).total_seconds(), 2),
            "advanced_per_s_first_to_last": round((advanced - 1) / max((last - first).total_seconds(), 1e-9), 1),
            "advanced_per_s_from_due": round(advanced / max((last - start).total_seconds(), 1e-9), 1),
            "drain_s_from_due": round((last - due).total_seconds(), 1),
            "per_second_median": statistics.median(busy), "per_second_max": max(busy),
            "lateness_s": {"p50": round(lat[0][0], 2), "p95": round(lat[0][1], 2), "p99": round(lat[0][2], 2),
                           "max": round(lat[1], 2), "min": round(lat[2], 2)},
        })
    return out


# ---------------------------------------------------------------------------------------------
# Inline: advance in this process and count every statement
# ---------------------------------------------------------------------------------------------


class StatementCounter:
    """Counts statements (by verb) and transactions on one SQLAlchemy engine while `on`."""

    def __init__(self, engine: Any) -> None:
        self.on = False
        self.statements: Counter[str] = Counter()
        self.executemany = 0
        self.commits = 0
        self.rollbacks = 0
        event.listen(engine, "before_cursor_execute", self._execute)
        event.listen(engine, "commit", self._commit)
        event.listen(engine, "rollback", self._rollback)

    def _execute(self, conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if self.on:
            verb = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "?"
            if verb == "WITH":  # the claim's locking CTE is an UPDATE
                verb = "WITH…UPDATE" if " UPDATE " in statement.upper() else "WITH…SELECT"
            self.statements[verb] += 1
            self.executemany += int(bool(executemany))

    def _commit(self, conn) -> None:  # type: ignore[no-untyped-def]
        if self.on:
            self.commits += 1

    def _rollback(self, conn) -> None:  # type: ignore[no-untyped-def]
        if self.on:
            self.rollbacks += 1

    def reset(self) -> None:
        self.statements.clear()
        self.executemany = self.commits = self.rollbacks = 0

    def summary(self, per: int) -> dict[str, Any]:
        total = sum(self.statements.values())
        return {"statements": total, "per_unit": round(total / max(per, 1), 2),
                "by_verb_per_unit": {k: round(v / max(per, 1), 2) for k, v in sorted(self.statements.items())},
                "commits_per_unit": round(self.commits / max(per, 1), 2),
                "rollbacks_per_unit": round(self.rollbacks / max(per, 1), 2)}


#: The bare limit's statement: one claim of due runs moved from the wait to the end and their step
#: events written, in one statement (one transaction) straight in SQL, with no engine around it.
BARE_CLAIM_SQL = (
    "WITH due AS (SELECT id FROM enrollments WHERE status = 'active' AND next_eval_at <= now() "
    "ORDER BY next_eval_at LIMIT %(claim)s FOR UPDATE SKIP LOCKED), "
    "moved AS (UPDATE enrollments e SET current_node_id = 'fim', status = 'completed', outcome = 'exhausted', "
    "next_eval_at = NULL, ended_at = now(), steps = e.steps + 1, revision = e.revision + 1, updated_at = now() "
    "FROM due WHERE e.id = due.id RETURNING e.id, e.org_id) "
    "INSERT INTO enrollment_events (org_id, enrollment_id, node_id, event_type, payload, idempotency_key, created_at) "
    "SELECT org_id, id, %(node)s, 'step', '{\"status\": \"ok\"}'::jsonb, 'bare:' || id, now() FROM moved")


def run_bare(args: argparse.Namespace, conninfo: str, clinic: dict[str, int]) -> dict[str, Any]:
    """The bare limit of an advance in this run: `--bare` due runs moved wait → end by
    `BARE_CLAIM_SQL` in claims of the engine's size from 2 threads (one per core), each claim one
    statement; what PostgreSQL alone allows on this machine, beside which the engine's rate reads."""
    k = args.bare
    first_contact = args.enrollments + args.inline + 1
    load_enrollments(conninfo, clinic, range(first_contact, first_contact + k), datetime.now(UTC) - timedelta(seconds=1))
    claim = int(args.send_batch or 200)
    moved: list[int] = []

    def work() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            while True:
                n = conn.execute(BARE_CLAIM_SQL, {"claim": claim, "node": WAIT_NODE}).rowcount
                if not n:
                    return
                moved.append(n)

    started = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return {"enrollments": k, "moved": sum(moved), "claim": claim, "threads": 2, "wall_s": round(wall, 2),
            "advances_per_s": round(sum(moved) / max(wall, 1e-9))}


def run_inline(args: argparse.Namespace, conninfo: str, database_url: str, secret_keys: str,
               clinic: dict[str, int], fake: FakeProcess | None = None) -> dict[str, Any]:
    from engine.messaging import dispatch
    from engine.flows import runtime as flows_runtime
    from engine.store.runtime import Runtime, install

    k = args.inline
    first_contact = args.enrollments + 1
    with psycopg.connect(conninfo, autocommit=True) as pg:
        # What the process run left behind (backed-off enrollments, open messages) would be claimed
        # with the inline ones and blur their counts: set it aside, and say how much there was.
        left = pg.execute("UPDATE enrollments SET status = 'cancelled', cancel_reason = 'bench_set_aside', "
                          "next_eval_at = NULL, lease_until = NULL, ended_at = now() "
                          "WHERE status IN ('active', 'waiting_reply', 'paused_handoff')").rowcount
        left_messages = pg.execute("UPDATE messages SET status = 'cancelled' "
                                   "WHERE status IN ('new', 'pending', 'claimed', 'sending')").rowcount
    load_s = load_enrollments(conninfo, clinic, range(first_contact, first_contact + k),
                              datetime.now(UTC) - timedelta(seconds=1))
    settings = Settings.from_env({"DATABASE_URL": database_url, "BROKER_URL": "stub://",
                                  "LEMBRA_SECRET_KEYS": secret_keys, "LEMBRA_LOG_LEVEL": "WARNING",
                                  **({"LEMBRA_PROVIDER_ALLOW": "127.0.0.1"} if fake is not None else {})})
    rt = Runtime.build(settings)
    previous = install(rt)
    counter = StatementCounter(rt.db.engine)
    batch = int(args.send_batch or settings.send_batch)
    profiler = cProfile.Profile() if args.inline_profile else None
    out: dict[str, Any] = {"enrollments": k, "claim_batch": batch, "load_s": round(load_s, 1),
                           "set_aside_from_the_process_run": {"enrollments": left, "messages": left_messages}}
    try:
        # Warm up (graph cache, pool, compiled statements) on a few, outside the counts.
        warm = flows_runtime.claim_due(rt, limit=min(batch, k))
        flows_runtime.advance_claimed(rt, warm)
        with psycopg.connect(conninfo, autocommit=True) as pg:
            before = pg_counters(pg)
            tables_before = table_reads(pg)
            claim_wall = advance_wall = advance_cpu = 0.0
            steps = claimed = claims = 0
            claim_counter: Counter[str] = Counter()
            while True:
                counter.reset()
                counter.on = True
                t0 = time.perf_counter()
                pairs = flows_runtime.claim_due(rt, limit=batch)
                claim_wall += time.perf_counter() - t0
                counter.on = False
                claim_counter.update(counter.statements)
                claims += 1
                if not pairs:
                    break
                claimed += len(pairs)
                counter.reset()
                if profiler is not None:
                    profiler.enable()
                counter.on = True
                t0, c0 = time.perf_counter(), time.process_time()
                steps += flows_runtime.advance_claimed(rt, pairs)
                advance_wall += time.perf_counter() - t0
                advance_cpu += time.process_time() - c0
                counter.on = False
                if profiler is not None:
                    profiler.disable()
                out.setdefault("_advance_statements", Counter()).update(counter.statements)
                out["_commits"] = out.get("_commits", 0) + counter.commits
                out["_executemany"] = out.get("_executemany", 0) + counter.executemany
            after = pg_counters(pg)
            tables_after = table_reads(pg)
        advanced = claimed
        stmts: Counter[str] = out.pop("_advance_statements", Counter())
        total = sum(stmts.values())
        pg_delta = {key: after[key] - before[key] for key in before}
        out.update({
            "advanced": advanced + len(warm), "measured": advanced, "steps": steps,
            "advance_statements_per_enrollment": round(total / max(advanced, 1), 2),
            "advance_statements_by_verb_per_enrollment": {v: round(c / max(advanced, 1), 2)
                                                          for v, c in sorted(stmts.items())},
            "advance_transactions_committed_per_enrollment": round(out.pop("_commits", 0) / max(advanced, 1), 2),
            "advance_executemany": out.pop("_executemany", 0),
            "claim_statements_per_claim": {v: round(c / claims, 2) for v, c in sorted(claim_counter.items())},
            "advance_cpu_ms_per_enrollment": round(1000 * advance_cpu / max(advanced, 1), 2),
            "advance_wall_ms_per_enrollment": round(1000 * advance_wall / max(advanced, 1), 2),
            "claim_wall_ms_per_enrollment": round(1000 * claim_wall / max(advanced, 1), 3),
            "one_thread_advances_per_s": round(advanced / max(advance_wall + claim_wall, 1e-9), 1),
            "postgres_commits_per_enrollment": round(pg_delta["commits"] / max(advanced, 1), 2),
            "postgres_rows_written_per_enrollment": round(
                (pg_delta["tuples_inserted"] + pg_delta["tuples_updated"]) / max(advanced, 1), 2),
            "postgres_wal_kib_per_enrollment": round(pg_delta["wal_bytes"] / max(advanced, 1) / 1024, 2),
            "enrollments_hot_update_pct": round(100 * pg_delta["enrollments_hot_updates"]
                                                / max(pg_delta["enrollments_updates"], 1), 1),
            "most_read_tables_per_enrollment": reads_per(tables_before, tables_after, max(advanced, 1)),
        })
        if profiler is not None:
            out["profile"] = profile_summary(profiler)
            if args.inline_profile_out is not None:
                profiler.dump_stats(args.inline_profile_out)
        if args.with_send:
            counter.reset()
            sent = 0
            counter.on = True
            t0, c0 = time.perf_counter(), time.process_time()
            sender = cProfile.Profile() if args.inline_profile else None
            while True:
                ids = dispatch.claim_due(rt, limit=batch)
                if not ids:
                    break
                if sender is not None:
                    sender.enable()
                dispatch.send_batch(rt, ids)  # as a worker's send actor takes a claim's task
                if sender is not None:
                    sender.disable()
                sent += len(ids)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            counter.on = False
            if sender is not None and args.inline_profile_out is not None:
                sender.dump_stats(f"{args.inline_profile_out}.send")
            out["send"] = {"sent": sent, **counter.summary(sent),
                           "cpu_ms_per_message": round(1000 * cpu / max(sent, 1), 2),
                           "wall_ms_per_message": round(1000 * wall / max(sent, 1), 2)}
    finally:
        install(previous)
        rt.close()
    return out


def profile_summary(profiler: cProfile.Profile, top: int = 15) -> dict[str, Any]:
    """Self time by library and the top functions by inclusive time (cProfile slows Python ~2x)."""
    stats = pstats.Stats(profiler)
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values()) or 1e-9
    by_lib: dict[str, float] = defaultdict(float)
    for (path, line, func), (_cc, _nc, tottime, _cum, _callers) in raw.items():
        by_lib[_library(f"{func} ({path}:{line})")] += tottime
    inclusive = sorted(((v[3], f"{func} ({Path(path).name}:{line})") for (path, line, func), v in raw.items()),
                       reverse=True)
    return {"self_by_library_pct": [(k, round(100 * v / total, 1)) for k, v in
                                    sorted(by_lib.items(), key=lambda kv: -kv[1])[:10]],
            "top_inclusive_s": [(name, round(t, 2)) for t, name in inclusive[:top]]}


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--enrollments", type=int, default=100_000, help="due enrollments for the worker processes")
    p.add_argument("--workers", type=int, default=2, help="worker processes (`lembra worker --processes`)")
    p.add_argument("--threads", type=int, default=8, help="send threads per worker process (`--threads`)")
    p.add_argument("--conversation-threads", type=int, default=4,
                   help="threads per worker process that advance flow steps (`--conversation-threads`)")
    p.add_argument("--with-send", action="store_true", help="the flow sends a template through the outbox")
    p.add_argument("--provider", choices=("sandbox", "http-fake"), default="sandbox",
                   help="where --with-send's follow-ups go: the sandbox (rows in PostgreSQL) or a Meta channel "
                        "at bench/http_fake.py on loopback")
    p.add_argument("--inline", type=int, default=0, metavar="K",
                   help="then advance K more enrollments in this process, counting every statement")
    p.add_argument("--bare", type=int, default=20_000, metavar="N",
                   help="the bare limit: N more due runs moved wait → end in plain SQL after the run (0: skip)")
    p.add_argument("--inline-profile", action="store_true", help="run the inline advances under cProfile")
    p.add_argument("--inline-profile-out", type=Path, default=None, metavar="FILE",
                   help="run the inline advances under cProfile and dump their pstats to FILE, the send's to "
                        "FILE.send (read with `python -m pstats FILE`)")
    p.add_argument("--lead", type=float, default=None,
                   help="seconds from the end of the load to the due instant (default: estimated)")
    p.add_argument("--timeout", type=float, default=1800, help="hard limit on the advancing phase, seconds")
    p.add_argument("--dispatch-interval", default="0.2", help="LEMBRA_DISPATCH_INTERVAL of the scheduler")
    p.add_argument("--claim-batch", default=None, help="LEMBRA_CLAIM_BATCH (engine default when unset)")
    p.add_argument("--send-batch", default=None, help="LEMBRA_SEND_BATCH: claims per actor message")
    p.add_argument("--max-in-flight", default=None, help="LEMBRA_MAX_IN_FLIGHT (engine default when unset)")
    p.add_argument("--send-concurrency", default=None,
                   help="LEMBRA_SEND_CONCURRENCY, provider calls in flight per worker process (engine default when unset)")
    p.add_argument("--lease", default=None, help="LEMBRA_LEASE_SECONDS (engine default when unset)")
    p.add_argument("--py-spy", type=float, default=0, metavar="SECONDS",
                   help="record this many seconds of one worker process with py-spy (--gil) once advancing starts")
    p.add_argument("--db-name", default="lembra_bench_flows")
    p.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres", help="libpq server connection")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/14", help="broker URL; its db is FLUSHDB'd")
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    if not args.db_name.startswith("lembra_bench"):
        p.error("--db-name must start with lembra_bench (the database is dropped)")
    if args.enrollments <= 0 and args.inline <= 0:
        p.error("nothing to do: give --enrollments and/or --inline")
    if args.inline_profile_out is not None:
        args.inline_profile = True
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    configure_logs("WARNING", "text")
    conninfo = f"{args.pg} dbname={args.db_name}"
    database_url = sqlalchemy_url(args.pg, args.db_name)
    report: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    report["machine"] = machine_info(f"{args.pg} dbname=postgres", args.redis)
    report["code"] = code_version()
    m = report["machine"]
    log(f"machine: {m['nproc']} CPU ({m['cpu_model']}), {m['memory_gib']} GiB, Python {m['python']}, "
        f"{m['postgresql']}, Redis {m['redis']}, load {m['loadavg_before']}; code {report['code']['commit']}"
        + (" + uncommitted engine changes" if report["code"]["engine_dirty"] else ""))
    create_database(args.pg, args.db_name)
    ok = False
    try:
        ok = _run(args, conninfo, database_url, report)
    finally:
        if args.keep:
            log(f"kept database {args.db_name}")
        else:
            drop_database(args.pg, args.db_name)
            log(f"dropped database {args.db_name}")
        if args.json:
            args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
            log(f"figures written to {args.json}")
    return 0 if ok else 1


def _run(args: argparse.Namespace, conninfo: str, database_url: str, report: dict[str, Any]) -> bool:
    upgrade(database_url)
    secret_keys = Keyring.generate_spec()
    keyring = Keyring.parse(secret_keys)
    db = Database(database_url)
    tz = pick_timezone()
    fake = FakeProcess(Path(tempfile.mkdtemp(prefix="lembra-bench-flows-fake-"))) \
        if args.provider == "http-fake" else None
    try:
        clinic = create_clinic(db, keyring, tz, args.with_send, fake.base_url if fake else None)
        db.dispose()
        return _measure(args, conninfo, database_url, report, secret_keys, clinic, tz, fake)
    finally:
        if fake is not None:
            fake.stop()


def _measure(args: argparse.Namespace, conninfo: str, database_url: str, report: dict[str, Any], secret_keys: str,
             clinic: dict[str, int], tz: str, fake: FakeProcess | None) -> bool:
    n = args.enrollments
    contacts_s = load_contacts(conninfo, clinic["org_id"], n + args.inline + args.bare)
    lead = args.lead if args.lead is not None else 25 + n / 20_000
    due = datetime.now(UTC) + timedelta(seconds=lead)
    ok = True
    if n:
        load_s = load_enrollments(conninfo, clinic, range(1, n + 1), due)
        report["load"] = {"enrollments": n, "contacts": n + args.inline, "timezone": tz,
                          "contacts_s": round(contacts_s, 1), "enrollments_s": round(load_s, 1),
                          "flow": "trigger → wait 60 → " + ("action(template) → " if args.with_send else "") + "end"}
        log(f"loaded {n:,} enrollments at the wait ({contacts_s:.1f}s contacts, {load_s:.1f}s enrollments + "
            f"VACUUM ANALYZE); all due at {due.strftime('%H:%M:%S')}")
        ok = _advance(args, conninfo, database_url, secret_keys, due, report, fake)
    if args.bare:
        log(f"bare limit: moving {args.bare:,} due runs wait → end in plain SQL, claims of one statement")
        report["bare"] = run_bare(args, conninfo, clinic)
    if args.inline:
        log(f"inline: advancing {args.inline:,} enrollments in this process, counting statements")
        inline = report["inline"] = run_inline(args, conninfo, database_url, secret_keys, clinic, fake)
        inline["lost"] = inline["enrollments"] - inline["advanced"]
        if args.with_send:
            inline["unsent"] = inline["enrollments"] - inline["send"]["sent"]
        ok = ok and not inline["lost"] and not inline.get("unsent")
    if fake is not None and args.with_send:
        # Every message sent, by the processes and inline, reached the fake exactly once.
        with psycopg.connect(conninfo, autocommit=True) as conn:
            checks = report["fake"] = fake_checks(conn, fake.stats())
        ok = ok and not (checks["duplicates"] or checks["sent_never_seen_by_fake"] or checks["seen_by_fake_not_sent"])
    _print_summary(report)
    return ok


def _advance(args: argparse.Namespace, conninfo: str, database_url: str, secret_keys: str, due: datetime,
             report: dict[str, Any], fake: FakeProcess | None = None) -> bool:
    n = args.enrollments
    redis.Redis.from_url(args.redis).flushdb()
    logdir = Path(tempfile.mkdtemp(prefix="lembra-bench-flows-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMBRA_", "DATABASE_URL", "BROKER_URL"))}
    env.update({"DATABASE_URL": database_url, "BROKER_URL": args.redis, "LEMBRA_SECRET_KEYS": secret_keys,
                "LEMBRA_LOG_LEVEL": "WARNING", "LEMBRA_DISPATCH_INTERVAL": args.dispatch_interval,
                "LEMBRA_POPULATE_INTERVAL": "3600", "PYTHONUNBUFFERED": "1"})
    if fake is not None:
        env["LEMBRA_PROVIDER_ALLOW"] = "127.0.0.1"  # the egress guard lets the workers reach the fake
    for option, name in ((args.claim_batch, "LEMBRA_CLAIM_BATCH"), (args.send_batch, "LEMBRA_SEND_BATCH"),
                         (args.max_in_flight, "LEMBRA_MAX_IN_FLIGHT"), (args.lease, "LEMBRA_LEASE_SECONDS"),
                         (args.send_concurrency, "LEMBRA_SEND_CONCURRENCY")):
        if option:
            env[name] = option
    children = Children(logdir, env)
    sampler = Sampler(children.procs, args.db_name)
    log(f"starting {args.workers} worker process(es) x {args.conversation_threads} flow threads "
        f"(+ {args.threads} send threads); logs in {logdir}")
    children.start("worker", ["worker", "--processes", str(args.workers), "--threads", str(args.threads),
                              "--conversation-threads", str(args.conversation_threads)])
    spy = None
    spy_out = logdir / "worker.pyspy.txt"
    timed_out = False
    polls = 0
    samples: list[dict[str, Any]] = []
    try:
        sampler.start()
        ready_s = wait_for_workers(args.redis, args.workers, children, timeout=120)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            pg_before = pg_counters(conn)
            tables_before = table_reads(conn)
        children.start("scheduler", ["scheduler"])
        started_at = datetime.now(UTC)
        wait_s = (due - started_at).total_seconds()
        log(f"workers ready in {ready_s:.1f}s; scheduler started; enrollments due in {wait_s:.1f}s")
        if wait_s < 0:
            log("WARNING: the enrollments fell due before the scheduler started; raise --lead")
        deadline = time.monotonic() + args.timeout + max(wait_s, 0)
        marked = False
        last_report, previous_live, previous_t = 0.0, n, time.monotonic()
        with psycopg.connect(conninfo, autocommit=True) as conn:
            while True:
                time.sleep(1)
                polls += 2
                state = progress(conn)
                now = time.monotonic()
                advancing = datetime.now(UTC) >= due
                if advancing and not marked:
                    sampler.mark()  # CPU is counted from the due instant on
                    marked = True
                if args.py_spy and spy is None and state["live"] < n:
                    targets = [pid for pid, st in sampler.stats.items() if st.role.startswith("worker #")]
                    if targets:
                        spy = start_py_spy(targets[0], args.py_spy, spy_out)
                        log(f"py-spy recording worker pid {targets[0]} for {args.py_spy:.0f}s")
                if now - last_report >= 5:
                    rate = (previous_live - state["live"]) / (now - previous_t)
                    log(f"live {state['live']:,} (due {state['due']:,}, claimed {state['leased']:,}), dead "
                        f"{state['dead']:,}, open messages {state['open_messages']:,}; last 5s {rate:,.0f} advanced/s")
                    samples.append({"t": round((datetime.now(UTC) - due).total_seconds(), 1), **state})
                    last_report, previous_live, previous_t = now, state["live"], now
                if advancing and state["due"] == 0 and state["leased"] == 0 and state["live"] < n and \
                        (not args.with_send or state["open_messages"] == 0):
                    break
                dead_procs = {k: v for k, v in children.alive().items() if v is not None}
                if dead_procs:
                    log(f"WARNING: a process exited during the run: {dead_procs}")
                    break
                if now > deadline:
                    log(f"WARNING: timed out after {args.timeout:.0f}s: {state}")
                    timed_out = True
                    break
    finally:
        if spy is not None:
            try:
                spy.wait(timeout=args.py_spy + 30)
            except subprocess.TimeoutExpired:
                spy.kill()
        sampler.stop()
        children.stop_all()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        pg_after = pg_counters(conn)
        tables_after = table_reads(conn)
        run = results(conn, due, args.with_send)
        run["still_live"] = progress(conn)
    run["timed_out"] = timed_out
    run["workers_ready_s"] = round(ready_s, 1)
    run["progress_every_5s"] = samples
    report["run"] = run
    advanced = max(run["advanced"], 1)
    delta = {k: pg_after[k] - pg_before[k] for k in pg_before}
    delta["commits"] -= polls + 2  # this script's own polling: one autocommit transaction per query
    report["postgres"] = {
        **{f"{k}_total": v for k, v in delta.items()},
        "commits_per_advance": round(delta["commits"] / advanced, 2),
        "rows_inserted_per_advance": round(delta["tuples_inserted"] / advanced, 2),
        "rows_updated_per_advance": round(delta["tuples_updated"] / advanced, 2),
        "rows_read_per_advance": round(delta["tuples_read"] / advanced, 1),
        "wal_kib_per_advance": round(delta["wal_bytes"] / advanced / 1024, 2),
        "enrollments_updates_per_advance": round(delta["enrollments_updates"] / advanced, 2),
        "enrollments_hot_update_pct": round(100 * delta["enrollments_hot_updates"]
                                            / max(delta["enrollments_updates"], 1), 1),
        "most_read_tables_per_advance": reads_per(tables_before, tables_after, advanced),
    }
    resources = sampler.summary()
    groups = resources["cpu_seconds_by_group"]
    resources["cpu_ms_per_advance"] = {k: round(1000 * v / advanced, 2) for k, v in groups.items()}
    ours = sum(groups.values())
    resources["cpu_ms_per_advance_total"] = round(1000 * ours / advanced, 2)
    resources["ceiling_advances_per_s_dedicated_cores"] = round((os.cpu_count() or 1) * advanced / max(ours, 1e-9))
    children_rss = [s.peak_rss for s in sampler.stats.values() if s.role.startswith("worker #")]
    resources["worker_process_peak_rss_mib"] = round(max(children_rss, default=0) / 2**20, 1)
    report["resources"] = resources
    report["logdir"] = str(logdir)
    if spy is not None and spy_out.exists():
        report["py_spy"] = summarize_collapsed(spy_out)
        report["py_spy"]["file"] = str(spy_out)
    # The checks: every enrollment advanced past the wait once (none twice, none lost) and, with a
    # send, every follow-up sent once; the exit status is 1 otherwise.
    run["lost"] = n - run["advanced"]
    if args.with_send:
        run["unsent"] = n - run["messages_by_status"].get("sent", 0)
    bad = (run["advanced_twice_at_wait"] or run["lost"] or run.get("unsent") or run.get("sandbox_duplicate_keys")
           or timed_out)
    return not bad


def _print_summary(report: dict[str, Any]) -> None:
    m, code = report["machine"], report.get("code", {})
    lines = ["", f"=== Lembra follow-up flows benchmark (commit {code.get('commit')}"
             + (", engine files modified" if code.get("engine_dirty") else "") + ")",
             f"machine    {m['nproc']} CPU {m['cpu_model']}, {m['memory_gib']} GiB RAM, kernel {m['kernel']}, "
             f"load before {m['loadavg_before']}",
             f"software   Python {m['python']}, {m['postgresql']} (shared_buffers "
             f"{m['postgresql_settings'].get('shared_buffers')}, synchronous_commit "
             f"{m['postgresql_settings'].get('synchronous_commit')}), Redis {m['redis']}"]
    run = report.get("run")
    if run:
        a, load = report["args"], report["load"]
        lines.append(f"data       {load['enrollments']:,} enrollments due at once, flow {load['flow']}")
        lines.append(f"workers    {a['workers']} process(es) x {a.get('conversation_threads', '?')} flow threads "
                     f"(+ {a['threads']} send threads)")
        if run.get("advanced"):
            lat = run["lateness_s"]
            lines += [
                f"advanced   {run['advanced']:,} ({run['advanced_per_s_first_to_last']:,.0f}/s first->last step, "
                f"{run['advanced_per_s_from_due']:,.0f}/s from the due instant; per-second median "
                f"{run['per_second_median']}, max {run['per_second_max']}; drained {run['drain_s_from_due']}s "
                "after due)",
                f"lateness   p50 {lat['p50']}s, p95 {lat['p95']}s, p99 {lat['p99']}s, max {lat['max']}s",
            ]
    fake = report.get("fake")
    if fake:
        lines.append(f"fake       {fake['fake_references']:,} references at the Meta fake, duplicates {fake['duplicates']}, "
                     f"sent never seen by the fake {fake['sent_never_seen_by_fake']}, seen but not sent "
                     f"{fake['seen_by_fake_not_sent']}, refused {fake['refused_by_fake']}")
    bare = report.get("bare")
    if bare:
        share = f" (the run's first->last rate is {100 * run['advanced_per_s_first_to_last'] / bare['advances_per_s']:.1f}%)" \
            if run and run.get("advanced") else ""
        lines.append(f"bare       {bare['moved']:,} due runs moved wait -> end by one SQL statement per claim of "
                     f"{bare['claim']} from {bare['threads']} threads: {bare['advances_per_s']:,} advances/s{share}")
    if run:
        lines.append(f"checks     advanced twice at the wait {run['advanced_twice_at_wait']}, lost {run['lost']}"
                     + (f", unsent {run['unsent']}" if "unsent" in run else "") + ", statuses "
                     f"{run['enrollments_by_status']}, with attempts > 0 {run['enrollments_with_attempts']}, "
                     f"still live {run['still_live']}")
        lines.append("steps      " + ", ".join(f"{k}: {v:,}" for k, v in run["steps_by_node_status_reason"].items()))
        if "messages_by_status" in run:
            lines.append(f"messages   {run['messages_by_status']}, sandbox rows {run['sandbox_rows']}, duplicate keys "
                         f"{run['sandbox_duplicate_keys']}, {run.get('messages_per_s_first_to_last_sent')} msg/s, "
                         f"end to end {run.get('enrollments_per_s_due_to_last_sent')} enrollments/s (due → last sent), "
                         f"send lateness p50/p99 {run.get('send_lateness_s_p50_p99')}s")
        res, pg = report["resources"], report["postgres"]
        lines.append(f"RSS        worker process peak {res['worker_process_peak_rss_mib']} MiB; "
                     + "; ".join(f"{name} {p['peak_rss_mib']} MiB" for name, p in res["processes"].items()))
        lines.append(f"CPU        machine {res['machine_cpu_busy_pct']}% busy; per advance: "
                     + ", ".join(f"{k} {v} ms" for k, v in sorted(res["cpu_ms_per_advance"].items()))
                     + f"; total {res['cpu_ms_per_advance_total']} ms -> at most "
                     f"{res['ceiling_advances_per_s_dedicated_cores']:,} advances/s on {m['nproc']} dedicated cores; "
                     f"everything else on the machine {res['other_cpu_s']}s")
        lines.append(f"postgres   per advance: {pg['commits_per_advance']} commits, {pg['rows_inserted_per_advance']} "
                     f"rows inserted, {pg['rows_updated_per_advance']} updated, {pg['rows_read_per_advance']} read, "
                     f"{pg['wal_kib_per_advance']} KiB WAL; enrollments updates "
                     f"{pg['enrollments_updates_per_advance']} "
                     f"({pg['enrollments_hot_update_pct']}% HOT)")
        lines.append("           rows read per advance by table: " + "; ".join(
            f"{t} {v['seq_scans']} seq scans ({v['seq_rows']} rows), {v['index_scans']} index scans "
            f"({v['index_rows']} rows)" for t, v in pg["most_read_tables_per_advance"].items()))
        spy = report.get("py_spy")
        if spy:
            lines.append(f"py-spy     {spy['samples']} samples of one worker, self time by library: "
                         + ", ".join(f"{k} {v}%" for k, v in spy["self_by_library_pct"][:8]))
    inline = report.get("inline")
    if inline:
        lines.append(f"inline     {inline['measured']:,} enrollments advanced in this process in claims of "
                     f"{inline['claim_batch']} ({inline['steps']:,} steps): "
                     f"{inline['advance_statements_per_enrollment']} statements per enrollment "
                     f"{inline['advance_statements_by_verb_per_enrollment']}, "
                     f"{inline['advance_transactions_committed_per_enrollment']} transactions committed "
                     f"({inline['postgres_commits_per_enrollment']} commits seen by PostgreSQL, pre-ping included); "
                     f"claim: {inline['claim_statements_per_claim']} per claim")
        lines.append(f"           {inline['advance_cpu_ms_per_enrollment']} ms CPU and "
                     f"{inline['advance_wall_ms_per_enrollment']} ms wall per enrollment -> "
                     f"{inline['one_thread_advances_per_s']}/s on one thread; "
                     f"{inline['postgres_rows_written_per_enrollment']} rows written, "
                     f"{inline['postgres_wal_kib_per_enrollment']} KiB WAL, enrollments HOT "
                     f"{inline['enrollments_hot_update_pct']}%; lost {inline['lost']}"
                     + (f", unsent {inline['unsent']}" if "unsent" in inline else ""))
        lines.append("           rows read per enrollment by table: " + "; ".join(
            f"{t} {v['seq_scans']} seq scans ({v['seq_rows']} rows), {v['index_scans']} index scans "
            f"({v['index_rows']} rows)" for t, v in inline["most_read_tables_per_enrollment"].items()))
        if "send" in inline:
            s = inline["send"]
            lines.append(f"           send (claims of {inline['claim_batch']}, `dispatch.send_batch` as the workers): "
                         f"{s['per_unit']} statements per message {s['by_verb_per_unit']}, "
                         f"{s['commits_per_unit']} transactions, {s['cpu_ms_per_message']} ms CPU")
        if "profile" in inline:
            lines.append("           cProfile self time by library: "
                         + ", ".join(f"{k} {v}%" for k, v in inline["profile"]["self_by_library_pct"]))
            lines.append("           top inclusive: " + "; ".join(f"{k} {v}s" for k, v in
                                                                  inline["profile"]["top_inclusive_s"][:10]))
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
