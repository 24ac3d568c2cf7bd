"""Pendências: the operator's inbox (engine.inbox) — things a person must look at and then mark
resolved: messages given up on or with an unknown outcome, broken channels, patients who
cancelled by replying.

Unlike the other views, agents act here too: the front desk is who handles these items, so
"Resolver" is open to every role (it changes nothing but the item's own resolved_at/by).
"""

from __future__ import annotations

from typing import Any

from flask import flash, has_request_context, redirect, url_for
from flask_admin import expose
from flask_admin.actions import action
from flask_admin.contrib.sqla.filters import BaseSQLAFilter
from flask_admin.contrib.sqla.view import ModelView
from flask_login import current_user
from markupsafe import Markup, escape
from sqlalchemy import case, func

from admin.i18n import _, _l, ngettext
from admin.views.base import TenantModelView, db_session, ids_of, org_id, write_audit
from admin.views.followup.queue import reason_text, run_reason
from engine import clock
from engine.flows import queries
from engine.inbox import resolve_inbox_item
from engine.models import Channel, InboxItem, User

#: What engine code opens (grep open_inbox_item), in the operator's words.
KIND_LABELS = {
    "message_dead": _l("Mensagem não enviada"),
    "message_unknown": _l("Envio incerto"),
    "channel_broken": _l("Canal com problema"),
    "appointment_cancelled_by_patient": _l("Cancelado pelo paciente"),
    "enrollment_dead": _l("Follow-up parado"),
}
#: What to do about each kind (the engine's `detail` is a short technical note, in English).
KIND_HINTS = {
    "message_dead": _l("O Lembra desistiu depois de várias tentativas. Verifique o canal e, se ainda fizer "
                       "sentido, reenvie pela Fila."),
    "message_unknown": _l("Não dá para saber se a mensagem saiu. Confira com o paciente antes de reenviar, para "
                          "não mandar duas vezes."),
    "channel_broken": _l("O canal parou de enviar. Abra o canal, confira as credenciais ou reconecte o número."),
    "appointment_cancelled_by_patient": _l("O paciente respondeu CANCELAR. Libere o horário na agenda e, se for o "
                                           "caso, ofereça outro."),
    "enrollment_dead": _l("O Lembra desistiu desta etapa do follow-up depois de várias tentativas. Abra a execução "
                          "para ver o motivo, corrija o fluxo ou o agente e, se fizer sentido, inclua o paciente de "
                          "novo."),
}


def open_count() -> int:
    """Open items of the signed-in user's org."""
    return int(db_session().query(func.count(InboxItem.id))
               .filter(InboxItem.org_id == org_id(), InboxItem.resolved_at.is_(None)).scalar() or 0)


class OpenCountLabel:
    """The menu label with the number of open items, "Pendências (3)", counted at each render for
    the signed-in user's org (the menu is built once at start-up for everyone)."""

    def __init__(self, label: Any) -> None:
        self.label = label

    def __str__(self) -> str:
        label = str(self.label)
        if not has_request_context() or not current_user.is_authenticated:
            return label
        count = open_count()
        return f"{label} ({count})" if count else label

    def __html__(self) -> str:
        return str(escape(str(self)))


class StateFilter(BaseSQLAFilter):
    """Aberta / Resolvida, i.e. resolved_at empty or not."""

    def __init__(self) -> None:
        super().__init__(InboxItem.resolved_at, _l("Situação"),
                         options=[("open", _l("Aberta")), ("resolved", _l("Resolvida"))])

    def apply(self, query: Any, value: Any, alias: Any = None) -> Any:
        column = self.get_column(alias)
        return query.filter(column.isnot(None) if value == "resolved" else column.is_(None))

    def operation(self) -> Any:
        return _l("é")


def _kind(view: Any, context: Any, model: Any, name: str) -> str:
    return str(KIND_LABELS.get(model.kind, model.kind))


def _detail(view: Any, context: Any, model: Any, name: str) -> str:
    """The engine's note; a follow-up's is a catalogue code, shown as its sentence."""
    if model.kind == "enrollment_dead":
        run = queries.find_enrollment(view.session.connection(), org_id(), model.enrollment_id) \
            if model.enrollment_id else None
        text = run_reason(view.session.connection(), org_id(), run) if run is not None else None
        return text or reason_text(model.detail) or ""  # an unknown code is never shown raw
    return model.detail or ""


def _hint(view: Any, context: Any, model: Any, name: str) -> str:
    return str(KIND_HINTS.get(model.kind, ""))


def _state(view: Any, context: Any, model: Any, name: str) -> Markup:
    if model.resolved_at is None:
        return Markup('<span class="badge badge-warning">{}</span>').format(_("Aberta"))
    return Markup('<span class="badge badge-success">{}</span>').format(_("Resolvida"))


def _channel_name(view: Any, channel_id: int) -> str:
    row = view.session.query(Channel.name).filter(Channel.org_id == org_id(), Channel.id == channel_id).first()
    return row.name if row else f"#{channel_id}"


