"""Free times offered to a patient and the one they pick. Pure: the `do` node reads and writes.

The times offered are kept on the run (`enrollments.ask_state`, tagged with the node visit like
an `ask`'s), so that only a time actually offered can be picked, and then booked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time
from typing import Any
from zoneinfo import ZoneInfo

from babel import Locale, UnknownLocaleError
from babel.dates import format_date

from engine.people.agenda import Slot, SlotQuery
from engine.words.understanding import Understanding


@dataclass(frozen=True)
class OfferState:
    """The node visit, the times offered in it (as `Slot.as_json`) and how many lists were sent."""

    visit: str
    offered: tuple[Mapping[str, Any], ...] = ()
    asks: int = 0

    @classmethod
    def of(cls, stored: Any, visit: str) -> "OfferState":
        """The stored state when it belongs to this visit, else a fresh one."""
        if not isinstance(stored, Mapping) or stored.get("visit") != visit:
            return cls(visit)
        offered = stored.get("offered")
        asks = stored.get("asks")
        return cls(visit, tuple(s for s in offered if isinstance(s, Mapping)) if isinstance(offered, list) else (),
                   asks if isinstance(asks, int) else 0)

    def as_json(self) -> dict[str, Any]:
        """The form stored on the run."""
        return {"visit": self.visit, "offered": [dict(s) for s in self.offered], "asks": self.asks}


def slot_of(stored: Mapping[str, Any]) -> Slot:
    """A slot back from its stored form."""
    return Slot(datetime.fromisoformat(stored["starts_at"]), datetime.fromisoformat(stored["ends_at"]),
                stored.get("professional"), stored.get("professional_id"))


def query_for(config: Mapping[str, Any], data: Mapping[str, Any], *, professional_id: int | None,
              reading: Understanding | None = None) -> SlotQuery:
    """The search the node makes: what the run collected (the node's date, period and time fields),
    or what the patient just asked for instead ("tem na quinta?"), for one professional or any."""
    wanted: dict[str, Any] = {
        "date": data.get(config["date_field"]) if config.get("date_field") else None,
        "period": data.get(config["period_field"]) if config.get("period_field") else None,
        "time": data.get(config["time_field"]) if config.get("time_field") else None,
    }
    excluded: tuple[int, ...] = ()
    if reading is not None:
        said = {key: reading.fields.get(key) for key in ("date", "period", "time")}
        if any(said.values()):
            wanted = said
        excluded = tuple(reading.fields.get("exclude_weekdays") or ())
    day = _date(wanted["date"])
    return SlotQuery(date_from=day, date_to=day, period=wanted["period"] if isinstance(wanted["period"], str) else None,
                     time=wanted["time"] if isinstance(wanted["time"], str) else None, exclude_weekdays=excluded,
                     professional_id=professional_id, limit=config["limit"])


def _date(value: Any) -> date | None:
    try:
        return date.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _locale(name: str | None) -> Locale:
    try:
        return Locale.parse((name or "pt_BR").replace("-", "_"))
    except (UnknownLocaleError, ValueError, TypeError):
        return Locale.parse("pt_BR")


def offer_text(slots: Sequence[Slot], *, intro: str, outro: str, timezone: str, locale: str | None) -> str:
    """The numbered list the patient answers: "1. sexta-feira, 11/12 às 09:00 (Dra. Ana)"."""
    zone, babel = ZoneInfo(timezone), _locale(locale)
    lines = [intro] if intro else []
    for number, slot in enumerate(slots, start=1):
        local = slot.starts_at.astimezone(zone)
        weekday = format_date(local.date(), "EEEE", locale=babel)
        line = f"{number}. {weekday}, {local:%d/%m} às {local:%H:%M}"
        lines.append(f"{line} ({slot.professional})" if slot.professional else line)
    if outro:
        lines.append(outro)
    return "\n".join(lines)


@dataclass(frozen=True)
class Pick:
    """What a reply to the list says: the slot picked, or another search wished for, or neither."""

    slot: Mapping[str, Any] | None = None
    search_again: bool = False
    reasons: tuple[str, ...] = field(default=())


def pick(reading: Understanding, offered: Sequence[Mapping[str, Any]], *, timezone: str) -> Pick:
    """The offered slot a reply names: by its number ("2", "a segunda"), or by its day and/or hour
    ("sexta 9h", "o das 14h") when exactly one offered slot has them. A day or period that matches
    none of them asks for another search; anything else picks nothing."""
    choice = reading.fields.get("choice")
    if isinstance(choice, int) and not isinstance(choice, bool):
        return Pick(offered[choice - 1]) if 1 <= choice <= len(offered) else Pick()
    zone = ZoneInfo(timezone)
    day, hour, period = reading.fields.get("date"), reading.fields.get("time"), reading.fields.get("period")
    if not (day or hour):
        return Pick(search_again=bool(period) or bool(reading.fields.get("exclude_weekdays")))

    def matches(stored: Mapping[str, Any]) -> bool:
        local = datetime.fromisoformat(stored["starts_at"]).astimezone(zone)
        return (day is None or local.date().isoformat() == day) and (
            hour is None or local.time() == time.fromisoformat(hour))

    found = [stored for stored in offered if matches(stored)]
    if len(found) == 1:
        return Pick(found[0])
    return Pick(search_again=not found)
