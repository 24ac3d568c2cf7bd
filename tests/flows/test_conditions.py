"""The condition registry and `evaluate` (docs/flows.md, "Condition fields")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.flows import conditions
from engine.flows.conditions import FIELDS, check_problem, evaluate

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

#: docs/flows.md's table, written out again on purpose: the registry must match it exactly.
DOCS_TABLE = {
    **dict.fromkeys(("contact.name", "contact.phone", "contact.email", "contact.locale", "contact.stage",
                     "appointment.status", "enrollment.last_class"),
                    ("text", {"eq", "ne", "in", "not_in", "exists", "not_exists"})),
    "appointment.starts_at": ("instant", {"exists", "not_exists", "before_now", "after_now",
                                          "within_next_minutes", "older_than_minutes"}),
    **dict.fromkeys(("enrollment.steps", "enrollment.llm_calls", "enrollment.messages_sent", "enrollment.replies"),
                    ("number", {"eq", "ne", "gt", "gte", "lt", "lte"})),
    **dict.fromkeys(("enrollment.created_at", "enrollment.last_reply_at", "enrollment.last_outbound_at"),
                    ("instant", {"exists", "not_exists", "older_than_minutes", "newer_than_minutes"})),
}


def check(field: str, op: str, value: object = None) -> dict[str, object]:
    return {"field": field, "op": op, "value": value}


def holds(field: str, op: str, value: object, fact: object, now: datetime = NOW) -> bool:
    return evaluate([check(field, op, value)], "all", {field: fact}, now)


def test_registry_is_the_docs_table() -> None:
    assert {name: (spec.type, set(spec.ops)) for name, spec in FIELDS.items()} == DOCS_TABLE


# --- check_problem --------------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "op", "value"), [
    ("contact.stage", "eq", "lead"),
    ("contact.stage", "ne", ""),
    ("contact.stage", "in", ["lead", "orcamento"]),
    ("contact.stage", "not_in", ["x"] * 50),
    ("contact.email", "exists", None),
    ("appointment.status", "not_exists", None),
    ("appointment.starts_at", "before_now", None),
    ("appointment.starts_at", "within_next_minutes", 60),
    ("enrollment.steps", "gte", 3),
    ("enrollment.replies", "lt", 2.5),
    ("enrollment.last_reply_at", "newer_than_minutes", 1),
])
def test_valid_checks(field: str, op: str, value: object) -> None:
    assert check_problem(field, op, value) is None


@pytest.mark.parametrize(("field", "op", "value", "part"), [
    ("contact.age", "eq", "x", "field"),
    (None, "eq", "x", "field"),
    ("contact.stage", "gt", "x", "op"),
    ("contact.stage", "before_now", None, "op"),
    ("enrollment.steps", "in", ["1"], "op"),
    ("appointment.starts_at", "newer_than_minutes", 5, "op"),
    ("enrollment.created_at", "within_next_minutes", 5, "op"),
    ("enrollment.created_at", "eq", "x", "op"),
    ("contact.stage", "eq", None, "value"),
    ("contact.stage", "eq", 3, "value"),
    ("contact.stage", "eq", "x" * 256, "value"),
    ("contact.stage", "in", [], "value"),
    ("contact.stage", "in", "lead", "value"),
    ("contact.stage", "in", ["lead", 1], "value"),
    ("contact.stage", "in", ["x"] * 51, "value"),
    ("contact.stage", "exists", "lead", "value"),
    ("appointment.starts_at", "after_now", 5, "value"),
    ("appointment.starts_at", "older_than_minutes", 0, "value"),
    ("appointment.starts_at", "older_than_minutes", 1.5, "value"),
    ("appointment.starts_at", "older_than_minutes", True, "value"),
    ("appointment.starts_at", "older_than_minutes", "60", "value"),
    ("enrollment.steps", "eq", "3", "value"),
    ("enrollment.steps", "eq", True, "value"),
    ("enrollment.steps", "gt", float("nan"), "value"),
    ("enrollment.steps", "gt", None, "value"),
])
def test_invalid_checks(field: object, op: str, value: object, part: str) -> None:
    assert check_problem(field, op, value) == part


# --- evaluate -------------------------------------------------------------------------------------

def test_text_compares_casefolded_and_accent_folded() -> None:
    assert holds("contact.stage", "eq", "Orçamento", "ORCAMENTO")
    assert holds("contact.stage", "ne", "lead", "Orçamento")
    assert not holds("contact.stage", "ne", "orçamento", "Orcamento")
    assert holds("contact.stage", "in", ["lead", "ORÇAMENTO"], "orcamento")
    assert holds("contact.stage", "not_in", ["lead"], "orcamento")
    assert not holds("contact.stage", "not_in", ["Lead"], "LEAD")


def test_numbers() -> None:
    assert holds("enrollment.steps", "eq", 3, 3)
    assert holds("enrollment.steps", "ne", 3, 4)
    assert holds("enrollment.steps", "gt", 3, 4) and not holds("enrollment.steps", "gt", 3, 3)
    assert holds("enrollment.steps", "gte", 3, 3)
    assert holds("enrollment.steps", "lt", 3, 2.5) and not holds("enrollment.steps", "lt", 3, 3)
    assert holds("enrollment.steps", "lte", 3, 3)


def test_instants() -> None:
    past, future = NOW - timedelta(minutes=90), NOW + timedelta(minutes=30)
    assert holds("appointment.starts_at", "before_now", None, past)
    assert not holds("appointment.starts_at", "before_now", None, future)
    assert holds("appointment.starts_at", "after_now", None, future)
    assert holds("appointment.starts_at", "within_next_minutes", 30, future)
    assert not holds("appointment.starts_at", "within_next_minutes", 29, future)
    assert not holds("appointment.starts_at", "within_next_minutes", 60, past)
    assert holds("appointment.starts_at", "older_than_minutes", 90, past)  # from the 90th minute on
    assert not holds("appointment.starts_at", "older_than_minutes", 91, past)
    assert holds("enrollment.last_reply_at", "newer_than_minutes", 91, past)
    assert not holds("enrollment.last_reply_at", "newer_than_minutes", 90, past)


def test_instants_in_other_zones_compare_as_instants() -> None:
    sao_paulo = timezone(timedelta(hours=-3))
    fact = datetime(2026, 12, 1, 8, 0, tzinfo=sao_paulo)  # 11:00 UTC, an hour before NOW
    assert holds("enrollment.created_at", "older_than_minutes", 60, fact)
    assert not holds("enrollment.created_at", "older_than_minutes", 61, fact)


def test_a_huge_number_of_minutes_does_not_overflow() -> None:
    assert not holds("enrollment.created_at", "older_than_minutes", 10**15, NOW - timedelta(days=1))
    assert holds("appointment.starts_at", "within_next_minutes", 10**15, NOW + timedelta(days=1))


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_missing_or_none_fact_fails_every_op_but_not_exists(field: str) -> None:
    for op in FIELDS[field].ops:
        value = {"none": None, "text": "x", "texts": ["x"], "number": 1, "minutes": 5}[conditions.value_kind(field, op)]
        expected = op == "not_exists"
        assert evaluate([check(field, op, value)], "all", {}, NOW) is expected
        assert evaluate([check(field, op, value)], "all", {field: None}, NOW) is expected


def test_exists_and_not_exists_with_a_fact() -> None:
    assert holds("contact.email", "exists", None, "a@b.c")
    assert not holds("contact.email", "not_exists", None, "a@b.c")
    assert holds("enrollment.last_class", "exists", None, "")  # an empty text is a fact, not a missing one


def test_combinators() -> None:
    checks = [check("enrollment.steps", "gt", 1), check("contact.stage", "eq", "lead")]
    facts = {"enrollment.steps": 2, "contact.stage": "cliente"}
    assert not evaluate(checks, "all", facts, NOW)
    assert evaluate(checks, "any", facts, NOW)
    assert evaluate([], "all", facts, NOW) and not evaluate([], "any", facts, NOW)


def test_a_check_without_value_key_works() -> None:
    assert evaluate([{"field": "contact.email", "op": "not_exists"}], "all", {}, NOW)


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError):
        evaluate([], "all", {}, datetime(2026, 12, 1, 12, 0))


def test_naive_instant_fact_is_refused() -> None:
    with pytest.raises(ValueError):
        holds("appointment.starts_at", "before_now", None, datetime(2026, 12, 1, 11, 0))


@pytest.mark.parametrize(("field", "op", "value", "fact"), [
    ("contact.stage", "eq", "lead", 3),
    ("enrollment.steps", "gt", 1, "2"),
    ("enrollment.steps", "gt", 1, True),
    ("appointment.starts_at", "before_now", None, "2026-12-01T10:00:00Z"),
])
def test_a_fact_of_the_wrong_type_is_a_bug(field: str, op: str, value: object, fact: object) -> None:
    with pytest.raises(TypeError):
        holds(field, op, value, fact)


@pytest.mark.parametrize("bad", [check("contact.age", "eq", "x"), check("contact.stage", "gt", 1), {}])
def test_unknown_field_or_op_raises_even_when_any_would_stop_earlier(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        evaluate([check("contact.email", "not_exists"), bad], "any", {}, NOW)


def test_unknown_combinator_raises() -> None:
    with pytest.raises(ValueError):
        evaluate([], "most", {}, NOW)


_texts = st.text(max_size=20)


@given(fact=_texts, value=_texts)
def test_eq_and_ne_are_opposites(fact: str, value: str) -> None:
    assert holds("contact.name", "eq", value, fact) is not holds("contact.name", "ne", value, fact)


@given(fact=_texts, values=st.lists(_texts, min_size=1, max_size=5))
def test_in_and_not_in_are_opposites(fact: str, values: list[str]) -> None:
    assert holds("contact.name", "in", values, fact) is not holds("contact.name", "not_in", values, fact)


@given(minutes_ago=st.integers(-10**6, 10**6), limit=st.integers(1, 10**6))
def test_older_and_newer_are_opposites(minutes_ago: int, limit: int) -> None:
    fact = NOW - timedelta(minutes=minutes_ago)
    older = holds("enrollment.created_at", "older_than_minutes", limit, fact)
    assert older is not holds("enrollment.created_at", "newer_than_minutes", limit, fact)
    assert older is (minutes_ago >= limit)
