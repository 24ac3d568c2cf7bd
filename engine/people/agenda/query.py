"""What a search for free times asks (`SlotQuery`) and what it answers (`Slot`), and the rules both
sources of free times share: the days searched, the period boundaries, lead time and horizon, and
how N slots are spread over the candidates."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Iterable, Sequence
from zoneinfo import ZoneInfo

from engine.people.agenda.errors import AgendaError
from engine.people.agenda.professionals import check_time, minutes_of
from engine.words.understanding.when import PERIODS

DEFAULT_LIMIT = 3
MAX_LIMIT = 20
#: No slot starts sooner than this after now: the clinic needs time to prepare, the patient to come.
DEFAULT_LEAD_MINUTES = 120
#: No slot is offered further ahead than this.
DEFAULT_HORIZON_DAYS = 60


@dataclass(frozen=True)
class SlotQuery:
    """The constraints of a search for free times; every field is optional.

    `date_from`/`date_to`: the first and last local days searched (by default today and the
    horizon's last day; both the same day for one day). `period`: morning, afternoon or evening, the boundaries of
    `docs/understanding.md` (a slot belongs to the period its start falls in). `time` ('HH:MM'):
    the slots nearest to it, that one first. `exclude_weekdays`: 0 = Monday … 6 = Sunday.
    `professional_id` or `professional` (a name): only that professional's slots."""

    date_from: date | None = None
    date_to: date | None = None
    period: str | None = None
    time: str | None = None
    exclude_weekdays: tuple[int, ...] = ()
    professional_id: int | None = None
    professional: str | None = None
    limit: int = DEFAULT_LIMIT
    lead_minutes: int = DEFAULT_LEAD_MINUTES
    horizon_days: int = DEFAULT_HORIZON_DAYS
    #: Not a constraint: set by `checked()`.
    _checked: bool = field(default=False, compare=False, repr=False)

    def checked(self) -> SlotQuery:
        """This query, validated (AgendaError naming the field otherwise)."""
        if self.date_from is not None and self.date_to is not None and self.date_to < self.date_from:
            raise AgendaError("agenda_date_order", "date_to", date_from=self.date_from.isoformat(),
                              date_to=self.date_to.isoformat())
        if self.period is not None and self.period not in PERIODS:
            raise AgendaError("agenda_period", "period", choices=", ".join(PERIODS))
        if self.time is not None:
            check_time(self.time, "time")
        weekdays = tuple(sorted(set(self.exclude_weekdays)))
        if any(isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= 6 for d in weekdays):
            raise AgendaError("agenda_exclude_weekdays", "exclude_weekdays")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or not 1 <= self.limit <= MAX_LIMIT:
            raise AgendaError("agenda_limit", "limit", min=1, max=MAX_LIMIT)
        return SlotQuery(self.date_from, self.date_to, self.period, self.time, weekdays, self.professional_id,
                         self.professional, self.limit, max(0, self.lead_minutes), max(1, self.horizon_days), True)


@dataclass(frozen=True)
class Slot:
    """One free time: aware start and end in the org's timezone, and whose it is."""

    starts_at: datetime
    ends_at: datetime
    professional: str | None = None
    professional_id: int | None = None

    def as_json(self) -> dict[str, Any]:
        """ISO 8601 with the offset; the API's, the CLI's and the webhook's shape."""
        return {"starts_at": self.starts_at.isoformat(), "ends_at": self.ends_at.isoformat(),
                "professional": self.professional, "professional_id": self.professional_id}


@dataclass(frozen=True)
class Bounds:
    """A checked query made concrete for one org at one moment: the local days to search and the
    earliest and latest instants a slot may start at."""

    zone: ZoneInfo
    first_day: date
    last_day: date
    earliest: datetime
    latest: datetime

    def days(self, exclude: Sequence[int]) -> Iterable[date]:
        """The local days searched, in order, without the excluded weekdays."""
        day = self.first_day
        while day <= self.last_day:
            if day.weekday() not in exclude:
                yield day
            day += timedelta(days=1)


def bounds(query: SlotQuery, zone: ZoneInfo, now: datetime) -> Bounds | None:
    """The days and instants `query` allows at `now` (aware), or None when they are empty (the
    range is all past or all beyond the horizon)."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    earliest = now + timedelta(minutes=query.lead_minutes)
    latest = now + timedelta(days=query.horizon_days)
    today = now.astimezone(zone).date()
    first = max(query.date_from or today, earliest.astimezone(zone).date())
    last = min(query.date_to or latest.astimezone(zone).date(), latest.astimezone(zone).date())
    if last < first:
        return None
    return Bounds(zone, first, last, earliest, latest)


def fits(slot: Slot, query: SlotQuery, limits: Bounds) -> bool:
    """Whether a slot meets every constraint of the query (the webhook's answers are held to this)."""
    start = slot.starts_at.astimezone(limits.zone)
    if not limits.earliest <= slot.starts_at <= limits.latest:
        return False
    if not limits.first_day <= start.date() <= limits.last_day or start.weekday() in query.exclude_weekdays:
        return False
    if query.period is not None:
        low, high = (minutes_of(t) for t in PERIODS[query.period])
        if not low <= start.hour * 60 + start.minute < high:
            return False
    return True


def spread(candidates: Iterable[Slot], query: SlotQuery, zone: ZoneInfo) -> list[Slot]:
    """Up to `query.limit` of the candidates, spread over the days rather than packed into one
    morning, returned in time order.

    The rule: the candidates are grouped by local day. Round one takes one slot from each day,
    earliest days first: the day's earliest slot, or with `time` the one nearest to it. While more
    are wanted, each further round takes one more slot from each day: with `time` the next nearest,
    without it the slot farthest from the ones already taken that day (a morning and an afternoon
    rather than 09:00 and 09:30). Two professionals free at the same instant count as one time
    (the first by name is offered)."""
    days: dict[date, list[Slot]] = {}
    seen: set[datetime] = set()
    for slot in sorted(candidates, key=lambda s: (s.starts_at, s.professional or "")):
        if slot.starts_at in seen:
            continue
        seen.add(slot.starts_at)
        days.setdefault(slot.starts_at.astimezone(zone).date(), []).append(slot)
    target = minutes_of(query.time) if query.time else None

    def distance(slot: Slot) -> int:
        local = slot.starts_at.astimezone(zone)
        return abs(local.hour * 60 + local.minute - target) if target is not None else 0

    taken: dict[date, list[Slot]] = {d: [] for d in days}
    chosen: list[Slot] = []
    while len(chosen) < query.limit:
        progress = False
        for day in sorted(days):
            left = [s for s in days[day] if s not in taken[day]]
            if not left:
                continue
            if target is not None:
                pick = min(left, key=lambda s: (distance(s), s.starts_at))
            elif not taken[day]:
                pick = left[0]
            else:
                pick = max(left, key=lambda s: (min(abs((s.starts_at - t.starts_at).total_seconds())
                                                    for t in taken[day]), -s.starts_at.timestamp()))
            taken[day].append(pick)
            chosen.append(pick)
            progress = True
            if len(chosen) == query.limit:
                break
        if not progress:
            break
    return sorted(chosen, key=lambda s: s.starts_at)
