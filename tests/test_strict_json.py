"""engine/core/strict_json.py: the one strict reading of a JSON document from outside (issue 30, point 6).
Every hostile input is refused with a catalogue code and the path of the value, never an exception
of another kind, and nothing it lets through would fail a write to either database."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.words.catalogue import known
from engine.core.strict_json import INT_MAX, INT_MIN, MAX_DEPTH, JsonRefused, find_problem, loads, storable_text


def refused(raw: str | bytes) -> JsonRefused:
    with pytest.raises(JsonRefused) as caught:
        loads(raw)
    return caught.value


@pytest.mark.parametrize(("raw", "field", "detail"), [
    ('{"max_steps": NaN}', "max_steps", "detail_not_finite"),
    ('{"a": [1, Infinity]}', "a.1", "detail_not_finite"),
    ('{"a": -Infinity}', "a", "detail_not_finite"),
    ('{"x": 1e999}', "x", "detail_number_range"),
    ('{"x": -1e999}', "x", "detail_number_range"),
    ('{"v": 9223372036854775808}', "v", "detail_number_range"),
    ('{"v": -9223372036854775809}', "v", "detail_number_range"),
    ('{"v": ' + "9" * 5000 + "}", "v", "detail_number_range"),  # past Python's own 4300-digit limit
    ('{"name": "a\\u0000b"}', "name", "detail_unstorable"),
    ('{"name": "a\\ud800b"}', "name", "detail_unstorable"),
    ('{"name": "\\udfff"}', "name", "detail_unstorable"),
    ('{"g": {"nodes": [{"config": {"\\u0000": 1}}]}}', "g.nodes.0.config", "detail_unstorable"),
    ('{"g": {"\\ud800": 1}}', "g", "detail_unstorable"),
    ("NaN", "$", "detail_not_finite"),
])
def test_a_value_no_database_stores_is_refused_with_its_path(raw: str, field: str, detail: str) -> None:
    error = refused(raw)
    assert error.code == "body_invalid_value" and error.problem is not None
    assert error.problem.code == detail and error.params["field"] == field
    assert f"({field}: " in str(error.message)
    assert known(error.code) and known(detail)


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a": }', b"\xff\xfe\x00", b'{"a": "\x00"}', b"[1,]", b"{'a': 1}"])
def test_what_is_not_json_is_refused_as_such(raw: bytes) -> None:
    assert refused(raw).code == "body_not_json" and refused(raw).problem is None


@pytest.mark.parametrize("raw", ["[" * 200_000, "[" * 200_000 + "]" * 200_000, '{"a":' * 600 + "1" + "}" * 600,
                                 "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)])
def test_nesting_past_the_bound_is_refused_however_deep(raw: str) -> None:
    error = refused(raw)
    assert error.code == "body_too_deep" and error.params == {"max": MAX_DEPTH} and error.problem is None


def test_what_fits_is_read_as_it_was_written() -> None:
    document = {"a": [INT_MIN, INT_MAX, -0.0, 1.5e308, "olá \U0001f600", None, True], "b": {"c": {}},
                "deep": json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))}  # with the root: MAX_DEPTH
    assert loads(json.dumps(document)) == document
    assert loads(json.dumps(document).encode("utf-8")) == document
    assert loads('"\\ud83d\\ude00"') == "\U0001f600"  # a surrogate PAIR is one character, and fine


def test_a_long_key_is_cut_in_the_path_a_person_reads() -> None:
    error = refused(json.dumps({"k" * 10_000: float("nan")}))
    assert len(error.params["field"]) <= 40


def test_find_problem_covers_what_a_python_caller_can_hand_the_engine() -> None:
    assert find_problem({"a": (1, 2), "b": [{"c": "d"}]}) is None
    assert find_problem({"a": float("inf")}).code == "detail_not_finite"
    assert find_problem({"a": 2**64}).path == ("a",)
    assert find_problem({"a": object()}).code == "detail_invalid"
    assert find_problem([[[]]], max_depth=2).code == "detail_too_deep"
    assert storable_text("ação") and not storable_text("a\x00") and not storable_text("\udc80")


_hostile_text = st.text(alphabet=st.one_of(st.characters(codec=None, exclude_categories=()),
                                           st.sampled_from(["\x00", "\ud800", "\udfff", "\ud83d", "["])), max_size=8)
_hostile_json = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.sampled_from([2**63, -(2**63) - 1, 10**40])
    | _hostile_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_hostile_text, inner, max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=500)
@given(document=_hostile_json)
def test_any_document_is_read_or_refused_and_what_is_read_can_be_stored(document: Any) -> None:
    raw = json.dumps(document)  # ensure_ascii: lone surrogates travel as \\udXXX escapes, NaN as NaN
    try:
        read = loads(raw)
    except JsonRefused as error:
        assert known(error.code)
        return
    # What passes encodes to UTF-8 and to strict JSON, as both databases' JSON columns need.
    json.dumps(read, allow_nan=False, ensure_ascii=False).encode("utf-8")
    assert "\\u0000" not in json.dumps(read)
