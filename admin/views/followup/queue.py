"""Fila de follow-ups: the org's live enrollments in one table (contact, flow, current step, next
run relative and absolute in the org's time zone, status, why), filtered by flow, status and
period, with Cancelar through the API's own cancel path (`admin.api.services.cancel_enrollment`,
i.e. `lifecycle.end_live` with reason `cancelled_by_clinic`), audited.

Every role reads the queue (the front desk watches it); only owners and managers cancel. The
words shown (statuses, node types, reasons) are shared with the Execuções page (runs.py) and the
contact page (handoff.py), so they live here, once.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from flask import abort, flash, has_request_context, redirect, request, url_for
from flask_admin import expose
from flask_admin.actions import action
from flask_admin.contrib.sqla.filters import BaseSQLAFilter
from flask_login import current_user
from markupsafe import Markup
from sqlalchemy import case, select
from sqlalchemy.engine import Connection

from admin.api import services
from admin.api.core import ApiError
from admin.i18n import _, _l, ngettext, translate
from admin.views.base import TenantModelView, db_session, ids_of, is_editor, local_dt, org_id, write_audit
from admin.views.filters import IdEqualFilter, OrgDateTimeBetweenFilter
from admin.views.followup.exits import last_class_label
from engine.core import clock
from engine.flows import lifecycle, queries
from engine.flows.versions import FlowNotFound, graph_of
from engine.store.models import Enrollment, FlowPointer, contacts, enrollment_events, flow_pointers

#: An enrollment's status in the receptionist's words (masculine: "o acompanhamento").
ENROLLMENT_STATUS_LABELS = {
    "active": _l("Em andamento"), "waiting_reply": _l("Aguardando resposta"),
    "paused_handoff": _l("Pausado: atendimento humano"), "completed": _l("Concluído"),
    "cancelled": _l("Cancelado"), "dead": _l("Falhou"),
}
ENROLLMENT_STATUS_COLORS = {
    "active": "info", "waiting_reply": "warning", "paused_handoff": "secondary", "completed": "success",
    "cancelled": "light", "dead": "danger",
}
#: The builder's names of the six node types (followup-spec §8).
NODE_TYPE_LABELS = {
    "trigger": _l("Gatilho"), "wait": _l("Esperar"), "condition": _l("Condição"),
    "ai_classify": _l("Classificar resposta (IA)"), "action": _l("Enviar mensagem"), "end": _l("Fim"),
}
#: A placeholder left in a sentence whose parameter was not recorded.
_UNFILLED = re.compile(r"%\(\w+\)[sd]")
#: The filter's "every live status" choice, the list's default.
LIVE_CHOICE = "live"


def enrollment_badge(status: str | None) -> Markup:
    """A coloured badge for an enrollment's status."""
    if not status:
        return Markup("—")
    return Markup('<span class="badge badge-{}" data-status="{}">{}</span>').format(
        ENROLLMENT_STATUS_COLORS.get(status, "light"), status, ENROLLMENT_STATUS_LABELS.get(status, status))


def reason_text(code: str | None, params: Mapping[str, Any] | None = None) -> str | None:
    """The catalogue's sentence for a code in the reader's language, or None (no code, or one the
    catalogue does not hold: never shown raw). A `code` parameter that is itself a catalogue code
    (the AI's `timeout` inside `ai_unavailable`) is said as its own sentence; a placeholder whose
    value was not recorded reads "—", never `%(name)s`."""
    text = queries.sentence(code, params)
    if text is None:
        return None
    try:
        out = translate(text)
    except (KeyError, ValueError, TypeError):  # a translation whose placeholders drifted
        out = str(text)
    return _UNFILLED.sub("—", out)


def reason_params(conn: Connection, oid: int, rows: Iterable[Any]) -> dict[int, Mapping[str, Any]]:
    """For each run that has a reason, the parameters its latest event with that reason recorded
    (what the sentence binds), in one query for all the runs of a page."""
    wanted = {int(row.id): code for row in rows if (code := queries.reason_code(row))}
    if not wanted:
        return {}
    found: dict[int, Mapping[str, Any]] = {}
    events = conn.execute(select(enrollment_events.c.enrollment_id, enrollment_events.c.payload).where(
        enrollment_events.c.org_id == oid, enrollment_events.c.enrollment_id.in_(sorted(wanted)))
        .order_by(enrollment_events.c.id.desc()))
    for enrollment_id, payload in events:
        if enrollment_id in found or not isinstance(payload, Mapping) or payload.get("reason") != wanted[enrollment_id]:
            continue
        params = payload.get("params")
        found[enrollment_id] = params if isinstance(params, Mapping) else {}
        if len(found) == len(wanted):
            break
    return found


