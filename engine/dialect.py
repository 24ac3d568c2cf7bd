"""The few statements that are spelled differently on PostgreSQL and SQLite."""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection


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
