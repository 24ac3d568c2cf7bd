"""The deterministic checks of `condition` nodes and trigger conditions (docs/flows.md,
"Condition fields"): which fields exist, which ops each allows, what `value` each op takes,
and `evaluate`, which runs a list of checks over a dict of facts.

A check is `{"field": "contact.stage", "op": "eq", "value": "lead"}`. `schema.py` validates
checks with `check_problem`; `evaluate` assumes they were validated and raises on a check that
names an unknown field or op (a bug, not a patient's doing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal

from engine.words.keywords import normalize_text

FieldType = Literal["text", "number", "instant"]
#: What an op's `value` must be: nothing, a text, a list of texts, a number, whole minutes.
ValueKind = Literal["none", "text", "texts", "number", "minutes"]
#: The part of a check that is wrong.
CheckPart = Literal["field", "op", "value"]

TEXT_OPS = ("eq", "ne", "in", "not_in", "exists", "not_exists")
NUMBER_OPS = ("eq", "ne", "gt", "gte", "lt", "lte")
APPOINTMENT_INSTANT_OPS = ("exists", "not_exists", "before_now", "after_now", "within_next_minutes",
                           "older_than_minutes")
ENROLLMENT_INSTANT_OPS = ("exists", "not_exists", "older_than_minutes", "newer_than_minutes")

COMBINATORS = ("all", "any")
MAX_CHECKS = 20
#: `in` / `not_in` take 1 to this many texts.
MAX_LIST_VALUES = 50
#: The longest text a check compares with (an e-mail address can be 254 characters).
MAX_TEXT_VALUE = 255


@dataclass(frozen=True)
class FieldSpec:
    """A condition field: the type of its facts and the ops it allows."""

    type: FieldType
    ops: tuple[str, ...]


def _same(names: Iterable[str], spec: FieldSpec) -> dict[str, FieldSpec]:
    return dict.fromkeys(names, spec)


#: The condition fields, exactly as docs/flows.md's table lists them.
FIELDS: Mapping[str, FieldSpec] = MappingProxyType({
    **_same(("contact.name", "contact.phone", "contact.email", "contact.locale", "contact.stage"),
            FieldSpec("text", TEXT_OPS)),
    "appointment.status": FieldSpec("text", TEXT_OPS),
    "appointment.starts_at": FieldSpec("instant", APPOINTMENT_INSTANT_OPS),
    **_same(("enrollment.steps", "enrollment.llm_calls", "enrollment.messages_sent", "enrollment.replies"),
            FieldSpec("number", NUMBER_OPS)),
    **_same(("enrollment.created_at", "enrollment.last_reply_at", "enrollment.last_outbound_at"),
            FieldSpec("instant", ENROLLMENT_INSTANT_OPS)),
    "enrollment.last_class": FieldSpec("text", TEXT_OPS),
})

#: Every op some field allows, in first-seen order.
OPS: tuple[str, ...] = tuple(dict.fromkeys(op for spec in FIELDS.values() for op in spec.ops))

_NO_VALUE_OPS = frozenset({"exists", "not_exists", "before_now", "after_now"})
_LIST_OPS = frozenset({"in", "not_in"})
_MINUTES_OPS = frozenset({"within_next_minutes", "older_than_minutes", "newer_than_minutes"})


def value_kind(field: str, op: str) -> ValueKind:
    """What `value` `op` takes on `field` (both must be known): `eq`/`ne` compare with a text on
    text fields and with a number on number fields."""
    if op in _NO_VALUE_OPS:
        return "none"
    if op in _LIST_OPS:
        return "texts"
    if op in _MINUTES_OPS:
        return "minutes"
    return "text" if FIELDS[field].type == "text" else "number"


def _is_number(value: Any) -> bool:
    # bool is an int in Python, never a number in a flow.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT_VALUE


def value_fits(kind: ValueKind, value: Any) -> bool:
    """Whether `value` is what an op of this kind takes (None stands for "no value")."""
    if kind == "none":
        return value is None
    if kind == "text":
        return _is_text(value)
    if kind == "texts":
        return (isinstance(value, list) and 1 <= len(value) <= MAX_LIST_VALUES
                and all(_is_text(item) for item in value))
    if kind == "number":
        return _is_number(value)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_problem(field: Any, op: Any, value: Any = None) -> CheckPart | None:
    """The first wrong part of a check, or None when it is valid: an unknown field, an op the
    field does not allow, or a value that does not fit the op (None means "no value")."""
    spec = FIELDS.get(field) if isinstance(field, str) else None
    if spec is None:
        return "field"
    if op not in spec.ops:
        return "op"
    if not value_fits(value_kind(field, op), value):
        return "value"
    return None


# --- evaluation ---------------------------------------------------------------------------------

_Op = Callable[[Any, Any, datetime], bool]


def _text(fact: Any) -> str:
    if not isinstance(fact, str):
        raise TypeError(f"a text fact must be a str, not {type(fact).__name__}")
    return normalize_text(fact)


def _number(fact: Any) -> float:
    if not _is_number(fact):
        raise TypeError(f"a number fact must be an int or float, not {type(fact).__name__}")
    return fact


def _instant(fact: Any) -> datetime:
    if not isinstance(fact, datetime):
        raise TypeError(f"an instant fact must be a datetime, not {type(fact).__name__}")
    if fact.utcoffset() is None:
        raise ValueError("an instant fact must be an aware datetime")
    return fact


def _age_seconds(fact: Any, now: datetime) -> float:
    # Seconds, not timedelta arithmetic: `now - timedelta(minutes=value)` overflows for a huge
    # (but valid) number of minutes.
    return (now - _instant(fact)).total_seconds()


_TEXT: Mapping[str, _Op] = {
    "eq": lambda fact, value, now: _text(fact) == normalize_text(value),
    "ne": lambda fact, value, now: _text(fact) != normalize_text(value),
    "in": lambda fact, value, now: _text(fact) in {normalize_text(item) for item in value},
    "not_in": lambda fact, value, now: _text(fact) not in {normalize_text(item) for item in value},
}
_NUMBER: Mapping[str, _Op] = {
    "eq": lambda fact, value, now: _number(fact) == value,
    "ne": lambda fact, value, now: _number(fact) != value,
    "gt": lambda fact, value, now: _number(fact) > value,
    "gte": lambda fact, value, now: _number(fact) >= value,
    "lt": lambda fact, value, now: _number(fact) < value,
    "lte": lambda fact, value, now: _number(fact) <= value,
}
_INSTANT: Mapping[str, _Op] = {
    "before_now": lambda fact, value, now: _instant(fact) < now,
    "after_now": lambda fact, value, now: _instant(fact) > now,
    "within_next_minutes": lambda fact, value, now: 0 <= -_age_seconds(fact, now) <= value * 60,
    # "Older than N minutes" holds from the Nth minute on, so a condition right after a wait of
    # N minutes sees the N-minute-old instant as old enough.
    "older_than_minutes": lambda fact, value, now: _age_seconds(fact, now) >= value * 60,
    "newer_than_minutes": lambda fact, value, now: _age_seconds(fact, now) < value * 60,
}
_BY_TYPE: Mapping[FieldType, Mapping[str, _Op]] = {"text": _TEXT, "number": _NUMBER, "instant": _INSTANT}


def _spec(check: Mapping[str, Any]) -> FieldSpec:
    field, op = check.get("field"), check.get("op")
    spec = FIELDS.get(field) if isinstance(field, str) else None
    if spec is None:
        raise ValueError(f"unknown condition field {field!r}")
    if op not in spec.ops:
        raise ValueError(f"op {op!r} is not allowed for {field!r}")
    return spec


def _holds(check: Mapping[str, Any], facts: Mapping[str, Any], now: datetime) -> bool:
    spec, op = _spec(check), check["op"]
    fact = facts.get(check["field"])
    if fact is None:
        # Nothing is known: only "it does not exist" can be true.
        return op == "not_exists"
    if op in ("exists", "not_exists"):
        return op == "exists"
    return _BY_TYPE[spec.type][op](fact, check.get("value"), now)


def evaluate(checks: Sequence[Mapping[str, Any]], combinator: str, facts: Mapping[str, Any], now: datetime) -> bool:
    """Whether the checks hold over `facts` (field name → value), combined with `all` or `any`.

    A missing or None fact fails every op but `not_exists`. Texts compare casefolded and
    accent-folded (`engine.words.keywords.normalize_text`). Instants are aware datetimes and `now` must
    be aware: a naive one raises ValueError, as do an unknown combinator, field or op; a fact of
    the wrong type raises TypeError (both are bugs of the caller). No checks: `all` holds, `any`
    does not.
    """
    if not isinstance(now, datetime) or now.utcoffset() is None:
        raise ValueError("now must be an aware datetime")
    if combinator not in COMBINATORS:
        raise ValueError(f"unknown combinator {combinator!r}")
    for check in checks:  # refuse a malformed check even where any/all would stop before it
        _spec(check)
    results = (_holds(check, facts, now) for check in checks)
    return all(results) if combinator == "all" else any(results)
