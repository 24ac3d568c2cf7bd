"""`lembra apikeys …`: REST API keys."""

from __future__ import annotations

import click

from admin.cli.common import domain, fail, load_runtime, org_of


@click.group(help="REST API keys (one org each; shown once, stored hashed).")
def apikeys() -> None:
    """API key commands."""


@apikeys.command("create", help="Create an API key for an org. The key is printed once, on the last line; "
                                "only its hash is stored.")
@click.option("--org", "org_slug", required=True)
@click.option("--name", required=True, help="What the key is for, e.g. the clinic's scheduling software.")
def apikeys_create(org_slug: str, name: str) -> None:
    from engine.tenants.apikeys import create_key

    rt = load_runtime()
    with rt.db.begin() as conn:
        org = org_of(conn, org_slug)
        new = domain(lambda: create_key(conn, org_id=org.id, name=name))
    click.echo(f"API key {new.id} ({new.prefix}) for {org_slug}; store it now, it is not shown again:", err=True)
    click.echo(new.key)


@apikeys.command("revoke", help="Revoke one of an org's API keys by id.")
@click.option("--org", "org_slug", required=True)
@click.option("--id", "key_id", required=True, type=int)
def apikeys_revoke(org_slug: str, key_id: int) -> None:
    from engine.tenants.apikeys import revoke

    rt = load_runtime()
    with rt.db.begin() as conn:
        org = org_of(conn, org_slug)
        if not revoke(conn, org.id, key_id):
            fail(f"org {org_slug} has no live API key {key_id}")
    click.echo(f"revoked {key_id}")
