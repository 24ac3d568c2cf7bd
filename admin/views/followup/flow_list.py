"""The Fluxos list page, which both the list's view (flows.py) and the builder opened without a
flow (builder.py) render, and a flow's status in words, which both show.

The rows are the REST API's (`queries.flows_query` + `services.flows_out`), so the list, the API
and the CLI count live enrollments the same way. Every query is scoped by the signed-in user's org.
"""

from __future__ import annotations

from typing import Any

from flask_login import current_user
from markupsafe import Markup
from sqlalchemy import select
from sqlalchemy.engine import Connection

from admin.api import services
from admin.i18n import _l
from admin.views.base import TenantPageView, db_session, local_dt, org_id
from engine.flows import queries
from engine.store.models import flow_pointers, flow_versions, users

#: A flow's status in the manager's words.
FLOW_STATUS_LABELS = {"draft": _l("Rascunho"), "active": _l("Publicado"), "disabled": _l("Desativado")}
FLOW_STATUS_COLORS = {"draft": "warning", "active": "success", "disabled": "secondary"}

#: Flows shown on the page (a clinic has a handful; past this the list says so).
MAX_FLOWS = 500


def flow_badge(status: str) -> Markup:
    """A coloured badge for a flow's status."""
    return Markup('<span class="badge badge-{}" data-status="{}">{}</span>').format(
        FLOW_STATUS_COLORS.get(status, "light"), status, FLOW_STATUS_LABELS.get(status, status))


def last_published(conn: Connection, oid: int, flow_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Per flow, its newest version: number, when it was published and by whom (an e-mail, or None
    for a publish through the API or by a user since removed)."""
    if not flow_ids:
        return {}
    rows = conn.execute(
        select(flow_versions.c.pointer_id, flow_versions.c.version, flow_versions.c.created_at, users.c.email)
        .outerjoin(users, (users.c.id == flow_versions.c.created_by) & (users.c.org_id == oid))
        .where(flow_versions.c.org_id == oid, flow_versions.c.pointer_id.in_(flow_ids))
        .order_by(flow_versions.c.pointer_id, flow_versions.c.version.desc()))
    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        out.setdefault(int(row.pointer_id), {"version": row.version, "at": row.created_at, "by": row.email})
    return out


def list_page(view: TenantPageView) -> Any:
    """The list of the org's flows, newest first, rendered by `view` (the list, or the builder when
    it is opened without a flow)."""
    oid = org_id()
    session = db_session()
    conn = session.connection()
    rows = list(conn.execute(queries.flows_query(oid).order_by(flow_pointers.c.id.desc()).limit(MAX_FLOWS + 1)))
    more = len(rows) > MAX_FLOWS
    rows = rows[:MAX_FLOWS]
    flows = services.flows_out(conn, oid, rows)
    published = last_published(conn, oid, [row.id for row in rows])
    session.rollback()  # read only
    return view.render("admin/followup/flows.html", flows=flows, published=published, more=more,
                       max_flows=MAX_FLOWS, flow_badge=flow_badge, local_dt=local_dt,
                       can_edit=bool(current_user.can_edit))
