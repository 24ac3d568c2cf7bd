"""Pendências: the operator's inbox (engine.queue.inbox) — things a person must look at and then mark
resolved: messages given up on or with an unknown outcome, broken channels, patients who
cancelled by replying.

Unlike the other views, agents act here too: the front desk is who handles these items, so
"Resolver" is open to every role (it changes nothing but the item's own resolved_at/by).
"""

from __future__ import annotations

from typing import Any

from flask import flash, g, redirect, url_for
from flask_admin import expose
from flask_admin.actions import action
from flask_admin.contrib.sqla.filters import BaseSQLAFilter
from flask_admin.contrib.sqla.view import ModelView
from flask_login import current_user
from markupsafe import Markup
from sqlalchemy import case, func

from admin.i18n import _, _l, ngettext
from admin.views.base import KIND_LABELS as CHANNEL_KIND_LABELS
from admin.views.base import (
    PURPOSE_LABELS,
    CountedMenu,
    TenantModelView,
    db_session,
    ids_of,
    local_dt,
    org_id,
    write_audit,
)
from admin.views.followup.queue import reason_text, run_reason
from admin.views.words import code_text
from engine.core import clock
from engine.flows import queries
from engine.messaging.conversations import unhandled_count
from engine.queue.inbox import resolve_inbox_item
from engine.store.models import Appointment, Channel, Contact, InboxItem, Message, User

#: What engine code opens (grep open_inbox_item), in the operator's words.
KIND_LABELS = {
    "message_dead": _l("Mensagem não enviada"),
    "message_unknown": _l("Envio incerto"),
    "message_failed": _l("Mensagem recusada"),
    "channel_broken": _l("Canal com problema"),
    "appointment_cancelled_by_patient": _l("Cancelado pelo paciente"),
    "enrollment_dead": _l("Follow-up parado"),
    "handoff_requested": _l("Paciente pediu uma pessoa"),
    "flow_notification": _l("Aviso de um fluxo"),
}
#: What to do about each kind (the engine's `detail` is a short technical note, in English).
KIND_HINTS = {
    "message_dead": _l("O Lembra desistiu depois de várias tentativas. Verifique o canal e, se ainda fizer "
                       "sentido, reenvie pela Fila."),
    "message_unknown": _l("Não dá para saber se a mensagem saiu. Confira com o paciente antes de reenviar, para "
                          "não mandar duas vezes."),
    "message_failed": _l("O provedor recusou a mensagem e ela não será tentada de novo. Leia o motivo, corrija o "
                         "contato, o modelo ou o canal e reenvie pela Fila; se houver outro canal na regra, ele já "
                         "foi para a fila."),
    "channel_broken": _l("O canal parou de enviar. Abra o canal, confira as credenciais ou reconecte o número."),
    "appointment_cancelled_by_patient": _l("O paciente respondeu CANCELAR. Libere o horário na agenda e, se for o "
                                           "caso, ofereça outro."),
    "enrollment_dead": _l("O Lembra desistiu desta etapa do follow-up depois de várias tentativas. Abra a execução "
                          "para ver o motivo, corrija o fluxo ou o agente e, se fizer sentido, inclua o paciente de "
                          "novo."),
    "handoff_requested": _l("O paciente pediu para falar com alguém da clínica no meio de uma conversa do "
                            "follow-up. Responda em Conversas e, ao terminar, devolva a conversa ao Lembra."),
    "flow_notification": _l("Uma etapa de um fluxo pediu para avisar a equipe; o texto é o que a clínica escreveu "
                            "nessa etapa. Abra a execução para ver o paciente e a conversa."),
}


def open_count() -> int:
    """Open items of the signed-in user's org."""
    return int(db_session().query(func.count(InboxItem.id))
               .filter(InboxItem.org_id == org_id(), InboxItem.resolved_at.is_(None)).scalar() or 0)


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


class _Page:
    """What one page of items is about, read in a few queries (not two per row)."""

    def __init__(self) -> None:
        self.messages: dict[int, Any] = {}
        self.appointments: dict[int, Any] = {}
        self.contacts: dict[int, str] = {}
        self.channels: dict[int, Any] = {}


def _page(view: Any) -> _Page:
    found = g.get("lembra_inbox_page")
    if found is None:
        found = g.lembra_inbox_page = _Page()
    return found


def _prefetch(view: Any, items: list[Any]) -> None:
    """Load the messages, appointments, contacts and channels a page of items points at."""
    page, oid, session = _page(view), org_id(), view.session
    message_ids = {int(i.message_id) for i in items if i.message_id}
    if message_ids:
        page.messages.update({int(m.id): m for m in session.query(Message).filter(
            Message.org_id == oid, Message.id.in_(message_ids))})
    appointment_ids = {int(i.appointment_id) for i in items if i.appointment_id}
    appointment_ids |= {int(m.appointment_id) for m in page.messages.values() if m.appointment_id}
    if appointment_ids:
        page.appointments.update({int(a.id): a for a in session.query(Appointment).filter(
            Appointment.org_id == oid, Appointment.id.in_(appointment_ids))})
    contact_ids = {int(m.contact_id) for m in page.messages.values() if m.contact_id}
    contact_ids |= {int(a.contact_id) for a in page.appointments.values() if a.contact_id}
    if contact_ids:
        page.contacts.update({int(c.id): c.name or "" for c in session.query(Contact.id, Contact.name).filter(
            Contact.org_id == oid, Contact.id.in_(contact_ids))})
    channel_ids = {int(i.channel_id) for i in items if i.channel_id}
    if channel_ids:
        page.channels.update({int(c.id): c for c in session.query(Channel).filter(
            Channel.org_id == oid, Channel.id.in_(channel_ids))})


