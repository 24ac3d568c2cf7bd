"""Free times from the clinic's own system: the availability webhook (docs/agenda.md).

`GET <availability_url>?date_from=&date_to=&period=&time=&exclude_weekdays=&professional=&limit=`
through the egress guard, within a short timeout; the answer must be JSON
`{"slots": [{"starts_at": ISO with offset, "ends_at": ISO with offset, "professional": text|null}]}`.
An answer of any other shape is refused whole; slots that break the query's constraints (the past,
the lead time, the horizon, the days, the period, the excluded weekdays, another professional than
the one asked; a slot with professional null is kept) are dropped one by one. A failure is an `AvailabilityUnavailable`, transient (timeout, no connection,
HTTP 5xx/429) or permanent (another HTTP status, an unusable answer, an address the guard refuses),
with a catalogue sentence; the caller (a flow's `unavailable` exit) decides what follows.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from engine.people.agenda.errors import AgendaError
from engine.people.agenda.query import Bounds, Slot, SlotQuery, fits, spread
from engine.words.catalogue import describe
from engine.words.texts import Text
from gateway.egress import STRICT, EgressPolicy, EgressRefused, InvalidAddress, check_saved_url
from gateway.errors import ProviderError
from gateway.http import Client, call

log = logging.getLogger(__name__)

#: The clinic's system answers within this, or the search fails (a patient is waiting on WhatsApp).
DEFAULT_TIMEOUT = 5.0
#: An answer of free times is a few kB; past this it is not one.
MAX_ANSWER_BYTES = 256 * 1024
#: Slots read from one answer at most (the rest ignored): the spread needs only a few.
MAX_SLOTS = 500


class AvailabilityUnavailable(Exception):
    """The clinic's system could not give free times. `permanent`: asking again will not help
    until someone fixes the address or the system; `code` is the catalogue's."""

    def __init__(self, code: str, *, permanent: bool, **params: Any) -> None:
        self.code = code
        self.permanent = permanent
        self.params = params
        self.text: Text = describe(code, **params)
        super().__init__(str(self.text))


def check_url(url: str | None, egress: EgressPolicy | None) -> str | None:
    """An availability URL as it may be saved (None or "" clears it): http(s), no credentials,
    and with `egress` not resolving inside the network. AgendaError otherwise."""
    if url is None or not url.strip():
        return None
    url = url.strip()
    try:
        check_saved_url(url, egress)
    except InvalidAddress:
        raise AgendaError("agenda_url", "availability_url") from None
    except EgressRefused as exc:
        raise AgendaError("agenda_url_refused", "availability_url", host=exc.host) from None
    return url


def request_params(query: SlotQuery, limits: Bounds, professional: str | None) -> dict[str, Any]:
    """The query string the clinic's system receives (absent constraints left out)."""
    params: dict[str, Any] = {"date_from": limits.first_day.isoformat(), "date_to": limits.last_day.isoformat(),
                              "period": query.period, "time": query.time,
                              "exclude_weekdays": ",".join(str(d) for d in query.exclude_weekdays) or None,
                              "professional": professional, "limit": query.limit}
    return {k: v for k, v in params.items() if v is not None}


def _instant(value: Any, index: int, name: str) -> datetime:
    if not isinstance(value, str):
        raise AvailabilityUnavailable("availability_bad_answer", permanent=True, detail=f"slots[{index}].{name}")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise AvailabilityUnavailable("availability_bad_answer", permanent=True,
                                      detail=f"slots[{index}].{name}") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise AvailabilityUnavailable("availability_bad_answer", permanent=True,
                                      detail=f"slots[{index}].{name}: no UTC offset")
    return parsed


def parse_answer(body: Any) -> list[Slot]:
    """The slots of an answer, strictly: an object with a list `slots` whose items each have
    `starts_at` and `ends_at` (ISO 8601 with an offset, ends after starts) and `professional`
    (text or null). AvailabilityUnavailable (permanent) naming the first problem otherwise."""
    if not isinstance(body, dict) or not isinstance(body.get("slots"), list):
        raise AvailabilityUnavailable("availability_bad_answer", permanent=True, detail="slots")
    out: list[Slot] = []
    for index, item in enumerate(body["slots"][:MAX_SLOTS]):
        if not isinstance(item, dict) or not {"starts_at", "ends_at", "professional"} <= set(item):
            raise AvailabilityUnavailable("availability_bad_answer", permanent=True, detail=f"slots[{index}]")
        starts, ends = _instant(item["starts_at"], index, "starts_at"), _instant(item["ends_at"], index, "ends_at")
        if ends <= starts:
            raise AvailabilityUnavailable("availability_bad_answer", permanent=True,
                                          detail=f"slots[{index}].ends_at")
        who = item["professional"]
        if who is not None and (not isinstance(who, str) or len(who) > 200):
            raise AvailabilityUnavailable("availability_bad_answer", permanent=True,
                                          detail=f"slots[{index}].professional")
        out.append(Slot(starts_at=starts, ends_at=ends, professional=who.strip() if who else None))
    return out


def webhook_slots(url: str, query: SlotQuery, limits: Bounds, *, professional: str | None = None,
                  egress: EgressPolicy = STRICT, timeout: float = DEFAULT_TIMEOUT) -> list[Slot]:
    """Ask the clinic's system for free times and keep those that meet the query, spread as the
    built-in agenda's are, in the org's timezone. AvailabilityUnavailable when it cannot answer."""
    client = Client(egress)
    try:
        response = call(client, "GET", url, timeout=timeout, params=request_params(query, limits, professional),
                        headers={"Accept": "application/json"}, max_bytes=MAX_ANSWER_BYTES)
    except EgressRefused as exc:
        raise AvailabilityUnavailable("availability_refused", permanent=True, host=exc.host) from None
    except ProviderError as exc:
        # Logged by code only: the clinic's URL may carry a token, the answer a patient's name.
        log.warning("availability webhook failed", extra={"code": exc.code})
        raise _unavailable(exc, timeout) from None
    finally:
        client.close()
    if not isinstance(response.body, (dict, list)):
        raise AvailabilityUnavailable("availability_bad_answer", permanent=True, detail="JSON")
    wanted = professional.strip().casefold() if professional else None
    slots = [Slot(s.starts_at.astimezone(limits.zone), s.ends_at.astimezone(limits.zone), s.professional)
             for s in parse_answer(response.body)]
    # A slot of no one in particular (professional null) is the clinic's answer to the name it was sent.
    kept = [s for s in slots if fits(s, query, limits)
            and (wanted is None or s.professional is None or s.professional.casefold() == wanted)]
    return spread(kept, query, limits.zone)


def _unavailable(exc: ProviderError, timeout: float) -> AvailabilityUnavailable:
    code = exc.code or ""
    if code in ("timeout", "connect_timeout"):
        return AvailabilityUnavailable("availability_timeout", permanent=False, seconds=f"{timeout:g}")
    if code.startswith("http_") and code[5:].isdigit():
        return AvailabilityUnavailable("availability_http", permanent=exc.permanent, status=code[5:])
    if code == "provider_answer_too_large":
        return AvailabilityUnavailable("availability_bad_answer", permanent=True, detail="size")
    return AvailabilityUnavailable("availability_unreachable", permanent=exc.permanent)
