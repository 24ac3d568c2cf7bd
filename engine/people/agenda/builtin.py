"""Free times from the built-in agenda: each professional's weekly hours cut into slots of their
length, on the days the query allows, minus the org's holidays and the professional's booked
appointments.

Slots are laid on the wall clock of the org's timezone: 08:00, 08:30, … in every interval, the
last one ending by the interval's end. A wall time that does not exist that day (the hour a DST
change skips) is not offered; one that exists twice (the hour repeated) is offered once, at its
first occurrence. An appointment with a professional takes their slot length from its start.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Any, Iterator
from zoneinfo import ZoneInfo

from sqlalchemy import or_, select
from sqlalchemy.engine import Connection

from engine.people.agenda.professionals import Professional, list_professionals, minutes_of
from engine.people.agenda.query import Bounds, Slot, SlotQuery, fits, spread
from engine.reminders.windows import is_allowed_day, window_policy
from engine.store.models import appointments

#: Statuses that keep a time taken (a cancelled appointment frees it).
_BUSY_STATUSES = ("scheduled", "confirmed", "completed", "no_show")


def is_holiday(org: Any, day: date) -> bool:
    """Whether `day` is a holiday of the org (national + its state), by the sending window's own
    holiday rule (engine/reminders/windows.py)."""
    policy = window_policy(timezone=org.timezone, quiet_start="00:00", quiet_end="23:59", skip_sundays=False,
                           skip_holidays=True, state=org.state)
    return not is_allowed_day(policy, day)


def _wall(day: date, minutes: int, zone: ZoneInfo) -> datetime | None:
    """The aware instant of a wall-clock time of `day`, or None when that wall time does not exist."""
    naive = datetime(day.year, day.month, day.day) + timedelta(minutes=minutes)
    aware = naive.replace(tzinfo=zone, fold=0)
    if aware.astimezone(timezone.utc).astimezone(zone).replace(tzinfo=None) != naive:
        return None  # skipped by a DST change
    return aware


def _day_slots(professional: Professional, day: date, zone: ZoneInfo) -> Iterator[Slot]:
    length = professional.slot_minutes
    for interval in professional.hours:
        if interval.weekday != day.weekday():
            continue
        start, end = minutes_of(interval.starts), minutes_of(interval.ends)
        minute = start
        while minute + length <= end:
            at = _wall(day, minute, zone)
            if at is not None:
                yield Slot(starts_at=at, ends_at=(at.astimezone(timezone.utc) + timedelta(minutes=length))
                           .astimezone(zone), professional=professional.name, professional_id=professional.id)
            minute += length


def _booked(conn: Connection, org_id: int, chosen: list[Professional], limits: Bounds
            ) -> dict[int, list[tuple[datetime, datetime]]]:
    """Each professional's taken intervals between the bounds: appointments linked by id, or, for
    those that only carry a name, by that name (case and spaces ignored)."""
    longest = max(p.slot_minutes for p in chosen)
    by_name = {p.name.strip().casefold(): p for p in chosen}
    rows = conn.execute(select(appointments.c.starts_at, appointments.c.professional_id, appointments.c.professional)
                        .where(appointments.c.org_id == org_id, appointments.c.status.in_(_BUSY_STATUSES),
                               appointments.c.starts_at > limits.earliest - timedelta(minutes=longest),
                               appointments.c.starts_at < limits.latest + timedelta(days=1),
                               or_(appointments.c.professional_id.in_([p.id for p in chosen]),
                                   appointments.c.professional_id.is_(None))))
    ids = {p.id: p for p in chosen}
    taken: dict[int, list[tuple[datetime, datetime]]] = {p.id: [] for p in chosen}
    for row in rows:
        owner = ids.get(row.professional_id) if row.professional_id is not None else \
            by_name.get((row.professional or "").strip().casefold())
        if owner is not None:
            taken[owner.id].append((row.starts_at, row.starts_at + timedelta(minutes=owner.slot_minutes)))
    return taken


def builtin_slots(conn: Connection, org: Any, query: SlotQuery, chosen: list[Professional],
                  limits: Bounds) -> list[Slot]:
    """Up to `query.limit` free slots of the `chosen` professionals within `limits`, spread
    (`query.spread`: one a day first). Only as many days are read as the spread can use."""
    chosen = [p for p in chosen if p.hours]
    if not chosen:
        return []
    taken = _booked(conn, org.id, chosen, limits)
    found: list[Slot] = []
    days_with_slots = 0
    for day in limits.days(query.exclude_weekdays):
        if is_holiday(org, day):
            continue
        before = len(found)
        for professional in chosen:
            busy = taken[professional.id]
            found.extend(s for s in _day_slots(professional, day, limits.zone) if fits(s, query, limits)
                         and not any(s.starts_at < end and start < s.ends_at for start, end in busy))
        days_with_slots += len(found) > before
        if days_with_slots >= query.limit:
            break  # the first `limit` days with free times are all the spread takes from
    return spread(found, query, limits.zone)


def professionals_for(conn: Connection, org_id: int, query: SlotQuery) -> list[Professional]:
    """The active professionals the query is about (one, or all of the org's)."""
    from engine.people.agenda.professionals import find_by_name, get_professional

    if query.professional_id is not None:
        one = get_professional(conn, org_id, query.professional_id)
        return [one] if one.active else []
    if query.professional:
        one = find_by_name(conn, org_id, query.professional)
        return [one] if one.active else []
    return list_professionals(conn, org_id, active_only=True)
