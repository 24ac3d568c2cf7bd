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


@orgs.command("staff-quiet", help="How many minutes a hand-off the clinic's own phone started lasts after its "
                                    "last message (0: only a person ends it on the console). Default 30.")
@click.option("--org", "org_slug", required=True)
@click.option("--minutes", type=int, required=True)
def orgs_staff_quiet(org_slug: str, minutes: int) -> None:
    from engine.messaging.clinic_phone import set_quiet_minutes
    from engine.tenants.orgs import org_by_slug

    rt = load_runtime()
    with rt.db.begin() as conn:
        org = domain(lambda: org_by_slug(conn, org_slug))
        saved = domain(lambda: set_quiet_minutes(conn, org.id, minutes))
    click.echo(f"{org_slug}: {saved} minutes")


@orgs.command("list", help="List the orgs: slug and name (the slug is what --org takes). Never a secret.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array of {id, slug, name}.")
def orgs_list(as_json: bool) -> None:
    import json

    from sqlalchemy import select

    from engine.store.models import orgs as orgs_table

    rt = load_runtime()
    with rt.db.connect() as conn:
        rows = conn.execute(select(orgs_table.c.id, orgs_table.c.slug, orgs_table.c.name)
                            .order_by(orgs_table.c.slug)).all()
    if as_json:
        click.echo(json.dumps([{"id": r.id, "slug": r.slug, "name": r.name} for r in rows], ensure_ascii=False))
        return
    if not rows:
        click.echo("no orgs")
        return
    width = max(len("SLUG"), *(len(r.slug) for r in rows))
    click.echo(f"{'SLUG':<{width}}  NAME")
    for row in rows:
        click.echo(f"{row.slug:<{width}}  {row.name}")


@orgs.command("transcription", help="Set the org's OpenAI-compatible transcription server for patients' voice "
                                    "notes (POST {url}/audio/transcriptions), or clear it with --clear (then "
                                    "every voice note goes to a person). The key is read from stdin, never "
                                    "echoed; give none for a server without auth.")
@click.option("--org", "org_slug", required=True)
@click.option("--url", default=None, help="Base URL, e.g. https://api.openai.com/v1 or http://whisper:8000/v1.")
@click.option("--model", default=None, help="The model, e.g. whisper-1.")
@click.option("--clear", is_flag=True, help="Remove the setting.")
def orgs_transcription(org_slug: str, url: str | None, model: str | None, clear: bool) -> None:
    from engine.messaging.voice import configure_transcription
    from engine.tenants.orgs import org_by_slug

    if not clear and not url:
        raise click.UsageError("give --url and --model, or --clear")
    import sys

    key = None if clear or sys.stdin.isatty() else (sys.stdin.read().strip() or None)
    rt = load_runtime()
    with rt.db.begin() as conn:
        org = domain(lambda: org_by_slug(conn, org_slug))
        domain(lambda: configure_transcription(conn, rt.keyring, org.id, base_url=None if clear else url,
                                               model=model, api_key=key, egress=rt.settings.egress))
    click.echo("transcription cleared" if clear else "transcription set")
