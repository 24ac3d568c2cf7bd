"""What the clinic's WhatsApp Business Account (WABA) says of its templates: category (UTILITY,
MARKETING, AUTHENTICATION) and status (APPROVED, PENDING, REJECTED, PAUSED, DISABLED), with when
and why the last change came (issue 34).

One row per channel × Meta name × language in `meta_template_states`, not a column of `templates`:
a global default's mapping is shared by every clinic, while a category belongs to one WABA. Two
sources fill it, both idempotent (the same news twice writes nothing new):

- the WABA's list, each time Lembra reads it (`record_waba`: Modelos, `lembra templates waba`);
- Meta's webhooks message_template_status_update and template_category_update, which the provider
  turns into `TemplateEvent`s only for the channel's own WABA (`apply_event`).

A template Meta moved to MARKETING costs about nine times a utility one in Brazil and is subject
to the per-user marketing limits: Modelos and the Painel flag it (`marketing_in_use`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.messaging.meta_templates import WabaList, effective, meta_channel
from engine.store.db import Database
from engine.store.dialect import insert_ignore
from engine.store.models import meta_template_states, templates
from gateway.contract import ProviderTemplate, TemplateEvent

MARKETING = "MARKETING"
UTILITY = "UTILITY"
CATEGORIES = ("UTILITY", "MARKETING", "AUTHENTICATION")


@dataclass(frozen=True)
class State:
    """A template's category and status at the WABA, as Lembra last heard."""

    name: str
    language: str
    category: str | None
    status: str | None
    previous_category: str | None = None
    reason: str | None = None
    changed_at: Any = None

    @property
    def marketing(self) -> bool:
        return self.category == MARKETING

    @property
    def recategorised(self) -> bool:
        """Meta moved it to marketing from another category (not created as marketing)."""
        return self.marketing and self.previous_category not in (None, MARKETING)


def _state(row: Any) -> State:
    return State(name=row.name, language=row.language, category=row.category, status=row.status,
                 previous_category=row.previous_category, reason=row.reason, changed_at=row.changed_at)


def states(conn: Connection, org_id: int, channel_id: int) -> dict[tuple[str, str], State]:
    """Every template state of the channel, by (Meta name, language)."""
    m = meta_template_states.c
    return {(r.name, r.language): _state(r) for r in conn.execute(
        select(meta_template_states).where(m.org_id == org_id, m.channel_id == channel_id))}


def state_of(conn: Connection, org_id: int, channel_id: int, name: str, language: str) -> State | None:
    """One template's state, or None when Lembra has heard nothing of it."""
    m = meta_template_states.c
    row = conn.execute(select(meta_template_states).where(
        m.org_id == org_id, m.channel_id == channel_id, m.name == name, m.language == language)).first()
    return _state(row) if row is not None else None


def _upsert(conn: Connection, org_id: int, channel_id: int, name: str, language: str, *,
            category: str | None, status: str | None, reason: str | None, at: Any,
            previous_category: str | None = None) -> bool:
    """Record what the WABA says now; True when something changed. A category or status the news
    does not give (None) stays as it was."""
    now = clock.now()
    m = meta_template_states.c
    conn.execute(insert_ignore(conn, meta_template_states, ("org_id", "channel_id", "name", "language")).values(
        org_id=org_id, channel_id=channel_id, name=name[:512], language=language[:32], updated_at=now))
    row = conn.execute(select(meta_template_states).where(
        m.org_id == org_id, m.channel_id == channel_id, m.name == name[:512], m.language == language[:32])).one()
    values: dict[str, Any] = {}
    if category and category != row.category:
        values["category"] = category
        values["previous_category"] = previous_category or row.category
    if status and status != row.status:
        values["status"] = status
        values["reason"] = reason
    if not values:
        return False
    values["changed_at"] = at or now
    values["updated_at"] = now
    conn.execute(update(meta_template_states).where(m.org_id == org_id, m.id == row.id).values(**values))
    return True


def apply_event(conn: Connection, channel: Any, event: TemplateEvent) -> bool:
    """A template webhook for the channel's WABA (the provider has checked the account); True
    when it changed what Lembra knew. A repeated delivery changes nothing."""
    return _upsert(conn, channel.org_id, channel.id, event.name, event.language, category=event.category,
                   status=event.status, reason=event.reason, at=event.timestamp,
                   previous_category=event.previous_category)


def record_listed(conn: Connection, channel: Any, listed: Iterable[ProviderTemplate]) -> int:
    """The WABA's list as read now: each template's category and status; how many changed."""
    return sum(_upsert(conn, channel.org_id, channel.id, t.name, t.language, category=t.category or None,
                       status=t.status or None, reason=None, at=None) for t in listed)


def record_waba(db: Database, channel: Any, waba: WabaList | None) -> int:
    """`record_listed` in its own transaction, when the list could be read (else nothing)."""
    if channel is None or waba is None or waba.templates is None:
        return 0
    with db.begin() as conn:
        return record_listed(conn, channel, waba.templates)


# --- what the org sends -----------------------------------------------------------------------------

@dataclass(frozen=True)
class InUse:
    """One of the org's WhatsApp templates and the state of the Meta template it sends."""

    template_id: int
    key: str
    state: State


def in_use(conn: Connection, org_id: int) -> list[InUse]:
    """The org's WhatsApp templates (its own, else the defaults) whose Meta template Lembra has a
    state for, on the org's Meta channel; empty when its WhatsApp is not Meta's."""
    channel = meta_channel(conn, org_id)
    if channel is None:
        return []
    known = states(conn, org_id, channel.id)
    if not known:
        return []
    t = templates.c
    rows = conn.execute(select(templates).where(
        t.channel_kind == "whatsapp", (t.org_id == org_id) | t.org_id.is_(None))).all()
    own = {(r.key, r.locale) for r in rows if r.org_id == org_id}
    defaults = {(r.key, r.locale): r for r in rows if r.org_id is None}
    found: list[InUse] = []
    for row in rows:
        if row.org_id is None and (row.key, row.locale) in own:
            continue  # overridden by the org's own
        mapping, _ = effective(row, defaults.get((row.key, row.locale)) if row.org_id is not None else None)
        state = known.get((mapping.name, mapping.language)) if mapping is not None else None
        if state is not None:
            found.append(InUse(template_id=row.id, key=row.key, state=state))
    return found


def marketing_in_use(conn: Connection, org_id: int) -> list[InUse]:
    """The org's templates that go out as MARKETING at Meta (the Painel's and Modelos' flag)."""
    return [u for u in in_use(conn, org_id) if u.state.marketing]


def marketing_keys(conn: Connection, org_id: int) -> set[str]:
    """The template keys the org sends as MARKETING at Meta."""
    return {u.key for u in marketing_in_use(conn, org_id)}


def flag_keys(items: Sequence[InUse]) -> list[str]:
    """The template keys of `items`, once each, in order."""
    return list(dict.fromkeys(u.key for u in items))


def graph_template_keys(graph: Any) -> list[str]:
    """The template keys a flow's graph sends (its `action` nodes' template and fallback
    template), once each, in node order; a malformed graph names none."""
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    keys: list[str] = []
    for node in nodes if isinstance(nodes, list) else []:
        config = node.get("config") if isinstance(node, dict) and node.get("type") == "action" else None
        if not isinstance(config, dict):
            continue
        for where in ("template", "fallback_template"):
            if isinstance(config.get(where), str) and config[where]:
                keys.append(config[where])
    return list(dict.fromkeys(keys))