def _related(view: Any, context: Any, model: Any, name: str) -> Markup:
    """Links to what the item is about (those views are org-scoped and answer 404 otherwise)."""
    links: list[Markup] = []
    link = Markup('<a href="{}">{}</a>')
    if model.message_id:
        links.append(link.format(url_for("queue.details_view", id=model.message_id),
                                 _("Mensagem #%(id)s", id=model.message_id)))
    if model.appointment_id:
        links.append(link.format(url_for("appointments.details_view", id=model.appointment_id),
                                 _("Agendamento #%(id)s", id=model.appointment_id)))
    if model.channel_id:
        links.append(link.format(url_for("channels.details_view", id=model.channel_id),
                                 _channel_name(view, model.channel_id)))
    if model.enrollment_id:  # the run's timeline (Execuções), org-scoped like the others
        links.append(link.format(url_for("followup_runs.index", enrollment=model.enrollment_id),
                                 _("Execução #%(id)s", id=model.enrollment_id)))
    return Markup(" · ").join(links) if links else Markup("—")


def _related_text(view: Any, context: Any, model: Any, name: str) -> str:
    parts = [f"{label}:{value}" for label, value in (
        ("message", model.message_id), ("appointment", model.appointment_id), ("channel", model.channel_id),
        ("enrollment", model.enrollment_id)) if value]
    return " ".join(parts)


def _resolver_email(view: Any, model: Any) -> str:
    if model.resolved_by is None:
        return ""
    row = view.session.query(User.email).filter(User.org_id == org_id(), User.id == model.resolved_by).first()
    return row.email if row else f"#{model.resolved_by}"


def _resolved_by(view: Any, context: Any, model: Any, name: str) -> str:
    return _resolver_email(view, model) or "—"


class InboxView(TenantModelView):
    """Pendências of the org, open ones first; every role may resolve."""

    allow_create = allow_edit = allow_delete = False  # the engine opens items; people only resolve them
    column_list = ("state", "kind", "detail", "related", "created_at")
    column_details_list = ("state", "kind", "hint", "detail", "related", "created_at", "resolved_at", "resolved_by")
    column_export_list = ("kind", "detail", "related", "created_at", "resolved_at", "resolved_by")
    column_labels = {"state": _l("Situação"), "kind": _l("Tipo"), "hint": _l("O que fazer"), "detail": _l("Detalhe"),
                     "related": _l("Sobre"), "created_at": _l("Aberta em"), "resolved_at": _l("Resolvida em"),
                     "resolved_by": _l("Resolvida por")}
    column_formatters = {"state": _state, "kind": _kind, "hint": _hint, "related": _related,
                         "resolved_by": _resolved_by, "detail": _detail}
    column_formatters_detail = column_formatters
    column_formatters_export = {"kind": lambda v, c, m, n: m.kind, "related": _related_text, "detail": _detail,
                                "resolved_by": lambda v, c, m, n: _resolver_email(v, m)}
    column_filters = (StateFilter(),)
    column_sortable_list = ("created_at", "resolved_at")
    details_template = "admin/inbox_details.html"
    empty_message = _l("Nada pendente.")
    audit_entity = "inbox_items"

    # The menu item is created by Flask-Admin (it sets `view.menu`); its label gets the count.
    @property
    def menu(self) -> Any:
        return self._menu

    @menu.setter
    def menu(self, item: Any) -> None:
        if item is not None and not isinstance(item.name, OpenCountLabel):
            item.name = OpenCountLabel(item.name)
        self._menu = item

    def is_action_allowed(self, name: str) -> bool:
        # Not TenantModelView's editors-only rule: agents resolve items too (see module docstring).
        return bool(current_user.is_authenticated) and ModelView.is_action_allowed(self, name)

    def _apply_sorting(self, query: Any, joins: Any, sort_column: Any, sort_desc: bool) -> Any:
        if sort_column is not None:
            return super()._apply_sorting(query, joins, sort_column, sort_desc)
        # Default order: open items first, newest first. Spelled as a CASE because NULLs sort first
        # on SQLite and last on PostgreSQL.
        return query.order_by(case((InboxItem.resolved_at.is_(None), 0), else_=1), InboxItem.created_at.desc(),
                              InboxItem.id.desc()), joins

    def _resolve(self, ids: list[int]) -> int:
        conn = self.session.connection()
        now, user_id = clock.now(), int(current_user.id)
        done = 0
        for item_id in ids:
            if resolve_inbox_item(conn, org_id(), item_id, user_id):
                write_audit(conn, "resolve", self.audit_entity, item_id, {"resolved_at": now})
                done += 1
        self.session.commit()
        return done

    def _flash_resolved(self, done: int) -> None:
        if done:
            flash(ngettext("%(num)d pendência resolvida.", "%(num)d pendências resolvidas.", done), "success")
        else:
            flash(_("Nenhuma das selecionadas estava aberta."), "warning")

    @action("resolve", _l("Resolver"), _l("Marcar as pendências selecionadas como resolvidas?"))
    def action_resolve(self, ids: Any) -> None:
        """List action: resolve the selected open items of the org (other ids are ignored)."""
        self._flash_resolved(self._resolve(ids_of(ids)))

    @expose("/resolve/<int:id>/", methods=("POST",))
    def resolve_view(self, id: int) -> Any:
        """The details page's Resolver button."""
        model = self.get_one(id)  # another org's item: 404
        self._flash_resolved(self._resolve([int(model.id)]))
        return redirect(self.get_url(".details_view", id=id))
