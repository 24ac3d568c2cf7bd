"""Send windows: decide *when* a reminder may be sent, in the org's timezone.

A reminder may only go out inside the org's allowed hours (default 08:00-20:00
local wall-clock time, both ends inclusive) and, when enabled, not on Sundays
and not on holidays (national + the org's state, from the ``holidays``
package).

Conventions used throughout this module:

* Every datetime going in or out is timezone-aware; naive input raises
  ``ValueError``.  Every datetime returned is in UTC (``timezone.utc``).
* "Allowed" is judged on the *local wall clock* of the policy's timezone: an
  instant is allowed when its local date is an allowed day and its local time
  of day is within ``[allowed_start, allowed_end]``.
* Searches walk the *local* calendar day by day (never "+24 h in UTC") and are
  bounded to :data:`MAX_SEARCH_DAYS` days.  For each local day the allowed
  instants are computed once, as closed UTC intervals, and cached, so the
  per-row cost is a handful of datetime conversions.
* DST is handled exactly: a window edge that falls in a DST gap maps to the
  first/last instant that really exists (e.g. a nonexistent local 20:00 yields
  the last instant before the jump), and a window edge inside a repeated
  (fold) hour only admits the instants whose wall clock really is inside the
  window.  All results are allowed instants by construction (and re-checked).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import holidays

from engine.core.errors import DomainError

__all__ = [
    "MAX_SEARCH_DAYS",
    "SKIP_NO_ALLOWED_INSTANT",
    "SKIP_TOO_LATE",
    "Placement",
    "WindowPolicy",
    "earliest_allowed_after",
    "is_allowed",
    "is_allowed_day",
    "latest_allowed_before",
    "nominal_due",
    "place",
]

UTC = timezone.utc

#: Upper bound, in local calendar days, of any day-by-day search.
MAX_SEARCH_DAYS = 400

#: Skip reason: the moment the reminder was meant for had already passed
#: (when it was created, or relative to the deadline).
SKIP_TOO_LATE = "too_late"
#: Skip reason: there is no allowed instant between creation and the deadline.
SKIP_NO_ALLOWED_INSTANT = "no_allowed_instant"

_MINUTES_PER_DAY = 24 * 60
_ONE_DAY = timedelta(days=1)
_EPSILON = timedelta(microseconds=1)  # datetime resolution


# ---------------------------------------------------------------------------
# Small cached helpers
# ---------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    """Return the ``ZoneInfo`` for an IANA name, or raise ``ValueError``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"unknown timezone: {name}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError, TypeError):
        raise ValueError(f"unknown timezone: {name}") from None


@lru_cache(maxsize=64)
def _subdivisions(country: str) -> frozenset[str]:
    """Subdivision codes the ``holidays`` package knows for ``country``."""
    try:
        return frozenset(holidays.country_holidays(country).subdivisions)
    except (NotImplementedError, KeyError, AttributeError, TypeError):
        raise ValueError(f"unknown country: {country}") from None


@lru_cache(maxsize=1024)
def _holiday_dates(country: str, subdiv: str | None, year: int) -> frozenset[date]:
    """Holiday dates (national + ``subdiv``) for one year; cached per key."""
    return frozenset(
        holidays.country_holidays(country, subdiv=subdiv, years=year).keys()
    )


def _require_aware(value: datetime, name: str) -> None:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (naive datetime given)")


def _to_utc(value: datetime, name: str) -> datetime:
    _require_aware(value, name)
    return value.astimezone(UTC)


def _resolve_tz(tz: str | ZoneInfo) -> ZoneInfo:
    if isinstance(tz, ZoneInfo):
        return tz
    return _zone(tz)


