"""The reply corpus of bench/understanding.py stays well-formed (without needing the reader itself).

bench/data/understanding_ptbr.jsonl is the fixture the bench scores `engine.words.understanding`
on, on the contract's fixed clock (Monday 2026-12-07 10:00 in São Paulo): every line must parse,
carry only known keys with values of the contract's shapes, and the corpus must stay large and
varied enough for its figures to mean something.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import pytest

CORPUS = Path(__file__).resolve().parent.parent / "bench" / "data" / "understanding_ptbr.jsonl"
STANDARD_INTENTS = ("confirm", "cancel", "reschedule", "opt_out", "human", "question", "other")
REQUIRED = {"text", "intent", "date", "time", "period"}
OPTIONAL = {"pending", "note", "choice", "time_range", "exclude_weekdays"}
PERIODS = {"morning", "afternoon", "evening"}
PENDING_SLUGS = {"date", "time", "period", "choice"}
#: Dates a reply may name, on the fixed clock: from today to the end of next year.
FIRST_DAY, LAST_DAY = date(2026, 12, 7), date(2027, 12, 31)
HHMM = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")


def _lines() -> list[tuple[int, str]]:
    return [(n, raw) for n, raw in enumerate(CORPUS.read_text(encoding="utf-8").splitlines(), 1) if raw.strip()]


def _rows() -> list[dict[str, Any]]:
    return [json.loads(raw) for _, raw in _lines()]


def test_every_line_parses_as_an_object() -> None:
    for number, raw in _lines():
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:  # pragma: no cover - the message names the line
            pytest.fail(f"line {number} is not JSON: {exc}")
        assert isinstance(row, dict), f"line {number} is not an object"


def test_keys_and_values_have_the_contract_shapes() -> None:
    for number, row in enumerate(_rows(), 1):
        where = f"line {number} ({row.get('text')!r})"
        assert REQUIRED <= row.keys(), f"{where} lacks {REQUIRED - row.keys()}"
        assert row.keys() <= REQUIRED | OPTIONAL, f"{where} has unknown keys {row.keys() - REQUIRED - OPTIONAL}"
        assert isinstance(row["text"], str) and row["text"].strip(), f"{where}: empty text"
        assert row["intent"] in STANDARD_INTENTS, f"{where}: intent {row['intent']!r}"
        if row["date"] is not None:
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), f"{where}: date {row['date']!r}"
            assert FIRST_DAY <= date.fromisoformat(row["date"]) <= LAST_DAY, f"{where}: date out of range"
        if row["time"] is not None:
            assert HHMM.match(row["time"]), f"{where}: time {row['time']!r}"
        assert row["period"] is None or row["period"] in PERIODS, f"{where}: period {row['period']!r}"
        pending = row.get("pending", [])
        assert isinstance(pending, list) and set(pending) <= PENDING_SLUGS, f"{where}: pending {pending!r}"
        if "choice" in row:
            assert isinstance(row["choice"], int) and not isinstance(row["choice"], bool) and row["choice"] >= 1
            assert "choice" in pending, f"{where}: a choice is expected only while one is pending"
        if "time_range" in row:
            start, end = row["time_range"]
            assert HHMM.match(start) and HHMM.match(end) and start < end, f"{where}: time_range"
        if "exclude_weekdays" in row:
            days = row["exclude_weekdays"]
            assert days and all(isinstance(d, int) and 0 <= d <= 6 for d in days), f"{where}: exclude_weekdays"
        assert isinstance(row.get("note", ""), str)


def test_texts_are_not_repeated() -> None:
    keys = Counter((row["text"], tuple(row.get("pending", []))) for row in _rows())
    assert [key for key, count in keys.items() if count > 1] == []


def test_the_corpus_is_large_and_varied_enough() -> None:
    rows = _rows()
    assert len(rows) >= 200
    per_intent = Counter(row["intent"] for row in rows)
    assert {intent: per_intent[intent] for intent in STANDARD_INTENTS if per_intent[intent] < 10} == {}
    assert sum(row["date"] is not None for row in rows) >= 60
    assert sum(row["time"] is not None for row in rows) >= 30
    assert sum("choice" in row for row in rows) >= 5
