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
#: The marker a redacted value is stored as (the Auditoria page says it in words).
REDACTED = "[redacted]"
#: Records whose `name` (and, for a template, `key`: its purpose) is the clinic's own wording, not
#: anybody's personal data: a flow called "Retomar contato" stays readable in Auditoria. Table
#: names and the API's singular resource names both.
NAMED_THINGS = frozenset({
    "flows", "flow", "flow_pointers", "channels", "channel", "reminder_rules", "rule", "rules", "templates",
    "template", "agents", "agent", "api_keys", "api_key", "professionals", "professional", "fields", "field",
    "webhook_endpoints", "webhook_endpoint", "webhooks", "webhook", "orgs", "org",
})
#: Which of REDACTED_FIELDS a named thing keeps (an API key's `key` is a secret: never kept).
_KEPT = {"name"}
_KEPT_TEMPLATE = {"name", "key"}


def redact(changes: Mapping[str, Any], entity: str | None = None) -> dict[str, Any]:
    """Changes as they may be stored: personal data and secrets become a marker. A named thing's
    (a flow's, a channel's…) name is kept: it says which one changed and belongs to nobody."""
    kept = (_KEPT_TEMPLATE if entity in ("templates", "template") else _KEPT) if entity in NAMED_THINGS else set()
    out: dict[str, Any] = {}
    for field, value in changes.items():
        if field in REDACTED_FIELDS and field not in kept and value is not None:
            out[field] = REDACTED
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
        entity_id=entity_id, changes=redact(changes, entity) if changes else None, created_at=clock.now(),
    ))
