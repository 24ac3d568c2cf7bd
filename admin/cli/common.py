"""What every `lembra` command shares: settings and runtime loaded from the environment (or a
one-line error and exit status 2), and domain errors turned into such lines."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, NoReturn

import click

from engine.core.config import ConfigError, Settings

EXIT_CONFIG = 2


def fail(message: str) -> NoReturn:
    """Print a one-line error and exit with status 2."""
    click.echo(f"lembra: error: {message}", err=True)
    sys.exit(EXIT_CONFIG)


def load_settings() -> Settings:
    """The settings from the environment, or a one-line error."""
    try:
        return Settings.from_env()
    except ConfigError as exc:
        fail(str(exc))


def load_runtime(*, check_broker: bool = False, migrate: bool = False) -> Any:
    """Settings → checked database (and broker) → runtime, or a one-line error."""
    from engine.store.app_role import warn_if_row_security_is_off
    from engine.fleet.broker import check_broker as broker_check
    from engine.store.db import Database
    from engine.core.logs import configure
    from engine.store.migrate import upgrade_database
    from engine.store.runtime import Runtime

    settings = load_settings()
    configure(settings.log_level, settings.log_format)
    try:
        if check_broker:
            broker_check(settings)
        if not migrate:
            _refuse_to_create_a_database(settings.database_url)
        database = Database(settings.database_url)
        try:
            database.check()
            if not migrate and not database.has_schema():
                fail("the database has no Lembra tables yet: run `lembra db upgrade` (or `lembra up`) first")
            if check_broker:  # the long-running commands (up, web, worker, scheduler): said once, at start
                warn_if_row_security_is_off(database.engine)
        finally:
            database.dispose()
        if migrate:
            upgrade_database(settings)
        rt = Runtime.build(settings)
    except ConfigError as exc:
        fail(str(exc))
    # The command's pooled connections close with the command, not whenever the garbage collector
    # finds them (a command run in-process, as the tests and `lembra up` do, would leak them).
    context = click.get_current_context(silent=True)
    if context is not None:
        context.call_on_close(rt.close)
    return rt


def _refuse_to_create_a_database(database_url: str) -> None:
    """Only `lembra up` and `lembra db upgrade` may start a new SQLite file: a command run in the
    wrong folder would otherwise leave an empty lembra.db (and a key) behind and fail on it."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    if not os.path.exists(url.database) and os.path.isdir(os.path.dirname(os.path.abspath(url.database))):
        fail(f"no Lembra database at {os.path.abspath(url.database)}: run this in the folder where you ran "
             "`lembra up`, or set DATABASE_URL")


def org_of(conn: Any, slug: str) -> Any:
    """The org whose slug is `slug`, or a one-line CLI error naming what exists."""
    from engine.tenants.orgs import org_by_slug

    return domain(lambda: org_by_slug(conn, slug))


def domain(action: Callable[[], Any]) -> Any:
    """Run a domain action, turning its validation errors into one-line CLI errors."""
    from engine.core.errors import DomainError

    try:
        return action()
    except DomainError as exc:
        fail(str(exc))
