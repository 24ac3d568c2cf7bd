"""Flows as a clinic edits them: a pointer holds the name, the policies and the draft graph;
publishing validates the draft and freezes it as an immutable version the pointer points at;
rollback points at an earlier version; disable stops new enrollments. An enrollment keeps the
version it entered, whatever the pointer does afterwards.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Mapping
from weakref import WeakKeyDictionary

from marshmallow import ValidationError
from sqlalchemy import func, insert, or_, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from engine.core import clock
from engine.words.catalogue import describe
from engine.core.errors import DomainError
from engine.flows import lifecycle
from engine.flows.graph import GraphIndex
from engine.flows.issues import FlowIssue, bounded
from engine.flows.schema import ConfigError, check_draft, load_trigger_config, normalize_graph
from engine.flows.validate import validate_for_publish
from engine.core.ids import valid_id
from engine.store.models import conversation_fields, enrollments, flow_pointers, flow_versions, templates
from engine.core.strict_json import storable_text

HANDOFF_POLICIES = ("pause", "cancel", "allow")
DISABLE_LIVE = ("finish", "cancel")
#: The version numbers a flow can have (flow_versions.version is a 32-bit INTEGER): any other
#: number is no version, and is answered as one that does not exist before the database sees it
#: (PostgreSQL refuses to compare a column of that type with 2**31: "integer out of range").
MAX_VERSION = 2**31 - 1
EMPTY_GRAPH: dict[str, Any] = {"nodes": [], "edges": []}


class FlowNotFound(DomainError):
    """No such flow (or version) in this org."""


class FlowNameTaken(DomainError):
    """The org already has a flow with that name."""


class FlowRejected(DomainError):
    """A draft or a publish that breaks the rules; `issues` says where and why, per node (the
    first MAX_ISSUES of them, and how many more: every caller answers a bounded list)."""

    def __init__(self, issues: list[FlowIssue]) -> None:
        issues = bounded(issues)
        super().__init__("; ".join(f"{i.node_id or '-'}: {i.code}" for i in issues))
        self.issues = issues


def get_flow(conn: Connection, org_id: int, pointer_id: int) -> Any:
    """The org's flow pointer row; FlowNotFound otherwise (also for a number no row's id can be)."""
    if not valid_id(pointer_id):
        raise FlowNotFound("no such flow")
    row = conn.execute(select(flow_pointers).where(flow_pointers.c.org_id == org_id,
                                                   flow_pointers.c.id == pointer_id)).first()
    if row is None:
        raise FlowNotFound("no such flow")
    return row


def _check_settings(values: Mapping[str, Any]) -> list[FlowIssue]:
    issues: list[FlowIssue] = []
    if "handoff_policy" in values and values["handoff_policy"] not in HANDOFF_POLICIES:
        issues.append(FlowIssue(None, "invalid_handoff_policy"))
    steps = values.get("max_steps")
    if "max_steps" in values and not (isinstance(steps, int) and not isinstance(steps, bool) and 1 <= steps <= 200):
        issues.append(FlowIssue(None, "invalid_max_steps"))
    grace = values.get("resume_grace_minutes")
    if "resume_grace_minutes" in values and not (isinstance(grace, int) and not isinstance(grace, bool)
                                                 and 0 <= grace <= 10080):
        issues.append(FlowIssue(None, "invalid_resume_grace"))
    name = values.get("name")
    if "name" in values and not (isinstance(name, str) and 1 <= len(name.strip()) <= 120 and storable_text(name)):
        issues.append(FlowIssue(None, "invalid_name"))
    if "trigger_config" in values:
        try:
            load_trigger_config(values["trigger_config"])
        except ConfigError as exc:
            issues.extend(FlowIssue(None, "invalid_trigger", {"field": p.field("trigger_config"), "detail": p.detail})
                          for p in exc.problems)
        except ValidationError:
            issues.append(FlowIssue(None, "invalid_trigger", {"field": "trigger_config",
                                                              "detail": describe("detail_invalid")}))
    if "draft_graph" in values:
        issues.extend(check_draft(values["draft_graph"]))
    return issues


def create_flow(
    conn: Connection, org_id: int, *, name: str, draft_graph: Mapping[str, Any] | None = None,
    trigger_config: Mapping[str, Any] | None = None, handoff_policy: str = "pause", cancel_on_reply: bool = False,
    max_steps: int = 30, resume_grace_minutes: int = 30,
) -> int:
    """A new flow in `draft`; FlowRejected (nothing written) when a field or the draft's shape is bad."""
    values = {"name": name, "draft_graph": dict(draft_graph or EMPTY_GRAPH), "trigger_config": dict(trigger_config or {"kind": "manual"}),
              "handoff_policy": handoff_policy, "cancel_on_reply": bool(cancel_on_reply), "max_steps": max_steps,
              "resume_grace_minutes": resume_grace_minutes}
    issues = _check_settings(values)
    if issues:
        raise FlowRejected(issues)
    values["name"] = name.strip()
    now = clock.now()
    try:
        with conn.begin_nested():
            return int(conn.execute(insert(flow_pointers).values(
                org_id=org_id, status="draft", created_at=now, updated_at=now, **values,
            ).returning(flow_pointers.c.id)).scalar_one())
    except IntegrityError:
        raise FlowNameTaken("a flow with this name already exists") from None


