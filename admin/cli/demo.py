"""`lembra demo …`: the demo clinic."""

from __future__ import annotations

import click

from admin.cli.common import load_runtime


@click.group(help="The demo clinic.")
def demo() -> None:
    """Demo commands."""


@demo.command(help="Create the demo clinic (no-op if it exists).")
def seed() -> None:
    from engine.fleet import demo as demo_seed

    rt = load_runtime(migrate=True)
    with rt.db.begin() as conn:
        result = demo_seed.seed(conn, rt.keyring)
    click.echo(("created" if result.created else "already there") + f": org id {result.org_id}")
