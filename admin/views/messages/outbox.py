"""Fila (the outbox: filters, cancel, retry) and Registros (message logs with their timeline)."""

from __future__ import annotations

from typing import Any

from flask import flash
from flask_admin.actions import action
from flask_admin.contrib.sqla.filters import FilterEqual
from markupsafe import Markup
from sqlalchemy import select

from admin.i18n import _, _l, ngettext
from admin.views.words import code_text, event_detail_text, event_text, message_reason_text, provider_status_text
from admin.views.base import (
    KIND_LABELS,
    PURPOSE_LABELS,
    STATUS_LABELS,
    TenantModelView,
    badge,
    ids_of,
    local_dt,
    org_id,
    write_audit,
)
from admin.views.filters import IdEqualFilter, OrgDateTimeBetweenFilter, PatientSearchMixin
from engine.core import clock
from engine.store.models import (
    CHANNEL_KINDS,
    MESSAGE_STATUSES,
    OPEN_STATUSES,
    Channel,
    Appointment,
    Contact,
    Message,
    Org,
    User,
    message_events,
)
from engine.queue.outbox import transition
from engine.messaging.templates import message_variables

RETRYABLE = ("failed", "dead", "unknown", "expired")
LOGGED = ("sent", "delivered", "read", "failed", "unknown", "dead", "expired", "sending")


def _variables(view: Any, model: Any) -> Markup:
    """What the template had to fill in: the appointment's, contact's and org's values as the
    send builds them (a message stores only what was given beyond those)."""
    if model.template_key is None:
        return Markup("—")
    session, oid = view.session, org_id()
    contact = session.query(Contact).filter(Contact.org_id == oid, Contact.id == model.contact_id).first()
    org = session.get(Org, oid)
    if contact is None or org is None:
        return Markup("—")
    appointment = session.query(Appointment).filter(Appointment.org_id == oid,
                                                    Appointment.id == model.appointment_id).first() \
        if model.appointment_id else None
    try:
        values = message_variables(org=org, contact=contact, appointment=appointment,
                                   extra=(model.payload or {}).get("variables"))
    except ValueError:
        return Markup("—")
    lines = [Markup("<div><code>{}</code> = {}</div>").format("{{ %s }}" % name, value)
             for name, value in sorted(values.items()) if isinstance(name, str)]
    return Markup("").join(lines) if lines else Markup("—")


def _contact(view: Any, model: Any) -> str:
    row = view.session.query(Contact.name).filter(Contact.org_id == org_id(), Contact.id == model.contact_id).first()
    return row.name if row and row.name else _("Contato %(id)s", id=model.contact_id)


def _channel_options() -> list[tuple[str, str]]:
    """The org's channels, for the channel filter (evaluated per request, scoped)."""
    from flask import has_request_context
    from flask_login import current_user

    from admin.views.base import db_session

    if not has_request_context() or not current_user.is_authenticated:
        return []
    rows = db_session().query(Channel.id, Channel.name).filter(Channel.org_id == org_id()).order_by(Channel.name).all()
    return [(str(r.id), r.name) for r in rows]


STATUS_OPTIONS = [(s, STATUS_LABELS[s]) for s in MESSAGE_STATUSES]
KIND_OPTIONS = [(k, KIND_LABELS[k]) for k in CHANNEL_KINDS]
PURPOSE_OPTIONS = list(PURPOSE_LABELS.items())


class _MessageBase(PatientSearchMixin, TenantModelView):
    """A list of the org's messages; its search box finds them by the patient's name or phone."""

    allow_create = False
    allow_edit = False
    allow_delete = False
    column_labels = {
        "id": "#", "contact": _l("Paciente"), "purpose": _l("Tipo"), "channel_kind": _l("Canal"),
        "status": _l("Status"), "due_at": _l("Programada para"), "sent_at": _l("Enviada"),
        "delivered_at": _l("Entregue"), "read_at": _l("Lida"), "attempts": _l("Tentativas"),
        "reason": _l("Motivo"), "template_key": _l("Modelo"), "body": _l("Texto enviado"), "subject": _l("Assunto"),
        "error_code": _l("Erro"), "error_detail": _l("Detalhe do erro"), "skip_reason": _l("Motivo"),
        "provider_message_id": _l("Id no provedor"), "created_at": _l("Criada em"), "failed_at": _l("Falhou em"),
        "variables": _l("Variáveis"),
    }
    column_formatters = {
        "contact": lambda v, c, m, n: _contact(v, m),
        "purpose": lambda v, c, m, n: PURPOSE_LABELS.get(m.purpose, m.purpose),
        "template_key": lambda v, c, m, n: PURPOSE_LABELS.get(m.template_key, m.template_key) if m.template_key
        else _("Texto escrito na hora"),
        "channel_kind": lambda v, c, m, n: KIND_LABELS.get(m.channel_kind, m.channel_kind),
        "status": lambda v, c, m, n: badge(m.status),
        "reason": lambda v, c, m, n: message_reason_text(m),
        "error_code": lambda v, c, m, n: code_text(m.error_code, kind=m.channel_kind),
        "skip_reason": lambda v, c, m, n: code_text(m.skip_reason, kind=m.channel_kind),
        "variables": lambda v, c, m, n: _variables(v, m),
    }
    column_formatters_detail = column_formatters
    # The export is read by tools: codes as stored.
    column_formatters_export = {
        "contact": lambda v, c, m, n: _contact(v, m),
        "reason": lambda v, c, m, n: m.error_code or m.skip_reason or "",
        "status": lambda v, c, m, n: m.status,
    }
    column_default_sort = ("id", True)
    column_sortable_list = ("id", "due_at", "sent_at", "status")
    details_template = "admin/message_details.html"

    def render(self, template: str, **kwargs: Any) -> Any:
        model = kwargs.get("model")
        if template == self.details_template and model is not None:
            rows = self.session.connection().execute(
                select(message_events).where(message_events.c.org_id == org_id(),
                                             message_events.c.message_id == model.id)
                .order_by(message_events.c.id)).all()
            user_ids = {r.detail.get("user_id") for r in rows if isinstance(r.detail, dict)} - {None}
            users = dict(self.session.query(User.id, User.email).filter(
                User.org_id == org_id(), User.id.in_(user_ids)).all()) if user_ids else {}
            kwargs["events"] = [{
                "when": local_dt(r.created_at, seconds=True), "label": event_text(r.event),
                "attempt": r.attempt, "provider_status": r.provider_status,
                "provider_label": provider_status_text(r.provider_status),
                "detail": event_detail_text(r.detail if isinstance(r.detail, dict) else None,
                                            kind=model.channel_kind, users=users),
            } for r in rows]
        return super().render(template, **kwargs)


