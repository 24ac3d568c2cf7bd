"""Dates, times and periods of the day in a normalised reply, resolved against now and the
appointment (conventions in docs/understanding.md).

dateparser's Portuguese data reads the written dates ("12 de dezembro", "12/12/2026"); what it
lacks is here: weekday resolution, "semana que vem", "dia 12", "daqui a 15 dias", "fim do mês",
periods of the day, hours said the Brazilian way ("3 da tarde"), ranges and exclusions. Every
pattern is linear and runs over at most a normalised MAX_CHARS, so a hostile text stays cheap."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

__all__ = ["WEEKDAYS", "Mention", "When", "read_when"]

WEEKDAYS = ("segunda", "terca", "quarta", "quinta", "sexta", "sabado", "domingo")  # Monday = 0
PERIODS = {"morning": ("06:00", "12:00"), "afternoon": ("12:00", "18:00"), "evening": ("18:00", "23:00")}
_NUMBERS = {
    "um": 1, "uma": 1, "dois": 2, "duas": 2, "tres": 3, "quatro": 4, "cinco": 5, "seis": 6, "sete": 7,
    "oito": 8, "nove": 9, "dez": 10, "onze": 11, "doze": 12, "quinze": 15, "vinte": 20, "trinta": 30,
}
_NUM = r"(\d{1,3}|" + "|".join(_NUMBERS) + r")"
_NEGATORS = frozenset({"nao", "nem", "nunca", "menos", "exceto", "tirando", "fora"})
# A word that ends a negation's reach looking back: "sexta não dá, só segunda" offers Monday.
_SCOPE_BREAKS = frozenset({"so", "somente", "apenas", "mas", "pode", "prefiro", "melhor", "quero", "sim", "e"})
_MONTHS = ("janeiro|fevereiro|marco|abril|maio|junho|julho|agosto|setembro|outubro|novembro|dezembro|"
           "jan|fev|mar|abr|mai|jun|jul|ago|set|out|nov|dez")

_DEPOIS_DE_AMANHA = re.compile(r"\bdepois de amanha\b")
_AMANHA = re.compile(r"\bamanha\b")
_HOJE = re.compile(r"\bhoje\b")
_NEXT_WEEK = re.compile(r"\b(?:semana que vem|proxima semana|semana seguinte|outra semana)\b")
_WEEKDAY = re.compile(r"\b(segunda|terca|quarta|quinta|sexta|sabado|domingo)\b(?! (?:opcao|vez|via))")
_EXCLUDE = re.compile(r"\b(?:menos|exceto|tirando|fora|sem ser|so nao|nao pode ser|nao posso)"
                      r"((?: (?:na|no|a|o|de|e|nem|ou|segunda|terca|quarta|quinta|sexta|sabado|domingo)){1,14})")
_WRITTEN_DATE = re.compile(r"\b(\d{1,2}) de (" + _MONTHS + r")\b(?: de (\d{4}))?")
_SLASH_DATE = re.compile(r"\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b")
_DAY_N = re.compile(r"\bdia (\d{1,2})\b")
_IN_N = re.compile(r"\b(?:daqui a|daqui|em|dentro de) " + _NUM + r" (dias?|semanas?|mes|meses)\b")
_END_OF_MONTH = re.compile(r"\b(?:fim|final) do mes\b")
_SAME_DAY = re.compile(r"\bmesmo dia\b")
_SAME_TIME = re.compile(r"\bmesmo horario\b")

_HOUR = r"(\d{1,2}|" + "|".join(k for k, v in _NUMBERS.items() if v <= 12) + r")"
_TIME_HM = re.compile(r"\b(\d{1,2})(?:h(\d{2})?|:(\d{2}))(?=\s|$)")
_TIME_SAID = re.compile(r"\b" + _HOUR + r"(?: e (meia|quinze|\d{2}))? (?:da|de|pela) (manha|tarde|noite)\b")
_TIME_AS = re.compile(r"\b(?:as|a partir das|depois das|antes das|umas|por volta das) " + _HOUR
                      + r"(?: e (meia|quinze|\d{2}))?\b(?!/)")
_NOON = re.compile(r"\bmeio dia(?: e meia)?\b")
_RANGE = re.compile(r"\b(?:entre|das|de) (?:as )?(\d{1,2})(?:h(\d{2})?|:(\d{2}))?"
                    r" (?:e|as|a|ate) (?:as )?(\d{1,2})(?:h(\d{2})?|:(\d{2}))?(?: (?:da|de) (manha|tarde|noite))?\b")
_LATE_AFTERNOON = re.compile(r"\b(?:fim|final) (?:da|de) tarde\b")
_AFTER_LUNCH = re.compile(r"\b(?:depois|apos) (?:do|o) almoco\b")
_BEFORE_LUNCH = re.compile(r"\bantes do almoco\b")
_MORNING = re.compile(r"(?<!bom dia )\b(?:manha|manhazinha|cedinho)\b")
_AFTERNOON = re.compile(r"(?<!boa )(?<!mais )\btarde(?:zinha)?\b")
_EVENING = re.compile(r"(?<!boa )(?<!meia )\bnoite\b")


@dataclass
class Mention:
    """One thing the reply says about when: where it stands and whether it is refused."""

    kind: str          # "date", "time", "period", "range", "weekday", "next_week"
    value: Any
    clause: int
    start: int
    negated: bool = False


@dataclass
class When:
    """What a reply says about when, resolved."""

    date: str | None = None
    time: str | None = None
    period: str | None = None
    time_range: list[str] | None = None
    exclude_weekdays: list[int] = field(default_factory=list)
    #: Something positive was said about when (a date, a time, a period or a range).
    said: bool = False
    #: Only refused mentions ("amanhã não posso").
    refused: bool = False

    def fields(self) -> dict[str, Any]:
        """The contract's fields: date, time and period always, the others when found."""
        out: dict[str, Any] = {"date": self.date, "time": self.time, "period": self.period}
        if self.time_range:
            out["time_range"] = self.time_range
        if self.exclude_weekdays:
            out["exclude_weekdays"] = sorted(set(self.exclude_weekdays))
        return out