# ---------------------------------------------------------------------------
# Public types
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowPolicy:
    """When an org allows reminders to be sent.

    Attributes:
        timezone: IANA timezone name of the org (validated).
        allowed_start: first allowed local wall-clock time of day (inclusive).
        allowed_end: last allowed local wall-clock time of day (inclusive);
            must be strictly after ``allowed_start``.
        skip_sundays: when True, no sending on (local) Sundays.
        skip_holidays: when True, no sending on national holidays nor on the
            holidays of ``state``.
        state: subdivision code as known by the ``holidays`` package for
            ``country`` (for Brazil, a UF such as ``"SP"``); ``None`` means
            national holidays only.
        country: ISO country code for the ``holidays`` package.
    """

    timezone: str = "America/Sao_Paulo"
    allowed_start: time = time(8, 0)
    allowed_end: time = time(20, 0)
    skip_sundays: bool = True
    skip_holidays: bool = True
    state: str | None = None
    country: str = "BR"

    def __post_init__(self) -> None:
        _zone(self.timezone)  # raises ValueError("unknown timezone: X")
        for name in ("allowed_start", "allowed_end"):
            value = getattr(self, name)
            if not isinstance(value, time):
                raise TypeError(f"{name} must be a datetime.time")
            if value.tzinfo is not None:
                raise ValueError(f"{name} must be a naive local time of day")
        if not self.allowed_end > self.allowed_start:
            raise ValueError("allowed_end must be after allowed_start")
        subdivisions = _subdivisions(self.country)  # ValueError for unknown country
        if self.state is not None and self.state not in subdivisions:
            raise ValueError(f"unknown state: {self.state}")

    @property
    def tz(self) -> ZoneInfo:
        """The policy's timezone as a ``ZoneInfo``."""
        return _zone(self.timezone)


@dataclass(frozen=True)
class Placement:
    """Result of :func:`place`.

    Attributes:
        due_at: when to send (aware, UTC), or ``None`` when skipped.
        skip_reason: ``None`` when placed, else a short code without PII
            (:data:`SKIP_TOO_LATE` or :data:`SKIP_NO_ALLOWED_INSTANT`).
        moved: True when ``due_at`` differs from the nominal instant.
    """

    due_at: datetime | None
    skip_reason: str | None
    moved: bool


# ---------------------------------------------------------------------------
# Allowed days / instants
# ---------------------------------------------------------------------------


def is_allowed_day(policy: WindowPolicy, local_date: date) -> bool:
    """Whether sending is allowed at all on ``local_date`` (a local calendar date).

    False on Sundays when ``policy.skip_sundays`` and on holidays (national +
    ``policy.state``) when ``policy.skip_holidays``.  A ``datetime`` is
    rejected with ``TypeError`` because its date is ambiguous across zones.
    """
    if isinstance(local_date, datetime) or not isinstance(local_date, date):
        raise TypeError("local_date must be a datetime.date (not a datetime)")
    if policy.skip_sundays and local_date.weekday() == 6:
        return False
    if policy.skip_holidays and local_date in _holiday_dates(
        policy.country, policy.state, local_date.year
    ):
        return False
    return True


def _wall_allowed(policy: WindowPolicy, local: datetime) -> bool:
    return policy.allowed_start <= local.time() <= policy.allowed_end and (
        is_allowed_day(policy, local.date())
    )


def is_allowed(policy: WindowPolicy, instant: datetime) -> bool:
    """Whether a message may be sent at ``instant`` (aware; any zone).

    The instant is converted to the policy's timezone; it is allowed when that
    local date is an allowed day and the local time of day is within
    ``[allowed_start, allowed_end]`` (both inclusive).
    """
    _require_aware(instant, "instant")
    return _wall_allowed(policy, instant.astimezone(policy.tz))


def _offset_at(ts: int, tz: ZoneInfo) -> timedelta:
    return datetime.fromtimestamp(ts, tz).utcoffset()  # type: ignore[return-value]


