"""A field's value: checked by the field's type (`coerce`) and read out of a patient's reply
(`harvest`). Nothing a patient writes becomes a value without passing `coerce`: a date is in the
future and within the booking horizon, a choice is one of the options, a phone is a real number.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from engine.core.errors import DomainError
from engine.flows.conversation.fields import MAX_QUESTION, Field
from engine.words.findings import Finding
from engine.words.understanding import Understanding
from engine.words.understanding.normalise import normalise
from gateway.phones import InvalidPhone, normalize_phone

#: How far ahead a date may be, by default (the booking horizon).
HORIZON_DAYS = 90
PERIODS = ("morning", "afternoon", "evening")
_TIME = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})+")
_NUMBER = re.compile(r"-?\d{1,12}(?:[.,]\d{1,6})?")
_PHONE = re.compile(r"\+?\d[\d ().-]{8,18}\d")
#: Types read from what the understanding found (`Understanding.fields`), by key.
_UNDERSTOOD = {"date": "date", "time": "time", "period": "period"}


class ValueRejected(DomainError):
    """A value that its field's type does not take; `finding` says why, in the catalogue's words."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.code)
        self.finding = finding


def _refuse(slug: str, code: str, **params: Any) -> ValueRejected:
    return ValueRejected(Finding(code, slug, params))


def coerce(spec: Field, value: Any, *, today: date, horizon_days: int = HORIZON_DAYS) -> Any:
    """`value` in the stored form of `spec`'s type, or ValueRejected.

    :param today: the org's today (dates before it are refused).
    :param horizon_days: dates more than this many days after `today` are refused.
    """
    kind, slug = spec.type, spec.slug
    if value is None:
        raise _refuse(slug, "detail_required")
    if kind == "text":
        if not isinstance(value, str) or not value.strip() or len(value.strip()) > MAX_QUESTION:
            raise _refuse(slug, "detail_text", max=MAX_QUESTION)
        return value.strip()
    if kind == "number":
        if isinstance(value, bool):
            raise _refuse(slug, "detail_number")
        if isinstance(value, (int, float)):
            return value
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            number = float(value.strip().replace(",", "."))
            return int(number) if number.is_integer() else number
        raise _refuse(slug, "detail_number")
    if kind == "date":
        try:
            day = date.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            day = None
        if day is None:
            raise _refuse(slug, "field_value_date")
        if day < today:
            raise _refuse(slug, "field_value_past")
        if day > today + timedelta(days=horizon_days):
            raise _refuse(slug, "field_value_horizon", days=horizon_days)
        return day.isoformat()
    if kind == "time":
        if not isinstance(value, str) or not _TIME.match(value):
            raise _refuse(slug, "field_value_time")
        return value
    if kind == "period":
        if value not in PERIODS:
            raise _refuse(slug, "detail_choice", choices=", ".join(PERIODS))
        return value
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        raise _refuse(slug, "detail_boolean")
    if kind == "choice":
        values = [option.value for option in spec.options]
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(values):
            return values[value - 1]
        if isinstance(value, str):
            for option in values:
                if option.casefold() == value.strip().casefold():
                    return option
        raise _refuse(slug, "detail_choice", choices=", ".join(values))
    if kind == "phone":
        try:
            return normalize_phone(str(value))
        except (InvalidPhone, ValueError):
            raise _refuse(slug, "field_value_phone") from None
    if kind == "email":
        if isinstance(value, str) and _EMAIL.fullmatch(value.strip()):
            return value.strip().lower()
        raise _refuse(slug, "field_value_email")
    raise _refuse(slug, "detail_invalid")


@dataclass
class Harvest:
    """What one reply said about the fields: the values taken (by slug) and the values found but
    refused (a date in the past…), each with the sentence to tell the patient why."""

    values: dict[str, Any] = field(default_factory=dict)
    refused: dict[str, Finding] = field(default_factory=dict)


def _choice_of(spec: Field, text: str, understood: Mapping[str, Any]) -> Any:
    if understood.get("choice") is not None:
        return understood["choice"]
    said = normalise(text).text
    for option in spec.options:
        if normalise(option.label).text == said or normalise(option.value).text == said:
            return option.value
    return None


def _read(spec: Field, text: str, reading: Understanding, asked: bool) -> Any:
    """What the reply says for `spec`, unchecked; None when it says nothing for it."""
    understood = reading.fields
    if spec.type in _UNDERSTOOD:
        return understood.get(_UNDERSTOOD[spec.type])
    if spec.type == "email":
        found = _EMAIL.search(text)
        return found.group(0) if found else None
    if spec.type == "phone":
        found = _PHONE.search(text)
        return found.group(0) if found else None
    if not asked:
        return None
    if spec.type == "choice":
        return _choice_of(spec, text, understood)
    if spec.type == "boolean":
        return {"confirm": True, "cancel": False}.get(reading.intent)
    if spec.type == "number":
        found = _NUMBER.search(text)
        return found.group(0) if found else None
    return text.strip() or None  # text: the whole answer to its own question


def harvest(specs: Sequence[Field], text: str, reading: Understanding, *, asked: str | None, today: date,
            horizon_days: int = HORIZON_DAYS) -> Harvest:
    """Read `specs`' values out of one reply (`text`, as `reading` understood it).

    A field is read when its harvest is `any_reply`, or when it is the one `asked`. One thing said
    fills one field: a date goes to the asked field when it is a date, else to the first date field
    in `specs` order; a value given again replaces the one before ("sexta não, quinta").
    """
    result = Harvest()
    taken_types: set[str] = set()
    order = sorted(specs, key=lambda s: s.slug != asked)  # the asked field has first pick
    for spec in order:
        is_asked = spec.slug == asked
        if spec.harvest != "any_reply" and not is_asked:
            continue
        if spec.type in taken_types and spec.type != "text":
            continue
        raw = _read(spec, text, reading, is_asked)
        if raw is None:
            continue
        taken_types.add(spec.type)
        try:
            result.values[spec.slug] = coerce(spec, raw, today=today, horizon_days=horizon_days)
        except ValueRejected as exc:
            result.refused[spec.slug] = exc.finding
    return result
