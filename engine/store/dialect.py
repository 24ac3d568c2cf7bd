"""The few statements that are spelled differently on PostgreSQL and SQLite."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Sequence

from sqlalchemy import (
    JSON, Integer, Table, Text, any_, bindparam, case, cast, column, func, literal, select, tuple_, type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from engine.store.db import require_aware


@contextmanager
def planner_setting(conn: Connection, name: str, value: str, *, when: bool = True,
                    restore: bool = True) -> Iterator[None]:
    """PostgreSQL: plan the statements run inside with the planner setting `name` at `value`,
    local to the transaction, and put the previous value back after them; elsewhere (or when
    `when` is false) nothing. With `restore` false, for a caller whose transaction ends with
    the block (it began the transaction for these statements alone), the setting is only set:
    the transaction's end undoes it, and reading and restoring it would be two statements spent
    on nothing (one per dispatch claim).

    For the few statements whose right plan does not depend on what the statistics say, where a
    plan chosen from stale ones is far slower (each use says why)."""
    if not when or conn.dialect.name != "postgresql":
        yield
        return
    if not restore:
        conn.exec_driver_sql("SELECT set_config(%(name)s, %(value)s, true)", {"name": name, "value": value})
        yield
        return
    previous = conn.exec_driver_sql(
        "SELECT current_setting(%(name)s), set_config(%(name)s, %(value)s, true)", {"name": name, "value": value},
    ).scalar_one()
    yield
    # Not in a `finally`: a statement that failed has aborted the transaction, which undoes the
    # setting (it is local to the transaction) and would refuse this statement.
    conn.exec_driver_sql("SELECT set_config(%(name)s, %(value)s, true)", {"name": name, "value": previous})


def insert_ignore(conn: Connection, table: Table, conflict_columns: Sequence[str]) -> Any:
    """`INSERT … ON CONFLICT (cols) DO NOTHING` for the connection's dialect.

    Add `.values(...)` or `.from_select(...)`, then the conflict clause is applied on render.
    """
    module = postgresql if conn.dialect.name == "postgresql" else sqlite
    return _IgnoringInsert(module.insert(table), list(conflict_columns))


class _IgnoringInsert:
    """Builds the dialect insert and applies ON CONFLICT DO NOTHING after values/from_select."""

    def __init__(self, stmt: Any, columns: list[str]) -> None:
        self._stmt = stmt
        self._columns = columns

    def values(self, *args: Any, **kwargs: Any) -> Any:
        return self._stmt.values(*args, **kwargs).on_conflict_do_nothing(index_elements=self._columns)

    def from_select(self, names: Sequence[str], select: Any) -> Any:
        return self._stmt.from_select(names, select).on_conflict_do_nothing(index_elements=self._columns)


def claim_first_due(table: Table, *, due: Sequence[Any], order_by: Sequence[Any], still: Any,
                    values: Mapping[str, Any], returning: Sequence[Any], postgresql: bool) -> Any:
    """A queue's claim in one statement: `UPDATE table SET values WHERE id IN (the first `:limit`
    rows matching `due`, in `order_by`) AND still RETURNING returning` (the caller binds
    `:limit`). On PostgreSQL the chosen rows are locked and those another claim holds skipped.

    They are chosen in a CTE, not `IN (subquery)`: PostgreSQL may run a `LIMIT … SKIP LOCKED`
    subquery once per candidate row, and then claims far more than `:limit` rows; a locking CTE
    runs once."""
    chosen = select(table.c.id).where(*due).order_by(*order_by).limit(bindparam("limit", type_=Integer))
    if postgresql:
        chosen = chosen.with_for_update(skip_locked=True)
    chosen_cte = chosen.cte("due")
    return update(table).where(table.c.id.in_(select(chosen_cte.c.id)), still).values(**values).returning(*returning)


def epoch_seconds(column: Any) -> Any:
    """An integer epoch for a timestamp column, on either backend."""
    from sqlalchemy import BigInteger, cast, extract

    return cast(extract("epoch", column), BigInteger)


def in_values(conn: Connection, column: Any, values: Iterable[Any]) -> ColumnElement[bool]:
    """`column IN (values)` with one statement text for any number of values: `= ANY(:array)` on
    PostgreSQL, so that SQLAlchemy renders the statement once and psycopg prepares it once (an
    IN list is rendered again for every batch and is a new statement to the server for every
    count of values). SQLite keeps the IN list."""
    values = list(values)
    if conn.dialect.name == "postgresql":
        return column == any_(_array_param(column, values))
    return column.in_(values)


def in_pairs(conn: Connection, columns: tuple[Any, Any], pairs: Iterable[tuple[Any, Any]]) -> ColumnElement[bool]:
    """`(a, b) IN (pairs)`: rows matching one of the given pairs, not every combination of the
    two columns' values.

    On PostgreSQL `(a, b) IN (SELECT * FROM unnest(:a_values, :b_values))`, one statement text for
    any number of pairs, read through a two-column index once per pair. `a = ANY(…) AND
    b = ANY(…)` matches every combination instead: for a batch's 100 contacts in 10 orgs the
    planner scanned all of `preferences` (2.6 ms on 25,000 rows; 0.46 ms by pairs, measured),
    and the scan grows with the table, not the batch. SQLite takes the row-value IN list."""
    pairs = sorted(set(pairs))
    first, second = columns
    if conn.dialect.name == "postgresql":
        source = func.unnest(_array_param(first, [a for a, _ in pairs]),
                             _array_param(second, [b for _, b in pairs])).table_valued("a", "b").render_derived()
        return tuple_(first, second).in_(select(source.c.a, source.c.b))
    return tuple_(first, second).in_(pairs)


def _array_param(column: Any, values: list[Any]) -> Any:
    """One PostgreSQL array parameter of `values`, typed as the column's array."""
    if all(type(value) is int for value in values):
        return cast(bindparam(None, int_array(values), type_=Text()), postgresql.ARRAY(column.type))
    return bindparam(None, values, type_=postgresql.ARRAY(column.type))


def int_array(values: Iterable[int]) -> str:
    """PostgreSQL's literal of an array of ints (`{1,2,3}`), to send as one text parameter cast
    to the array type: psycopg dumps a list of ints element by element in Python, five times the
    cost of this join."""
    return "{" + ",".join(map(str, values)) + "}"


#: SQLite's (older builds') limit of bound parameters per statement.
SQLITE_MAX_PARAMS = 999


def _array_rows(table: Table, columns: Sequence[str]) -> Any:
    """PostgreSQL: `unnest(:row_<col>, …) AS row_values(<col>, …)`, a table of rows from one array
    parameter per column, typed as the table's columns: one statement text for any row count, so
    SQLAlchemy compiles it once (a multi-row VALUES or a per-row CASE is compiled for every batch).

    An UPDATE joins these rather than `_json_rows`: the planner takes an `unnest` of parameters
    for a few rows and reads each by primary key, while it takes a JSON function for 100 rows of
    anything and, on a fresh table's statistics, hash-joins them against every row the
    statement's status filter matches (four times the server's CPU, measured)."""
    return func.unnest(
        *[bindparam(f"row_{name}", type_=postgresql.ARRAY(table.c[name].type)) for name in columns],
    ).table_valued(*columns).render_derived(name="row_values")


def _array_params(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> dict[str, list[Any]]:
    return {f"row_{name}": [row[name] for row in rows] for name in columns}


def _json_rows(table: Table, columns: Sequence[str]) -> Any:
    """PostgreSQL: `json_to_recordset(:row_values_json) AS row_values(<col> <type>, …)`, a table of
    rows from one JSON parameter, typed as the table's columns, for an INSERT … SELECT: one
    statement text for any row count, so SQLAlchemy compiles it once and psycopg prepares it once.

    One JSON text rather than one array per column: psycopg dumps a list element by element in
    Python (a hundred timestamps, texts or jsonb values cost it 0.3–1 ms each), `json.dumps`
    writes the whole batch in C; a hundred event rows cost the client 1.0 ms instead of 2.7 ms,
    and the server the same (measured)."""
    return func.json_to_recordset(cast(bindparam("row_values_json", type_=Text()), postgresql.JSON())).table_valued(
        *[column(name, table.c[name].type) for name in columns],
    ).render_derived(name="row_values", with_types=True)


def _json_params(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> dict[str, str]:
    written: dict[datetime, str] = {}  # a batch's rows mostly share one timestamp: write it once

    def timestamp(value: Any) -> str:
        # Only what the JSON encoder does not know: timestamps, all timestamptz columns, so a
        # naive one is refused as UTCDateTime refuses it.
        if not isinstance(value, datetime):
            raise TypeError(f"{type(value).__name__} cannot be written in a batch of rows")
        text = written.get(value)
        if text is None:
            text = written[value] = require_aware(value).isoformat()
        return text

    return {"row_values_json": json.dumps([{name: row[name] for name in columns} for row in rows],
                                          default=timestamp, separators=(",", ":"), allow_nan=False)}


def _as_inserted(value: Any, target: Any) -> Any:
    # json_to_recordset reads a JSON null as SQL NULL; every other insert (SQLAlchemy's JSON
    # type, SQLite here) writes None into a JSON column as JSON null, and so does this one.
    if isinstance(target.type, JSON):
        return func.coalesce(value, cast(literal("null"), target.type))
    return value


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], *,
                ignore_conflicts: Sequence[str] = (), on_conflict: Callable[[Any], Any] | None = None,
                returning: Sequence[Any] = (), params: Mapping[str, Any] | None = None) -> list[Any]:
    """INSERT `rows` (each naming the same columns): PostgreSQL selects them from JSON (one
    statement text for any count of rows, compiled once), SQLite takes multi-row VALUES (not
    executemany: the driver would send one statement per row).

    With `ignore_conflicts`, a row whose values of those columns (a unique index) are already
    taken, by an earlier row or one of the same batch, is left out (`ON CONFLICT (…) DO
    NOTHING`); `on_conflict` is given the dialect's INSERT and returns it with its own `ON
    CONFLICT` clause (its `excluded` is the row offered). `on_conflict` is a module-level
    function whose clause names its values as bind parameters, given in `params`: PostgreSQL's
    statement is built once per function and kept, where one built for every call cost its
    construction and its cache key (a sixth of a send's recipient spacing, profiled). With
    `returning`, those columns of the rows written come back, in no set order."""
    if not rows:
        return []
    columns = list(rows[0])
    module = postgresql if conn.dialect.name == "postgresql" else sqlite

    def finish(stmt: Any) -> Any:
        if ignore_conflicts:
            stmt = stmt.on_conflict_do_nothing(index_elements=list(ignore_conflicts))
        if on_conflict is not None:
            stmt = on_conflict(stmt)
        return stmt.returning(*returning) if returning else stmt

    written: list[Any] = []
    if conn.dialect.name == "postgresql":
        stmt = _json_insert(table, tuple(columns), tuple(ignore_conflicts), tuple(returning), on_conflict)
        result = conn.execute(stmt, {**_json_params(rows, columns), **(params or {})})
        return list(result.all()) if returning else written
    per_statement = (SQLITE_MAX_PARAMS - len(params or ())) // len(columns)
    for start in range(0, len(rows), per_statement):
        chunk = list(rows[start:start + per_statement])
        # One row as a one-row INSERT: SQLAlchemy caches its compiled form (a multi-row VALUES has
        # no cache key and is compiled every time).
        result = conn.execute(finish(module.insert(table).values(chunk[0] if len(chunk) == 1 else chunk)),
                              dict(params or {}))
        if returning:
            written.extend(result.all())
    return written


@functools.lru_cache(maxsize=128)
def _json_insert(table: Table, columns: tuple[str, ...], ignore_conflicts: tuple[str, ...],
                 returning: tuple[Any, ...], on_conflict: Callable[[Any], Any] | None = None) -> Any:
    """PostgreSQL: `insert_rows`'s `INSERT INTO table (columns) SELECT … FROM json_to_recordset(…)`,
    with its `ON CONFLICT` clause and `RETURNING` when given. Built once per table and
    shape and kept: a statement built for every batch cost its construction and its cache key
    (the compiled form is cached either way), five times per conversational turn
    (bench/conversations.py --inline-profile)."""
    source = _json_rows(table, columns)
    stmt = postgresql.insert(table).from_select(
        columns, select(*[_as_inserted(source.c[name], table.c[name]) for name in columns]))
    if ignore_conflicts:
        stmt = stmt.on_conflict_do_nothing(index_elements=list(ignore_conflicts))
    if on_conflict is not None:
        stmt = on_conflict(stmt)
    return stmt.returning(*returning) if returning else stmt


def update_per_row(
    conn: Connection,
    table: Table,
    rows: Mapping[int, Mapping[str, Any]],
    *,
    where: Sequence[Any],
    values: Mapping[str, Any],
    returning: Sequence[Any],
    match: Sequence[str] = (),
) -> list[Any]:
    """UPDATE the rows of `table` whose ids are the keys of `rows`, each with its own value of
    the columns its mapping names (every mapping names the same ones), the same `values` for
    the rest, under `where`; returns the `returning` columns of the rows that changed. The
    columns named in `match` are compared with the row's own value instead of set (a row's
    org: each row is held to its own org, with no `org_id = ANY(…)` for the planner to read a
    whole status of the orgs by).

    PostgreSQL joins the rows from arrays (`UPDATE … FROM unnest(…)`); SQLite, a CASE on the id
    per column."""
    if not rows:
        return []
    ids = list(rows)
    columns = list(next(iter(rows.values())))
    written = [name for name in columns if name not in match]
    key = table.c.id
    if conn.dialect.name == "postgresql":
        arrays = _array_rows(table, ["id", *columns])
        stmt = (update(table).where(key == arrays.c.id, *[table.c[name] == arrays.c[name] for name in match], *where)
                .values(**values, **{name: arrays.c[name] for name in written}).returning(*returning))
        params = _array_params([{"id": i, **rows[i]} for i in ids], ["id", *columns])
        return list(conn.execute(stmt, params).all())
    per_row = {name: type_coerce(case({i: rows[i][name] for i in ids}, value=key), table.c[name].type)
               for name in columns}
    stmt = (update(table).where(key.in_(ids), *[table.c[name] == per_row[name] for name in match], *where)
            .values(**values, **{name: per_row[name] for name in written}).returning(*returning))
    return list(conn.execute(stmt).all())
