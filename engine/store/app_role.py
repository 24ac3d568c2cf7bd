"""The application's PostgreSQL role: the one web, workers and the scheduler connect as.

Row-level security (sql/postgresql/0003 and later) never applies to a superuser or to a role with
BYPASSRLS, so a deployment that connects as `postgres` (or as the official image's POSTGRES_USER,
a superuser) has no defence in depth at all. The processes that serve tenants therefore connect as
a role with neither, which may read and write rows and nothing else; the schema's owner runs the
migrations. `lembra db upgrade`, given the owner's URL (LEMBRA_OWNER_DATABASE_URL) and the
application's (DATABASE_URL), creates the application's role when it is missing and grants it the
tables, again on every run, so the tables a later migration adds are granted by the same command
that creates them.

What the runtime needs beyond reading and writing rows, and why these grants cover it:
- `nextval` of the id columns: USAGE on the sequences;
- `SELECT … FOR UPDATE SKIP LOCKED` (the claims): UPDATE on the table;
- the scheduler's `pg_try_advisory_lock`, `set_config('lembra.org_id', …)`, `SET TIME ZONE`: open
  to every role;
- retention and erasure delete rows (DELETE); nothing at runtime truncates, creates or alters.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.engine import make_url

from engine.words.catalogue import describe
from engine.core.config import ConfigError
from engine.store.db import Database

log = logging.getLogger(__name__)

#: What the application's role may do to every Lembra table.
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
#: yoyo's bookkeeping: only the owner migrates, so the application's role gets none of these.
MIGRATION_TABLES = frozenset({"_yoyo_migration", "_yoyo_log", "_yoyo_version", "yoyo_lock"})
#: Serialises two `lembra db upgrade` creating the role at once (two compose `migrate` runs).
_ROLE_LOCK = 0x4C454D42 + 1  # "LEMB" + 1; the scheduler holds "LEMB" itself


@dataclass(frozen=True)
class AppRole:
    """What `grant_app_role` did for the application's role."""

    name: str
    #: The role did not exist and was created (NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE).
    created: bool
    #: An existing role that is a superuser or has BYPASSRLS, left as it was: row-level security
    #: does not apply to it.
    bypasses_row_security: bool


def _conninfo(url: str) -> str:
    """A libpq URL for psycopg from a SQLAlchemy one (the password kept: psycopg needs it)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_role_command(role: str) -> str:
    """The one statement a database administrator runs when the owner may not create roles."""
    return (f"CREATE ROLE {sql.Identifier(role).as_string(None)} LOGIN PASSWORD '…' "
            "NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;")


def grant_app_role(owner_url: str, app_url: str) -> AppRole | None:
    """As the schema's owner, create DATABASE_URL's role if missing and grant it the tables and
    sequences of the schema (yoyo's excepted). None when both URLs name the same role.

    Idempotent: an existing role keeps its attributes and password, and grants are repeated.
    Raises ConfigError (one line, no password) when the owner cannot do it."""
    app = make_url(app_url)
    role = app.username or ""
    try:
        with psycopg.connect(_conninfo(owner_url), connect_timeout=10, application_name="lembra") as conn:
            return _grant(conn, role, None if app.password is None else str(app.password))
    except psycopg.OperationalError as exc:
        raise ConfigError(f"LEMBRA_OWNER_DATABASE_URL: cannot connect ({_first_line(exc)})") from None
    except psycopg.Error as exc:
        raise ConfigError(f"LEMBRA_OWNER_DATABASE_URL: cannot grant the application's role ({_first_line(exc)})") \
            from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _grant(conn: psycopg.Connection[Any], role: str, password: str | None) -> AppRole | None:
    """`grant_app_role` in the owner's open transaction (committed when the connection closes)."""
    owner, schema = conn.execute("SELECT current_user, current_schema()").fetchone()  # type: ignore[misc]
    if role in ("", owner):
        return None
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ROLE_LOCK,))
    found = conn.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    ident = sql.Identifier(role)
    if found is None:
        may = conn.execute("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user").fetchone()
        if not (may and may[0]):
            raise ConfigError(str(describe("app_role_cannot_create", role=role, owner=owner,
                                            command=create_role_command(role))))
        statement = sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION"
                            ).format(ident)
        if password is not None:
            # The server gets the SCRAM verifier, never the password itself (nor does its statement log).
            verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), None)
            statement = sql.SQL("{} PASSWORD {}").format(statement, sql.Literal(verifier.decode()))
        conn.execute(statement)
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), ident))
    tables = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') ORDER BY c.relname").fetchall()
    names = [sql.Identifier(schema, name) for (name,) in tables if name not in MIGRATION_TABLES]
    if names:
        conn.execute(sql.SQL("GRANT {} ON TABLE {} TO {}").format(
            sql.SQL(", ").join(sql.SQL(p) for p in TABLE_PRIVILEGES), sql.SQL(", ").join(names), ident))
    conn.execute(sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {} TO {}").format(
        sql.Identifier(schema), ident))
    return AppRole(name=role, created=found is None, bypasses_row_security=bool(found and found[0]))


def row_security_bypassed(engine: Any) -> str | None:
    """The role `engine` connects as when row-level security does not apply to it (a superuser
    or BYPASSRLS), else None; always None on SQLite."""
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT current_user, rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")).one()
    return str(row[0]) if row[1] else None


def row_security_bypassed_at(url: str) -> str | None:
    """`row_security_bypassed` for a URL, on a connection of its own."""
    database = Database(url, pool_size=1)
    try:
        return row_security_bypassed(database.engine)
    finally:
        database.dispose()


def warn_if_row_security_is_off(engine: Any) -> bool:
    """Log once, at a long-running command's start, that row-level security does not apply to the
    role it connects as; True when it said so."""
    role = row_security_bypassed(engine)
    if role is None:
        return False
    log.warning(str(describe("row_security_bypassed", role=role)), extra={"code": "row_security_bypassed"})
    return True
