"""Database access: one engine per process, UTC timestamps, short transactions.

Both backends run the same statements. SQLite (the embedded default) gets WAL, a busy timeout and
`BEGIN IMMEDIATE`, so concurrent writers queue instead of failing; PostgreSQL gets a pool that
pings a connection which sat idle, so a dropped one is replaced instead of failing the next
statement (`_ping_when_idle`).
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime, timezone
from typing import Any, Iterator

from sqlalchemy import JSON, DateTime, LargeBinary, create_engine, event, text
from sqlalchemy.dialects.postgresql import BYTEA, JSONB
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.pool import NullPool
from sqlalchemy.types import TypeDecorator

from engine.core.config import ConfigError

UTC = timezone.utc

#: JSON stored as jsonb on PostgreSQL and as text on SQLite.
JSONType = JSON().with_variant(JSONB(), "postgresql")
BinaryType = LargeBinary().with_variant(BYTEA(), "postgresql")


def require_aware(value: datetime) -> datetime:
    """`value` itself; ValueError when it is naive (a naive timestamp written is a bug)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("naive datetime given to the database; use aware datetimes")
    return value


class UTCDateTime(TypeDecorator[datetime]):
    """An aware datetime in, an aware UTC datetime out, on every backend.

    PostgreSQL stores timestamptz. SQLite stores naive UTC text, which compares correctly as
    text because every value is written in the same format. Naive input is a bug and refused.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect):  # type: ignore[no-untyped-def]
        if dialect.name == "sqlite":
            return dialect.type_descriptor(DateTime())
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:  # type: ignore[no-untyped-def]
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError("UTCDateTime expects a datetime")
        value = require_aware(value).astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:  # type: ignore[no-untyped-def]
        if value is None or value.tzinfo is UTC:
            return value
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Database:
    """A process's handle on the database: `with db.begin() as conn:` is one transaction."""

    def __init__(self, url: str, *, pool_size: int = 10, echo: bool = False) -> None:
        self.url = url
        self.dialect = make_url(url).get_backend_name()
        self.engine: Engine = _make_engine(url, pool_size=pool_size, echo=echo)

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @contextlib.contextmanager
    def begin(self) -> Iterator[Connection]:
        """A write transaction: committed on success, rolled back on error."""
        with self.engine.connect() as conn:
            conn.execution_options(lembra_write=True)
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection for reading (on SQLite its transactions do not take the write lock)."""
        with self.engine.connect() as conn:
            yield conn

    def check(self) -> None:
        """Raise ConfigError with a one-line reason when the database cannot be reached."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except OperationalError as exc:
            raise ConfigError(f"DATABASE_URL: cannot connect ({_reason(exc)})") from None

    def has_schema(self) -> bool:
        """Whether the migrations have run here (the orgs table exists)."""
        from sqlalchemy import inspect

        with self.engine.connect() as conn:
            return bool(inspect(conn).has_table("orgs"))

    def dispose(self) -> None:
        self.engine.dispose()


def _reason(exc: OperationalError) -> str:
    """The first line of the driver's message, which names host and cause but never the password."""
    message = str(exc.orig) if exc.orig is not None else str(exc)
    first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    return first[:200]


def _make_engine(url: str, *, pool_size: int, echo: bool) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(
            url,
            echo=echo,
            connect_args={"timeout": 60, "check_same_thread": False},
            hide_parameters=True,
            poolclass=NullPool if parsed.database in (None, "", ":memory:") else None,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin.
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=60000")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            # Write transactions take the write lock up front: a deferred transaction that later
            # writes can fail with "database is locked" instead of waiting its turn. Reads stay
            # deferred, so WAL lets them run beside a writer.
            if conn.get_execution_options().get("lembra_write"):
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.exec_driver_sql("BEGIN")

        return engine
    engine = create_engine(
        url,
        echo=echo,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=1800,
        connect_args={"connect_timeout": 10, "application_name": "lembra"},
        hide_parameters=True,
    )

    @event.listens_for(engine, "connect")
    def _utc_session(dbapi_conn: Any, _record: Any) -> None:
        # Sessions in UTC whatever the server's default: psycopg then hands timestamptz values out
        # in `timezone.utc` itself, which UTCDateTime passes through without converting. (A SET,
        # not the connection's `options`, which a DATABASE_URL or PGOPTIONS may already carry.)
        dbapi_conn.execute("SET TIME ZONE 'UTC'")
        dbapi_conn.commit()

    _ping_when_idle(engine)
    return engine


#: A pooled connection unused for longer than this is pinged before it is handed out.
PING_AFTER_IDLE = 5.0


def _ping_when_idle(engine: Engine) -> None:
    """Replace a dropped connection before it fails a statement, pinging only those that sat idle.

    `pool_pre_ping` pings on every checkout: one more round trip and one more commit per
    transaction, a third of the commits a busy worker made. A connection in constant use is
    not pinged; if the server went away under it, its statement fails, SQLAlchemy discards the
    whole pool, and the caller's retry (the actor, the sweep, the next scheduler pass) gets a
    fresh connection."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["lembra_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("lembra_idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception:
            # The pool drops this connection and checks out (or opens) another one.
            raise DisconnectionError() from None
