"""How well the built-in reader understands patients' replies: scored on a pt-BR corpus, with its cost.

    .venv/bin/python bench/understanding.py [--corpus PATH] [--show-misses] [--rounds 5]

Every line of the corpus (bench/data/understanding_ptbr.jsonl, one JSON object a line: the reply's
`text`, the expected `intent`, `date`, `time`, `period`, optionally `pending`, `choice`,
`time_range`, `exclude_weekdays` and a `note` saying why) is read by
`engine.words.understanding.understand` on the contract's fixed clock: now Monday
2026-12-07 10:00 in São Paulo, the appointment Wednesday 2026-12-09 14:00, every standard intent
declared, `pending` as the line gives it. Nothing else of Lembra is imported, so the bench runs
before the rest of the engine is set up; without the package it says so in one line and exits 0.

It prints

- intent accuracy per expected intent (n, correct, %) and overall;
- field accuracy: date, time and period each over the lines that expect one (a line that expects
  null is not scored for that field, but a value found where none was expected is counted apart as
  "spurious", since a reply's date that was never said could move an appointment); choice,
  time_range and exclude_weekdays over the lines that carry them;
- the critical errors (an expected cancel, reschedule or opt-out read as a confirm, or an expected
  confirm read as a cancel: the ones that cost a patient their slot or a clinic an empty chair),
  each listed;
- a confusion summary of the mistakes (expected → got, counted);
- the cost: µs per call, p50 and p99, of `understand` beside a bare baseline (`str.lower` on the
  same texts), rounds interleaved so a busy neighbour costs both alike, and the machine.

A measurement, not a test: the exit code is 0 whatever the figures (tests/test_understanding_corpus.py
keeps the corpus well-formed). Aim (issue 32): intent ≥ 90 %, date ≥ 85 %, 0 critical errors.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parent.parent
# Appended, not put first as the other benches do: PYTHONPATH may point the bench at another
# checkout's reader (`PYTHONPATH=../other python bench/understanding.py`), and must win.
sys.path.append(str(ROOT))

DEFAULT_CORPUS = ROOT / "bench" / "data" / "understanding_ptbr.jsonl"
TIMEZONE = "America/Sao_Paulo"
#: The contract's fixed clock: a Monday morning, two days before the appointment.
NOW = datetime(2026, 12, 7, 10, 0, tzinfo=ZoneInfo(TIMEZONE))
APPOINTMENT_AT = datetime(2026, 12, 9, 14, 0, tzinfo=ZoneInfo(TIMEZONE))
INTENTS = ("confirm", "cancel", "reschedule", "opt_out", "human", "question", "other")
#: Misreadings that act against the patient's word: a slot kept for someone who is not coming (or
#: who asked to stop hearing from the clinic), or a slot given away from someone who is.
CRITICAL = {("cancel", "confirm"), ("reschedule", "confirm"), ("opt_out", "confirm"), ("confirm", "cancel")}
#: Optional fields scored only on the lines that carry them.
EXTRA_FIELDS = ("choice", "time_range", "exclude_weekdays")
AIMS = {"intent": 90.0, "date": 85.0}


@dataclass
class Line:
    """One corpus line and what the reader made of it."""

    number: int
    expected: dict[str, Any]
    intent: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def text(self) -> str:
        return self.expected["text"]


def load_corpus(path: Path) -> list[Line]:
    """The corpus's lines, blank lines skipped."""
    lines = []
    with path.open(encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            if raw.strip():
                lines.append(Line(number, json.loads(raw)))
    return lines


def _import_reader() -> tuple[Callable[..., Any], type] | None:
    """`understand` and `Context`, or None (after saying why in one line) when the package is missing."""
    try:
        module = importlib.import_module("engine.words.understanding")
        return module.understand, module.Context
    except Exception as exc:  # noqa: BLE001 - any failure to import means nothing to measure
        print(f"engine.words.understanding is not importable ({type(exc).__name__}: {exc}); nothing to measure.")
        return None


def _context(Context: type, line: Line) -> Any:
    return Context(now=NOW, timezone=TIMEZONE, appointment_at=APPOINTMENT_AT, intents=INTENTS,
                   pending=tuple(line.expected.get("pending", ())))


def read_all(understand: Callable[..., Any], Context: type, lines: list[Line]) -> None:
    """Fill each line's reading; an exception is recorded as the intent `<error>`, not raised."""
    for line in lines:
        try:
            result = understand(line.text, _context(Context, line))
            line.intent, line.fields = result.intent, dict(result.fields)
        except Exception as exc:  # noqa: BLE001 - one bad line must not hide the other figures
            line.intent, line.fields, line.error = "<error>", {}, f"{type(exc).__name__}: {exc}"


def _pct(correct: int, n: int) -> str:
    return f"{100 * correct / n:5.1f} %" if n else "    – "


def _normal(name: str, value: Any) -> Any:
    """Lists compared as lists whatever their container (a tuple from the reader is fine)."""
    if name in ("time_range", "exclude_weekdays") and value is not None:
        return list(value)
    return value


def score(lines: list[Line]) -> dict[str, Any]:
    """Every figure the report prints, from the readings."""
    per_intent: dict[str, list[int]] = {intent: [0, 0] for intent in INTENTS}
    for line in lines:
        counts = per_intent.setdefault(line.expected["intent"], [0, 0])
        counts[0] += 1
        counts[1] += line.intent == line.expected["intent"]
    fields: dict[str, dict[str, Any]] = {}
    for name in ("date", "time", "period", *EXTRA_FIELDS):
        scored = [line for line in lines if line.expected.get(name) is not None]
        wrong = [line for line in scored if _normal(name, line.fields.get(name)) != line.expected[name]]
        spurious = [line for line in lines if name in ("date", "time", "period")
                    and line.expected.get(name) is None and line.fields.get(name) is not None
                    and not line.error]
        fields[name] = {"n": len(scored), "correct": len(scored) - len(wrong), "wrong": wrong, "spurious": spurious}
    mistakes = [line for line in lines if line.intent != line.expected["intent"]]
    critical = [line for line in mistakes if (line.expected["intent"], line.intent) in CRITICAL]
    confusion = Counter((line.expected["intent"], line.intent) for line in mistakes)
    return {"per_intent": per_intent, "fields": fields, "mistakes": mistakes, "critical": critical,
            "confusion": confusion, "errors": [line for line in lines if line.error]}


def _percentile(samples: list[int], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000 if ordered else 0.0


def time_calls(understand: Callable[..., Any], Context: type, lines: list[Line],
               rounds: int) -> dict[str, tuple[float, float]]:
    """µs per call (p50, p99) of the reader and of the bare baseline, rounds interleaved.

    The Context is built outside the timed span for both (a caller builds one per conversation);
    the baseline is `str.lower` on the same text, the least any reader of the text must cost.
    """
    contexts = [_context(Context, line) for line in lines]
    samples: dict[str, list[int]] = {"understand": [], "str.lower": []}
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for line, context in zip(lines, contexts):
            text = line.text
            start = clock()
            text.lower()
            samples["str.lower"].append(clock() - start)
            start = clock()
            try:
                understand(text, context)
            except Exception:  # noqa: BLE001, S110 - already reported by read_all; still a call's cost
                pass
            samples["understand"].append(clock() - start)
    return {name: (_percentile(values, 0.5), _percentile(values, 0.99)) for name, values in samples.items()}


def machine() -> str:
    """nproc, CPU model and Python, in one line."""
    cpu_model = "unknown"
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                cpu_model = row.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} CPU ({cpu_model}), {platform.python_implementation()} {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def _reading(line: Line) -> str:
    if line.error:
        return line.error
    shown = {k: v for k, v in line.fields.items() if v is not None}
    return f"{line.intent} {json.dumps(shown, ensure_ascii=False)}"


def _expected(line: Line) -> str:
    shown = {k: line.expected[k] for k in ("date", "time", "period", *EXTRA_FIELDS)
             if line.expected.get(k) is not None}
    return f"{line.expected['intent']} {json.dumps(shown, ensure_ascii=False)}"


def report(lines: list[Line], figures: dict[str, Any], timing: dict[str, tuple[float, float]] | None,
           corpus: Path, show_misses: bool) -> None:
    """Print the tables."""
    print(f"corpus   {corpus.relative_to(ROOT) if corpus.is_relative_to(ROOT) else corpus}: {len(lines)} lines; "
          f"clock {NOW.isoformat()} ({NOW:%A}), appointment {APPOINTMENT_AT.isoformat()} ({APPOINTMENT_AT:%A})")
    print()
    print(f"{'intent':<12} {'n':>5} {'correct':>8} {'accuracy':>9}")
    total = correct = 0
    for intent, (n, ok) in figures["per_intent"].items():
        print(f"{intent:<12} {n:>5} {ok:>8} {_pct(ok, n):>9}")
        total, correct = total + n, correct + ok
    print(f"{'overall':<12} {total:>5} {correct:>8} {_pct(correct, total):>9}   (aim ≥ {AIMS['intent']:.0f} %)")
    print()
    print(f"{'field':<17} {'n':>5} {'correct':>8} {'accuracy':>9} {'spurious':>9}")
    for name, row in figures["fields"].items():
        spurious = str(len(row["spurious"])) if name in ("date", "time", "period") else ""
        aim = f"   (aim ≥ {AIMS[name]:.0f} %)" if name in AIMS else ""
        print(f"{name:<17} {row['n']:>5} {row['correct']:>8} {_pct(row['correct'], row['n']):>9} {spurious:>9}{aim}")
    print("(a field is scored on the lines that expect a value; spurious: a value where the line expects none)")
    print()
    critical = figures["critical"]
    print(f"critical errors: {len(critical)}   (aim 0)")
    for line in critical:
        print(f"  line {line.number}: {line.text!r}: expected {line.expected['intent']}, got {line.intent}")
    if figures["errors"]:
        print(f"exceptions: {len(figures['errors'])}")
        for line in figures["errors"]:
            print(f"  line {line.number}: {line.text!r}: {line.error}")
    if figures["confusion"]:
        print()
        print("confusion (expected → got: count)")
        for (expected, got), count in figures["confusion"].most_common():
            marker = "  CRITICAL" if (expected, got) in CRITICAL else ""
            print(f"  {expected:>10} → {got:<10} {count:>4}{marker}")
    if show_misses:
        print()
        print("intent misses")
        for line in figures["mistakes"]:
            print(f"  {line.number:>4} {line.text!r}: expected {_expected(line)}, got {_reading(line)}")
        for name, row in figures["fields"].items():
            if not row["wrong"] and not row["spurious"]:
                continue
            print(f"{name} misses")
            for line in row["wrong"]:
                print(f"  {line.number:>4} {line.text!r}: expected {line.expected[name]!r}, "
                      f"got {line.fields.get(name)!r}")
            for line in row["spurious"]:
                print(f"  {line.number:>4} {line.text!r}: expected none, got {line.fields.get(name)!r}")
    if timing:
        print()
        print(f"{'cost (µs/call)':<17} {'p50':>9} {'p99':>9}")
        for name, (p50, p99) in timing.items():
            print(f"{name:<17} {p50:>9.1f} {p99:>9.1f}")
    print()
    print(f"machine  {machine()}")


def main(argv: list[str] | None = None) -> int:
    """Score the reader on the corpus and print the report; always 0 (a measurement, not a test)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="JSONL corpus (default: %(default)s)")
    parser.add_argument("--show-misses", action="store_true", help="list every intent and field miss")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed passes over the corpus (0: no timing; default: %(default)s)")
    args = parser.parse_args(argv)
    reader = _import_reader()
    if reader is None:
        return 0
    understand, Context = reader
    corpus = args.corpus.resolve()
    lines = load_corpus(corpus)
    read_all(understand, Context, lines)
    figures = score(lines)
    timing = time_calls(understand, Context, lines, args.rounds) if args.rounds > 0 else None
    report(lines, figures, timing, corpus, args.show_misses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