class QueueView(_MessageBase):
    """Fila: every message of the org, with cancel and retry through engine.queue.outbox.transition."""

    column_list = ("id", "contact", "purpose", "channel_kind", "status", "due_at", "sent_at", "attempts", "reason")
    column_details_list = ("id", "contact", "purpose", "channel_kind", "status", "template_key", "due_at", "sent_at",
                           "delivered_at", "read_at", "failed_at", "attempts", "error_code", "skip_reason",
                           "created_at")
    column_export_list = column_list
    column_filters = (
        FilterEqual(Message.status, _l("Status"), options=STATUS_OPTIONS),
        FilterEqual(Message.channel_kind, _l("Canal"), options=KIND_OPTIONS),
        FilterEqual(Message.purpose, _l("Tipo"), options=PURPOSE_OPTIONS),
        OrgDateTimeBetweenFilter(Message.due_at, _l("Programada para")),
    )
    empty_message = _l("Nada na fila. Crie regras de lembrete e agendamentos para ver mensagens aqui.")

    @action("cancel", _l("Cancelar"), _l("Cancelar as mensagens selecionadas que ainda não saíram?"))
    def action_cancel(self, ids: Any) -> None:
        conn = self.session.connection()
        done = 0
        for mid in ids_of(ids):
            if transition(conn, org_id(), mid, OPEN_STATUSES, "cancelled", "cancelled",
                          values={"skip_reason": "cancelled_by_operator", "lease_until": None},
                          detail={"reason": "cancelled_by_operator", "user_id": int(current_user_id())}):
                write_audit(conn, "cancel", "messages", mid, {"status": "cancelled"})
                done += 1
        self.session.commit()
        flash(ngettext("%(num)d mensagem cancelada.", "%(num)d mensagens canceladas.", done) if done
              else _("Nenhuma das selecionadas podia ser cancelada."), "success" if done else "warning")

    @action("retry", _l("Reenviar"), _l("Reenviar agora as mensagens selecionadas que falharam?"))
    def action_retry(self, ids: Any) -> None:
        conn = self.session.connection()
        now = clock.now()
        done = 0
        for mid in ids_of(ids):
            if transition(conn, org_id(), mid, RETRYABLE, "pending", "retried",
                          values={"due_at": now, "next_attempt_at": now, "lease_until": None, "claimed_by": None,
                                  "error_code": None, "error_detail": None},
                          detail={"reason": "retried_by_operator", "user_id": int(current_user_id())}):
                write_audit(conn, "retry", "messages", mid, {"status": "pending"})
                done += 1
        self.session.commit()
        flash(ngettext("%(num)d mensagem de volta à fila.", "%(num)d mensagens de volta à fila.", done) if done
              else _("Nenhuma das selecionadas podia ser reenviada."), "success" if done else "warning")


class LogView(_MessageBase):
    """Registros: what went out (or tried to), with template, body, variables and provider events."""

    column_list = ("id", "contact", "purpose", "channel_kind", "status", "sent_at", "delivered_at", "read_at", "reason")
    column_details_list = ("id", "contact", "purpose", "channel_kind", "status", "template_key", "subject", "body",
                           "variables", "provider_message_id", "attempts", "sent_at", "delivered_at", "read_at",
                           "failed_at", "error_code", "error_detail")
    column_export_list = ("id", "contact", "purpose", "channel_kind", "status", "template_key", "sent_at",
                          "delivered_at", "read_at", "error_code", "body")
    column_filters = (
        IdEqualFilter(Message.channel_id, _l("Canal"), options=_channel_options),
        FilterEqual(Message.status, _l("Status"), options=[(s, STATUS_LABELS[s]) for s in LOGGED]),
        OrgDateTimeBetweenFilter(Message.sent_at, _l("Período (envio)")),
    )
    column_default_sort = ("sent_at", True)
    empty_message = _l("Nenhuma mensagem enviada ainda. Elas aparecem aqui assim que o primeiro lembrete sair.")

    def scope(self, query: Any) -> Any:
        return super().scope(query).filter(Message.status.in_(LOGGED))


def current_user_id() -> int:
    from flask_login import current_user

    return int(current_user.id)