def update_flow(conn: Connection, org_id: int, pointer_id: int, **changes: Any) -> Any:
    """Change the draft and the flow's settings (live enrollments keep their pinned version)."""
    allowed = {"name", "draft_graph", "trigger_config", "handoff_policy", "cancel_on_reply", "max_steps",
               "resume_grace_minutes"}
    unknown = set(changes) - allowed
    if unknown:
        raise DomainError(f"unknown flow fields: {', '.join(sorted(unknown))}")
    get_flow(conn, org_id, pointer_id)
    issues = _check_settings(changes)
    if issues:
        raise FlowRejected(issues)
    if "name" in changes:
        changes["name"] = changes["name"].strip()
    if changes:
        try:
            with conn.begin_nested():
                conn.execute(update(flow_pointers).where(flow_pointers.c.org_id == org_id,
                                                         flow_pointers.c.id == pointer_id)
                             .values(**changes, updated_at=clock.now()))
        except IntegrityError:
            raise FlowNameTaken("a flow with this name already exists") from None
    return get_flow(conn, org_id, pointer_id)


def template_checker(conn: Connection, org_id: int) -> Callable[[str], bool]:
    """Whether a template key exists for the org (its own or a global default)."""
    keys = set(conn.execute(select(templates.c.key).where(
        or_(templates.c.org_id == org_id, templates.c.org_id.is_(None)))).scalars())
    return keys.__contains__


def field_checker(conn: Connection, org_id: int) -> Callable[[str], bool]:
    """Whether a conversation field slug is declared by the org."""
    slugs = set(conn.execute(select(conversation_fields.c.slug).where(conversation_fields.c.org_id == org_id)).scalars())
    return slugs.__contains__


#: Who may publish a version besides a user of the clinic (`flow_versions.published_by`).
SYSTEM_PUBLISHERS = ("demo", "import", "api")


def publish(conn: Connection, org_id: int, pointer_id: int, *, user_id: int | None = None,
            by: str | None = None) -> Any:
    """Validate the draft and make it the active version; FlowRejected lists every issue. The new
    version records who published it: the user `user_id`, or the system `by` (SYSTEM_PUBLISHERS).

    Publishing a draft identical to the active version only re-activates it (no new version)."""
    if by is not None and by not in SYSTEM_PUBLISHERS:
        raise ValueError(f"unknown publisher {by!r}")
    pointer = get_flow(conn, org_id, pointer_id)
    issues = validate_for_publish(pointer.draft_graph, trigger_config=pointer.trigger_config,
                                  max_steps=pointer.max_steps, template_exists=template_checker(conn, org_id),
                                  field_exists=field_checker(conn, org_id))
    if issues:
        raise FlowRejected(issues)
    graph = normalize_graph(pointer.draft_graph)
    active = None
    if pointer.active_version_id is not None:
        active = conn.execute(select(flow_versions).where(flow_versions.c.org_id == org_id,
                                                          flow_versions.c.id == pointer.active_version_id)).first()
    now = clock.now()
    if active is not None and active.graph == graph:
        version_id = active.id
    else:
        number = (conn.execute(select(func.max(flow_versions.c.version)).where(
            flow_versions.c.org_id == org_id, flow_versions.c.pointer_id == pointer_id)).scalar() or 0) + 1
        version_id = int(conn.execute(insert(flow_versions).values(
            org_id=org_id, pointer_id=pointer_id, version=number, graph=graph, created_by=user_id,
            published_by="user" if user_id is not None else by, created_at=now,
        ).returning(flow_versions.c.id)).scalar_one())
    conn.execute(update(flow_pointers).where(flow_pointers.c.org_id == org_id, flow_pointers.c.id == pointer_id)
                 .values(active_version_id=version_id, status="active", updated_at=now))
    return get_version(conn, org_id, version_id)


