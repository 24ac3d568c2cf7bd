"""`lembra understand`: how the built-in reader understands a patient's reply (what a flow would
see), for trying phrasings and checking an org's keywords without sending anything."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import click

from admin.cli.common import domain, fail, load_runtime

DEFAULT_TIMEZONE = "America/Sao_Paulo"


def _when(value: str | None, zone: ZoneInfo, option: str) -> datetime | None:
    """An ISO date-time; a naive one is read in the org's timezone."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        fail(f"{option} must be an ISO date-time such as 2026-12-07T10:00:00-03:00, not {value!r}")
        raise  # unreachable
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=zone)


def _org_context(slug: str) -> tuple[str, dict[str, Any]]:
    """The org's timezone and its own keywords (the orgs table's optout/confirm/cancel columns)."""
    from engine.tenants.orgs import org_by_slug
    from engine.words.keywords import parse_keywords

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = domain(lambda: org_by_slug(conn, slug))
    keywords = {intent: parse_keywords(csv) for intent, csv in (
        ("opt_out", org.optout_keywords), ("confirm", org.confirm_keywords), ("cancel", org.cancel_keywords))}
    return org.timezone or DEFAULT_TIMEZONE, {k: v for k, v in keywords.items() if v}


@click.command("understand", help="Show how a patient's reply is understood: intent, date, time, period.")
@click.option("--org", "org_slug", default=None, help="Use this org's timezone and keywords.")
@click.option("--now", "now_iso", default=None, help="The current time (ISO; default: now).")
@click.option("--appointment-at", "appointment_iso", default=None, help="The appointment discussed (ISO).")
@click.option("--pending", multiple=True, help="A field the conversation awaits (e.g. choice); repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.argument("text")
def understand(org_slug: str | None, now_iso: str | None, appointment_iso: str | None, pending: tuple[str, ...],
               as_json: bool, text: str) -> None:
    from engine.words.understanding import Context
    from engine.words.understanding import understand as read

    timezone, keywords = _org_context(org_slug) if org_slug else (DEFAULT_TIMEZONE, {})
    zone = ZoneInfo(timezone)
    now = _when(now_iso, zone, "--now") or datetime.now(zone)
    context = Context(now=now, timezone=timezone, appointment_at=_when(appointment_iso, zone, "--appointment-at"),
                      pending=pending, keywords=keywords or None)
    result = read(text, context).as_json()
    if as_json:
        click.echo(json.dumps(result, ensure_ascii=False))
        return
    click.echo(f"intent: {result['intent']} (confidence {result['confidence']})")
    for name, value in result["fields"].items():
        click.echo(f"{name}: {'-' if value is None else value}")
