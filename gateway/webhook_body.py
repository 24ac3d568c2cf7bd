"""The checks every webhook body goes through before a provider reads it: it is bytes, it is not
larger than the provider ever sends, and it is the JSON the provider documents."""

from __future__ import annotations

import json
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
    """The body parsed as JSON (any value)."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise MalformedWebhook("body is not JSON") from None


def json_object(body: bytes) -> dict[str, Any]:
    """The body parsed as a JSON object."""
    data = json_value(body)
    if not isinstance(data, dict):
        raise MalformedWebhook("body is not a JSON object")
    return data
