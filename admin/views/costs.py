"""The month's estimated Meta cost as the console shows it (Painel, the flow list, a flow's page):
the price table named by LEMBRA_META_PRICES (else the repo's), or the sentence saying why it
cannot be read, never a half-read table (engine/messaging/pricing)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy.engine import Connection

from admin.i18n import translate
from admin.views.base import org_timezone, runtime
from engine.core import clock
from engine.messaging.pricing import MonthCosts, PriceFileError, load, money, month_costs
from engine.words.catalogue import describe


@dataclass
class Estimate:
    """The org's month, or `error` (a sentence) when the price table is broken."""

    costs: MonthCosts | None = None
    error: str | None = None

    def show(self, value: Decimal | None) -> str:
        """A sum in the table's currency ("—" when there is none)."""
        if value is None or self.costs is None:
            return "—"
        return money(value, self.costs.currency)


def estimate(conn: Connection, org_id: int) -> Estimate:
    """The org's estimated Meta cost this month (its time zone's calendar month)."""
    try:
        table = load(runtime().settings.meta_prices or None)
    except PriceFileError as exc:
        return Estimate(error=translate(describe("price_file_broken", error=str(exc))))
    return Estimate(costs=month_costs(conn, org_id, table, clock.now(), org_timezone()))


def unpriced_note(costs: Any) -> str | None:
    """The sentence saying how many messages had no price, or None."""
    if costs is None or not costs.total.unpriced:
        return None
    return translate(describe("price_unpriced", count=costs.total.unpriced))
