"""Professionals of the built-in agenda and their weekly hours.

A professional has a name (unique in the org), a slot length (5–480 minutes: one free time, one
appointment) and weekly hours: intervals of a weekday (0 = Monday … 6 = Sunday) in the org's
wall-clock time, 'HH:MM'–'HH:MM'. Several intervals a day express breaks (08:00–12:00 and
13:00–18:00: lunch at noon). Everything is validated before anything is written, so a refused
change leaves the professional as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.people.agenda.errors import AgendaError, ProfessionalNotFound
from engine.store.models import appointments, professional_hours, professionals

MAX_NAME = 120
MIN_SLOT_MINUTES, MAX_SLOT_MINUTES = 5, 480
DEFAULT_SLOT_MINUTES = 30
#: Seven days of a few intervals each is plenty; the cap keeps one request's work bounded.
MAX_INTERVALS = 70
_HHMM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])|24:00")


@dataclass(frozen=True, order=True)
class Interval:
    """One interval of a weekday, wall-clock 'HH:MM' (ends may be '24:00', the end of the day)."""

    weekday: int
    starts: str
    ends: str

    def as_json(self) -> dict[str, Any]:
        """The API's and the CLI's shape."""
        return {"weekday": self.weekday, "starts": self.starts, "ends": self.ends}


@dataclass(frozen=True)
class Professional:
    """A professional as read, with their hours in weekday and time order."""

    id: int
    org_id: int
    name: str
    slot_minutes: int
    active: bool
    hours: tuple[Interval, ...]

    def as_json(self) -> dict[str, Any]:
        """The API's and the CLI's shape."""
        return {"id": self.id, "name": self.name, "slot_minutes": self.slot_minutes, "active": self.active,
                "hours": [i.as_json() for i in self.hours]}


def minutes_of(hhmm: str) -> int:
    """'08:30' → 510 ('24:00' → 1440); the value must already be valid."""
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)


def check_time(value: Any, field: str) -> str:
    """A wall-clock 'HH:MM' (or '24:00'); AgendaError about `field` otherwise."""
    if not isinstance(value, str) or not _HHMM.fullmatch(value):
        raise AgendaError("agenda_time", field)
    return value


def check_name(value: Any) -> str:
    """The name stripped; AgendaError when empty, too long or not text."""
    name = value.strip() if isinstance(value, str) else ""
    if not name or len(name) > MAX_NAME or "\x00" in name:
        raise AgendaError("agenda_name", "name", max=MAX_NAME)
    return name


def check_slot_minutes(value: Any) -> int:
    """A slot length in minutes, 5–480."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_SLOT_MINUTES <= value <= MAX_SLOT_MINUTES:
        raise AgendaError("agenda_slot_minutes", "slot_minutes", min=MIN_SLOT_MINUTES, max=MAX_SLOT_MINUTES)
    return value


def check_hours(hours: Iterable[Mapping[str, Any]]) -> tuple[Interval, ...]:
    """The week's intervals validated (weekday 0–6, 'HH:MM', starts before ends, none overlapping
    another of the same day) and sorted; AgendaError naming the first problem otherwise."""
    items = list(hours)
    if len(items) > MAX_INTERVALS:
        raise AgendaError("agenda_too_many_hours", "hours", max=MAX_INTERVALS)
    out: list[Interval] = []
    for index, item in enumerate(items):
        where = f"hours.{index}"
        if not isinstance(item, Mapping):
            raise AgendaError("agenda_time", where)
        weekday = item.get("weekday")
        if isinstance(weekday, bool) or not isinstance(weekday, int) or not 0 <= weekday <= 6:
            raise AgendaError("agenda_weekday", f"{where}.weekday")
        starts = check_time(item.get("starts"), f"{where}.starts")
        ends = check_time(item.get("ends"), f"{where}.ends")
        if starts == "24:00" or minutes_of(ends) <= minutes_of(starts):
            raise AgendaError("agenda_interval_order", f"{where}.ends", starts=starts, ends=ends)
        out.append(Interval(weekday, starts, ends))
    out.sort(key=lambda i: (i.weekday, minutes_of(i.starts)))
    for first, second in zip(out, out[1:]):
        if first.weekday == second.weekday and minutes_of(second.starts) < minutes_of(first.ends):
            raise AgendaError("agenda_overlap", "hours", first=f"{first.starts}–{first.ends}",
                              second=f"{second.starts}–{second.ends}")
    return tuple(out)


def _name_taken(conn: Connection, org_id: int, name: str, except_id: int | None = None) -> bool:
    query = select(professionals.c.id).where(professionals.c.org_id == org_id, professionals.c.name == name)
    if except_id is not None:
        query = query.where(professionals.c.id != except_id)
    return conn.execute(query).first() is not None


def _write_hours(conn: Connection, org_id: int, professional_id: int, hours: tuple[Interval, ...]) -> None:
    conn.execute(delete(professional_hours).where(professional_hours.c.org_id == org_id,
                                                  professional_hours.c.professional_id == professional_id))
    if hours:
        conn.execute(insert(professional_hours), [
            {"org_id": org_id, "professional_id": professional_id, "weekday": i.weekday, "starts": i.starts,
             "ends": i.ends} for i in hours])


