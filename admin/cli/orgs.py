"""`lembra orgs …`: tenants."""

from __future__ import annotations

import click

from admin.cli.common import domain, load_runtime


@click.group(help="Tenants.")
def orgs() -> None:
    """Org commands."""


@orgs.command("create", help="Create an org.")
@click.option("--slug", required=True)
@click.option("--name", required=True)
@click.option("--timezone", default="America/Sao_Paulo", show_default=True)
@click.option("--state", default=None, help="Brazilian state (UF) for state holidays, e.g. SP.")
def orgs_create(slug: str, name: str, timezone: str, state: str | None) -> None:
    from engine.tenants.orgs import create_org

    rt = load_runtime()
    with rt.db.begin() as conn:
        org_id = domain(lambda: create_org(conn, slug=slug, name=name, timezone=timezone, state=state))
    click.echo(str(org_id))
