"""`lembra agenda`: the built-in agenda from the command line — its professionals and their weekly
hours, the free times a flow would offer, and the clinic's availability webhook (docs/agenda.md)."""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from typing import Any, Iterator
from zoneinfo import ZoneInfo

import click

from admin.cli.common import domain, fail, load_runtime, org_of

WEEKDAY_NAMES = ("seg", "ter", "qua", "qui", "sex", "sáb", "dom")
_SPEC_DAYS = re.compile(r"^([0-6])(?:-([0-6]))?$")


@click.group("agenda", help="The built-in agenda: professionals, their hours and free times.")
def agenda() -> None:
    """The `lembra agenda` group."""


def _org(conn: Any, slug: str) -> Any:
    from engine.people.agenda import org_row

    return org_row(conn, org_of(conn, slug).id)


def _hours(specs: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """'0-4 08:00-12:00 13:00-18:00' (weekdays 0 = Monday, a range or a comma list, then intervals)
    as the agenda's hours; each spec repeatable."""
    for spec in specs:
        days_part, *intervals = spec.split()
        days: list[int] = []
        for piece in days_part.split(","):
            match = _SPEC_DAYS.match(piece)
            if not match:
                fail(f"--hours {spec!r}: start with weekdays such as 0-4 or 0,2,4 (0 = Monday)")
            low = int(match.group(1))
            days.extend(range(low, int(match.group(2) or low) + 1))
        if not intervals:
            fail(f"--hours {spec!r}: give at least one interval such as 08:00-12:00")
        for interval in intervals:
            starts, _, ends = interval.partition("-")
            for day in days:
                yield {"weekday": day, "starts": starts, "ends": ends}


def _show(professional: Any) -> str:
    days: dict[int, list[str]] = {}
    for interval in professional.hours:
        days.setdefault(interval.weekday, []).append(f"{interval.starts}-{interval.ends}")
    week = "; ".join(f"{WEEKDAY_NAMES[d]} {' '.join(v)}" for d, v in sorted(days.items())) or "sem horários"
    state = "" if professional.active else " (inativo)"
    return f"{professional.id}\t{professional.name}{state}\t{professional.slot_minutes} min\t{week}"


@agenda.command("professionals", help="List an org's professionals and their weekly hours.")
@click.option("--org", "org_slug", required=True, help="The org's slug.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def professionals(org_slug: str, as_json: bool) -> None:
    from engine.people.agenda import list_professionals

    rt = load_runtime()
    with rt.db.connect() as conn:
        found = list_professionals(conn, _org(conn, org_slug).id)
    if as_json:
        click.echo(json.dumps([p.as_json() for p in found], ensure_ascii=False))
        return
    for professional in found:
        click.echo(_show(professional))


@agenda.command("add", help="Add a professional: --hours '0-4 08:00-12:00 13:00-18:00' (0 = Monday), repeatable.")
@click.option("--org", "org_slug", required=True, help="The org's slug.")
@click.option("--name", required=True, help="The professional's name, unique in the org.")
@click.option("--slot-minutes", type=int, default=30, show_default=True, help="The length of one free time.")
@click.option("--hours", "hour_specs", multiple=True, help="Weekdays and intervals; repeatable.")
def add(org_slug: str, name: str, slot_minutes: int, hour_specs: tuple[str, ...]) -> None:
    from engine.people.agenda import create_professional, link_appointments

    rt = load_runtime()
    hours = list(_hours(hour_specs))
    with rt.db.begin() as conn:
        org = _org(conn, org_slug)
        made = domain(lambda: create_professional(conn, org.id, name=name, slot_minutes=slot_minutes, hours=hours))
        linked = link_appointments(conn, org.id)
    click.echo(_show(made))
    if linked:
        click.echo(f"{linked} agendamento com este nome ligado ao profissional" if linked == 1
                   else f"{linked} agendamentos com este nome ligados ao profissional")


def _day(value: str | None, option: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        fail(f"{option} must be a date such as 2026-12-11, not {value!r}")


@agenda.command("slots", help="Show the free times a flow would offer.")
@click.option("--org", "org_slug", required=True, help="The org's slug.")
@click.option("--date", "on", default=None, help="One day (YYYY-MM-DD).")
@click.option("--from", "date_from", default=None, help="The first day searched (default: today).")
@click.option("--to", "date_to", default=None, help="The last day searched (default: 60 days ahead).")
@click.option("--period", type=click.Choice(["morning", "afternoon", "evening"]), default=None)
@click.option("--time", "at", default=None, help="HH:MM: that time or the nearest ones.")
@click.option("--exclude", "exclude", default=None, help="Weekdays left out, e.g. 0,4 (0 = Monday).")
@click.option("--professional", default=None, help="Only this professional's times (their name).")
@click.option("--limit", type=int, default=3, show_default=True)
@click.option("--now", "now_iso", default=None, help="The current time (ISO with offset; default: now).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def slots(org_slug: str, on: str | None, date_from: str | None, date_to: str | None, period: str | None,
          at: str | None, exclude: str | None, professional: str | None, limit: int, now_iso: str | None,
          as_json: bool) -> None:
    from engine.core import clock
    from engine.people.agenda import AvailabilityUnavailable, SlotQuery, free_slots

    rt = load_runtime()
    try:
        weekdays = tuple(int(d) for d in exclude.split(",")) if exclude else ()
    except ValueError:
        fail(f"--exclude must be weekdays such as 0,4 (0 = Monday), not {exclude!r}")
    now = clock.now()
    if now_iso is not None:
        try:
            now = datetime.fromisoformat(now_iso)
        except ValueError:
            fail(f"--now must be an ISO date-time such as 2026-12-07T10:00:00-03:00, not {now_iso!r}")
        if now.tzinfo is None:
            fail("--now needs its UTC offset, e.g. 2026-12-07T10:00:00-03:00")
    query = SlotQuery(date_from=_day(date_from, "--from") or _day(on, "--date"),
                      date_to=_day(date_to, "--to") or _day(on, "--date"), period=period, time=at,
                      exclude_weekdays=weekdays, professional=professional, limit=limit)
    query = domain(query.checked)
    with rt.db.connect() as conn:
        org = _org(conn, org_slug)
        try:
            found = domain(lambda: free_slots(conn, org, query, now, egress=rt.settings.egress))
        except AvailabilityUnavailable as exc:
            fail(f"{exc} ({exc.code}, {'permanent' if exc.permanent else 'transient'})")
    if as_json:
        click.echo(json.dumps([s.as_json() for s in found], ensure_ascii=False))
        return
    if not found:
        click.echo("nenhum horário livre")
    zone = ZoneInfo(org.timezone)
    for index, slot in enumerate(found, start=1):
        local = slot.starts_at.astimezone(zone)
        click.echo(f"{index}. {WEEKDAY_NAMES[local.weekday()]} {local:%d/%m %H:%M}"
                   + (f" — {slot.professional}" if slot.professional else ""))


@agenda.command("availability-url", help="Ask the clinic's own system for free times (give no URL to stop).")
@click.option("--org", "org_slug", required=True, help="The org's slug.")
@click.argument("url", required=False, default="")
def availability_url(org_slug: str, url: str) -> None:
    from engine.people.agenda import set_availability_url

    rt = load_runtime()
    with rt.db.begin() as conn:
        org = _org(conn, org_slug)
        saved = domain(lambda: set_availability_url(conn, org.id, url, egress=rt.settings.egress))
    click.echo(f"free times come from {saved}" if saved else "free times come from the built-in agenda")
