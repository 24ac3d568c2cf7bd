"""The bare write, and what each guarantee of the schema costs it, one by one.

bench/throughput.py runs this after a `--populate-only` run, as the populate counterpart of the
bare wire (bench/wire.py): the reminders populate wrote are copied aside, `messages` and
`message_events` emptied, and the same rows written again, per org, by one `INSERT … SELECT …
ON CONFLICT DO NOTHING` with each row's `queued`/`skipped` event in the same statement (the
statement shape populate uses), on as many connections at a time as populate uses. The schema is
the real one: every index, foreign key and constraint of the two tables is there, so the write
pays what populate's write pays; what it leaves out is populate's own work (which appointments,
rules and channel kinds apply, the plan of each reminder's time, the cancellation of stale ones).

The account (`account()`) then writes the same rows again, into the emptied tables, once per
variant, each leaving out one thing: each foreign key's check (its constraint dropped while the
tables are empty, added back after), each secondary index of the two tables, the partial indexes
that hold none of these rows, the unique key that makes populate idempotent (with a plain
INSERT), the events written at creation; then all the foreign keys at once, the rows alone with
nothing but their keys, and one what-if: foreign keys that include the org (`(org_id,
contact_id) → contacts (org_id, id)` …), so that one check replaces two. A full write
comes first and again after every few variants (`sequence()`): each variant's cost is the mean
of the two full writes on either side of it minus its own time, and the full writes' spread is
the noise of the machine over the account. These are
measurements on a throwaway benchmark database, never what Lembra does: every constraint and
index is restored before the next variant, and the database is left as populate left it (the same
reminders and events, new ids).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

#: The columns populate writes (engine/reminders/populate.py, `_insert_reminders`), copied as they are.
COLUMNS = (
    "org_id", "purpose", "contact_id", "channel_kind", "appointment_id", "appointment_starts_at",
    "rule_id", "template_key", "respect_window", "idempotency_key", "status", "nominal_due_at",
    "due_at", "next_attempt_at", "expires_at", "skip_reason", "attempts", "created_at", "updated_at",
)
SOURCE = "bench_bare_write_source"
TABLES = ("messages", "message_events")
#: The unique index populate's `ON CONFLICT` stands on: the guarantee of one reminder per key.
IDEMPOTENCY_INDEX = "messages_org_idempotency"

_ROWS = f"""
    INSERT INTO messages ({", ".join(COLUMNS)})
    SELECT {", ".join(COLUMNS)} FROM {SOURCE} WHERE org_id = %(org)s"""
_WITH_EVENTS = """
WITH ins AS ({rows}
    RETURNING id, status, skip_reason
), events AS (
    INSERT INTO message_events (org_id, message_id, event, detail, created_at)
    SELECT %(org)s, id, CASE WHEN status = 'pending' THEN 'queued' ELSE 'skipped' END,
           CASE WHEN status = 'skipped' THEN jsonb_build_object('reason', skip_reason) END, now()
    FROM ins WHERE status IN ('pending', 'skipped')
)
SELECT count(*) FROM ins
"""
_ON_CONFLICT = "\n    ON CONFLICT (org_id, idempotency_key) DO NOTHING"


def statement(*, events: bool = True, on_conflict: bool = True) -> str:
    """The write of one org's rows (`%(org)s`), returning how many rows it wrote."""
    rows = _ROWS + (_ON_CONFLICT if on_conflict else "")
    if events:
        return _WITH_EVENTS.format(rows=rows)
    return f"WITH ins AS ({rows}\n    RETURNING id\n) SELECT count(*) FROM ins"


@dataclass
class Variant:
    """One write of the account: what it leaves out, and the DDL that leaves it out and puts it back
    (run on the emptied tables, so that neither is timed nor validates any row)."""

    name: str
    label: str
    setup: list[str] = field(default_factory=list)
    restore: list[str] = field(default_factory=list)
    events: bool = True
    on_conflict: bool = True