def _looked_up(view: Any, model: Any) -> _Page:
    """The page's lookups; a details page (one item, no list) fills them for its item."""
    page = _page(view)
    if (model.message_id and int(model.message_id) not in page.messages) or \
            (model.appointment_id and int(model.appointment_id) not in page.appointments) or \
            (model.channel_id and int(model.channel_id) not in page.channels):
        _prefetch(view, [model])
    return page


def _detail(view: Any, context: Any, model: Any, name: str) -> str:
    """What happened, in words: the catalogue's sentence for the code behind the item (the
    engine's `detail` is a code or a technical note, never shown as it is)."""
    if model.kind == "enrollment_dead":
        run = queries.find_enrollment(view.session.connection(), org_id(), model.enrollment_id) \
            if model.enrollment_id else None
        text = run_reason(view.session.connection(), org_id(), run) if run is not None else None
        return text or reason_text(model.detail) or ""  # an unknown code is never shown raw
    page = _looked_up(view, model)
    message = page.messages.get(int(model.message_id)) if model.message_id else None
    if model.kind == "message_dead" and message is not None:
        return _("O Lembra tentou %(num)s vezes. Último erro: %(reason)s", num=message.attempts or 0,
                 reason=code_text(message.error_code, kind=message.channel_kind) or "—")
    if model.kind == "message_failed" and message is not None:
        return code_text(message.error_code or model.detail, kind=message.channel_kind)
    if model.kind == "channel_broken" and model.channel_id:
        channel = page.channels.get(int(model.channel_id))
        return code_text(channel.status_detail, kind=channel.kind) if channel is not None else ""
    return ""


def _hint(view: Any, context: Any, model: Any, name: str) -> str:
    return str(KIND_HINTS.get(model.kind, ""))


def _state(view: Any, context: Any, model: Any, name: str) -> Markup:
    if model.resolved_at is None:
        return Markup('<span class="badge badge-warning">{}</span>').format(_("Aberta"))
    return Markup('<span class="badge badge-success">{}</span>').format(_("Resolvida"))


def _appointment_label(page: _Page, appointment: Any) -> str:
    return _("%(patient)s em %(when)s", patient=page.contacts.get(int(appointment.contact_id)) or _("paciente"),
             when=local_dt(appointment.starts_at))


def _related(view: Any, context: Any, model: Any, name: str) -> Markup:
    """Links to what the item is about, named by the patient and the time (those views are
    org-scoped and answer 404 otherwise)."""
    page = _looked_up(view, model)
    links: list[Markup] = []
    link = Markup('<a href="{}">{}</a>')
    message = page.messages.get(int(model.message_id)) if model.message_id else None
    appointment_id = model.appointment_id or (message.appointment_id if message is not None else None)
    if message is not None:
        label = _("%(what)s para %(patient)s (%(channel)s)", what=PURPOSE_LABELS.get(message.purpose) or _("Mensagem"),
                  patient=page.contacts.get(int(message.contact_id)) or _("paciente"),
                  channel=CHANNEL_KIND_LABELS.get(message.channel_kind, message.channel_kind))
        links.append(link.format(url_for("queue.details_view", id=model.message_id), label))
    if appointment_id and int(appointment_id) in page.appointments:
        links.append(link.format(url_for("appointments.details_view", id=appointment_id),
                                 _appointment_label(page, page.appointments[int(appointment_id)])))
    if model.channel_id:
        channel = page.channels.get(int(model.channel_id))
        links.append(link.format(url_for("channels.details_view", id=model.channel_id),
                                 channel.name if channel is not None else _("Canal")))
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


class InboxView(CountedMenu, TenantModelView):
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
    list_template = "admin/inbox_list.html"
    details_template = "admin/inbox_details.html"
    empty_message = _l("Nada pendente.")
    audit_entity = "inbox_items"

    def menu_count(self) -> int:
        return open_count()

    def get_list(self, *args: Any, **kwargs: Any) -> Any:
        count, rows = super().get_list(*args, **kwargs)
        _prefetch(self, list(rows))
        return count, rows

    def render(self, template: str, **kwargs: Any) -> Any:
        # Replies nobody has read are the front desk's to-do too; they live in Conversas (one
        # store of inbound messages), and Pendências says how many wait there.
        kwargs.setdefault("conversations_waiting",
                          unhandled_count(self.session.connection(), org_id()) if current_user.is_authenticated else 0)
        return super().render(template, **kwargs)

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