def create_professional(conn: Connection, org_id: int, *, name: Any, slot_minutes: Any = DEFAULT_SLOT_MINUTES,
                        active: bool = True, hours: Iterable[Mapping[str, Any]] = ()) -> Professional:
    """A new professional with their weekly hours; AgendaError (nothing written) when refused."""
    clean_name = check_name(name)
    minutes = check_slot_minutes(slot_minutes)
    week = check_hours(hours)
    if _name_taken(conn, org_id, clean_name):
        raise AgendaError("agenda_name_taken", "name")
    now = clock.now()
    professional_id = int(conn.execute(insert(professionals).values(
        org_id=org_id, name=clean_name, slot_minutes=minutes, active=bool(active), created_at=now, updated_at=now,
    ).returning(professionals.c.id)).scalar_one())
    _write_hours(conn, org_id, professional_id, week)
    return get_professional(conn, org_id, professional_id)


def update_professional(conn: Connection, org_id: int, professional_id: int, **changes: Any) -> Professional:
    """Change name, slot_minutes, active and/or hours (the whole week, replaced) of one of the
    org's professionals; unknown keys are a bug (TypeError). All checked before anything is written."""
    unknown = set(changes) - {"name", "slot_minutes", "active", "hours"}
    if unknown:
        raise TypeError(f"unknown changes: {sorted(unknown)}")
    get_professional(conn, org_id, professional_id)  # 404 first: another org's id says nothing more
    values: dict[str, Any] = {}
    if "name" in changes:
        values["name"] = check_name(changes["name"])
        if _name_taken(conn, org_id, values["name"], except_id=professional_id):
            raise AgendaError("agenda_name_taken", "name")
    if "slot_minutes" in changes:
        values["slot_minutes"] = check_slot_minutes(changes["slot_minutes"])
    if "active" in changes:
        values["active"] = bool(changes["active"])
    week = check_hours(changes["hours"]) if "hours" in changes else None
    conn.execute(update(professionals).where(professionals.c.org_id == org_id, professionals.c.id == professional_id)
                 .values(**values, updated_at=clock.now()))
    if week is not None:
        _write_hours(conn, org_id, professional_id, week)
    return get_professional(conn, org_id, professional_id)


def delete_professional(conn: Connection, org_id: int, professional_id: int) -> Professional:
    """Remove one of the org's professionals and their hours. Their appointments stay, with the
    text name they carry and without the link."""
    gone = get_professional(conn, org_id, professional_id)
    conn.execute(update(appointments).where(appointments.c.org_id == org_id,
                                            appointments.c.professional_id == professional_id)
                 .values(professional_id=None))
    _write_hours(conn, org_id, professional_id, ())
    conn.execute(delete(professionals).where(professionals.c.org_id == org_id, professionals.c.id == professional_id))
    return gone


def _hours_of(conn: Connection, org_id: int, ids: list[int]) -> dict[int, tuple[Interval, ...]]:
    found: dict[int, list[Interval]] = {i: [] for i in ids}
    if ids:
        rows = conn.execute(select(professional_hours).where(
            professional_hours.c.org_id == org_id, professional_hours.c.professional_id.in_(ids)))
        for row in rows:
            found[row.professional_id].append(Interval(row.weekday, row.starts, row.ends))
    return {i: tuple(sorted(v, key=lambda x: (x.weekday, minutes_of(x.starts)))) for i, v in found.items()}


def _read(conn: Connection, org_id: int, rows: list[Any]) -> list[Professional]:
    hours = _hours_of(conn, org_id, [r.id for r in rows])
    return [Professional(id=r.id, org_id=r.org_id, name=r.name, slot_minutes=r.slot_minutes, active=bool(r.active),
                         hours=hours[r.id]) for r in rows]


def get_professional(conn: Connection, org_id: int, professional_id: int) -> Professional:
    """One of the org's professionals; ProfessionalNotFound for any other id."""
    row = conn.execute(select(professionals).where(professionals.c.org_id == org_id,
                                                   professionals.c.id == professional_id)).first()
    if row is None:
        raise ProfessionalNotFound()
    return _read(conn, org_id, [row])[0]


def find_by_name(conn: Connection, org_id: int, name: str) -> Professional:
    """The org's professional called `name` (case and surrounding spaces ignored)."""
    wanted = name.strip().casefold()
    for professional in list_professionals(conn, org_id):
        if professional.name.casefold() == wanted:
            return professional
    raise ProfessionalNotFound("professional")


def list_professionals(conn: Connection, org_id: int, *, active_only: bool = False) -> list[Professional]:
    """The org's professionals by name."""
    query = select(professionals).where(professionals.c.org_id == org_id)
    if active_only:
        query = query.where(professionals.c.active.is_(True))
    return _read(conn, org_id, list(conn.execute(query.order_by(professionals.c.name, professionals.c.id))))


def link_appointments(conn: Connection, org_id: int) -> int:
    """Give the org's appointments that only name a professional (the text of an import or of the
    API) the id of the professional of that name; returns how many were linked."""
    linked = 0
    for professional in list_professionals(conn, org_id):
        linked += conn.execute(update(appointments).where(
            appointments.c.org_id == org_id, appointments.c.professional_id.is_(None),
            func.lower(func.trim(appointments.c.professional)) == professional.name.lower(),
        ).values(professional_id=professional.id)).rowcount or 0
    return linked
