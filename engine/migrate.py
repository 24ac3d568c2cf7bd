"""Apply the plain-SQL migrations in `sql/<dialect>/` with yoyo-migrations."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from sqlalchemy.engine import make_url
from yoyo import get_backend, read_migrations

from engine.config import ConfigError

SQL_ROOT = Path(__file__).resolve().parent.parent / "sql"


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
    except Exception as exc:  # yoyo wraps driver errors in several types
        raise ConfigError(f"DATABASE_URL: cannot connect ({str(exc).strip().splitlines()[0][:200]})") from None
    migrations = read_migrations(str(SQL_ROOT / dialect))
    # yoyo prints the rows of any statement that returns some; SQLite's ADD COLUMN with a CHECK
    # returns its internal check query's, which would land on a user's terminal at first start.
    with backend.lock(), contextlib.redirect_stdout(io.StringIO()):
        pending = backend.to_apply(migrations)
        backend.apply_migrations(pending)
    applied = [m.id for m in pending]
    backend.connection.close()
    return applied
