"""Apply the plain-SQL migrations in `sql/<dialect>/` with yoyo-migrations, as the schema's owner;
then (PostgreSQL, owner and application apart) grant the application's role (engine/store/app_role.py)."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

from psycopg.errors import InsufficientPrivilege
from sqlalchemy.engine import make_url
from yoyo import get_backend, read_migrations

from engine.store.app_role import AppRole, grant_app_role, row_security_bypassed_at
from engine.words.catalogue import describe
from engine.core.config import ConfigError, Settings

SQL_ROOT = Path(__file__).resolve().parents[2] / "sql"


def _yoyo_url(database_url: str) -> str:
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        return "sqlite:///" + (url.database or ":memory:")
    # yoyo understands psycopg 3 under the same scheme SQLAlchemy uses.
    return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def upgrade(database_url: str) -> list[str]:
    """Apply every pending migration; return the ids applied (empty when already current)."""
    dialect = "sqlite" if make_url(database_url).get_backend_name() == "sqlite" else "postgresql"
    try:
        backend = get_backend(_yoyo_url(database_url))
    except InsufficientPrivilege:  # yoyo creates its tables first: the application's role may not
        raise ConfigError(str(describe("migration_needs_owner"))) from None
    except Exception as exc:  # yoyo wraps driver errors in several types
        raise ConfigError(f"DATABASE_URL: cannot connect ({str(exc).strip().splitlines()[0][:200]})") from None
    migrations = read_migrations(str(SQL_ROOT / dialect))
    try:
        # yoyo prints the rows of any statement that returns some; SQLite's ADD COLUMN with a CHECK
        # returns its internal check query's, which would land on a user's terminal at first start.
        with backend.lock(), contextlib.redirect_stdout(io.StringIO()):
            pending = backend.to_apply(migrations)
            backend.apply_migrations(pending)
    except InsufficientPrivilege:
        raise ConfigError(str(describe("migration_needs_owner"))) from None
    finally:
        backend.connection.close()
    return [m.id for m in pending]


@dataclass(frozen=True)
class Upgraded:
    """What `upgrade_database` did."""

    applied: list[str]
    #: The application's role granted, when it is set apart from the owner (PostgreSQL only).
    app_role: AppRole | None
    #: DATABASE_URL's role when row-level security does not apply to it (a superuser or BYPASSRLS).
    row_security_off: str | None


def upgrade_database(settings: Settings) -> Upgraded:
    """Migrate as the owner (LEMBRA_OWNER_DATABASE_URL, else DATABASE_URL); when the owner is set
    apart, create DATABASE_URL's role if missing and grant it every table, the new ones included."""
    applied = upgrade(settings.migration_url)
    if settings.owner_database_url:
        role = grant_app_role(settings.owner_database_url, settings.database_url)
        if role is not None:
            return Upgraded(applied, role, role.name if role.bypasses_row_security else None)
    return Upgraded(applied, None, None if settings.is_sqlite else row_security_bypassed_at(settings.database_url))
