"""The checks every webhook body goes through before a provider reads it: it is bytes, it is not
larger than the provider ever sends, and it is the JSON the provider documents; and the cleaning
of what a body may carry that no database column can hold (NUL, unpaired surrogates, NaN)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gateway.errors import MalformedWebhook


def bounded(body: object, max_bytes: int) -> bytes:
    """The raw body, refused when it is not bytes or larger than `max_bytes`."""
    if not isinstance(body, (bytes, bytearray)):
        raise MalformedWebhook("body is not bytes")
    if len(body) > max_bytes:
        raise MalformedWebhook("body too large")
    return bytes(body)


def json_value(body: bytes) -> Any:
    """The body parsed as JSON (any value), cleaned (`clean_json`): no NUL, no unpaired surrogate,
    no NaN or Infinity reaches a provider's parser, nor what it hands the engine to store."""
    try:
        return clean_json(json.loads(body))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise MalformedWebhook("body is not JSON") from None


def json_object(body: bytes) -> dict[str, Any]:
    """The body parsed as a JSON object."""
    data = json_value(body)
    if not isinstance(data, dict):
        raise MalformedWebhook("body is not a JSON object")
    return data


# --- what a body may hold that no database column can (issue 9, point 8) ------------------------

#: Surrogate code points: in a decoded str they are always unpaired (json decodes a valid pair into
#: one character), and neither UTF-8 nor PostgreSQL can hold them.
_SURROGATES = re.compile("[\ud800-\udfff]")


def clean_text(value: str) -> str:
    """`value` as text columns can hold it: NUL characters dropped (PostgreSQL text and jsonb
    refuse them), unpaired surrogates replaced by U+FFFD."""
    if "\x00" in value:
        value = value.replace("\x00", "")
    return _SURROGATES.sub("\ufffd", value)


def clean_json(value: Any) -> Any:
    """A parsed JSON value that jsonb (and any text column) can store: every string and key
    through `clean_text`, NaN and ±Infinity (which Python's json reads, and JSON has not) as null."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    return value
