"""The read side of follow-up flows, shared by the REST API and the CLI: flows with their active
version number and live enrollment counts, enrollments with the version number they pinned, and
a run's timeline. Every query is scoped by org; nothing here writes.

The timeline (`run_steps`) is built from the `enrollment_events` payloads, which hold codes,
node ids, counters and instants only: never a patient's text, name or address.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql import Select

from engine.words.catalogue import describe, known
from engine.flows import lifecycle
from engine.store.models import enrollment_events, enrollments, flow_pointers, flow_versions
from engine.words.texts import Text

#: Every status an enrollment can have, live ones first (the filters of the API and the CLI).
ENROLLMENT_STATUSES = (*lifecycle.LIVE, *lifecycle.TERMINAL)


# --- flows ----------------------------------------------------------------------------------------

def flows_query(org_id: int) -> Select[Any]:
    """The org's flows, each with `active_version` (the active version's number, or None)."""
    active = flow_versions.alias("active")
    return (
        select(flow_pointers, active.c.version.label("active_version"))
        .outerjoin(active, (active.c.id == flow_pointers.c.active_version_id) & (active.c.org_id == org_id))
        .where(flow_pointers.c.org_id == org_id)
    )


def find_flow(conn: Connection, org_id: int, flow_id: int) -> Any:
    """One of the org's flows as `flows_query` shows it, or None."""
    return conn.execute(flows_query(org_id).where(flow_pointers.c.id == flow_id)).first()


def live_counts(conn: Connection, org_id: int, flow_ids: Iterable[int] | None = None) -> dict[int, int]:
    """How many live enrollments (active, waiting for a reply, paused) each flow has; flows with
    none are absent. `flow_ids` narrows the count to those flows (one page of a list)."""
    query = (select(enrollments.c.pointer_id, func.count())
             .where(enrollments.c.org_id == org_id, enrollments.c.status.in_(lifecycle.LIVE))
             .group_by(enrollments.c.pointer_id))
    if flow_ids is not None:
        ids = list(flow_ids)
        if not ids:
            return {}
        query = query.where(enrollments.c.pointer_id.in_(ids))
    return {int(pointer_id): int(count) for pointer_id, count in conn.execute(query)}


# --- enrollments ----------------------------------------------------------------------------------

def enrollments_query(org_id: int, *, flow_id: int | None = None, status: str | None = None,
                      contact_id: int | None = None) -> Select[Any]:
    """The org's enrollments (optionally of one flow, in one status, of one contact), each with
    `version_number`: the number of the version it pinned when it started."""
    query = (
        select(enrollments, flow_versions.c.version.label("version_number"))
        .join(flow_versions, (flow_versions.c.id == enrollments.c.version_id) & (flow_versions.c.org_id == org_id))
        .where(enrollments.c.org_id == org_id)
    )
    if flow_id is not None:
        query = query.where(enrollments.c.pointer_id == flow_id)
    if status is not None:
        query = query.where(enrollments.c.status == status)
    if contact_id is not None:
        query = query.where(enrollments.c.contact_id == contact_id)
    return query


def find_enrollment(conn: Connection, org_id: int, enrollment_id: int) -> Any:
    """One of the org's enrollments as `enrollments_query` shows it, or None."""
    return conn.execute(enrollments_query(org_id).where(enrollments.c.id == enrollment_id)).first()


def reason_code(row: Any) -> str | None:
    """Why the run ended (its cancel reason) or, while it is live, why its last step failed."""
    return row.cancel_reason or row.last_error or None


def sentence(code: str | None, params: Mapping[str, Any] | None = None) -> Text | None:
    """The catalogue's sentence for a code (a step's reason, a refusal, an issue), or None for no
    code or one it does not hold (a code recorded by an older release, say). Params that the
    sentence does not use are fine; one whose params were not recorded falls back to its msgid."""
    if not code or not known(code):
        return None
    # A parameter that is itself a code (the AI error inside `ai_unavailable`) reads as its own
    # sentence, never as the raw code.
    bound = {key: describe(value) if key == "code" and isinstance(value, str) and known(value) else value
             for key, value in (params or {}).items()}
    text = describe(code, **bound)
    try:
        str(text)
    except (KeyError, ValueError, TypeError):
        return describe(code)
    return text


# --- a run's timeline -----------------------------------------------------------------------------

@dataclass(frozen=True)
class RunStep:
    """One line of a run's timeline: an event of the enrollment (`enrolled`, `step`, `reply`,
    `paused`, `resumed`, `ended`, …) with what its payload says, codes only."""

    at: datetime
    node_id: str | None
    event: str
    status: str | None
    reason: str | None
    next: str | None
    until: datetime | None
    llm_calls: int
    params: Mapping[str, Any]
    #: The exit a step left its node by (`{"type", "value"?}`, as the engine recorded it), or None.
    exit: Mapping[str, Any] | None = None

    @property
    def reason_text(self) -> Text | None:
        """The pt-BR sentence of `reason`; an event that carries no reason (`enrolled`) is
        described by its type, when the catalogue knows either."""
        return sentence(self.reason, self.params) if self.reason else sentence(self.event)


def run_steps(conn: Connection, org_id: int, enrollment_id: int) -> list[RunStep]:
    """Every event of one of the org's enrollments, oldest first."""
    rows = conn.execute(
        select(enrollment_events.c.created_at, enrollment_events.c.node_id, enrollment_events.c.event_type,
               enrollment_events.c.payload)
        .where(enrollment_events.c.org_id == org_id, enrollment_events.c.enrollment_id == enrollment_id)
        .order_by(enrollment_events.c.id)
    ).all()
    return [_run_step(row) for row in rows]


def _run_step(row: Any) -> RunStep:
    payload = row.payload if isinstance(row.payload, Mapping) else {}
    params = payload.get("params")
    # A resumed run says when its clock restarts as `at`; on the timeline that is its `until`.
    until = payload.get("until") or (payload.get("at") if row.event_type == "resumed" else None)
    llm_calls = payload.get("llm_calls")
    return RunStep(
        at=row.created_at, node_id=row.node_id, event=row.event_type, status=_text_or_none(payload.get("status")),
        reason=_text_or_none(payload.get("reason")), next=_text_or_none(payload.get("next")),
        until=_instant(until), llm_calls=llm_calls if isinstance(llm_calls, int) else 0,
        params=params if isinstance(params, Mapping) else {},
        exit=exit_of(payload),
    )


def exit_of(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The exit a `step` event's payload records (the edge condition its step left by), or None."""
    way = payload.get("exit")
    if not isinstance(way, Mapping) or not isinstance(way.get("type"), str):
        return None
    return dict(way)


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _instant(value: Any) -> datetime | None:
    """An ISO 8601 instant stored in a payload, or None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
