"""Understanding a patient's reply: ``understand(text, context) → Understanding`` (intent,
fields, confidence), built-in, deterministic and Portuguese first (docs/understanding.md).

normalise.py makes the text comparable, intents.py reads the keyword phrases and their negations,
when.py the dates, times and periods; this module weighs them into one intent."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from engine.words.understanding.intents import Signals, keyword_table, read_signals
from engine.words.understanding.normalise import MAX_CHARS, normalise
from engine.words.understanding.when import read_when

__all__ = ["MAX_CHARS", "STANDARD_INTENTS", "Context", "Understanding", "understand"]

STANDARD_INTENTS = ("confirm", "cancel", "reschedule", "opt_out", "human", "question", "other")

# The costly mistakes decide the order: an opt-out is never lost, a wish to come another day beats
# "não vou poder" (they still want the appointment), a cancel beats any confirm.
_PRECEDENCE = ("opt_out", "reschedule", "cancel", "human", "confirm", "question")
_ORDINALS = {"primeira": 1, "primeiro": 1, "segunda": 2, "segundo": 2, "terceira": 3, "terceiro": 3,
             "quarta": 4, "quarto": 4, "quinta": 5, "quinto": 5}
_CHOICE = re.compile(r"^(?:(?:a|o|opcao|numero|quero|quero a|quero o|prefiro a|prefiro o) )?(\d{1,2})$"
                     r"|^(?:(?:a|o|quero a|prefiro a) )?(primeira|primeiro|segunda|segundo|terceira|terceiro"
                     r"|quarta|quarto|quinta|quinto)(?: opcao)?$"
                     r"|\bopcao (\d{1,2})\b|\b(primeira|segunda|terceira|quarta|quinta) opcao\b")


@dataclass(frozen=True)
class Context:
    """What a reply is understood against."""

    now: datetime
    timezone: str = "America/Sao_Paulo"
    appointment_at: datetime | None = None
    intents: tuple[str, ...] = STANDARD_INTENTS
    pending: tuple[str, ...] = ()
    keywords: Mapping[str, Iterable[str]] | None = None

    def __post_init__(self) -> None:
        if self.now.tzinfo is None or self.now.utcoffset() is None:
            raise ValueError("Context.now must be an aware datetime")
        if self.appointment_at is not None and (self.appointment_at.tzinfo is None
                                                or self.appointment_at.utcoffset() is None):
            raise ValueError("Context.appointment_at must be an aware datetime")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown timezone {self.timezone!r}") from exc


@dataclass(frozen=True)
class Understanding:
    """What a reply means: an intent among the declared ones (or "other"), the fields found and
    how sure the reading is."""

    intent: str
    fields: dict[str, Any] = field(default_factory=lambda: {"date": None, "time": None, "period": None})
    confidence: float = 0.0
    engine: str = "builtin"
    llm_calls: int = 0

    def as_json(self) -> dict[str, Any]:
        """The JSON form the CLI prints and the bench compares."""
        return {"intent": self.intent, "fields": dict(self.fields), "confidence": round(self.confidence, 2),
                "engine": self.engine, "llm_calls": self.llm_calls}


def _choice(text: str) -> int | None:
    match = _CHOICE.search(text)
    if match is None:
        return None
    digits = match.group(1) or match.group(3)
    if digits:
        return int(digits)
    return _ORDINALS[match.group(2) or match.group(4)]


def _decide(signals: Signals, proposes_when: bool, declared: tuple[str, ...]) -> tuple[str, float]:
    found = dict(signals.found)
    if proposes_when and "reschedule" not in found and "opt_out" not in found:
        # A day or an hour offered ("dá pra ser sexta de manhã?") asks for another slot, unless a
        # plain yes confirms the one they have ("sim, quarta às 14h" is handled by the caller).
        found["reschedule"] = 0.7
    if "keep" in found and "confirm" not in found:
        found["confirm"] = found["keep"]
    mixed = len([k for k in found if k in _PRECEDENCE and k != "question"]) > 1
    for intent in _PRECEDENCE:
        if intent in found and intent in declared:
            confidence = found[intent] * (0.85 if mixed else 0.95)
            return intent, round(min(confidence, 0.99), 2)
    return "other", 0.3


def understand(text: str, context: Context) -> Understanding:
    """Understand a reply in its context (see the module and docs/understanding.md).

    :param text: the reply as received; only its first :data:`MAX_CHARS` characters are read.
    :param context: now, the org's timezone, the appointment, the declared intents, the pending
        fields and the org's keywords (which extend the built-in ones).
    :returns: the intent (one of ``context.intents`` or ``"other"``), the fields (``date``,
        ``time`` and ``period`` always; ``time_range``, ``exclude_weekdays`` and ``choice`` when
        found) and a confidence in 0..1.
    """
    if not isinstance(text, str):
        text = ""
    raw = text[:MAX_CHARS]
    zone = ZoneInfo(context.timezone)
    now = context.now.astimezone(zone)
    appointment = context.appointment_at.astimezone(zone) if context.appointment_at else None
    normal = normalise(raw)
    declared = tuple(context.intents)
    when = read_when(normal.clauses, now, appointment)
    fields = when.fields()
    whole = normal.text
    if "choice" in context.pending:
        choice = _choice(whole)
        if choice is not None:
            fields["choice"] = choice
            if fields["date"] is not None and re.fullmatch(r"(?:a |o )?\w+(?: opcao)?", whole):
                fields["date"] = None  # "a segunda" is the second option here, not Monday
            return Understanding("other", fields, 0.9)
    if whole in ("1", "2"):
        # Outside a menu the reminders' own digits (keywords.classify): 1 confirms, 2 cancels.
        intent = "confirm" if whole == "1" else "cancel"
        if intent in declared:
            return Understanding(intent, fields, 0.6)
    signals = read_signals(normal.clauses, raw, keyword_table(context.keywords))
    # Naming the appointment's own day or hour ("sim, quarta às 14h") proposes nothing new.
    same_as_appointment = appointment is not None and (fields["date"] or fields["time"]) is not None and (
        fields["date"] in (None, appointment.date().isoformat())
        and fields["time"] in (None, appointment.strftime("%H:%M"))
        and fields["period"] is None and "time_range" not in fields)
    offered = (when.said or "exclude_weekdays" in fields) and not same_as_appointment
    # A confirm with a day is read as a confirm ("confirmo sexta" when asked about Friday) unless it
    # also says no or asks: "não posso quarta, sexta?", "ok, mas tem como ser sexta?".
    proposes = offered and ("confirm" not in signals.found or "cancel" in signals.found or "?" in raw)
    intent, confidence = _decide(signals, proposes, declared)
    if not normal.text and intent == "other":
        confidence = 0.1
    return Understanding(intent, fields, confidence)
