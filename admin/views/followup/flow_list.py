"""The Fluxos list page, which both the list's view (flows.py) and the builder opened without a
flow (builder.py) render, and a flow's status in words, which both show.

The rows are the REST API's (`queries.flows_query` + `services.flows_out`), so the list, the API
and the CLI count live enrollments the same way. Per flow it also shows its trigger in words,
the runs started this week and its conversion (converted ÷ ended): a fixed number of grouped
queries, whatever the number of flows. Every query is scoped by the signed-in user's org.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from typing import Any, Mapping
from zoneinfo import ZoneInfo

from flask_login import current_user
from markupsafe import Markup
from sqlalchemy import and_, case, func, select
from sqlalchemy.engine import Connection

from admin.api import services
from admin.i18n import _, _l, format_percent_local, translate
from admin.views.base import PURPOSE_LABELS, TenantPageView, db_session, local_dt, org_id, org_timezone
from admin.views.costs import estimate
from engine.core import clock
from engine.flows import lifecycle, queries
from engine.messaging.meta_categories import graph_template_keys, marketing_keys
from engine.store.models import enrollments, flow_pointers, flow_versions, users
from engine.words.catalogue import describe

#: A flow's status in the manager's words.
FLOW_STATUS_LABELS = {"draft": _l("Rascunho"), "active": _l("Publicado"), "disabled": _l("Desativado")}
FLOW_STATUS_COLORS = {"draft": "warning", "active": "success", "disabled": "secondary"}

#: Flows shown on the page (a clinic has a handful; past this the list says so).
MAX_FLOWS = 500


def flow_badge(status: str) -> Markup:
    """A coloured badge for a flow's status."""
    return Markup('<span class="badge badge-{}" data-status="{}">{}</span>').format(
        FLOW_STATUS_COLORS.get(status, "light"), status, FLOW_STATUS_LABELS.get(status, status))


#: The trigger kinds that need no detail, in the manager's words (the builder's choices say the same).
TRIGGER_LABELS = {
    "manual": _l("Manual"), "silence": _l("Silêncio do paciente"), "reminder_no_reply": _l("Lembrete sem resposta"),
    "handoff_ended": _l("Fim de um atendimento humano"), "event": _l("Mudança de etapa do contato"),
}
#: An appointment trigger, by the appointment's event.
APPOINTMENT_TRIGGER_LABELS = {
    "no_show": _l("Falta (no-show)"), "created": _l("Agendamento criado"), "confirmed": _l("Agendamento confirmado"),
    "cancelled": _l("Agendamento cancelado"), "completed": _l("Consulta realizada"),
}
#: What a patient wrote that starts an intent flow, after "Intenção: ".
INTENT_WORDS = {
    "reschedule": _l("remarcar"), "cancel": _l("cancelar"), "confirm": _l("confirmar"), "question": _l("dúvida"),
    "human": _l("falar com uma pessoa"),
}


def trigger_text(config: Mapping[str, Any] | None) -> str:
    """A flow's trigger in words: "Falta (no-show)", "Intenção: remarcar", "Manual"…"""
    config = config if isinstance(config, Mapping) else {}
    kind = config.get("kind")
    if kind == "appointment" and config.get("appointment_event") in APPOINTMENT_TRIGGER_LABELS:
        return str(APPOINTMENT_TRIGGER_LABELS[config["appointment_event"]])
    if kind == "intent" and config.get("intent") in INTENT_WORDS:
        return _("Intenção: %(intencao)s", intencao=str(INTENT_WORDS[config["intent"]]))
    if kind in TRIGGER_LABELS:
        return str(TRIGGER_LABELS[kind])
    return "—"


@dataclass(frozen=True)
class FlowStats:
    """A flow's runs as the list counts them."""

    week: int = 0
    ended: int = 0
    converted: int = 0

    def conversion(self) -> str:
        """Converted ÷ ended as a percent in the reader's notation; "—" before any run ended."""
        return format_percent_local(self.converted / self.ended) if self.ended else "—"


