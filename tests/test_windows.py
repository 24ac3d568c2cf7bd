"""Tests for engine.reminders.windows (send windows, holidays, DST, placement)."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo

import holidays
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.reminders.windows import (
    Placement,
    WindowPolicy,
    earliest_allowed_after,
    is_allowed,
    is_allowed_day,
    latest_allowed_before,
    nominal_due,
    place,
)

UTC = timezone.utc
SP = ZoneInfo("America/Sao_Paulo")
NY = ZoneInfo("America/New_York")


def sp(*args: int) -> datetime:
    return datetime(*args, tzinfo=SP)


def ny(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=NY, fold=fold)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def is_utc(value: datetime | None) -> bool:
    return value is not None and value.tzinfo is UTC


DEFAULT = WindowPolicy()
CREATED_LONG_AGO = utc(2026, 1, 5, 12)


# ---------------------------------------------------------------------------
# Policy validation
# ---------------------------------------------------------------------------


def test_default_policy():
    p = WindowPolicy()
    assert p.timezone == "America/Sao_Paulo"
    assert (p.allowed_start, p.allowed_end) == (time(8), time(20))
    assert p.skip_sundays and p.skip_holidays
    assert p.state is None and p.country == "BR"
    assert p.tz == SP


def test_unknown_timezone():
    with pytest.raises(ValueError, match="^unknown timezone: Mars/Olympus_Mons$"):
        WindowPolicy(timezone="Mars/Olympus_Mons")
    for bad in ("", "../etc/passwd", "america/sao_paulo"):
        with pytest.raises(ValueError, match="unknown timezone"):
            WindowPolicy(timezone=bad)


def test_unknown_state():
    with pytest.raises(ValueError, match="^unknown state: XX$"):
        WindowPolicy(state="XX")
    assert WindowPolicy(state="SP").state == "SP"


def test_unknown_country():
    with pytest.raises(ValueError, match="^unknown country: XX$"):
        WindowPolicy(country="XX")


def test_end_must_be_after_start():
    with pytest.raises(ValueError):
        WindowPolicy(allowed_start=time(20), allowed_end=time(8))
    with pytest.raises(ValueError):
        WindowPolicy(allowed_start=time(9), allowed_end=time(9))


def test_policy_is_frozen_and_hashable():
    p = WindowPolicy(state="SP")
    with pytest.raises(AttributeError):
        p.state = "RJ"  # type: ignore[misc]
    assert hash(p) == hash(WindowPolicy(state="SP"))


# ---------------------------------------------------------------------------
# Naive input
# ---------------------------------------------------------------------------


NAIVE = datetime(2026, 3, 10, 10, 0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: is_allowed(DEFAULT, NAIVE),
        lambda: nominal_due(NAIVE, 60, "America/Sao_Paulo"),
        lambda: latest_allowed_before(DEFAULT, NAIVE, utc(2026, 3, 1)),
        lambda: latest_allowed_before(DEFAULT, utc(2026, 3, 10), NAIVE),
        lambda: earliest_allowed_after(DEFAULT, NAIVE, utc(2026, 3, 20)),
        lambda: earliest_allowed_after(DEFAULT, utc(2026, 3, 1), NAIVE),
        lambda: place(DEFAULT, NAIVE, CREATED_LONG_AGO, None),
        lambda: place(DEFAULT, utc(2026, 3, 10, 13), NAIVE, None),
        lambda: place(DEFAULT, utc(2026, 3, 10, 13), CREATED_LONG_AGO, NAIVE),
    ],
)
def test_naive_datetime_rejected(call):
    with pytest.raises(ValueError, match="timezone-aware"):
        call()


def test_is_allowed_day_rejects_datetime():
    with pytest.raises(TypeError):
        is_allowed_day(DEFAULT, utc(2026, 3, 10))


def test_nominal_due_unknown_timezone():
    with pytest.raises(ValueError, match="^unknown timezone: Nowhere/Land$"):
        nominal_due(utc(2026, 3, 10), 60, "Nowhere/Land")


# ---------------------------------------------------------------------------
# Allowed hours, in local time
# ---------------------------------------------------------------------------


def test_normal_weekday_is_allowed_and_kept():
    nominal = sp(2026, 3, 10, 10, 0)  # Tuesday
    assert is_allowed(DEFAULT, nominal)
    result = place(DEFAULT, nominal, CREATED_LONG_AGO, sp(2026, 3, 11, 10, 0))
    assert result == Placement(utc(2026, 3, 10, 13, 0), None, False)
    assert is_utc(result.due_at)


def test_window_edges_inclusive():
    assert is_allowed(DEFAULT, sp(2026, 3, 10, 8, 0))
    assert is_allowed(DEFAULT, sp(2026, 3, 10, 20, 0))
    assert not is_allowed(DEFAULT, sp(2026, 3, 10, 7, 59, 59, 999999))
    assert not is_allowed(DEFAULT, sp(2026, 3, 10, 20, 0, 0, 1))


def test_utc_vs_local_2340_trap():
    # 02:40 UTC on Tuesday is 23:40 on Monday in São Paulo: not allowed,
    # even though 02:40 "looks" like it is on an allowed day in UTC.
    nominal = utc(2026, 3, 10, 2, 40)
    assert nominal.astimezone(SP) == sp(2026, 3, 9, 23, 40)
    assert not is_allowed(DEFAULT, nominal)
    result = place(DEFAULT, nominal, utc(2026, 3, 9, 12), None)
    # moved back to Monday 20:00 local = 23:00 UTC
    assert result == Placement(utc(2026, 3, 9, 23, 0), None, True)


def test_input_zone_does_not_matter():
    instant = sp(2026, 3, 10, 19, 30)
    for zone in (UTC, NY, ZoneInfo("Asia/Tokyo"), timezone(timedelta(hours=5, minutes=30))):
        assert is_allowed(DEFAULT, instant.astimezone(zone))
    assert place(DEFAULT, instant.astimezone(NY), CREATED_LONG_AGO, None).due_at == instant


def test_sunday_moves_back_to_saturday_2000():
    nominal = sp(2026, 3, 8, 9, 0)  # Sunday
    assert nominal.weekday() == 6
    result = place(DEFAULT, nominal, CREATED_LONG_AGO, sp(2026, 3, 9, 9, 0))
    assert result == Placement(sp(2026, 3, 7, 20, 0).astimezone(UTC), None, True)
    assert is_utc(result.due_at)


def test_before_opening_moves_back_to_previous_evening():
    nominal = sp(2026, 3, 10, 7, 0)  # Tuesday 07:00
    result = place(DEFAULT, nominal, CREATED_LONG_AGO, sp(2026, 3, 10, 9, 0))
    assert result.due_at == sp(2026, 3, 9, 20, 0)


def test_created_too_late_for_move_back_goes_next_morning():
    created = sp(2026, 3, 8, 10, 0)  # Sunday 10:00
    appointment = sp(2026, 3, 9, 9, 0)  # Monday 09:00
    # 2 h reminder: Monday 07:00 -> Saturday 20:00 is before creation -> Monday 08:00
    nominal = nominal_due(appointment, 120, DEFAULT.tz)
    assert nominal == sp(2026, 3, 9, 7, 0)
    result = place(DEFAULT, nominal, created, appointment)
    assert result == Placement(sp(2026, 3, 9, 8, 0).astimezone(UTC), None, True)
    # 21 h reminder: Sunday 12:00 -> Monday 08:00
    nominal = nominal_due(appointment, 21 * 60, DEFAULT.tz)
    assert nominal == sp(2026, 3, 8, 12, 0)
    assert place(DEFAULT, nominal, created, appointment).due_at == sp(2026, 3, 9, 8, 0)


def test_move_back_allowed_instant_must_not_precede_creation():
    # created Saturday 19:00, nominal Sunday 09:00 -> Saturday 20:00 (>= created)
    result = place(DEFAULT, sp(2026, 3, 8, 9), sp(2026, 3, 7, 19), sp(2026, 3, 9, 9))
    assert result.due_at == sp(2026, 3, 7, 20)
    # created Saturday 20:00:01 -> Saturday 20:00 is too early -> Monday 08:00
    result = place(DEFAULT, sp(2026, 3, 8, 9), sp(2026, 3, 7, 20, 0, 1), sp(2026, 3, 9, 9))
    assert result.due_at == sp(2026, 3, 9, 8)


def test_no_allowed_instant_is_skipped():
    created = sp(2026, 3, 8, 10, 0)  # Sunday
    appointment = sp(2026, 3, 9, 7, 30)  # Monday, before opening
    result = place(DEFAULT, sp(2026, 3, 8, 12, 0), created, appointment)
    assert result == Placement(None, "no_allowed_instant", False)


def test_deadline_none_searches_forward_without_bound():
    result = place(DEFAULT, sp(2026, 3, 8, 12), sp(2026, 3, 8, 10), None)
    assert result.due_at == sp(2026, 3, 9, 8)


def test_late_tolerance():
    created = sp(2026, 3, 10, 10, 0)
    deadline = sp(2026, 3, 10, 12, 0)
    # more than 10 min in the past when created -> too late
    assert place(DEFAULT, created - timedelta(minutes=11), created, deadline) == Placement(
        None, "too_late", False
    )
    # exactly at the tolerance edge -> treated as created_at
    edge = place(DEFAULT, created - timedelta(minutes=10), created, deadline)
    assert edge == Placement(created.astimezone(UTC), None, True)
    # within tolerance -> treated as created_at
    assert place(DEFAULT, created - timedelta(minutes=3), created, deadline).due_at == created
    # custom tolerance
    assert (
        place(DEFAULT, created - timedelta(minutes=3), created, deadline, timedelta(0)).skip_reason
        == "too_late"
    )
    # slightly late and created_at outside the window -> moved like any other
    created_night = sp(2026, 3, 10, 21, 0)
    result = place(DEFAULT, created_night - timedelta(minutes=5), created_night, sp(2026, 3, 11, 15))
    assert result.due_at == sp(2026, 3, 11, 8)


def test_deadline_too_late():
    created = sp(2026, 3, 10, 10, 0)
    deadline = sp(2026, 3, 10, 12, 0)
    assert place(DEFAULT, deadline, created, deadline).skip_reason == "too_late"
    assert place(DEFAULT, deadline + timedelta(hours=1), created, deadline).skip_reason == "too_late"
    # slightly late nominal bumped to created_at, which is already at the deadline
    assert place(DEFAULT, deadline - timedelta(minutes=5), deadline, deadline).skip_reason == "too_late"


def test_negative_late_tolerance_rejected():
    with pytest.raises(ValueError):
        place(DEFAULT, sp(2026, 3, 10, 10), CREATED_LONG_AGO, None, timedelta(minutes=-1))


# ---------------------------------------------------------------------------
# Sundays and holidays
# ---------------------------------------------------------------------------


def test_skip_sundays_false():
    policy = WindowPolicy(skip_sundays=False)
    nominal = sp(2026, 3, 8, 9, 0)  # Sunday
    assert is_allowed_day(policy, date(2026, 3, 8))
    assert not is_allowed_day(DEFAULT, date(2026, 3, 8))
    assert place(policy, nominal, CREATED_LONG_AGO, None) == Placement(
        nominal.astimezone(UTC), None, False
    )


def test_national_holidays_from_package():
    national = holidays.country_holidays("BR", years=2026)
    # Finados
    assert date(2026, 11, 2) in national
    assert not is_allowed_day(DEFAULT, date(2026, 11, 2))
    assert not is_allowed(DEFAULT, sp(2026, 11, 2, 10))
    # Consciência Negra: the package lists it as national from 2024 on
    assert date(2026, 11, 20) in national
    assert not is_allowed_day(DEFAULT, date(2026, 11, 20))
    assert date(2023, 11, 20) not in holidays.country_holidays("BR", years=2023)
    assert is_allowed_day(DEFAULT, date(2023, 11, 20))  # a Monday, national-only policy
    # an ordinary Thursday
    assert is_allowed_day(DEFAULT, date(2026, 11, 19))


def test_holiday_moves_back():
    # Monday 2026-11-02 (Finados) 10:00 -> Saturday 2026-10-31 20:00 (Sunday skipped)
    result = place(DEFAULT, sp(2026, 11, 2, 10), CREATED_LONG_AGO, sp(2026, 11, 3, 10))
    assert result.due_at == sp(2026, 10, 31, 20)
    # created on Sunday: Saturday unavailable, Monday holiday -> Tuesday 08:00
    result = place(DEFAULT, sp(2026, 11, 2, 10), sp(2026, 11, 1, 10), sp(2026, 11, 3, 10))
    assert result.due_at == sp(2026, 11, 3, 8)
    # ... but Tuesday 07:30 deadline leaves nothing
    result = place(DEFAULT, sp(2026, 11, 2, 10), sp(2026, 11, 1, 10), sp(2026, 11, 3, 7, 30))
    assert result == Placement(None, "no_allowed_instant", False)
    # unless holidays are not skipped
    policy = WindowPolicy(skip_holidays=False)
    result = place(policy, sp(2026, 11, 2, 10), sp(2026, 11, 1, 10), sp(2026, 11, 3, 7, 30))
    assert result == Placement(sp(2026, 11, 2, 10).astimezone(UTC), None, False)


def test_state_holiday_sp_only():
    day = date(2026, 7, 9)  # Revolução Constitucionalista (SP), a Thursday
    assert day in holidays.country_holidays("BR", subdiv="SP", years=2026)
    assert day not in holidays.country_holidays("BR", subdiv="RJ", years=2026)
    assert day not in holidays.country_holidays("BR", years=2026)
    sp_policy = WindowPolicy(state="SP")
    rj_policy = WindowPolicy(state="RJ")
    assert not is_allowed_day(sp_policy, day)
    assert is_allowed_day(rj_policy, day)
    assert is_allowed_day(DEFAULT, day)
    nominal = sp(2026, 7, 9, 10)
    assert place(sp_policy, nominal, CREATED_LONG_AGO, None).due_at == sp(2026, 7, 8, 20)
    assert place(rj_policy, nominal, CREATED_LONG_AGO, None).due_at == nominal
    # and national holidays still apply with a state set
    assert not is_allowed_day(sp_policy, date(2026, 11, 2))


def test_holiday_cache_is_used():
    from engine.reminders.windows import _holiday_dates

    is_allowed_day(WindowPolicy(state="MG"), date(2027, 1, 4))
    before = _holiday_dates.cache_info()
    for _ in range(50):
        is_allowed_day(WindowPolicy(state="MG"), date(2027, 1, 4))
    after = _holiday_dates.cache_info()
    assert after.misses == before.misses
    assert after.hits >= before.hits + 50


# ---------------------------------------------------------------------------
# Search helpers
# ---------------------------------------------------------------------------


def test_search_bounds():
    inside = sp(2026, 3, 10, 10)
    assert latest_allowed_before(DEFAULT, inside, inside) == inside
    assert is_utc(latest_allowed_before(DEFAULT, inside, inside))
    assert latest_allowed_before(DEFAULT, inside, inside + timedelta(seconds=1)) is None
    assert earliest_allowed_after(DEFAULT, inside, inside + timedelta(microseconds=1)) == inside
    assert earliest_allowed_after(DEFAULT, inside, inside) is None  # `before` is strict
    night = sp(2026, 3, 10, 22)
    assert latest_allowed_before(DEFAULT, night, sp(2026, 3, 10, 20)) == sp(2026, 3, 10, 20)
    assert latest_allowed_before(DEFAULT, night, sp(2026, 3, 10, 20, 0, 1)) is None
    assert earliest_allowed_after(DEFAULT, night, sp(2026, 3, 11, 8)) is None
    assert earliest_allowed_after(DEFAULT, night, sp(2026, 3, 11, 8, 0, 1)) == sp(2026, 3, 11, 8)


def test_search_handles_long_ranges():
    far = sp(2031, 12, 10, 22)  # a Wednesday, not a holiday
    assert is_allowed_day(DEFAULT, far.date())
    assert latest_allowed_before(DEFAULT, far, sp(2020, 1, 1)) == sp(2031, 12, 10, 20)
    assert earliest_allowed_after(DEFAULT, sp(2026, 3, 10, 22), far) == sp(2026, 3, 11, 8)
    # nothing allowed between Saturday 21:00 and Sunday 09:00
    assert latest_allowed_before(DEFAULT, sp(2026, 3, 8, 9), sp(2026, 3, 7, 21)) is None


# ---------------------------------------------------------------------------
# DST
# ---------------------------------------------------------------------------


NY_POLICY = WindowPolicy(timezone="America/New_York", skip_sundays=False, skip_holidays=False)


def test_new_york_spring_forward_window():
    # 2026-03-08: 02:00 EST -> 03:00 EDT. Window 08:00-20:00 EDT = 12:00Z-00:00Z.
    assert not is_allowed(NY_POLICY, ny(2026, 3, 8, 7, 59))
    assert is_allowed(NY_POLICY, utc(2026, 3, 8, 12, 0))
    assert not is_allowed(NY_POLICY, utc(2026, 3, 8, 11, 59))  # 07:59 EDT (08:59 "in EST")
    assert is_allowed(NY_POLICY, utc(2026, 3, 9, 0, 0))
    assert earliest_allowed_after(NY_POLICY, ny(2026, 3, 8, 3, 30), ny(2026, 3, 9)) == utc(
        2026, 3, 8, 12
    )
    # Walking local days across the change: Saturday 20:00 is EST (01:00Z).
    sundays_off = WindowPolicy(timezone="America/New_York", skip_holidays=False)
    result = place(sundays_off, ny(2026, 3, 8, 9), CREATED_LONG_AGO, None)
    assert result.due_at == utc(2026, 3, 8, 1, 0)
    # ... and Monday 08:00 is EDT (12:00Z).
    result = place(sundays_off, ny(2026, 3, 8, 9), ny(2026, 3, 8, 8), None)
    assert result.due_at == utc(2026, 3, 9, 12, 0)


def test_new_york_window_edges_in_gap():
    # window opening inside the gap (02:30 does not exist) -> opens at 03:00 EDT
    policy = WindowPolicy(
        timezone="America/New_York", allowed_start=time(2, 30), skip_sundays=False
    )
    first = earliest_allowed_after(policy, utc(2026, 3, 8, 5), utc(2026, 3, 9))
    assert first == utc(2026, 3, 8, 7, 0)
    assert first.astimezone(NY).time() == time(3, 0)
    assert is_allowed(policy, first)
    assert not is_allowed(policy, first - timedelta(microseconds=1))
    # window closing inside the gap -> the last instant before the jump
    policy = WindowPolicy(
        timezone="America/New_York",
        allowed_start=time(0, 0),
        allowed_end=time(2, 30),
        skip_sundays=False,
    )
    last = latest_allowed_before(policy, utc(2026, 3, 8, 12), utc(2026, 3, 7))
    assert last is not None and is_allowed(policy, last)
    assert last == utc(2026, 3, 8, 7) - timedelta(microseconds=1)
    assert not is_allowed(policy, utc(2026, 3, 8, 7))


def test_new_york_fall_back_fold():
    # 2026-11-01: 02:00 EDT -> 01:00 EST; 01:00-01:59 happens twice.
    policy = WindowPolicy(
        timezone="America/New_York", allowed_start=time(1, 30), skip_sundays=False
    )
    assert is_allowed(policy, utc(2026, 11, 1, 5, 45))  # 01:45 EDT (first pass)
    assert not is_allowed(policy, utc(2026, 11, 1, 6, 0))  # 01:00 EST (second pass)
    assert earliest_allowed_after(policy, utc(2026, 11, 1, 6, 0), utc(2026, 11, 2)) == utc(
        2026, 11, 1, 6, 30
    )
    assert latest_allowed_before(policy, utc(2026, 11, 1, 6, 15), utc(2026, 11, 1)) == (
        utc(2026, 11, 1, 6) - timedelta(microseconds=1)
    )
    # default window on that day: 08:00-20:00 EST = 13:00Z-01:00Z
    assert earliest_allowed_after(NY_POLICY, ny(2026, 11, 1, 3), ny(2026, 11, 2)) == utc(
        2026, 11, 1, 13
    )
    assert latest_allowed_before(NY_POLICY, ny(2026, 11, 1, 23), ny(2026, 11, 1)) == utc(
        2026, 11, 2, 1
    )


def test_nominal_due_whole_days_keep_wall_clock_new_york():
    # spring: appointment Sunday 14:00 EDT; one day before is Saturday 14:00 EST (23 h)
    appt = ny(2026, 3, 8, 14)
    due = nominal_due(appt, 24 * 60, "America/New_York")
    assert due == utc(2026, 3, 7, 19) and is_utc(due)
    assert due.astimezone(NY).time() == time(14)
    assert appt - due == timedelta(hours=23)
    # fall: appointment Sunday 14:00 EST; one day before is Saturday 14:00 EDT (25 h)
    appt = ny(2026, 11, 1, 14)
    due = nominal_due(appt, 24 * 60, NY)
    assert due == utc(2026, 10, 31, 18)
    assert appt - due == timedelta(hours=25)
    # several days, and negative (after)
    assert nominal_due(ny(2026, 3, 10, 9), 3 * 24 * 60, NY) == ny(2026, 3, 7, 9)
    assert nominal_due(ny(2026, 3, 7, 9), -2 * 24 * 60, NY) == ny(2026, 3, 9, 9)
    # ambiguous wall time -> first occurrence (EDT)
    assert nominal_due(ny(2026, 11, 2, 1, 30), 24 * 60, NY) == utc(2026, 11, 1, 5, 30)


def test_nominal_due_non_whole_days_is_absolute_duration():
    appt = ny(2026, 3, 8, 14)
    assert nominal_due(appt, 25 * 60, NY) == appt.astimezone(UTC) - timedelta(hours=25)
    assert nominal_due(appt, 25 * 60, NY) == utc(2026, 3, 7, 17)  # 12:00 EST, 25 h earlier
    assert nominal_due(appt, 90, NY) == utc(2026, 3, 8, 16, 30)
    assert nominal_due(appt, -30, NY) == utc(2026, 3, 8, 18, 30)
    assert nominal_due(appt, 0, NY) == utc(2026, 3, 8, 18)
    assert is_utc(nominal_due(appt, 90, NY))


def test_nominal_due_sao_paulo_2018_midnight_gap():
    # 2018-11-04 00:00 -03 -> 01:00 -02 (historical Brazilian DST)
    appt = sp(2018, 11, 4, 14)  # -02
    assert appt.utcoffset() == timedelta(hours=-2)
    due = nominal_due(appt, 24 * 60, "America/Sao_Paulo")
    assert due == utc(2018, 11, 3, 17)  # 14:00 -03
    assert due.astimezone(SP).time() == time(14)
    assert appt - due == timedelta(hours=23)
    # a wall time that does not exist (00:30 on 2018-11-04) is pushed past the gap
    due = nominal_due(sp(2018, 11, 5, 0, 30), 24 * 60, SP)
    assert due == utc(2018, 11, 4, 3, 30)
    assert due.astimezone(SP).replace(tzinfo=None) == datetime(2018, 11, 4, 1, 30)


def test_sao_paulo_2018_window_from_midnight():
    # a window opening at 00:00 on the gap day opens at 01:00 -02 (03:00Z)
    policy = WindowPolicy(allowed_start=time(0), skip_sundays=False)
    first = earliest_allowed_after(policy, utc(2018, 11, 3, 23, 30), utc(2018, 11, 5))
    assert first == utc(2018, 11, 4, 3, 0)
    assert is_allowed(policy, first)


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------

ZONES = [
    "America/Sao_Paulo",
    "America/Manaus",
    "America/Noronha",
    "America/New_York",
    "America/St_Johns",
    "Europe/London",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Asia/Kolkata",
]
STATES = [None, "SP", "RJ", "MG", "BA", "RS", "PE"]
EPOCH_2026 = datetime(2026, 1, 1, tzinfo=UTC)
TWO_YEARS_MIN = 2 * 365 * 24 * 60


def _transitions(zone: str) -> list[datetime]:
    """UTC hours at which ``zone`` changes offset in 2026-2027 (to the hour)."""
    tz = ZoneInfo(zone)
    out, previous = [], None
    for hour in range(0, 2 * 366 * 24, 1):
        instant = EPOCH_2026 + timedelta(hours=hour)
        offset = instant.astimezone(tz).utcoffset()
        if previous is not None and offset != previous:
            out.append(instant)
        previous = offset
    return out


# (zone, UTC instant of a DST change) pairs, so that properties often probe DST days
DST_CHANGES = [(zone, t) for zone in ZONES for t in _transitions(zone)]
assert {zone for zone, _ in DST_CHANGES} >= {"America/New_York", "Europe/London", "Pacific/Chatham"}

input_zones = st.sampled_from(
    [UTC, SP, NY, ZoneInfo("Europe/London"), timezone(timedelta(hours=-3)), timezone(timedelta(hours=9))]
)


@st.composite
def windows(draw) -> tuple[time, time]:
    kind = draw(st.sampled_from(["default", "any", "night", "night"]))
    if kind == "default":
        return time(8), time(20)
    if kind == "any":
        start_min = draw(st.integers(0, 24 * 60 - 2))
        end_min = draw(st.integers(start_min + 1, 24 * 60 - 1))
    else:  # edges near the usual DST change hours (00:00-04:00 local)
        start_min = draw(st.integers(0, 4 * 60))
        end_min = draw(
            st.one_of(st.integers(start_min + 1, 5 * 60), st.integers(start_min + 1, 24 * 60 - 1))
        )
    return time(start_min // 60, start_min % 60), time(end_min // 60, end_min % 60)


@st.composite
def cases(draw) -> tuple[WindowPolicy, datetime, tzinfo]:
    """A random policy, a whole-minute UTC instant in 2026-2027 (two thirds of
    the time within 36 h of a DST change of the policy's zone), and a zone in which
    to express inputs.  Tests do arithmetic in UTC (aware arithmetic in a
    ZoneInfo zone is wall-clock arithmetic and can produce imaginary times)."""
    if draw(st.integers(0, 2)):
        zone, change = draw(st.sampled_from(DST_CHANGES))
        instant = change + timedelta(minutes=draw(st.integers(-36 * 60, 36 * 60)))
    else:
        zone = draw(st.sampled_from(ZONES))
        instant = EPOCH_2026 + timedelta(minutes=draw(st.integers(0, TWO_YEARS_MIN)))
    start, end = draw(windows())
    policy = WindowPolicy(
        timezone=zone,
        allowed_start=start,
        allowed_end=end,
        skip_sundays=draw(st.booleans()),
        skip_holidays=draw(st.booleans()),
        state=draw(st.sampled_from(STATES)),
    )
    return policy, instant, draw(input_zones)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=cases(),
    jitter_us=st.integers(-60_000_000, 60_000_000),
    created_gap=st.one_of(
        st.timedeltas(min_value=timedelta(minutes=-30), max_value=timedelta(days=3)),
        st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=40)),
    ),
    deadline_gap=st.one_of(
        st.none(),
        st.timedeltas(min_value=timedelta(minutes=-5), max_value=timedelta(hours=6)),
        st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=3)),
    ),
    created_zone=input_zones,
)
@example(
    case=(DEFAULT, utc(2026, 3, 10, 2, 40), SP),
    jitter_us=0,
    created_gap=timedelta(hours=5),
    deadline_gap=timedelta(hours=9),
    created_zone=UTC,
)
def test_place_properties(case, jitter_us, created_gap, deadline_gap, created_zone):
    policy, nominal, zone = case
    nominal = nominal + timedelta(microseconds=jitter_us)
    created_at = nominal - created_gap
    deadline = None if deadline_gap is None else nominal + deadline_gap
    result = place(
        policy,
        nominal.astimezone(zone),
        created_at.astimezone(created_zone),
        None if deadline is None else deadline.astimezone(zone),
    )

    late = nominal < created_at - timedelta(minutes=10)
    effective = max(nominal, created_at)
    past_deadline = deadline is not None and effective >= deadline
    if late or past_deadline:
        assert result == Placement(None, "too_late", False)
        return
    if result.due_at is None:
        assert result.skip_reason == "no_allowed_instant"
        assert not result.moved
        assert latest_allowed_before(policy, effective, created_at) is None
        if deadline is not None:
            assert earliest_allowed_after(policy, effective, deadline) is None
        return
    due = result.due_at
    assert result.skip_reason is None
    assert is_utc(due)
    assert is_allowed(policy, due)
    assert due >= created_at
    if deadline is not None:
        assert due < deadline
    assert result.moved == (due != nominal)
    if nominal >= created_at and is_allowed(policy, nominal):
        assert due == nominal and not result.moved
    if not is_allowed(policy, effective) and due < effective:
        # moved back: it is the latest allowed instant before the nominal
        assert latest_allowed_before(policy, effective, due) == due


def _scan(policy, start: datetime, stop: datetime, step: timedelta) -> datetime | None:
    """Brute force, minute by minute (test oracle only)."""
    t = start
    while (t >= stop) if step < timedelta(0) else (t < stop):
        if is_allowed(policy, t):
            return t
        t += step
    return None


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), span_min=st.integers(0, 36 * 60))
def test_latest_allowed_before_matches_brute_force(case, span_min):
    policy, instant, zone = case
    not_before = instant - timedelta(minutes=span_min)
    got = latest_allowed_before(policy, instant.astimezone(zone), not_before.astimezone(zone))
    expected = _scan(policy, instant, not_before, -timedelta(minutes=1))
    if expected is None:
        assert got is None
        return
    assert got is not None and is_utc(got)
    assert is_allowed(policy, got)
    assert not_before <= got <= instant
    # exact answer may be the last microsecond before a DST jump
    assert got.replace(second=0, microsecond=0) == expected
    if got != instant:
        assert not is_allowed(policy, got + timedelta(microseconds=1))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), span_min=st.integers(0, 36 * 60))
def test_earliest_allowed_after_matches_brute_force(case, span_min):
    policy, instant, zone = case
    before = instant + timedelta(minutes=span_min)
    got = earliest_allowed_after(policy, instant.astimezone(zone), before.astimezone(zone))
    expected = _scan(policy, instant, before, timedelta(minutes=1))
    assert got == expected
    if got is not None:
        assert is_utc(got) and is_allowed(policy, got)
        assert instant <= got < before
        if got != instant:
            assert not is_allowed(policy, got - timedelta(microseconds=1))


@settings(max_examples=300, deadline=None)
@given(case=cases(), days=st.integers(-3, 7))
def test_nominal_due_whole_days_property(case, days):
    policy, appt, zone = case
    tz = policy.tz
    due = nominal_due(appt.astimezone(zone), days * 24 * 60, policy.timezone)
    assert is_utc(due)
    target = appt.astimezone(tz).replace(tzinfo=None) - timedelta(days=days)
    local_due = due.astimezone(tz).replace(tzinfo=None)
    if local_due != target:
        # only when the target wall time does not exist (DST gap): pushed forward
        roundtrip = target.replace(tzinfo=tz).astimezone(UTC).astimezone(tz)
        assert roundtrip.replace(tzinfo=None) != target
        assert target < local_due <= target + timedelta(hours=1)


DST_WINDOWS = [
    (time(0, 0), time(23, 59, 59, 999999)),
    (time(8, 0), time(20, 0)),
    (time(1, 30), time(20, 0)),
    (time(0, 0), time(2, 30)),
    (time(2, 15), time(3, 15)),
    (time(1, 0), time(1, 59)),
]


@pytest.mark.parametrize("zone,change", DST_CHANGES, ids=lambda v: str(v)[:16])
def test_every_dst_change_against_brute_force(zone, change):
    """Deterministic sweep: around every DST change of the test zones, the
    search helpers agree with a minute-by-minute scan for several windows."""
    for start, end in DST_WINDOWS:
        policy = WindowPolicy(
            timezone=zone, allowed_start=start, allowed_end=end,
            skip_sundays=False, skip_holidays=False,
        )
        for k in range(0, 13):
            instant = change - timedelta(hours=26) + timedelta(hours=4 * k, minutes=7 * k)
            span = timedelta(hours=3)
            got = earliest_allowed_after(policy, instant, instant + span)
            assert got == _scan(policy, instant, instant + span, timedelta(minutes=1))
            got = latest_allowed_before(policy, instant, instant - span)
            expected = _scan(policy, instant, instant - span, -timedelta(minutes=1))
            if expected is None:
                assert got is None
            else:
                assert got is not None and is_allowed(policy, got)
                assert got.replace(second=0, microsecond=0) == expected
