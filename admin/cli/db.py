"""`lembra db …`: the database schema."""

from __future__ import annotations

import click

from admin.cli.common import fail, load_settings
from engine.core.config import ConfigError


@click.group(help="Database schema.")
def db() -> None:
    """Database commands."""


@db.command(help="Apply pending migrations (a no-op when the schema is current). On PostgreSQL, with "
                  "LEMBRA_OWNER_DATABASE_URL set, they run as that owner, and DATABASE_URL's role (the one web, "
                  "workers and scheduler use) is created if missing, with no superuser nor BYPASSRLS, and granted "
                  "the tables.")
def upgrade() -> None:
    from engine.words.catalogue import describe
    from engine.store.migrate import upgrade_database

    settings = load_settings()
    try:
        done = upgrade_database(settings)
    except ConfigError as exc:
        fail(str(exc))
    click.echo("applied: " + ", ".join(done.applied) if done.applied else "schema is up to date")
    if done.app_role is not None and done.row_security_off is None:
        click.echo(str(describe("app_role_created" if done.app_role.created else "app_role_granted",
                                role=done.app_role.name)))
    if done.row_security_off is not None:
        click.echo(str(describe("row_security_bypassed", role=done.row_security_off)), err=True)
