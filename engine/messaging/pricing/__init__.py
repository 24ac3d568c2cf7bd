"""What a Meta send costs (issue 34): the price table and the month's estimate.

The table is a CSV data file (`meta_prices.csv` beside this module: its header comments give the
source, the date the rates took effect and the currency), which ops may replace with a copy of
their own through LEMBRA_META_PRICES. A broken file is refused with one sentence saying the file,
the line and what is wrong (`PriceFileError`), never half read.

Every Meta send records its category (`price_category`: the template's at the WABA, or "service"
for the free text Lembra sends inside the 24 h customer-service window), whether it fell inside
that free window (`price_free`) and the recipient's country (`price_country`), when it is sent
(`billing_columns`). The estimate (`month_costs`) sums the sent messages of a month at the table's
rates: free ones cost nothing, a country the table does not price is counted apart.
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection

from engine.core.config import ConfigError
from engine.store.models import channels, enrollments, flow_pointers, messages

#: The table in the repo; LEMBRA_META_PRICES names an ops copy.
DEFAULT_FILE = Path(__file__).with_name("meta_prices.csv")
CATEGORIES = ("marketing", "utility", "authentication", "service")
#: Categories Meta does not charge inside an open customer-service window.
FREE_IN_WINDOW = frozenset({"service", "utility"})
COLUMNS = ("country", "currency", *CATEGORIES)
#: Statuses of a message Meta accepted (billed when delivered; sent is counted as the estimate's
#: upper bound, failed is not).
BILLED_STATUSES = ("sent", "delivered", "read")


class PriceFileError(ConfigError):
    """The price file cannot be read; the message names the file, the line and the fault."""


@dataclass(frozen=True)
class PriceTable:
    """Prices of one message by (country, category), in one currency."""

    currency: str
    prices: dict[str, dict[str, Decimal]]
    source: str

    def price(self, country: str | None, category: str) -> Decimal | None:
        """One message's price; None when neither the country nor `*` is in the table."""
        row = self.prices.get((country or "").upper()) or self.prices.get("*")
        return row.get(category) if row is not None else None


def parse(text: str, source: str) -> PriceTable:
    """The table in `text` (CSV, `#` comment lines); PriceFileError when it is not one."""
    def fail(line: int | None, what: str) -> PriceFileError:
        where = f"{source}, line {line}" if line else source
        return PriceFileError(f"Meta price file {where}: {what}")

    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise fail(None, "no header and no prices")
    rows = list(csv.reader(io.StringIO("\n".join(line for _, line in lines))))
    header = tuple(c.strip().lower() for c in rows[0])
    if header != COLUMNS:
        raise fail(lines[0][0], f"the header must be {','.join(COLUMNS)}")
    prices: dict[str, dict[str, Decimal]] = {}
    currency = ""
    for (number, _), row in zip(lines[1:], rows[1:]):
        if len(row) != len(COLUMNS):
            raise fail(number, f"{len(row)} values where {len(COLUMNS)} are expected")
        country, cur = row[0].strip().upper(), row[1].strip().upper()
        if not (country == "*" or (len(country) == 2 and country.isalpha())):
            raise fail(number, f"{country!r} is not a two-letter country code nor *")
        if len(cur) != 3 or not cur.isalpha():
            raise fail(number, f"{cur!r} is not a currency code")
        if currency and cur != currency:
            raise fail(number, f"currency {cur} where the file's first row says {currency}: one currency per file")
        currency = cur
        if country in prices:
            raise fail(number, f"{country} appears twice")
        values: dict[str, Decimal] = {}
        for name, raw in zip(CATEGORIES, row[2:]):
            try:
                value = Decimal(raw.strip())
            except InvalidOperation:
                raise fail(number, f"{name} price {raw.strip()!r} is not a number") from None
            if not value.is_finite() or value < 0:
                raise fail(number, f"{name} price {raw.strip()!r} is not a price")
            values[name] = value
        prices[country] = values
    if not prices:
        raise fail(None, "no prices under the header")
    return PriceTable(currency=currency, prices=prices, source=source)


_cache: dict[tuple[str, float], PriceTable] = {}


def load(path: str | os.PathLike[str] | None = None) -> PriceTable:
    """The price table of `path` (an ops copy), else the repo's; read again when the file changes."""
    file = Path(path) if path else DEFAULT_FILE
    try:
        stamp = file.stat().st_mtime
        key = (str(file), stamp)
        if key not in _cache:
            _cache.clear()
            _cache[key] = parse(file.read_text(encoding="utf-8"), str(file))
        return _cache[key]
    except PriceFileError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise PriceFileError(f"Meta price file {file}: cannot be read ({type(exc).__name__})") from None


# --- what a send records ----------------------------------------------------------------------------

#: An E.164 number as Lembra stores it: `+`, then 8 to 15 digits.
_E164 = re.compile(r"\+[1-9]\d{7,14}")


def country_of(phone: str | None) -> str | None:
    """The ISO country of an E.164 phone (the rate Meta applies is the recipient's country's)."""
    if not phone:
        return None
    import phonenumbers  # the dependency gateway.phones already has (imported here: only Meta sends need it)

    if _E164.fullmatch(phone):
        # A calling code is a prefix of one to three digits, and most name one country (55: BR):
        # then the number need not be parsed (a third of a Meta send's checks, profiled).
        for length in (1, 2, 3):
            regions = phonenumbers.COUNTRY_CODE_TO_REGION_CODE.get(int(phone[1:1 + length]))
            if regions is not None:
                if len(regions) == 1:
                    return regions[0] if regions[0] not in ("ZZ", "001") else None
                break
    try:
        region = phonenumbers.region_code_for_number(phonenumbers.parse(phone, None))
    except phonenumbers.NumberParseException:
        return None
    return region if region and region not in ("ZZ", "001") else None  # 001: no country (+800, +882…)


