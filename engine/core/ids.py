"""Row ids as the database holds them: a bigint identity, 1 … 2**63 - 1.

Anything else (a number beyond bigint, zero, a negative, text, "²", " 1") can be no row's id.
Comparing it with an id column would fail on the database instead (SQLite cannot bind an int past
64 bits; PostgreSQL refuses `bigint = varchar`), so callers check first and answer 404.
"""

from __future__ import annotations

import re
from typing import Any

#: The largest id a row can have (PostgreSQL BIGINT, SQLite INTEGER).
MAX_ID = 2**63 - 1
#: ASCII digits only, no sign, no leading zero ("²", "٣", "+1", "1_000" and " 1" are not ids).
_ID = re.compile(r"[1-9][0-9]{0,18}")


def parse_id(value: Any) -> int | None:
    """`value` (an int or its decimal text) as a row id, or None when no row can have it."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and _ID.fullmatch(value):
        number = int(value)
    else:
        return None
    return number if 0 < number <= MAX_ID else None


def valid_id(value: Any) -> bool:
    """Whether `value` can be a row's id (see `parse_id`)."""
    return parse_id(value) is not None
