"""Read-only endpoints of `/api/v1` for what the console configures: the org's assistants
(agents) and sending channels. Neither ever answers a secret: an agent's model key and a
channel's credentials (and its provider settings, which hold account ids and tokens) stay out,
and only whether a model key is set is said.

Importing this module adds its routes to the API blueprint, like admin/api/privacy.py."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields, validate
from sqlalchemy import select

from admin.api.core import ApiError, bp, caller, dump, load_query, org_tx, page, path_id, require_key
from admin.api.openapi import documented
from admin.api.schemas import PageQuery, page_schema
from engine.flows.versions import HANDOFF_POLICIES
from engine.store.models import CHANNEL_KINDS, agents, channels

_DT = {"format": "date-time"}


# --- schemas ------------------------------------------------------------------------------------

class AgentOut(Schema):
    id = fields.Integer(required=True)
    name = fields.String(required=True)
    persona = fields.String(required=True, allow_none=True,
                            metadata={"description": "How the assistant presents itself to patients."})
    llm_model = fields.String(required=True, allow_none=True)
    llm_api_key_set = fields.Boolean(required=True, metadata={"description": "Whether a model key is stored "
                                                                             "(the key itself is never shown)."})
    handoff_policy = fields.String(required=True, validate=validate.OneOf(HANDOFF_POLICIES))
    followup_enabled = fields.Boolean(required=True)
    flow_ids = fields.List(fields.Integer(), required=True,
                           metadata={"description": "The follow-up flows this assistant may start."})
    created_at = fields.DateTime(format="iso", required=True)
    updated_at = fields.DateTime(format="iso", required=True)


class ChannelOut(Schema):
    id = fields.Integer(required=True)
    kind = fields.String(required=True, validate=validate.OneOf(CHANNEL_KINDS))
    provider = fields.String(required=True, metadata={"example": "meta"})
    name = fields.String(required=True)
    status = fields.String(required=True, metadata={"example": "active"})
    is_default = fields.Boolean(required=True, metadata={"description": "The channel its kind sends through."})
    min_interval_ms = fields.Integer(required=True, allow_none=True,
                                     metadata={"description": "Pacing: the least time between two sends."})
    daily_cap = fields.Integer(required=True, allow_none=True)
    created_at = fields.DateTime(format="iso", required=True)
    updated_at = fields.DateTime(format="iso", required=True)


class ChannelQuery(PageQuery):
    kind = fields.String(validate=validate.OneOf(CHANNEL_KINDS))


AgentPage = page_schema(AgentOut, "AgentPage")
ChannelPage = page_schema(ChannelOut, "ChannelPage")


# --- rows as the API shows them -----------------------------------------------------------------

def agent_out(row: Any) -> dict[str, Any]:
    """An agent without its model key (nor its model endpoint, which is the console's business)."""
    flows = row.flow_pointer_ids if isinstance(row.flow_pointer_ids, list) else []
    return {"id": row.id, "name": row.name, "persona": row.persona, "llm_model": row.llm_model,
            "llm_api_key_set": row.llm_api_key is not None, "handoff_policy": row.handoff_policy,
            "followup_enabled": bool(row.followup_enabled), "flow_ids": [int(f) for f in flows],
            "created_at": row.created_at, "updated_at": row.updated_at}


#: The channel columns the API shows: never `credentials`, `key_version` or `settings`.
CHANNEL_COLUMNS = ("id", "kind", "provider", "name", "status", "is_default", "min_interval_ms", "daily_cap",
                   "created_at", "updated_at")


def channel_out(row: Any) -> dict[str, Any]:
    out = {name: getattr(row, name) for name in CHANNEL_COLUMNS}
    out["is_default"] = bool(out["is_default"])
    return out


# --- routes -------------------------------------------------------------------------------------

_AGENT_COLUMNS = (agents.c.id, agents.c.name, agents.c.persona, agents.c.llm_model, agents.c.llm_api_key,
                  agents.c.handoff_policy, agents.c.followup_enabled, agents.c.flow_pointer_ids,
                  agents.c.created_at, agents.c.updated_at)


@bp.get("/agents")
@documented("get", "/agents", "List the org's assistants (agents)", tag="agents", query=PageQuery,
            responses={200: (AgentPage, "A page of agents (never a model key)")}, errors=(422,))
@require_key
def list_agents() -> Any:
    params = load_query(PageQuery())
    query = select(*_AGENT_COLUMNS).where(agents.c.org_id == caller().org_id)
    with org_tx() as conn:
        rows, next_cursor = page(conn, query, agents.c.id, params)
    return dump(AgentPage, {"data": [agent_out(r) for r in rows], "next_cursor": next_cursor})


@bp.get("/agents/<int:agent_id>")
@documented("get", "/agents/{agent_id}", "Get an assistant (agent)", tag="agents", path_id="agent_id",
            responses={200: (AgentOut, "The agent (never its model key)")}, errors=(404,))
@require_key
def get_agent(agent_id: int) -> Any:
    with org_tx() as conn:
        row = conn.execute(select(*_AGENT_COLUMNS).where(agents.c.org_id == caller().org_id,
                                                         agents.c.id == path_id(agent_id))).first()
    if row is None:
        raise ApiError(404)
    return dump(AgentOut, agent_out(row))


_CHANNEL_SELECT = [channels.c[name] for name in CHANNEL_COLUMNS]


@bp.get("/channels")
@documented("get", "/channels", "List the org's sending channels", tag="channels", query=ChannelQuery,
            responses={200: (ChannelPage, "A page of channels (never a credential)")}, errors=(422,))
@require_key
def list_channels() -> Any:
    params = load_query(ChannelQuery())
    query = select(*_CHANNEL_SELECT).where(channels.c.org_id == caller().org_id)
    if params.get("kind"):
        query = query.where(channels.c.kind == params["kind"])
    with org_tx() as conn:
        rows, next_cursor = page(conn, query, channels.c.id, params)
    return dump(ChannelPage, {"data": [channel_out(r) for r in rows], "next_cursor": next_cursor})


@bp.get("/channels/<int:channel_id>")
@documented("get", "/channels/{channel_id}", "Get a sending channel", tag="channels", path_id="channel_id",
            responses={200: (ChannelOut, "The channel (never a credential)")}, errors=(404,))
@require_key
def get_channel(channel_id: int) -> Any:
    with org_tx() as conn:
        row = conn.execute(select(*_CHANNEL_SELECT).where(channels.c.org_id == caller().org_id,
                                                          channels.c.id == path_id(channel_id))).first()
    if row is None:
        raise ApiError(404)
    return dump(ChannelOut, channel_out(row))