def _transition_between(lo: datetime, hi: datetime, tz: ZoneInfo) -> datetime:
    """First instant in (lo, hi] with hi's UTC offset (assumes one transition)."""
    o_lo = lo.astimezone(tz).utcoffset()
    left = int(lo.timestamp() // 1)  # offset(left) == o_lo
    right = -int(-hi.timestamp() // 1)  # ceil; offset(right) == offset(hi)
    while right - left > 1:
        mid = (left + right) // 2
        if _offset_at(mid, tz) == o_lo:
            left = mid
        else:
            right = mid
    return datetime.fromtimestamp(right, UTC)


@lru_cache(maxsize=65536)
def _day_intervals(
    tzname: str, start: time, end: time, day: date
) -> tuple[tuple[datetime, datetime], ...]:
    """Closed UTC intervals of instants whose local wall clock is within
    ``[start, end]`` on local date ``day`` (ignores day-level rules).

    Usually one interval.  On a DST-transition day the window may be clipped
    (edge in a gap) or split in two (edge inside a repeated hour).
    """
    tz = _zone(tzname)
    wall_start = datetime.combine(day, start)
    wall_end = datetime.combine(day, end)
    lo = min(wall_start.replace(tzinfo=tz, fold=f).astimezone(UTC) for f in (0, 1))
    hi = max(wall_end.replace(tzinfo=tz, fold=f).astimezone(UTC) for f in (0, 1))
    o_lo = lo.astimezone(tz).utcoffset()
    o_hi = hi.astimezone(tz).utcoffset()
    assert o_lo is not None and o_hi is not None

    if o_lo == o_hi:
        pieces = [(lo, hi)]
    else:
        # One transition T in (lo, hi]: offset o_lo before it, o_hi from it on.
        # Each side maps wall clock linearly; clip the window on both sides.
        t = _transition_between(lo, hi, tz)
        pieces = [
            (
                max(lo, (wall_start - o_lo).replace(tzinfo=UTC)),
                min(t - _EPSILON, (wall_end - o_lo).replace(tzinfo=UTC)),
            ),
            (
                max(t, (wall_start - o_hi).replace(tzinfo=UTC)),
                min(hi, (wall_end - o_hi).replace(tzinfo=UTC)),
            ),
        ]

    def inside(instant: datetime) -> bool:
        local = instant.astimezone(tz)
        return local.date() == day and start <= local.time() <= end

    out: list[tuple[datetime, datetime]] = []
    for a, b in pieces:
        if a > b or not (inside(a) and inside(b)):
            continue  # empty piece (or a pathological zone): drop it
        if out and out[-1][1] + _EPSILON >= a:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def _allowed_intervals(
    policy: WindowPolicy, day: date
) -> tuple[tuple[datetime, datetime], ...]:
    if not is_allowed_day(policy, day):
        return ()
    return _day_intervals(policy.timezone, policy.allowed_start, policy.allowed_end, day)


# ---------------------------------------------------------------------------
# Searches
# ---------------------------------------------------------------------------


def latest_allowed_before(
    policy: WindowPolicy, instant: datetime, not_before: datetime
) -> datetime | None:
    """The latest allowed instant ``t`` with ``not_before <= t <= instant``.

    Returns it in UTC, or ``None`` when there is none.  Walks the local
    calendar backwards from ``instant``'s local date, at most
    :data:`MAX_SEARCH_DAYS` days.
    """
    return _latest(policy, _to_utc(instant, "instant"), _to_utc(not_before, "not_before"))


def _latest(policy: WindowPolicy, hi: datetime, lo: datetime) -> datetime | None:
    """Latest allowed UTC instant ``t`` with ``lo <= t <= hi`` (both UTC-aware)."""
    if lo > hi:
        return None
    tz = policy.tz
    first_day = hi.astimezone(tz).date()
    # One extra day on each side guards against folds that cross midnight.
    last_day = max(lo.astimezone(tz).date(), first_day - timedelta(days=MAX_SEARCH_DAYS))
    day = first_day + _ONE_DAY
    stop = last_day - _ONE_DAY
    while day >= stop:
        for a, b in reversed(_allowed_intervals(policy, day)):
            if a <= hi and b >= lo:
                return min(b, hi)
        day -= _ONE_DAY
    return None


def _earliest(
    policy: WindowPolicy, lo: datetime, hi: datetime | None
) -> datetime | None:
    """Earliest allowed UTC instant ``t`` with ``lo <= t`` and ``t < hi``
    (no upper bound when ``hi`` is None).  Both arguments are UTC-aware."""
    if hi is not None and hi <= lo:
        return None
    tz = policy.tz
    first_day = lo.astimezone(tz).date()
    last_day = first_day + timedelta(days=MAX_SEARCH_DAYS)
    if hi is not None:
        last_day = min(last_day, hi.astimezone(tz).date())
    day = first_day - _ONE_DAY
    stop = last_day + _ONE_DAY
    while day <= stop:
        for a, b in _allowed_intervals(policy, day):
            if b >= lo:
                candidate = max(a, lo)
                if hi is None or candidate < hi:
                    return candidate
                return None  # every later interval starts even later
        day += _ONE_DAY
    return None


def earliest_allowed_after(
    policy: WindowPolicy, instant: datetime, before: datetime
) -> datetime | None:
    """The earliest allowed instant ``t`` with ``instant <= t < before``.

    Returns it in UTC, or ``None`` when there is none.  Walks the local
    calendar forwards from ``instant``'s local date, at most
    :data:`MAX_SEARCH_DAYS` days.
    """
    return _earliest(policy, _to_utc(instant, "instant"), _to_utc(before, "before"))


# ---------------------------------------------------------------------------
# Nominal due time and placement
# ---------------------------------------------------------------------------


def nominal_due(starts_at: datetime, offset_minutes: int, tz: str | ZoneInfo) -> datetime:
    """When a reminder would ideally go out, before window rules.

    ``offset_minutes > 0`` means *before* ``starts_at``; ``< 0`` means after.
    When ``abs(offset_minutes)`` is a whole number of days, whole calendar
    days are subtracted on the local wall clock of ``tz`` (a 24 h reminder for
    a 14:00 appointment goes at 14:00 the day before, even across a DST
    change).  If that local wall time does not exist (DST gap) it is moved
    forward by the length of the gap; if it is ambiguous (DST fold) the
    earlier occurrence is used.  Other offsets subtract an absolute duration.

    Returns an aware UTC datetime.
    """
    _require_aware(starts_at, "starts_at")
    if isinstance(offset_minutes, bool) or not isinstance(offset_minutes, int):
        raise TypeError("offset_minutes must be an int")
    zone = _resolve_tz(tz)
    if offset_minutes % _MINUTES_PER_DAY == 0:
        days = offset_minutes // _MINUTES_PER_DAY
        wall = starts_at.astimezone(zone).replace(tzinfo=None) - timedelta(days=days)
        # fold=0: gap -> pre-transition offset (i.e. shifted forward past the
        # gap); fold -> first occurrence.
        return wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    return starts_at.astimezone(UTC) - timedelta(minutes=offset_minutes)


def place(
    policy: WindowPolicy,
    nominal: datetime,
    created_at: datetime,
    deadline: datetime | None,
    late_tolerance: timedelta = timedelta(minutes=10),
) -> Placement:
    """Decide when a reminder is actually sent.

    Rules, in order:

    1. ``nominal < created_at - late_tolerance`` -> skipped ``"too_late"``.
       A nominal in ``[created_at - late_tolerance, created_at)`` is treated
       as ``created_at``.
    2. ``deadline`` set and (effective) nominal ``>= deadline`` -> skipped
       ``"too_late"``.
    3. Nominal allowed -> sent at nominal.
    4. Otherwise the latest allowed instant before nominal that is still
       ``>= created_at``; failing that, the earliest allowed instant after
       nominal that is strictly before ``deadline`` (unbounded when
       ``deadline`` is None, searching at most :data:`MAX_SEARCH_DAYS` days);
       failing that, skipped ``"no_allowed_instant"``.

    ``moved`` is True whenever ``due_at`` differs from ``nominal`` (including
    when a slightly late nominal is bumped to ``created_at``).
    """
    nominal_utc = _to_utc(nominal, "nominal")
    created_utc = _to_utc(created_at, "created_at")
    deadline_utc = None if deadline is None else _to_utc(deadline, "deadline")
    if late_tolerance < timedelta(0):
        raise ValueError("late_tolerance must not be negative")

    if nominal_utc < created_utc - late_tolerance:
        return Placement(None, SKIP_TOO_LATE, False)
    effective = max(nominal_utc, created_utc)
    if deadline_utc is not None and effective >= deadline_utc:
        return Placement(None, SKIP_TOO_LATE, False)

    if _wall_allowed(policy, effective.astimezone(policy.tz)):
        due = effective
    else:
        due = _latest(policy, effective, created_utc)
        if due is None:
            due = _earliest(policy, effective, deadline_utc)
        if due is None:
            return Placement(None, SKIP_NO_ALLOWED_INSTANT, False)
    return Placement(due, None, due != nominal_utc)


def parse_hhmm(value: str) -> time:
    """'08:00' → time(8, 0)."""
    try:
        hours, minutes = value.strip().split(":")
        return time(int(hours), int(minutes))
    except (ValueError, AttributeError):
        raise DomainError(f"not a time of day: {value!r} (use HH:MM)") from None


# Cached: a send checks its org's window for every message, and an install has few distinct ones.
@lru_cache(maxsize=256)
def window_policy(*, timezone: str, quiet_start: str, quiet_end: str, skip_sundays: bool, skip_holidays: bool,
                  state: str | None) -> WindowPolicy:
    """The sending window these org settings describe; DomainError when they do not make one."""
    try:
        return WindowPolicy(timezone=timezone, allowed_start=parse_hhmm(quiet_start),
                            allowed_end=parse_hhmm(quiet_end), skip_sundays=bool(skip_sundays),
                            skip_holidays=bool(skip_holidays), state=state or None)
    except ValueError as exc:
        raise DomainError(str(exc)) from None


def policy_for(org: Any) -> WindowPolicy:
    """The sending window an org's settings describe (timezone, hours, Sundays, holidays)."""
    return window_policy(timezone=org.timezone, quiet_start=org.quiet_start, quiet_end=org.quiet_end,
                         skip_sundays=org.skip_sundays, skip_holidays=org.skip_holidays, state=org.state)