def _number(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBERS[word]


def _minutes(word: str | None) -> int:
    if not word:
        return 0
    return {"meia": 30, "quinze": 15}.get(word) or int(word)


def _clock(hour: int, minute: int, period: str | None, bare: bool) -> str | None:
    """HH:MM, with Brazilian habits: "3 da tarde" is 15:00; a bare "às 3" in a clinic is 15:00."""
    if (period in ("tarde", "noite") and 1 <= hour < 12) or (bare and period is None and 1 <= hour <= 6):
        hour += 12
    if not (0 <= hour <= 23 and 0 <= minute <= 59):
        return None
    return f"{hour:02d}:{minute:02d}"


def _negated(tokens: list[str], index: int, span: int) -> bool:
    """A mention is refused when a negator comes before it in its clause (up to a scope break) or
    within the two words after it ("amanhã não", "sexta não dá")."""
    for token in reversed(tokens[max(0, index - 4):index]):
        if token in _SCOPE_BREAKS:
            break
        if token in _NEGATORS:
            return True
    return any(t in _NEGATORS for t in tokens[index + span:index + span + 2])


def _token_index(clause: str, position: int) -> int:
    return clause.count(" ", 0, position)


def _written(text: str, today: date) -> date | None:
    """A written date ("12 de dezembro", "12/12") through dateparser's Portuguese data: this
    year's, or next year's when it has passed and no year was written."""
    # Imported on first use: most replies carry no written date.
    import dateparser

    parsed = dateparser.parse(text, languages=["pt"], settings={
        "DATE_ORDER": "DMY", "PREFER_DATES_FROM": "future", "REQUIRE_PARTS": ["day", "month"],
        "RELATIVE_BASE": datetime(today.year, today.month, today.day, 12)})
    if parsed is None:
        return None
    result = parsed.date()
    if result < today and not re.search(r"\d{4}|/\d{2,4}$", text):
        result = _add_years(result, 1)
    return result


def _add_years(day: date, years: int) -> date:
    try:
        return day.replace(year=day.year + years)
    except ValueError:  # 29 February
        return day.replace(year=day.year + years, day=28)


def _add_months(day: date, months: int) -> date:
    month0 = day.month - 1 + months
    year, month = day.year + month0 // 12, month0 % 12 + 1
    return date(year, month, min(day.day, calendar.monthrange(year, month)[1]))


def _next_day_n(today: date, n: int) -> date | None:
    for months in range(3):  # the 31st skips the short months
        first = _add_months(today.replace(day=1), months)
        if n <= calendar.monthrange(first.year, first.month)[1]:
            candidate = first.replace(day=n)
            if candidate >= today:
                return candidate
    return None


def _scan(clause: str, index: int, today: date, appointment: datetime | None) -> list[Mention]:
    """Every mention in one clause, in order; a span a longer pattern read is not read again."""
    mentions: list[Mention] = []
    taken: list[tuple[int, int]] = []

    def free(match: re.Match[str]) -> bool:
        return not any(a < match.end() and match.start() < b for a, b in taken)

    def add(kind: str, value: Any, match: re.Match[str]) -> None:
        taken.append((match.start(), match.end()))
        mentions.append(Mention(kind, value, index, match.start()))

    for match in _EXCLUDE.finditer(clause):
        days = [WEEKDAYS.index(w) for w in match.group(1).split() if w in WEEKDAYS]
        if days:
            add("exclude", days, match)
    for match in _DEPOIS_DE_AMANHA.finditer(clause):
        if free(match):
            add("date", today + timedelta(days=2), match)
    for pattern, days in ((_AMANHA, 1), (_HOJE, 0)):
        for match in pattern.finditer(clause):
            if free(match):
                add("date", today + timedelta(days=days), match)
    for match in _WRITTEN_DATE.finditer(clause):
        if free(match) and (found := _written(match.group(), today)):
            add("date", found, match)
    for match in _SLASH_DATE.finditer(clause):
        if free(match) and (found := _written(match.group(), today)):
            add("date", found, match)
    for match in _DAY_N.finditer(clause):
        if free(match) and (found := _next_day_n(today, int(match.group(1)))):
            add("date", found, match)
    for match in _IN_N.finditer(clause):
        if free(match):
            n, unit = _number(match.group(1)), match.group(2)
            if unit.startswith("dia") and n <= 400:
                add("date", today + timedelta(days=n), match)
            elif unit.startswith("semana") and n <= 60:
                add("date", today + timedelta(weeks=n), match)
            elif n <= 12:
                add("date", _add_months(today, n), match)
    for match in _END_OF_MONTH.finditer(clause):
        if free(match):
            last = today.replace(day=calendar.monthrange(today.year, today.month)[1])
            if last == today:
                nxt = _add_months(today.replace(day=1), 1)
                last = nxt.replace(day=calendar.monthrange(nxt.year, nxt.month)[1])
            add("date", last, match)
    if appointment is not None:
        for match in _SAME_DAY.finditer(clause):
            add("date", appointment.date(), match)
        for match in _SAME_TIME.finditer(clause):
            add("time", appointment.strftime("%H:%M"), match)
    for match in _NEXT_WEEK.finditer(clause):
        if free(match):
            add("next_week", None, match)
    for match in _WEEKDAY.finditer(clause):
        if free(match):
            add("weekday", WEEKDAYS.index(match.group(1)), match)
    # Times of day: ranges first, then the longer spellings, then the bare ones.
    for match in _RANGE.finditer(clause):
        if free(match):
            said = match.group(7)
            first = _clock(int(match.group(1)), _minutes(match.group(2) or match.group(3)), said, True)
            last = _clock(int(match.group(4)), _minutes(match.group(5) or match.group(6)), said, True)
            if first and last and first < last:
                add("range", [first, last], match)
    for match in _LATE_AFTERNOON.finditer(clause):
        if free(match):
            add("period", "afternoon", match)
            mentions.append(Mention("range", ["16:00", "18:00"], index, match.start()))
    for match in _NOON.finditer(clause):
        if free(match):
            add("time", "12:30" if match.group().endswith("meia") else "12:00", match)
    for match in _TIME_SAID.finditer(clause):
        if free(match):
            said = match.group(3)
            clock = _clock(_number(match.group(1)), _minutes(match.group(2)), said, False)
            if clock:  # the hour says it all: "3 da tarde" is 15:00, no period besides
                add("time", clock, match)
    for match in _TIME_HM.finditer(clause):
        if free(match):
            clock = _clock(int(match.group(1)), _minutes(match.group(2) or match.group(3)), None, True)
            if clock:
                add("time", clock, match)
    for match in _TIME_AS.finditer(clause):
        if free(match):
            clock = _clock(_number(match.group(1)), _minutes(match.group(2)), None, True)
            if clock:
                add("time", clock, match)
    for pattern, period in ((_AFTER_LUNCH, "afternoon"), (_BEFORE_LUNCH, "morning"), (_MORNING, "morning"),
                            (_AFTERNOON, "afternoon"), (_EVENING, "evening")):
        for match in pattern.finditer(clause):
            if free(match):
                add("period", period, match)
    mentions.sort(key=lambda m: m.start)
    tokens = clause.split()
    for mention in mentions:
        if mention.kind != "exclude":
            mention.negated = _negated(tokens, _token_index(clause, mention.start), 1)
    return mentions


def read_when(clauses: tuple[str, ...], now: datetime, appointment: datetime | None) -> When:
    """Resolve what the clauses say about when; ``now`` and ``appointment`` are in the org's
    timezone. The last positive mention of each kind wins ("quarta não, sexta" is Friday)."""
    today = now.date()
    mentions = [m for i, clause in enumerate(clauses) for m in _scan(clause, i, today, appointment)]
    when = When()
    positive = [m for m in mentions if not m.negated and m.kind != "exclude"]
    for mention in mentions:
        if mention.kind == "exclude":
            when.exclude_weekdays.extend(mention.value)
        elif mention.kind == "weekday" and mention.negated:
            when.exclude_weekdays.append(mention.value)

    def last(kind: str) -> Mention | None:
        found = [m for m in positive if m.kind == kind]
        return found[-1] if found else None

    time_m, period_m, range_m = last("time"), last("period"), last("range")
    date_m, weekday_m, next_week = last("date"), last("weekday"), last("next_week")
    if time_m:
        when.time = time_m.value
    if range_m:
        when.time_range = range_m.value
    if period_m:
        when.period = period_m.value
    chosen: date | None = None
    if weekday_m is not None and (date_m is None or weekday_m.start > date_m.start or weekday_m.clause > date_m.clause):
        weekday = weekday_m.value
        if next_week is not None:
            monday = today + timedelta(days=7 - today.weekday())
            chosen = monday + timedelta(days=weekday)
        else:
            ahead = (weekday - today.weekday()) % 7
            later_today = ahead == 0 and when.time is not None and when.time > now.strftime("%H:%M")
            chosen = today + timedelta(days=ahead if ahead or later_today else 7)
    elif date_m is not None:
        chosen = date_m.value
    elif next_week is not None:
        chosen = today + timedelta(days=7 - today.weekday())
    if chosen is not None:
        when.date = chosen.isoformat()
    when.said = any(m.kind in ("date", "weekday", "next_week", "time", "period", "range") for m in positive)
    when.refused = not when.said and any(m.negated for m in mentions)
    return when