def run_reason(conn: Connection, oid: int, row: Any, params: Mapping[str, Any] | None = None) -> str | None:
    """Why a run ended, or why its last step failed, with the parameters its event recorded
    (looked up unless the caller already has them, see `reason_params`)."""
    code = queries.reason_code(row)
    if not code:
        return None
    if params is None:
        params = reason_params(conn, oid, [row]).get(int(row.id), {})
    return reason_text(code, params)


def node_label(conn: Connection, oid: int, version_id: int, node_id: str | None) -> str:
    """A step as the builder names it: its label, else its type's name (the id as a last resort)."""
    if not node_id:
        return "—"
    try:
        node = graph_of(conn, oid, version_id).node(node_id)
    except (FlowNotFound, KeyError):
        return node_id
    label = (node.get("label") or "").strip()
    if label:
        return label
    type_label = NODE_TYPE_LABELS.get(node.get("type", ""))
    return f"{type_label} ({node_id})" if type_label else node_id


def relative(when: datetime | None, now: datetime | None = None) -> str:
    """How far `when` is from now, in the reader's language: "em 3 h", "há 5 min", "agora"."""
    if when is None:
        return "—"
    seconds = (when - (now or clock.now())).total_seconds()
    minutes = int(abs(seconds) // 60)
    future = seconds >= 0
    if minutes < 1:
        return _("agora")
    if minutes < 60:
        return _("em %(num)d min", num=minutes) if future else _("há %(num)d min", num=minutes)
    if minutes < 48 * 60:
        hours = minutes // 60
        return _("em %(num)d h", num=hours) if future else _("há %(num)d h", num=hours)
    days = minutes // 1440
    return ngettext("em %(num)d dia", "em %(num)d dias", days) if future \
        else ngettext("há %(num)d dia", "há %(num)d dias", days)


def next_run(when: datetime | None) -> Markup:
    """The next run as the queue shows it: relative, then the instant in the org's time zone."""
    if when is None:
        return Markup('<span class="text-muted">{}</span>').format(_("sem horário (pausado ou encerrado)"))
    return Markup('<span title="{}">{}</span> <small class="text-muted">{}</small>').format(
        local_dt(when, seconds=True), relative(when), local_dt(when))


def flow_names(conn: Connection, oid: int) -> dict[int, str]:
    """The org's flows by id (a page of the queue names each run's flow)."""
    return {int(r.id): r.name for r in conn.execute(
        select(flow_pointers.c.id, flow_pointers.c.name).where(flow_pointers.c.org_id == oid))}


def contact_names(conn: Connection, oid: int, contact_ids: Iterable[int]) -> dict[int, str]:
    """The contacts' names in one query (or "Contato N": an erased contact has none)."""
    wanted = sorted({int(cid) for cid in contact_ids})
    if not wanted:
        return {}
    names = dict(conn.execute(select(contacts.c.id, contacts.c.name)
                              .where(contacts.c.org_id == oid, contacts.c.id.in_(wanted))).all())
    return {cid: names.get(cid) or _("Contato %(id)s", id=cid) for cid in wanted}


def contact_name(conn: Connection, oid: int, contact_id: int) -> str:
    """The contact's name (or "Contato N": an erased contact has none)."""
    return contact_names(conn, oid, [contact_id])[int(contact_id)]


def cancel_run(conn: Connection, oid: int, enrollment_id: int) -> bool:
    """End one of the org's live runs as the clinic (the API's path), audited; False when it was
    not live (or not the org's: the caller has already answered 404 for that)."""
    try:
        services.cancel_enrollment(conn, oid, enrollment_id)
    except ApiError:
        return False
    write_audit(conn, "cancel", "enrollments", enrollment_id, {"reason": "cancelled_by_clinic"})
    return True


# --- the view ------------------------------------------------------------------------------------
def _flow_options() -> list[tuple[str, str]]:
    """The org's flows for the flow filter (built per request, scoped)."""
    if not has_request_context() or not current_user.is_authenticated:
        return []
    rows = db_session().query(FlowPointer.id, FlowPointer.name).filter(
        FlowPointer.org_id == org_id()).order_by(FlowPointer.name).all()
    return [(str(r.id), r.name) for r in rows]


class EnrollmentStatusFilter(BaseSQLAFilter):
    """Status: every live one (the default), or one status, ended ones included."""

    def __init__(self) -> None:
        options = [(LIVE_CHOICE, _l("Todos os não encerrados (padrão)")),
                   *((s, ENROLLMENT_STATUS_LABELS[s]) for s in queries.ENROLLMENT_STATUSES)]
        super().__init__(Enrollment.status, _l("Status"), options=options)

    def validate(self, value: Any) -> bool:
        return value == LIVE_CHOICE or value in queries.ENROLLMENT_STATUSES

    def apply(self, query: Any, value: Any, alias: Any = None) -> Any:
        column = self.get_column(alias)
        if value == LIVE_CHOICE:
            return query.filter(column.in_(lifecycle.LIVE))
        return query.filter(column == value)

    def operation(self) -> Any:
        return _l("é")


class _Row:
    """Per-request lookups for one page of the list (names of flows and contacts, node labels)."""

    def __init__(self) -> None:
        self.flows: dict[int, str] | None = None
        self.contacts: dict[int, str] = {}
        self.reasons: dict[int, Mapping[str, Any]] | None = None


def _lookups(view: Any) -> _Row:
    from flask import g

    found = g.get("lembra_followup_rows")
    if found is None:
        found = g.lembra_followup_rows = _Row()
    return found


def _flow(view: Any, model: Any) -> str:
    rows = _lookups(view)
    if rows.flows is None:
        rows.flows = flow_names(view.session.connection(), org_id())
    return rows.flows.get(int(model.pointer_id), f"#{model.pointer_id}")


def _contact(view: Any, model: Any) -> str:
    rows = _lookups(view)
    cid = int(model.contact_id)
    if cid not in rows.contacts:
        rows.contacts[cid] = contact_name(view.session.connection(), org_id(), cid)
    return rows.contacts[cid]


def _node(view: Any, model: Any) -> str:
    return node_label(view.session.connection(), org_id(), int(model.version_id), model.current_node_id)


def _last_class(view: Any, model: Any) -> str:
    if not model.last_class:
        return ""
    try:
        graph = graph_of(view.session.connection(), org_id(), int(model.version_id))
    except FlowNotFound:
        return str(model.last_class)
    return last_class_label(graph, model.last_class) or ""


def _reason(view: Any, model: Any) -> str:
    reasons = _lookups(view).reasons
    params = reasons.get(int(model.id), {}) if reasons is not None else None
    return run_reason(view.session.connection(), org_id(), model, params) or ""


def _prefetch(view: Any, rows: Sequence[Any]) -> None:
    """A page's contact names and reason parameters in two queries, not two per row."""
    lookups = _lookups(view)
    conn = view.session.connection()
    oid = org_id()
    lookups.contacts.update(contact_names(conn, oid, {int(r.contact_id) for r in rows} - set(lookups.contacts)))
    lookups.reasons = reason_params(conn, oid, rows)


def _contact_link(view: Any, context: Any, model: Any, name: str) -> Markup:
    return Markup('<a href="{}">{}</a>').format(url_for("contacts.details_view", id=model.contact_id),
                                                _contact(view, model))


def _run_link(view: Any, context: Any, model: Any, name: str) -> Markup:
    return Markup('<a class="btn btn-sm btn-outline-secondary" href="{}">{}</a>').format(
        url_for("followup_runs.index", enrollment=model.id), _("Ver execução"))


class FollowupQueueView(TenantModelView):
    """Fila de follow-ups (endpoint `followup_queue`): live runs by default; every role reads,
    owners and managers cancel."""

    allow_create = allow_edit = allow_delete = False  # runs start by triggers or by hand (contact page)
    can_view_details = False  # a run's page is its timeline (Execuções)
    column_list = ("contact", "flow", "node", "next_eval_at", "status", "last_class", "reason", "run")
    column_export_list = ("id", "contact", "flow", "node", "next_eval_at", "status", "last_class", "reason",
                          "created_at")
    column_labels = {"id": "#", "contact": _l("Paciente"), "flow": _l("Fluxo"), "node": _l("Etapa atual"),
                     "next_eval_at": _l("Próximo disparo"), "status": _l("Status"),
                     "reason": _l("Motivo ou último erro"), "run": _l("Execução"), "created_at": _l("Entrou em"),
                     "last_class": _l("Última classe da resposta")}
    column_formatters = {
        "contact": _contact_link,
        "flow": lambda v, c, m, n: _flow(v, m),
        "node": lambda v, c, m, n: _node(v, m),
        "next_eval_at": lambda v, c, m, n: next_run(m.next_eval_at),
        "status": lambda v, c, m, n: enrollment_badge(m.status),
        "reason": lambda v, c, m, n: _reason(v, m),
        "last_class": lambda v, c, m, n: _last_class(v, m),
        "run": _run_link,
    }
    column_formatters_export = {
        "contact": lambda v, c, m, n: _contact(v, m),
        "flow": lambda v, c, m, n: _flow(v, m),
        "node": lambda v, c, m, n: _node(v, m),
        "next_eval_at": lambda v, c, m, n: local_dt(m.next_eval_at),
        "status": lambda v, c, m, n: m.status,
        "reason": lambda v, c, m, n: _reason(v, m),
        "last_class": lambda v, c, m, n: _last_class(v, m),
    }
    column_filters = (
        IdEqualFilter(Enrollment.pointer_id, _l("Fluxo"), options=_flow_options),
        EnrollmentStatusFilter(),
        OrgDateTimeBetweenFilter(Enrollment.next_eval_at, _l("Próximo disparo")),
        OrgDateTimeBetweenFilter(Enrollment.created_at, _l("Entrou em")),
    )
    column_sortable_list = ("next_eval_at", "created_at")
    list_template = "admin/followup/queue_list.html"  # the list, refreshed every 30 s
    empty_message = _l("Nenhum paciente em follow-up agora. Publique um fluxo e inclua pacientes pela página do "
                       "contato, ou espere o gatilho do fluxo.")
    audit_entity = "enrollments"

    # --- live runs unless a status is chosen ------------------------------------------------------
    def _status_chosen(self) -> bool:
        keys = {key for key, (_idx, flt) in (self._filter_args or {}).items()
                if isinstance(flt, EnrollmentStatusFilter)}
        return any(arg.startswith("flt") and "_" in arg and arg.split("_", 1)[1] in keys for arg in request.args)

    def _live_only(self) -> bool:
        # Only the list (and its export) narrows to live runs: a cancel names any run of the org.
        return has_request_context() and (request.endpoint or "").endswith((".index_view", ".export")) \
            and not self._status_chosen()

    def get_query(self) -> Any:
        query = super().get_query()
        return query.filter(Enrollment.status.in_(lifecycle.LIVE)) if self._live_only() else query

    def get_count_query(self) -> Any:
        query = super().get_count_query()
        return query.filter(Enrollment.status.in_(lifecycle.LIVE)) if self._live_only() else query

    def get_list(self, *args: Any, **kwargs: Any) -> Any:
        count, rows = super().get_list(*args, **kwargs)
        _prefetch(self, list(rows))
        return count, rows

    def _apply_sorting(self, query: Any, joins: Any, sort_column: Any, sort_desc: bool) -> Any:
        if sort_column is not None:
            return super()._apply_sorting(query, joins, sort_column, sort_desc)
        # Soonest first, runs without a clock (paused) last: a CASE, since NULLs sort first on
        # SQLite and last on PostgreSQL.
        return query.order_by(case((Enrollment.next_eval_at.is_(None), 1), else_=0), Enrollment.next_eval_at,
                              Enrollment.id), joins

    # --- cancel ---------------------------------------------------------------------------------
    def _cancel(self, ids: list[int]) -> int:
        conn = self.session.connection()
        done = sum(1 for eid in ids if cancel_run(conn, org_id(), eid))
        self.session.commit()
        return done

    @staticmethod
    def _flash_cancelled(done: int) -> None:
        if done:
            flash(ngettext("%(num)d acompanhamento cancelado; as mensagens dele que ainda não saíram não saem mais.",
                           "%(num)d acompanhamentos cancelados; as mensagens deles que ainda não saíram não saem "
                           "mais.", done), "success")
        else:
            flash(_("Nenhum dos selecionados estava em andamento."), "warning")

    @action("cancel", _l("Cancelar"), _l("Cancelar os acompanhamentos selecionados? As mensagens que ainda não "
                                         "saíram deixam de sair."))
    def action_cancel(self, ids: Any) -> None:
        """List action: cancel the selected live runs of the org (other ids are ignored)."""
        wanted = ids_of(ids)
        mine = [int(r.id) for r in self.scope(self.session.query(Enrollment.id)).filter(Enrollment.id.in_(wanted))] \
            if wanted else []
        self._flash_cancelled(self._cancel(mine))

    @expose("/cancel/<int:id>/", methods=("POST",))
    def cancel_view(self, id: int) -> Any:
        """The Execuções page's Cancelar button (owners and managers)."""
        model = self.get_one(id)  # another org's run: 404, whoever asks
        if not is_editor():
            abort(403)
        self._flash_cancelled(self._cancel([int(model.id)]))
        return redirect(url_for("followup_runs.index", enrollment=model.id))