def billing_columns(template_category: str | None, conversation_open: bool, phone: str | None) -> dict[str, Any]:
    """The `messages` columns one Meta send records. Inside the window Lembra sends its own text
    ("service", free); outside it the template goes, billed at its category (utility when the
    WABA's category is not known yet: reminders are utility templates)."""
    if conversation_open:
        category = "service"
    else:
        category = (template_category or "UTILITY").lower()
        if category not in CATEGORIES:
            category = "utility"
    return {"price_category": category, "price_free": conversation_open and category in FREE_IN_WINDOW,
            "price_country": country_of(phone)}


# --- the month's estimate ---------------------------------------------------------------------------

@dataclass
class Cost:
    """An estimate: the sum, the messages counted, how many were free, how many had no price."""

    total: Decimal = Decimal(0)
    messages: int = 0
    free: int = 0
    unpriced: int = 0
    runs: int = 0

    def add(self, table: PriceTable, category: str, free: bool, country: str | None, count: int) -> None:
        self.messages += count
        if free:
            self.free += count
            return
        price = table.price(country, category)
        if price is None:
            self.unpriced += count
        else:
            self.total += price * count

    @property
    def per_run(self) -> Decimal | None:
        return self.total / self.runs if self.runs else None


@dataclass
class MonthCosts:
    """The month's estimate for an org: in all, per channel and per flow (pointer id)."""

    currency: str
    start: datetime
    end: datetime
    total: Cost = field(default_factory=Cost)
    by_channel: dict[int, Cost] = field(default_factory=dict)
    channel_names: dict[int, str] = field(default_factory=dict)
    by_flow: dict[int, Cost] = field(default_factory=dict)


def month_bounds(now: datetime, timezone: str) -> tuple[datetime, datetime]:
    """The org's current calendar month, as UTC instants [start, end)."""
    tz = ZoneInfo(timezone)
    local = now.astimezone(tz)
    start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start.astimezone(ZoneInfo("UTC")), end.astimezone(ZoneInfo("UTC"))


def month_costs(conn: Connection, org_id: int, table: PriceTable, now: datetime, timezone: str) -> MonthCosts:
    """The estimated cost of the org's Meta sends in its current month, from what each send
    recorded (messages without a recorded category — not Meta's — are not counted)."""
    start, end = month_bounds(now, timezone)
    m = messages.c
    result = MonthCosts(currency=table.currency, start=start, end=end)
    rows = conn.execute(
        select(m.channel_id, flow_pointers.c.id.label("flow_id"), m.price_category, m.price_free, m.price_country,
               func.count().label("n"))
        .select_from(messages.outerjoin(enrollments, and_(enrollments.c.org_id == m.org_id,
                                                          enrollments.c.id == m.enrollment_id))
                     .outerjoin(flow_pointers, and_(flow_pointers.c.org_id == m.org_id,
                                                    flow_pointers.c.id == enrollments.c.pointer_id)))
        .where(m.org_id == org_id, m.price_category.is_not(None), m.status.in_(BILLED_STATUSES),
               m.sent_at >= start, m.sent_at < end)
        .group_by(m.channel_id, flow_pointers.c.id, m.price_category, m.price_free, m.price_country)).all()
    for row in rows:
        free = bool(row.price_free)
        result.total.add(table, row.price_category, free, row.price_country, row.n)
        if row.channel_id is not None:
            result.by_channel.setdefault(row.channel_id, Cost()).add(table, row.price_category, free,
                                                                     row.price_country, row.n)
        if row.flow_id is not None:
            result.by_flow.setdefault(row.flow_id, Cost()).add(table, row.price_category, free,
                                                               row.price_country, row.n)
    if result.by_flow:  # the runs each flow's billed sends belong to: one grouped read for every flow
        runs = conn.execute(
            select(enrollments.c.pointer_id, func.count(func.distinct(m.enrollment_id)))
            .select_from(messages.join(enrollments, and_(enrollments.c.org_id == m.org_id,
                                                         enrollments.c.id == m.enrollment_id)))
            .where(m.org_id == org_id, enrollments.c.pointer_id.in_(list(result.by_flow)),
                   m.price_category.is_not(None), m.status.in_(BILLED_STATUSES), m.sent_at >= start,
                   m.sent_at < end)
            .group_by(enrollments.c.pointer_id)).all()
        for flow_id, count in runs:
            result.by_flow[flow_id].runs = int(count)
    if result.by_channel:
        result.channel_names = {r.id: r.name for r in conn.execute(
            select(channels.c.id, channels.c.name).where(channels.c.org_id == org_id,
                                                        channels.c.id.in_(list(result.by_channel))))}
    return result


def money(value: Decimal, currency: str) -> str:
    """A sum as the Painel shows it: US$ 1,23 (pt-BR decimal comma), R$ for BRL."""
    symbol = {"USD": "US$", "BRL": "R$"}.get(currency, currency)
    return f"{symbol} {value.quantize(Decimal('0.01')):,.2f}".replace(",", "X").replace(".", ",").replace("X", ".")