@dataclass
class BareWrite:
    """What one write took."""

    variant: str
    label: str
    rows: int
    seconds: float
    postgresql_cpu_seconds: float
    connections: int
    #: The machine's 1-minute load average just before the write (other work on its cores shows).
    load_before: float = 0.0


FULL = Variant("full", "every index, foreign key and event (the schema as it is)")


def _foreign_keys(conn: psycopg.Connection) -> list[tuple[str, str, list[str], str]]:
    """The foreign keys of the two tables: (table, constraint, columns, definition)."""
    return [(t, n, list(cols), d) for t, n, cols, d in conn.execute(
        """SELECT c.conrelid::regclass::text, c.conname,
                  ARRAY(SELECT a.attname FROM unnest(c.conkey) k JOIN pg_attribute a
                        ON a.attrelid = c.conrelid AND a.attnum = k),
                  pg_get_constraintdef(c.oid)
           FROM pg_constraint c
           WHERE c.contype = 'f' AND c.conrelid IN ('messages'::regclass, 'message_events'::regclass)
           ORDER BY 1, 2""")]


def _indexes(conn: psycopg.Connection) -> list[tuple[str, str, str, str | None]]:
    """The secondary indexes of the two tables: (table, index, definition, partial predicate)."""
    return list(conn.execute(
        """SELECT i.indrelid::regclass::text, c.relname, pg_get_indexdef(i.indexrelid),
                  pg_get_expr(i.indpred, i.indrelid)
           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
           WHERE i.indrelid IN ('messages'::regclass, 'message_events'::regclass) AND NOT i.indisprimary
           ORDER BY 1, 2"""))


