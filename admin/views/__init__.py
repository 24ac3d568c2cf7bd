"""The admin console (Flask-Admin) mounted at /admin: one tenant-scoped base view, every view
inheriting it, a scoped ORM session bound to the runtime's engine.

The views are grouped as the menu is: desk/ (the top-level items), messages/ (Mensagens),
followup/ (Acompanhamento) and settings/ (Configuração); base.py, filters.py and words.py are
what they share."""

from __future__ import annotations

from typing import Any

from flask import Flask, g
from flask_admin import Admin
from flask_admin.theme import Bootstrap4Theme
from sqlalchemy import event, text
from sqlalchemy.orm import scoped_session, sessionmaker

from admin.i18n import _l
from admin.security import csp_nonce
from engine.store.models import (
    Appointment,
    AuditLog,
    Channel,
    Contact,
    Message,
    ReminderRule,
    Template,
)
from engine.store.runtime import Runtime


def init_admin(app: Flask, rt: Runtime) -> Admin:
    from admin.views.desk.conversations import ConversationsView
    from admin.views.desk.dashboard import DashboardView
    from admin.views.desk.inbox import InboxView
    from admin.views.desk.scheduling import AppointmentView, ContactView
    from admin.views.followup.agents import AgentView
    from admin.views.followup.builder import FlowBuilderView
    from admin.views.followup.flows import FlowListView
    from admin.views.followup.queue import FollowupQueueView
    from admin.views.followup.runs import RunsView
    from admin.views.messages.outbox import LogView, QueueView
    from admin.views.messages.sandbox import SandboxView
    from admin.views.settings.access import ApiKeyView, UserView
    from admin.views.settings.audit import AuditView
    from admin.views.settings.channels import ChannelView
    from admin.views.settings.rules import ReminderRuleView
    from admin.views.settings.templates import TemplateView
    # settings pages: Campos, Agenda, Webhooks (i33/settings)
    from admin.views.settings.agenda import AgendaView
    from admin.views.settings.conversation import ConversationSettingsView
    from admin.views.settings.fields import FieldsView
    from admin.views.settings.webhooks import WebhooksView
    from engine.store.models import Agent, ApiKey, Enrollment, InboxItem, User

    factory = sessionmaker(bind=rt.db.engine)
    Session: scoped_session[Any] = scoped_session(factory)
    app.extensions["lembra_session"] = Session
    if rt.db.dialect == "postgresql":
        @event.listens_for(factory, "after_begin")
        def _declare_org(session: Any, transaction: Any, connection: Any) -> None:
            # Row-level security behind the views' own filters (defence in depth).
            org_id = g.get("lembra_org_id") if _has_app_context() else None
            if org_id is not None:
                connection.execute(text("SELECT set_config('lembra.org_id', :o, true)"), {"o": str(org_id)})

    @app.teardown_appcontext
    def _remove_session(exc: BaseException | None) -> None:
        Session.remove()

    admin = Admin(app, name="Lembra", url="/admin",
                  index_view=DashboardView(name=_l("Painel"), url="/admin", endpoint="admin"),
                  theme=Bootstrap4Theme(base_template="admin/lembra_base.html", fluid=True),
                  csp_nonce_generator=csp_nonce)  # admin/security.py: Flask-Admin's own scripts carry it
    s = Session
    # One line of menu at 1366 px: what the front desk acts on stays at the top; the message
    # lists, the follow-up engine and the settings are grouped.
    messages_menu, followup, settings = _l("Mensagens"), _l("Acompanhamento"), _l("Configuração")
    admin.add_view(AppointmentView(Appointment, s, name=_l("Agendamentos"), endpoint="appointments"))
    admin.add_view(ContactView(Contact, s, name=_l("Contatos"), endpoint="contacts"))
    admin.add_view(ConversationsView(name=_l("Conversas"), endpoint="conversations"))
    admin.add_view(InboxView(InboxItem, s, name=_l("Pendências"), endpoint="inbox"))
    admin.add_view(QueueView(Message, s, name=_l("Fila"), endpoint="queue", category=messages_menu))
    admin.add_view(LogView(Message, s, name=_l("Registros"), endpoint="logs", category=messages_menu))
    admin.add_view(SandboxView(name=_l("Caixa do sandbox"), endpoint="sandbox", category=messages_menu))
    admin.add_view(FlowListView(name=_l("Fluxos de follow-up"), endpoint="followup_flows", url="followup/flows",
                                category=followup))
    admin.add_view(FlowBuilderView(name=_l("Construtor de fluxos"), endpoint="flow_builder", url="followup/builder",
                                   category=followup))
    admin.add_view(FollowupQueueView(Enrollment, s, name=_l("Fila de follow-ups"), endpoint="followup_queue",
                                     category=followup))
    admin.add_view(RunsView(name=_l("Execuções"), endpoint="followup_runs", category=followup))
    admin.add_view(AgentView(Agent, s, name=_l("Agentes"), endpoint="followup_agents", category=followup))
    admin.add_view(ReminderRuleView(ReminderRule, s, name=_l("Regras de lembrete"), endpoint="rules",
                                    category=settings))
    admin.add_view(TemplateView(Template, s, name=_l("Modelos"), endpoint="templates", category=settings))
    admin.add_view(ChannelView(Channel, s, name=_l("Canais"), endpoint="channels", category=settings))
    admin.add_view(ApiKeyView(ApiKey, s, name=_l("Chaves de API"), endpoint="apikeys", category=settings))
    admin.add_view(UserView(User, s, name=_l("Usuários"), endpoint="users", category=settings))
    # settings pages: Campos, Agenda, Webhooks (i33/settings)
    admin.add_view(FieldsView(name=_l("Campos"), endpoint="settings_fields", url="settings/fields", category=settings))
    admin.add_view(AgendaView(name=_l("Agenda"), endpoint="settings_agenda", url="settings/agenda", category=settings))
    admin.add_view(ConversationSettingsView(name=_l("Atendimento"), endpoint="settings_conversation",
                                            url="settings/conversation", category=settings))
    admin.add_view(WebhooksView(name=_l("Avisos por webhook"), endpoint="settings_webhooks", url="settings/webhooks",
                                category=settings))
    admin.add_view(AuditView(AuditLog, s, name=_l("Auditoria"), endpoint="audit", category=settings))
    return admin


def _has_app_context() -> bool:
    from flask import has_app_context

    return has_app_context()
