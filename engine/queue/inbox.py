"""The operator's inbox: things a person must look at (dead or unknown-outcome messages,
patient cancellations, broken channels)."""

from __future__ import annotations

from sqlalchemy import String, cast, literal, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.store.dialect import insert_ignore
from engine.store.models import inbox_items


def open_inbox_item(
    conn: Connection, org_id: int, kind: str, dedupe_key: str, *, detail: str,
    message_id: int | None = None, appointment_id: int | None = None,
    enrollment_id: int | None = None, channel_id: int | None = None,
) -> None:
    """Put something in front of the operator, once per `dedupe_key`. `detail` carries no PII."""
    conn.execute(
        insert_ignore(conn, inbox_items, ("org_id", "dedupe_key")).values(
            org_id=org_id, kind=kind, dedupe_key=dedupe_key, detail=detail, message_id=message_id,
            appointment_id=appointment_id, enrollment_id=enrollment_id, channel_id=channel_id,
            created_at=clock.now(),
        )
    )


def resolve_inbox_item(conn: Connection, org_id: int, item_id: int, user_id: int | None) -> bool:
    """Close one open item of the org; False when it is not open (or not the org's).

    Its dedupe key is given up (suffixed with the item's id), so the same problem happening
    again — a channel that breaks a second time — opens a new item instead of being swallowed
    by the resolved one."""
    result = conn.execute(
        update(inbox_items)
        .where(inbox_items.c.org_id == org_id, inbox_items.c.id == item_id, inbox_items.c.resolved_at.is_(None))
        .values(resolved_at=clock.now(), resolved_by=user_id,
                dedupe_key=inbox_items.c.dedupe_key + literal(":resolved:") + cast(inbox_items.c.id, String)))
    return result.rowcount == 1
