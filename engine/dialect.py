"""The few statements that are spelled differently on PostgreSQL and SQLite."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from sqlalchemy import Table, any_, bindparam, case, func, insert, select, type_coerce, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement


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
        return column == any_(bindparam(None, values, type_=postgresql.ARRAY(column.type)))
    return column.in_(values)


#: SQLite's (older builds') limit of bound parameters per statement.
SQLITE_MAX_PARAMS = 999


def _array_rows(table: Table, columns: Sequence[str]) -> Any:
    """PostgreSQL: `unnest(:row_<col>, …) AS row_values(<col>, …)`, a table of rows from one array
    parameter per column, typed as the table's columns: one statement text for any row count, so
    SQLAlchemy compiles it once (a multi-row VALUES or a per-row CASE is compiled for every batch)."""
    return func.unnest(
        *[bindparam(f"row_{name}", type_=postgresql.ARRAY(table.c[name].type)) for name in columns],
    ).table_valued(*columns).render_derived(name="row_values")


def _array_params(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> dict[str, list[Any]]:
    return {f"row_{name}": [row[name] for row in rows] for name in columns}


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """INSERT `rows` (each naming the same columns): PostgreSQL selects them from arrays, SQLite
    takes multi-row VALUES (not executemany: the driver would send one statement per row)."""
    if not rows:
        return
    columns = list(rows[0])
    if conn.dialect.name == "postgresql":
        arrays = _array_rows(table, columns)
        stmt = insert(table).from_select(columns, select(*[arrays.c[name] for name in columns]))
        conn.execute(stmt, _array_params(rows, columns))
        return
    per_statement = SQLITE_MAX_PARAMS // len(columns)
    for start in range(0, len(rows), per_statement):
        conn.execute(insert(table).values(list(rows[start:start + per_statement])))


def update_per_row(
    conn: Connection,
    table: Table,
    rows: Mapping[int, Mapping[str, Any]],
    *,
    where: Sequence[Any],
    values: Mapping[str, Any],
    returning: Sequence[Any],
) -> list[Any]:
    """UPDATE the rows of `table` whose ids are the keys of `rows`, each with its own value of
    the columns its mapping names (every mapping names the same ones), the same `values` for
    the rest, under `where`; returns the `returning` columns of the rows that changed.

    PostgreSQL joins the rows from arrays (`UPDATE … FROM unnest(…)`); SQLite, a CASE on the id
    per column."""
    if not rows:
        return []
    ids = list(rows)
    columns = list(next(iter(rows.values())))
    key = table.c.id
    if conn.dialect.name == "postgresql":
        arrays = _array_rows(table, ["id", *columns])
        stmt = (update(table).where(key == arrays.c.id, *where)
                .values(**values, **{name: arrays.c[name] for name in columns}).returning(*returning))
        params = _array_params([{"id": i, **rows[i]} for i in ids], ["id", *columns])
        return list(conn.execute(stmt, params).all())
    per_row = {name: type_coerce(case({i: rows[i][name] for i in ids}, value=key), table.c[name].type)
               for name in columns}
    stmt = update(table).where(key.in_(ids), *where).values(**values, **per_row).returning(*returning)
    return list(conn.execute(stmt).all())