def rollback(conn: Connection, org_id: int, pointer_id: int, version: int) -> Any:
    """Point the flow at its earlier version number `version` (and activate it); FlowNotFound when
    the flow has no such version (any number outside 1 … MAX_VERSION included)."""
    get_flow(conn, org_id, pointer_id)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise FlowNotFound("no such version")
    row = conn.execute(select(flow_versions).where(flow_versions.c.org_id == org_id,
                                                   flow_versions.c.pointer_id == pointer_id,
                                                   flow_versions.c.version == version)).first()
    if row is None:
        raise FlowNotFound("no such version")
    conn.execute(update(flow_pointers).where(flow_pointers.c.org_id == org_id, flow_pointers.c.id == pointer_id)
                 .values(active_version_id=row.id, status="active", updated_at=clock.now()))
    return row


def disable(conn: Connection, org_id: int, pointer_id: int, *, live: str = "finish") -> int:
    """Stop new enrollments; live ones finish on their version (`finish`) or end now (`cancel`).
    Returns how many live enrollments were cancelled."""
    if live not in DISABLE_LIVE:
        raise DomainError("live must be finish or cancel")
    get_flow(conn, org_id, pointer_id)
    conn.execute(update(flow_pointers).where(flow_pointers.c.org_id == org_id, flow_pointers.c.id == pointer_id)
                 .values(status="disabled", updated_at=clock.now()))
    if live == "finish":
        return 0
    return len(lifecycle.end_live(conn, org_id, enrollments.c.pointer_id == pointer_id, status="cancelled",
                                  outcome=None, reason="flow_disabled"))


def get_version(conn: Connection, org_id: int, version_id: int) -> Any:
    row = conn.execute(select(flow_versions).where(flow_versions.c.org_id == org_id,
                                                   flow_versions.c.id == version_id)).first()
    if row is None:
        raise FlowNotFound("no such version")
    return row


def list_versions(conn: Connection, org_id: int, pointer_id: int) -> list[Any]:
    get_flow(conn, org_id, pointer_id)
    return list(conn.execute(select(flow_versions).where(flow_versions.c.org_id == org_id,
                                                         flow_versions.c.pointer_id == pointer_id)
                             .order_by(flow_versions.c.version.desc())))


# Versions never change, so their parsed graphs are kept per database engine (a test's fresh
# database gets a fresh engine, so ids reused across databases never collide).
_graphs: WeakKeyDictionary[Engine, dict[int, tuple[int, GraphIndex]]] = weakref.WeakKeyDictionary()
_graphs_lock = threading.Lock()


def graph_of(conn: Connection, org_id: int, version_id: int) -> GraphIndex:
    """The parsed graph of one of the org's versions (cached: versions are immutable)."""
    engine = conn.engine
    with _graphs_lock:
        cached = _graphs.setdefault(engine, {}).get(version_id)
    if cached is not None:
        if cached[0] != org_id:
            raise FlowNotFound("no such version")
        return cached[1]
    row = get_version(conn, org_id, version_id)
    index = GraphIndex(row.graph)
    with _graphs_lock:
        _graphs.setdefault(engine, {})[version_id] = (org_id, index)
    return index
