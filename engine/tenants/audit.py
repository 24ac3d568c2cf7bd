"""The audit trail: one `audit_log` row per write made through the API, the console or the CLI —
who (key or user) did what to which row — without secrets or personal data."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

from sqlalchemy import insert
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.store.models import audit_log

#: Fields whose values never go into the audit trail (only the fact that they changed).
REDACTED_FIELDS = frozenset({"name", "phone", "email", "text", "subject", "body", "key", "key_hash"})


def redact(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Changes as they may be stored: personal data and secrets become a marker."""
    out: dict[str, Any] = {}
    for field, value in changes.items():
        if field in REDACTED_FIELDS and value is not None:
            out[field] = "[redacted]"
        elif isinstance(value, datetime):
            out[field] = value.isoformat()
        else:
            out[field] = value
    return out


def audit(
    conn: Connection, *, org_id: int, action: str, entity: str, entity_id: int | None,
    changes: Mapping[str, Any] | None = None, api_key_id: int | None = None, user_id: int | None = None,
) -> None:
    """One audit_log row: who (key or user) did what to which row, without secrets or PII values."""
    conn.execute(insert(audit_log).values(
        org_id=org_id, user_id=user_id, api_key_id=api_key_id, action=action, entity=entity,
        entity_id=entity_id, changes=redact(changes) if changes else None, created_at=clock.now(),
    ))
