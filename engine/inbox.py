"""The operator's inbox: things a person must look at (dead or unknown-outcome messages,
patient cancellations, broken channels)."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from engine import clock
from engine.dialect import insert_ignore
from engine.models import inbox_items


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
