"""`lembra channels …`: provider accounts."""

from __future__ import annotations

import os
import sys

import click
from sqlalchemy import select

from admin.cli.common import domain, fail, load_runtime


@click.group(help="Provider accounts (channels).")
def channels() -> None:
    """Channel commands."""


def _parse_settings(pairs: tuple[str, ...]) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(f"--set takes key=value, got a value without '=' for {key.strip() or '?'}")
        values[key.strip()] = value
    return values


@channels.command("add", help="Add a channel. Credentials come from --set key=value or, one key=value per "
                              "line, from standard input (so they stay out of shell history); never echoed. "
                              "Prints the new channel id on its last line.")
@click.option("--org", "org_slug", required=True)
@click.option("--kind", type=click.Choice(["whatsapp", "email", "sms"]), required=True)
@click.option("--provider", required=True)
@click.option("--name", required=True)
@click.option("--set", "pairs", multiple=True, metavar="KEY=VALUE")
@click.option("--default/--no-default", "is_default", default=True, show_default=True)
@click.option("--min-interval-ms", type=int, default=None, help="Pacing: minimum gap between two sends.")
@click.option("--daily-cap", type=int, default=None, help="Pacing: sends per day at most.")
def channels_add(org_slug: str, kind: str, provider: str, name: str, pairs: tuple[str, ...], is_default: bool,
                 min_interval_ms: int | None, daily_cap: int | None) -> None:
    from engine.tenants.channels import create_channel
    from engine.tenants.orgs import org_by_slug

    credentials = _parse_settings(pairs)
    stdin = click.get_text_stream("stdin")
    if not pairs and not stdin.isatty():
        credentials = _parse_settings(tuple(line.strip() for line in stdin if line.strip()))
    rt = load_runtime()
    with rt.db.begin() as conn:
        org = domain(lambda: org_by_slug(conn, org_slug))
        channel_id = domain(lambda: create_channel(
            conn, rt.keyring, org_id=org.id, kind=kind, provider=provider, name=name, credentials=credentials,
            is_default=is_default, min_interval_ms=min_interval_ms, daily_cap=daily_cap))
    click.echo(f"webhook URL: {rt.settings.public_url}/webhooks/{provider}/{channel_id}")
    if provider == "evolution":
        # Evolution is told where to call (with the JWT key); other providers are set in their consoles.
        from engine.store.models import channels as channels_table
        from gateway.errors import ProviderError

        with rt.db.connect() as conn:
            row = conn.execute(select(channels_table).where(channels_table.c.id == channel_id)).one()
        try:
            rt.providers.get(row).configure_webhook()
            click.echo("webhook configured on the Evolution instance")
        except ProviderError as exc:
            click.echo(f"warning: could not configure the Evolution webhook ({exc.code}); "
                       "run `lembra channels add` again or set it in Evolution", err=True)
    click.echo(str(channel_id))


@channels.command("list", help="List an org's channels (never a secret: only which keys are set).")
@click.option("--org", "org_slug", required=True)
def channels_list(org_slug: str) -> None:
    from engine.store.models import channels as channels_table
    from engine.tenants.orgs import org_by_slug

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = domain(lambda: org_by_slug(conn, org_slug))
        rows = conn.execute(select(channels_table).where(channels_table.c.org_id == org.id)
                            .order_by(channels_table.c.id)).all()
    click.echo(f"{'ID':>5}  {'KIND':<8} {'PROVIDER':<9} {'STATUS':<8} {'DEFAULT':<7} {'PACING':<14} NAME / KEYS SET")
    for row in rows:
        keys_set = sorted(rt.keyring.open(row.credentials, key_version=row.key_version, table="channels",
                                          org_id=row.org_id, row_id=row.id)) if row.credentials else []
        pacing = f"{row.min_interval_ms or 0}ms/{row.daily_cap or '-'}" if (row.min_interval_ms or row.daily_cap) else "-"
        click.echo(f"{row.id:>5}  {row.kind:<8} {row.provider:<9} {row.status:<8} {'yes' if row.is_default else '':<7} "
                   f"{pacing:<14} {row.name} [{', '.join(keys_set)}]")


@channels.command("test", help="Send one message now through a channel and print the provider's message id. "
                               "Exit status: 0 sent, 2 permanent failure, 3 transient failure.")
@click.argument("channel_id", type=int)
@click.option("--to", "to", required=True, help="Phone number (E.164 or national) or e-mail address.")
@click.option("--text", default="Mensagem de teste do Lembra.", show_default=True)
def channels_test(channel_id: int, to: str, text: str) -> None:
    from engine.store.models import channels as channels_table
    from gateway.contract import OutboundMessage
    from gateway.errors import ProviderError
    from gateway.phones import InvalidPhone, normalize_phone

    rt = load_runtime()
    with rt.db.connect() as conn:
        channel = conn.execute(select(channels_table).where(channels_table.c.id == channel_id)).first()
    if channel is None:
        fail(f"no channel {channel_id}")
    if channel.kind != "email":
        try:
            to = normalize_phone(to)
        except InvalidPhone:
            fail("--to is not a valid phone number")
    message = OutboundMessage(to=to, text=text, subject="Teste do Lembra" if channel.kind == "email" else None,
                              idempotency_key=f"channel-test:{channel_id}:{os.urandom(6).hex()}",
                              conversation_open=True)
    try:
        result = rt.providers.get(channel).send(message)
    except ProviderError as exc:
        kind = "permanent" if exc.permanent else "transient"
        click.echo(f"{kind} failure: {exc.reason} (code {exc.code})", err=True)
        sys.exit(2 if exc.permanent else 3)
    click.echo(result.provider_message_id)