def week_start(tz: str, now: datetime) -> datetime:
    """Monday 00:00 of `now`'s week in the org's time zone, as a UTC instant."""
    zone = ZoneInfo(tz)
    today = now.astimezone(zone).date()
    return datetime.combine(today - timedelta(days=today.weekday()), time(0), tzinfo=zone).astimezone(timezone.utc)


def flow_stats(conn: Connection, oid: int, flow_ids: list[int], since: datetime) -> dict[int, FlowStats]:
    """Per flow, runs started since `since`, runs ended, and of them converted: one grouped query
    (a flow with no run is absent)."""
    if not flow_ids:
        return {}
    e = enrollments.c
    ended = e.status.in_(lifecycle.TERMINAL)
    rows = conn.execute(
        select(e.pointer_id,
               func.sum(case((e.created_at >= since, 1), else_=0)).label("week"),
               func.sum(case((ended, 1), else_=0)).label("ended"),
               func.sum(case((and_(ended, e.outcome == "converted"), 1), else_=0)).label("converted"))
        .where(e.org_id == oid, e.pointer_id.in_(flow_ids))
        .group_by(e.pointer_id))
    return {int(row.pointer_id): FlowStats(int(row.week or 0), int(row.ended or 0), int(row.converted or 0))
            for row in rows}


#: Who published a version when no user of the clinic did (`flow_versions.published_by`).
SYSTEM_PUBLISHER_LABELS = {"demo": _l("Lembra (demonstração)"), "import": _l("Importação de arquivo"),
                           "api": _l("API")}


def last_published(conn: Connection, oid: int, flow_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Per flow, its newest version: number, when it was published and by whom (an e-mail; the
    system's name for a version the demo, an import or the API published; or None for a user since
    removed or a version older than `published_by`). One query whatever the number of flows."""
    if not flow_ids:
        return {}
    rows = conn.execute(
        select(flow_versions.c.id, flow_versions.c.pointer_id, flow_versions.c.version, flow_versions.c.created_at,
               flow_versions.c.published_by, users.c.email)
        .outerjoin(users, (users.c.id == flow_versions.c.created_by) & (users.c.org_id == oid))
        .where(flow_versions.c.org_id == oid, flow_versions.c.pointer_id.in_(flow_ids))
        .order_by(flow_versions.c.pointer_id, flow_versions.c.version.desc()))
    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        system = SYSTEM_PUBLISHER_LABELS.get(row.published_by or "")
        out.setdefault(int(row.pointer_id), {"id": int(row.id), "version": row.version, "at": row.created_at,
                                             "by": row.email or (str(system) if system is not None else None)})
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
    ids = [row.id for row in rows]
    published = last_published(conn, oid, ids)
    stats = flow_stats(conn, oid, ids, week_start(org_timezone(), clock.now()))
    triggers = {row.id: trigger_text(row.trigger_config) for row in rows}
    cost = estimate(conn, oid)
    notices = marketing_notices(conn, oid, ids)
    session.rollback()  # read only
    return view.render("admin/followup/flows.html", flows=flows, published=published, more=more,
                       max_flows=MAX_FLOWS, flow_badge=flow_badge, local_dt=local_dt, stats=stats,
                       no_stats=FlowStats(), triggers=triggers, can_edit=bool(current_user.can_edit),
                       cost=cost, notices=notices)


def marketing_notices(conn: Connection, oid: int, flow_ids: list[int]) -> dict[int, list[str]]:
    """Per flow, the sentences warning that it sends a template Meta categorised as marketing
    (reminders and follow-ups should go as utility templates)."""
    marketing = marketing_keys(conn, oid)
    if not marketing or not flow_ids:
        return {}
    notices: dict[int, list[str]] = {}
    for flow_id, graph in conn.execute(select(flow_pointers.c.id, flow_pointers.c.draft_graph).where(
            flow_pointers.c.org_id == oid, flow_pointers.c.id.in_(flow_ids))):
        found = [translate(describe("flow_marketing_template", template=str(PURPOSE_LABELS.get(key, key))))
                 for key in graph_template_keys(graph) if key in marketing]
        if found:
            notices[flow_id] = found
    return notices
