"""`lembra webhooks …`: an org's outbound webhook endpoints and their delivery log (docs/webhooks.md)."""

from __future__ import annotations

import json

import click

from admin.cli.common import fail, load_runtime, org_of


@click.group(help="Outbound webhooks: where an org's events go (signed as Standard Webhooks says).")
def webhooks() -> None:
    """Webhook endpoint commands."""


@webhooks.command("list", help="List an org's webhook endpoints (never their secrets).")
@click.option("--org", "org_slug", required=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def webhooks_list(org_slug: str, as_json: bool) -> None:
    from engine.tenants.webhooks.endpoints import list_endpoints

    rt = load_runtime()
    with rt.db.connect() as conn:
        rows = list_endpoints(conn, org_of(conn, org_slug).id)
    for row in rows:
        if as_json:
            click.echo(json.dumps({"id": row.id, "url": row.url, "description": row.description,
                                   "event_types": list(row.event_types), "active": bool(row.active)}))
        else:
            state = "active" if row.active else "inactive"
            click.echo(f"{row.id}\t{state}\t{row.url}\t{','.join(row.event_types)}")


@webhooks.command("add", help="Add a webhook endpoint. Its signing secret is printed once, on the last line; "
                              "only a sealed copy is stored.")
@click.option("--org", "org_slug", required=True)
@click.option("--url", required=True, help="http(s) URL of the clinic's system (a public address).")
@click.option("--event", "event_types", multiple=True,
              help="An event type to send (repeat it); every event type by default.")
@click.option("--description", default=None)
def webhooks_add(org_slug: str, url: str, event_types: tuple[str, ...], description: str | None) -> None:
    from engine.tenants.webhooks.endpoints import EndpointRefused, create_endpoint
    from engine.tenants.webhooks.events import EVENT_TYPES
    from engine.words.catalogue import describe

    rt = load_runtime()
    try:
        with rt.db.begin() as conn:
            org = org_of(conn, org_slug)
            made = create_endpoint(conn, rt.keyring, org.id, url=url, event_types=event_types or EVENT_TYPES,
                                   description=description, egress=rt.settings.egress)
    except EndpointRefused as exc:
        fail(f"{exc.field}: {describe(exc.code, **exc.params)}")
    click.echo(f"webhook endpoint {made.endpoint_id} for {org_slug}; store its secret now, it is not shown again:",
               err=True)
    click.echo(made.secret)


@webhooks.command("remove", help="Delete one of an org's webhook endpoints (and its delivery log) by id.")
@click.option("--org", "org_slug", required=True)
@click.option("--id", "endpoint_id", required=True, type=int)
def webhooks_remove(org_slug: str, endpoint_id: int) -> None:
    from engine.tenants.webhooks.endpoints import EndpointNotFound, delete_endpoint

    rt = load_runtime()
    with rt.db.begin() as conn:
        org = org_of(conn, org_slug)
        try:
            delete_endpoint(conn, org.id, endpoint_id)
        except EndpointNotFound:
            fail(f"org {org_slug} has no webhook endpoint {endpoint_id}")
    click.echo(f"removed {endpoint_id}")


@webhooks.command("deliveries", help="The delivery log of an org's endpoints, newest last (no payloads).")
@click.option("--org", "org_slug", required=True)
@click.option("--id", "endpoint_id", type=int, default=None, help="Only this endpoint's deliveries.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
def webhooks_deliveries(org_slug: str, endpoint_id: int | None, limit: int) -> None:
    from sqlalchemy import select

    from engine.store.models import webhook_deliveries as deliveries
    from engine.words.catalogue import describe, known

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = org_of(conn, org_slug)
        query = select(deliveries).where(deliveries.c.org_id == org.id)
        if endpoint_id is not None:
            query = query.where(deliveries.c.endpoint_id == endpoint_id)
        rows = list(conn.execute(query.order_by(deliveries.c.id.desc()).limit(limit)))
    for row in reversed(rows):
        error = str(describe(row.last_error)) if row.last_error and known(row.last_error) else ""
        code = "" if row.last_status_code is None else str(row.last_status_code)
        click.echo(f"{row.id}\t{row.endpoint_id}\t{row.event_type}\t{row.status}\t{row.attempts}\t{code}\t{error}")