def variants(conn: psycopg.Connection) -> list[Variant]:
    """The account's writes, read from the catalogue while `messages` holds populate's rows (so
    that a foreign key none of them uses, or a partial index that holds none of them, is known)."""
    out = [FULL]
    fks = _foreign_keys(conn)
    used: list[tuple[str, str, list[str], str]] = []
    for table, name, cols, definition in fks:
        if table == "messages" and not conn.execute(
                f"SELECT EXISTS (SELECT 1 FROM messages WHERE {' AND '.join(f'{c} IS NOT NULL' for c in cols)})"
        ).fetchone()[0]:
            continue  # NULL in every row populate writes: the check is skipped anyway
        used.append((table, name, cols, definition))
        out.append(Variant(f"fk:{table}.{','.join(cols)}",
                           f"without the foreign key {table}({', '.join(cols)}) → {definition.split('REFERENCES ')[-1]}",
                           [f"ALTER TABLE {table} DROP CONSTRAINT {name}"],
                           [f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}"]))
    if used:
        out.append(Variant("fk:all", f"without any of these {len(used)} foreign keys",
                           [f"ALTER TABLE {t} DROP CONSTRAINT {n}" for t, n, _, _ in used],
                           [f"ALTER TABLE {t} ADD CONSTRAINT {n} {d}" for t, n, _, d in used]))
    empty: list[tuple[str, str]] = []
    secondary: list[tuple[str, str]] = []
    for table, name, definition, predicate in _indexes(conn):
        if name == IDEMPOTENCY_INDEX:
            out.append(Variant("idempotency", f"without the unique index {name} and ON CONFLICT (plain INSERT)",
                               [f"DROP INDEX {name}"], [definition], on_conflict=False))
            continue
        if predicate and table == "messages" and not conn.execute(
                f"SELECT EXISTS (SELECT 1 FROM messages WHERE {predicate})").fetchone()[0]:
            empty.append((name, definition))
            continue
        secondary.append((name, definition))
        out.append(Variant(f"index:{name}", f"without the index {name}"
                           + (f" (partial: {predicate})" if predicate else ""),
                           [f"DROP INDEX {name}"], [definition]))
    if empty:
        out.append(Variant("index:partial-empty",
                           f"without the {len(empty)} partial indexes holding none of these rows "
                           f"({', '.join(n for n, _ in empty)})",
                           [f"DROP INDEX {n}" for n, _ in empty], [d for _, d in empty]))
    out.append(Variant("events", "without the events written at creation (the rows alone)", events=False))
    everything = [*secondary, *empty]
    out.append(Variant("floor", "the rows alone: no event, no foreign key, no index but the primary and unique keys",
                       [f"ALTER TABLE {t} DROP CONSTRAINT {n}" for t, n, _, _ in used]
                       + [f"DROP INDEX {n}" for n, _ in everything],
                       [f"ALTER TABLE {t} ADD CONSTRAINT {n} {d}" for t, n, _, d in used]
                       + [d for _, d in everything], events=False))
    composite = _composite(used)
    if composite is not None:
        out.append(composite)
    return out


#: Referenced tables of the org-scoped what-if, and the unique (org_id, id) index each needs.
_SCOPED = {"contacts": "bench_contacts_org_id", "appointments": "bench_appointments_org_id",
           "reminder_rules": "bench_reminder_rules_org_id", "messages": "bench_messages_org_id"}


def _composite(used: list[tuple[str, str, list[str], str]]) -> Variant | None:
    """The what-if of foreign keys that include the org: each `x_id → x(id)` of the rows becomes
    `(org_id, x_id) → x(org_id, id)` (which also says the row's org is x's org), and the separate
    `org_id → orgs(id)` check goes, implied through x's own. The referenced tables get a unique
    (org_id, id) index; the one on `messages` is maintained by the write and so is in the cost."""
    drops, adds, restore_fks = [], [], []
    for table, name, cols, definition in used:
        if cols == ["org_id"]:
            drops.append((table, name))
            restore_fks.append((table, name, definition))
            continue
        target = definition.split("REFERENCES ")[-1].split("(")[0].strip()
        if len(cols) != 1 or target not in _SCOPED:
            continue
        drops.append((table, name))
        restore_fks.append((table, name, definition))
        adds.append((table, f"bench_{table}_{cols[0]}_scoped",
                     f"FOREIGN KEY (org_id, {cols[0]}) REFERENCES {target} (org_id, id)"))
    if not adds:
        return None
    targets = sorted({d.split("REFERENCES ")[-1].split(" (")[0] for _, _, d in adds})
    setup = [f"CREATE UNIQUE INDEX {_SCOPED[t]} ON {t} (org_id, id)" for t in targets]
    setup += [f"ALTER TABLE {t} DROP CONSTRAINT {n}" for t, n in drops]
    setup += [f"ALTER TABLE {t} ADD CONSTRAINT {n} {d}" for t, n, d in adds]
    restore = [f"ALTER TABLE {t} DROP CONSTRAINT {n}" for t, n, _ in adds]
    restore += [f"DROP INDEX {_SCOPED[t]}" for t in targets]
    restore += [f"ALTER TABLE {t} ADD CONSTRAINT {n} {d}" for t, n, d in restore_fks]
    return Variant("fk:org-scoped", f"foreign keys that include the org ({len(drops)} checks → {len(adds)}; "
                   f"unique (org_id, id) on {', '.join(targets)})", setup, restore)


def sequence(found: list[Variant], *, names: set[str] | None = None, bracket: int = 6,
             repeat: int = 1) -> list[Variant]:
    """The order of the writes: a full write, then at most `bracket` variants between two full
    writes, to the end; `repeat` times over (each variant's cost is then taken against the full
    writes on either side of it, so that a drift of the machine's speed during the account shows
    as their spread instead of as a cost). Only the variants in `names`, when given."""
    chosen = [v for v in found if v.name != FULL.name and (names is None or v.name in names)]
    out = [FULL]
    for _ in range(max(1, repeat)):
        for start in range(0, len(chosen), max(1, bracket)):
            out += [*chosen[start:start + max(1, bracket)], FULL]
    return out


def account(conninfo: str, connections: int, cpu_meter: Callable[[], Callable[[], float]], *,
            names: set[str] | None = None, bracket: int = 6, repeat: int = 1,
            log: Callable[[str], None] = print) -> list[BareWrite]:
    """Write again, into emptied tables, the reminders the database holds, once per write of
    `sequence()` (the variants of `variants()`, or only those in `names`, between full writes).

    `cpu_meter()` starts counting the CPU time of the database's PostgreSQL processes and returns
    a function that reads it (the write's own backends are connected before it starts and closed
    after it is read). Needs the tables' owner (DROP CONSTRAINT, DROP INDEX), never a superuser."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        todo = sequence(variants(conn), names=names, bracket=bracket, repeat=repeat)
        conn.execute(f"DROP TABLE IF EXISTS {SOURCE}")
        # Ordered by org, so that each org's rows are read from adjacent pages through the index.
        conn.execute(f"CREATE UNLOGGED TABLE {SOURCE} AS SELECT {', '.join(COLUMNS)} FROM messages "
                     "ORDER BY org_id, id")
        conn.execute(f"CREATE INDEX ON {SOURCE} (org_id)")
        conn.execute(f"VACUUM ANALYZE {SOURCE}")
        orgs = [row[0] for row in conn.execute(f"SELECT DISTINCT org_id FROM {SOURCE} ORDER BY 1")]
        expected = conn.execute(f"SELECT count(*) FROM {SOURCE}").fetchone()[0]
    out = []
    try:
        for variant in todo:
            log(f"bare write [{variant.name}]: {variant.label}")
            try:
                bare = _write(conninfo, connections, cpu_meter, variant, orgs, expected)
            except (psycopg.Error, RuntimeError) as exc:
                # One variant's failure (its DDL, say) leaves the others measurable.
                log(f"bare write [{variant.name}]: FAILED: {type(exc).__name__}: {exc}")
                continue
            log(f"bare write [{variant.name}]: {bare.seconds:.1f}s (PostgreSQL CPU {bare.postgresql_cpu_seconds:.1f}s)")
            out.append(bare)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {SOURCE}")
    return out


def _empty(conn: psycopg.Connection) -> None:
    # Emptied as populate found them: nothing else refers to a reminder in this benchmark.
    conn.execute("TRUNCATE message_events, messages CASCADE")


def _write(conninfo: str, connections: int, cpu_meter: Callable[[], Callable[[], float]], variant: Variant,
           orgs: list[int], expected: int) -> BareWrite:
    """One write of the account, into the emptied tables, with its variant's DDL around it."""
    sql = statement(events=variant.events, on_conflict=variant.on_conflict)
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
                    written.append(conn.execute(sql, {"org": org}).fetchone()[0])
        except Exception as exc:  # noqa: BLE001 - re-raised below, not lost in the thread
            failures.append(exc)

    load_before = os.getloadavg()[0]
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            _empty(conn)
            for ddl in variant.setup:
                conn.execute(ddl)
            for table in TABLES:
                conn.execute(f"VACUUM ANALYZE {table}")
        # Connected before and closed after the measurement: a backend that has exited takes its
        # CPU time with it.
        conns = [psycopg.connect(conninfo) for _ in range(max(1, connections))]
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
    finally:
        if variant.restore:
            # Put back on the emptied tables: instant, nothing to validate. Each statement on its
            # own, so that a setup that failed half-way is undone as far as it went.
            with psycopg.connect(conninfo, autocommit=True) as conn:
                _empty(conn)
                for ddl in variant.restore:
                    try:
                        conn.execute(ddl)
                    except psycopg.Error as exc:
                        failures.append(exc)
    if failures:
        raise failures[0]
    if sum(written) != expected:
        raise RuntimeError(f"the bare write [{variant.name}] wrote {sum(written)} rows of {expected}")
    return BareWrite(variant=variant.name, label=variant.label, rows=expected, seconds=seconds,
                     postgresql_cpu_seconds=cpu, connections=len(conns), load_before=load_before)
