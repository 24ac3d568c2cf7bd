"""Agents: the AI assistant profiles of an org (persona, LLM settings with an encrypted key, the
default hand-off policy) and which flows each may start automatically. The key is write-only:
it is sealed for its row and never read back out of this module but by `ai.factory.ai_for`."""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from engine import clock
from engine.flows.ai.factory import seal_api_key
from engine.models import agents, flow_pointers
from engine.orgs import DomainError
from gateway.crypto import Keyring
from gateway.egress import EgressPolicy, EgressRefused

HANDOFF_POLICIES = ("pause", "cancel", "allow")


def check_llm_base_url(url: str | None, egress: EgressPolicy | None) -> None:
    """Refuse (DomainError) an LLM base URL that resolves inside the network, when saved.

    `egress` is the process's policy (`Settings.egress`); without one only the connect-time
    guard applies (it refuses the address again at every call: that is the check that holds).
    """
    if not url or egress is None:
        return
    try:
        egress.check_url(url)
    except EgressRefused as exc:
        raise DomainError(f"llm_base_url: address not allowed: {exc.host}") from None


def _check_flows(conn: Connection, org_id: int, flow_ids: Sequence[int]) -> list[int]:
    ids = sorted({int(i) for i in flow_ids})
    if not ids:
        return []
    found = set(conn.execute(select(flow_pointers.c.id).where(flow_pointers.c.org_id == org_id,
                                                              flow_pointers.c.id.in_(ids))).scalars())
    if found != set(ids):
        raise DomainError("no such flow")
    return ids


def create_agent(
    conn: Connection, keyring: Keyring, org_id: int, *, name: str, persona: str | None = None,
    llm_base_url: str | None = None, llm_model: str | None = None, llm_api_key: str | None = None,
    handoff_policy: str = "pause", followup_enabled: bool = False, flow_ids: Sequence[int] = (),
    egress: EgressPolicy | None = None,
) -> int:
    """A new agent; its API key (if any) is sealed for this row only. With `egress`, an LLM base
    URL that resolves to an address it refuses is a DomainError (see `check_llm_base_url`)."""
    if not name or not name.strip():
        raise DomainError("name is required")
    check_llm_base_url(llm_base_url, egress)
    if handoff_policy not in HANDOFF_POLICIES:
        raise DomainError("handoff_policy must be pause, cancel or allow")
    now = clock.now()
    agent_id = int(conn.execute(insert(agents).values(
        org_id=org_id, name=name.strip(), persona=persona, llm_base_url=llm_base_url or None,
        llm_model=llm_model or None, handoff_policy=handoff_policy, followup_enabled=followup_enabled,
        flow_pointer_ids=_check_flows(conn, org_id, flow_ids), created_at=now, updated_at=now,
    ).returning(agents.c.id)).scalar_one())
    if llm_api_key:
        set_api_key(conn, keyring, org_id, agent_id, llm_api_key)
    return agent_id


def set_api_key(conn: Connection, keyring: Keyring, org_id: int, agent_id: int, api_key: str | None) -> None:
    """Replace (or, with None, remove) the agent's LLM API key."""
    sealed, version = seal_api_key(keyring, org_id=org_id, agent_id=agent_id, api_key=api_key) if api_key \
        else (None, None)
    result = conn.execute(update(agents).where(agents.c.org_id == org_id, agents.c.id == agent_id)
                          .values(llm_api_key=sealed, key_version=version, updated_at=clock.now()))
    if result.rowcount != 1:
        raise DomainError("no such agent")


def update_agent(conn: Connection, org_id: int, agent_id: int, *, egress: EgressPolicy | None = None,
                 **changes: Any) -> None:
    """Change an agent's settings (not its key: see `set_api_key`); `egress` as in `create_agent`."""
    allowed = {"name", "persona", "llm_base_url", "llm_model", "handoff_policy", "followup_enabled", "flow_ids"}
    unknown = set(changes) - allowed
    if unknown:
        raise DomainError(f"unknown agent fields: {', '.join(sorted(unknown))}")
    check_llm_base_url(changes.get("llm_base_url"), egress)
    if "handoff_policy" in changes and changes["handoff_policy"] not in HANDOFF_POLICIES:
        raise DomainError("handoff_policy must be pause, cancel or allow")
    if "flow_ids" in changes:
        changes["flow_pointer_ids"] = _check_flows(conn, org_id, changes.pop("flow_ids"))
    result = conn.execute(update(agents).where(agents.c.org_id == org_id, agents.c.id == agent_id)
                          .values(**changes, updated_at=clock.now()))
    if result.rowcount != 1:
        raise DomainError("no such agent")
