"""`lembra users …`: console users."""

from __future__ import annotations

import click

from admin.cli.common import domain, load_runtime, org_of


@click.group(help="Console users.")
def users() -> None:
    """User commands."""


@users.command("create", help="Create a console user (prompts for the password when not given).")
@click.option("--org", "org_slug", required=True)
@click.option("--email", required=True)
@click.option("--role", type=click.Choice(["owner", "manager", "agent"]), required=True)
@click.option("--password", default=None)
def users_create(org_slug: str, email: str, role: str, password: str | None) -> None:
    from engine.tenants.orgs import create_user

    if password is None:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    rt = load_runtime()
    with rt.db.begin() as conn:
        org = org_of(conn, org_slug)
        user_id = domain(lambda: create_user(conn, org_id=org.id, email=email, role=role, password=password))
    click.echo(str(user_id))
