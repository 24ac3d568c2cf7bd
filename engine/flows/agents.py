"""Agents: the AI assistant profiles of an org (persona, LLM settings with an encrypted key, the
default hand-off policy) and which flows each may start automatically. The key is write-only:
it is sealed for its row and never read back out of this module but by `ai.factory.ai_for`.

The key belongs to the base URL it was typed for: a change of the base URL to another endpoint
(scheme, host, port: `gateway.egress.secrets_follow`) clears it, so that no one who may edit an
agent can have Lembra send the org's key to a server of their own."""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError
from engine.flows.ai.factory import seal_api_key
from engine.store.models import agents, flow_pointers
from gateway.crypto import Keyring
from gateway.egress import EgressPolicy, EgressRefused, InvalidAddress, check_saved_url, secrets_follow

HANDOFF_POLICIES = ("pause", "cancel", "allow")


def check_llm_base_url(url: str | None, egress: EgressPolicy | None) -> None:
    """Refuse (DomainError) an LLM base URL that the HTTP client cannot use (`egress.endpoint`,
    said by its catalogue code) or, with `egress`, that resolves inside the network, when saved.

    `egress` is the process's policy (`Settings.egress`); without one only the connect-time
    guard applies (it refuses the address again at every call: that is the check that holds).
    """
    if not url:
        return
    try:
        check_saved_url(url, egress)
    except InvalidAddress as exc:
        raise DomainError(f"llm_base_url: {exc.code}") from None
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
    """Replace (or, with None, remove) the agent's LLM API key, sealed with the base URL the agent
    has now (`ai_for` sends it nowhere else). Set the base URL first when both change."""
    base_url = conn.execute(select(agents.c.llm_base_url).where(agents.c.org_id == org_id,
                                                                agents.c.id == agent_id)).first()
    if base_url is None:
        raise DomainError("no such agent")
    sealed, version = seal_api_key(keyring, org_id=org_id, agent_id=agent_id, api_key=api_key,
                                   base_url=base_url[0]) if api_key else (None, None)
    conn.execute(update(agents).where(agents.c.org_id == org_id, agents.c.id == agent_id)
                 .values(llm_api_key=sealed, key_version=version, updated_at=clock.now()))


def update_agent(conn: Connection, org_id: int, agent_id: int, *, egress: EgressPolicy | None = None,
                 **changes: Any) -> bool:
    """Change an agent's settings (not its key: see `set_api_key`); `egress` as in `create_agent`.

    A base URL that points to another endpoint than before clears the stored key (it is never
    sent to a server it was not typed for); returns True when it did."""
    allowed = {"name", "persona", "llm_base_url", "llm_model", "handoff_policy", "followup_enabled", "flow_ids"}
    unknown = set(changes) - allowed
    if unknown:
        raise DomainError(f"unknown agent fields: {', '.join(sorted(unknown))}")
    check_llm_base_url(changes.get("llm_base_url"), egress)
    if "handoff_policy" in changes and changes["handoff_policy"] not in HANDOFF_POLICIES:
        raise DomainError("handoff_policy must be pause, cancel or allow")
    if "flow_ids" in changes:
        changes["flow_pointer_ids"] = _check_flows(conn, org_id, changes.pop("flow_ids"))
    before = conn.execute(select(agents.c.llm_base_url, agents.c.llm_api_key).where(
        agents.c.org_id == org_id, agents.c.id == agent_id)).first()
    if before is None:
        raise DomainError("no such agent")
    cleared = ("llm_base_url" in changes and before.llm_api_key is not None
               and not secrets_follow({"url": before.llm_base_url}, {"url": changes["llm_base_url"]}))
    if cleared:
        changes.update(llm_api_key=None, key_version=None)
    conn.execute(update(agents).where(agents.c.org_id == org_id, agents.c.id == agent_id)
                 .values(**changes, updated_at=clock.now()))
    return cleared
