"""Ids in URLs, query strings and forms of the console and the webhooks (issue 9, point 8).

`valid_id` / `parse_id` say whether a value can be a row's id at all (1 … 2**63 - 1, ASCII
digits; the rule lives in engine.core.ids, which the webhook intake uses too): a page given anything
else answers 404 before the database sees it (SQLite cannot bind an int past 64 bits, PostgreSQL
answers "bigint out of range").
"""

from __future__ import annotations

from werkzeug.routing import IntegerConverter

from engine.core.ids import MAX_ID, parse_id, valid_id

__all__ = ["MAX_ID", "AsciiIntegerConverter", "parse_id", "valid_id"]


class AsciiIntegerConverter(IntegerConverter):
    """`<int:…>` in every route of the app: ASCII digits only. Werkzeug's own matches any Unicode
    digit, so `/templates/١٢` reached template 12 (Python's `int` reads Arabic-Indic digits)."""

    regex = r"[0-9]+"
