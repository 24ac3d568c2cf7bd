"""Auditoria: who changed what, read-only, in the reader's words.

Rows are written by the console, the API and the CLI with the table (or, from the API, the
resource) as `entity` and the changed columns as `changes`; this page names both as a person
would ("Contato", "Papel: gestor") and links to the record when it still exists.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from flask import url_for
from flask_babel.speaklater import LazyString
from markupsafe import Markup

from admin.i18n import _, _l, ngettext, translate
from admin.views.base import (
    KIND_LABELS,
    LOCALE_LABELS,
    PURPOSE_LABELS,
    STATUS_LABELS,
    TenantModelView,
    local_dt,
    org_id,
)
from admin.views.filters import OrgDateTimeBetweenFilter
from admin.views.settings.channels.messages import PROVIDER_LABELS
from admin.views.words import language_name
from engine.store.models import AuditLog, User
from engine.tenants.audit import REDACTED
from engine.words.catalogue import describe, known
from engine.words.reasons import message_reason

ACTION_LABELS = {"create": _l("criou"), "update": _l("alterou"), "delete": _l("excluiu"), "cancel": _l("cancelou"),
                 "retry": _l("reenviou"), "test_send": _l("testou"), "import": _l("importou"),
                 "revoke": _l("revogou"), "resolve": _l("resolveu"), "send": _l("enviou"), "record": _l("registrou"),
                 "check": _l("testou a conexão de"), "test_connection": _l("testou a conexão de"),
                 "connect": _l("conectou"), "create_instance": _l("criou a instância de"),
                 "consent": _l("registrou o consentimento de"), "opt_out": _l("descadastrou"),
                 "erase": _l("apagou os dados de"), "enroll": _l("incluiu no fluxo"), "publish": _l("publicou"),
                 "disable": _l("desativou"), "rollback": _l("voltou a versão de"), "reply": _l("respondeu"),
                 "handle": _l("resolveu"), "handoff": _l("assumiu a conversa de"), "release": _l("devolveu a conversa de")}

#: entity (a table, or the API's resource name) → (label, the console endpoint of its page).
ENTITIES: dict[str, tuple[LazyString, str | None]] = {
    "appointments": (_l("Agendamento"), "appointments.details_view"),
    "contacts": (_l("Contato"), "contacts.details_view"),
    "contact_events": (_l("Evento do contato"), None),
    "reminder_rules": (_l("Regra de lembrete"), "rules.edit_view"),
    "reminder_rule_kinds": (_l("Canais de uma regra"), "rules.edit_view"),
    "templates": (_l("Modelo"), "templates.details_view"),
    "channels": (_l("Canal"), "channels.details_view"),
    "api_keys": (_l("Chave de API"), "apikeys.details_view"),
    "users": (_l("Usuário"), "users.details_view"),
    "messages": (_l("Mensagem"), "queue.details_view"),
    "inbox_items": (_l("Pendência"), "inbox.details_view"),
    "inbound_messages": (_l("Conversa"), None),
    "orgs": (_l("Configurações da clínica"), None),
    "flow_pointers": (_l("Fluxo de follow-up"), None),
    "flows": (_l("Fluxo de follow-up"), None),
    "enrollments": (_l("Acompanhamento"), None),
    "agents": (_l("Agente"), "followup_agents.details_view"),
}

#: What a changed column is called on screen; a column not here is counted, never named.
FIELDS: dict[str, LazyString] = {
    "name": _l("Nome"), "email": _l("E-mail"), "phone": _l("Telefone"), "role": _l("Papel"),
    "prefix": _l("Prefixo"), "kinds": _l("Canais"), "kind": _l("Canal"), "channel_kind": _l("Canal"),
    "active": _l("Ativa"), "is_active": _l("Ativo"), "status": _l("Situação"), "result": _l("Resultado"),
    "cancelled": _l("Canceladas"), "resolved_at": _l("Resolvida em"), "handled_at": _l("Resolvida em"),
    "key": _l("Modelo"), "body": _l("Texto"), "subject": _l("Assunto"), "locale": _l("Idioma"),
    "version": _l("Versão"), "live": _l("Acompanhamentos em andamento"), "reason": _l("Motivo"),
    "paused": _l("Pausados"), "message_id": _l("Mensagem"), "consent": _l("Consentimento"),
    "offset_minutes": _l("Antecedência (minutos)"), "trigger": _l("Quando"), "respect_window": _l("Respeita o horário"),
    "quiet_start": _l("Início do horário"), "quiet_end": _l("Fim do horário"), "skip_sundays": _l("Pula domingos"),
    "skip_holidays": _l("Pula feriados"), "state": _l("Estado"), "timezone": _l("Fuso horário"),
    "starts_at": _l("Início"), "professional": _l("Profissional"), "location": _l("Local"), "mode": _l("Modalidade"),
    "external_id": _l("ID externo"), "provider": _l("Provedor"), "is_default": _l("Padrão"),
    "created": _l("Criados"), "updated": _l("Atualizados"), "rows": _l("Linhas"), "errors": _l("Erros"),
    "erased_at": _l("Apagado em"), "source": _l("Origem"), "evidence": _l("Evidência"), "flow": _l("Fluxo"),
    "model": _l("Modelo de IA"), "api_key_set": _l("Chave de API salva"), "max_steps": _l("Limite de passos"),
    # Atendimento (admin/views/settings/conversation.py)
    "transcription_server": _l("Servidor de transcrição"), "staff_quiet_minutes": _l("Minutos sem mensagens da clínica"),
    "reply_debounce_seconds": _l("Segundos para juntar mensagens do paciente"),
}


#: What a check or test recorded as its `result` (a channel's connection test, an agent's).
RESULTS: dict[str, LazyString] = {
    "ok": _l("funcionou"), "failed": _l("falhou"), "unsupported": _l("não se aplica a este provedor"),
    "created": _l("instância criada"), "webhook_set": _l("webhook configurado"),
}
#: Where a change was made from (`source`), as a person says it.
SOURCES: dict[str, LazyString] = {
    "console": _l("pelo console"), "console_bulk": _l("pelo console, vários de uma vez"), "api": _l("pela API"),
    "cli": _l("pela linha de comando"), "builder_test": _l("teste no editor do fluxo"),
    "flow_reply": _l("resposta do paciente a um fluxo"), "provider": _l("aviso do provedor"),
    "patient": _l("pelo paciente"), "clinic": _l("pela clínica"), "csv": _l("importação de planilha"),
}
#: An appointment's `mode`.
MODES: dict[str, LazyString] = {"in_person": _l("Presencial"), "online": _l("Online")}


def _user(view: Any, model: Any) -> str:
    if model.user_id is None:
        return "API" if model.api_key_id else _("sistema")
    row = view.session.query(User.email).filter(User.org_id == org_id(), User.id == model.user_id).first()
    return row.email if row else _("usuário %(id)s", id=model.user_id)


def _entity(name: str | None) -> tuple[LazyString | None, str | None]:
    """The label and page of an entity, by table name or the API's singular resource name."""
    if not name:
        return None, None
    return ENTITIES.get(name) or ENTITIES.get(f"{name}s") or (None, None)


def _entity_label(view: Any, context: Any, model: Any, name: str) -> str:
    label, _endpoint = _entity(model.entity)
    return str(label) if label is not None else _("Outro registro")


def _record(view: Any, context: Any, model: Any, name: str) -> Markup | str:
    """A link to the record's page (org-scoped: another org's id answers 404 there)."""
    if model.entity_id is None:
        return "—"
    _label, endpoint = _entity(model.entity)
    text = f"#{model.entity_id}"
    if endpoint is None:
        return text
    return Markup('<a href="{}">{}</a>').format(url_for(endpoint, id=model.entity_id), text)


def _value(field: str, value: Any) -> str:
    if value is None or value == "":
        return "—"
    if value == REDACTED:  # personal data or a secret: the trail keeps only the fact that it changed
        return _("alterado (dado pessoal, não registrado)")
    if isinstance(value, bool):
        return _("Sim") if value else _("Não")
    if field == "result" and isinstance(value, str):
        if value in RESULTS:
            return str(RESULTS[value])
        return translate(describe(value)) if known(value) else _("outro resultado")
    if field == "source" and isinstance(value, str):
        return str(SOURCES.get(value, _("outra origem")))
    if field == "mode" and isinstance(value, str):
        return str(MODES.get(value, value))
    if field == "key" and isinstance(value, str) and value in PURPOSE_LABELS:
        return str(PURPOSE_LABELS[value])
    if field == "locale" and isinstance(value, str):
        return str(LOCALE_LABELS[value]) if value in LOCALE_LABELS else language_name(value)
    if field == "provider" and isinstance(value, str):
        return str(PROVIDER_LABELS.get(value, value))
    if field == "reason" and isinstance(value, str):
        text = message_reason(value)
        return translate(text) if text is not None else "—"
    if field == "status" and isinstance(value, str):
        return str(STATUS_LABELS.get(value, _("outra")))
    if field in ("kinds", "consent") and isinstance(value, list):
        return ", ".join(str(KIND_LABELS.get(v, v)) for v in value) or "—"
    if field in ("kind", "channel_kind") and isinstance(value, str):
        return str(KIND_LABELS.get(value, value))
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] in "T ":
        try:
            return local_dt(datetime.fromisoformat(value))
        except ValueError:
            pass
    if isinstance(value, (dict, list)):
        return _("(%(num)s itens)", num=len(value))
    return str(value)[:120]


def _change_lines(model: Any) -> tuple[list[tuple[str, str]], int]:
    """(label, value) of the changes a person can read, and how many technical ones are left out."""
    changes = model.changes if isinstance(model.changes, dict) else {}
    lines, hidden = [], 0
    for field, value in changes.items():
        label = FIELDS.get(field)
        if label is None:
            hidden += 1
            continue
        lines.append((str(label), _value(field, value)))
    return lines, hidden


def _changes(view: Any, context: Any, model: Any, name: str) -> Markup:
    lines, hidden = _change_lines(model)
    parts = [Markup("<div>{}: {}</div>").format(label, value) for label, value in lines]
    if hidden:
        parts.append(Markup('<div class="text-muted">{}</div>').format(
            ngettext("e mais %(num)d dado técnico", "e mais %(num)d dados técnicos", hidden)))
    return Markup("").join(parts) if parts else Markup("—")


def _changes_export(view: Any, context: Any, model: Any, name: str) -> str:
    """The export keeps every key as stored: it is read by tools, not at the front desk."""
    return json.dumps(model.changes, ensure_ascii=False) if model.changes else ""


class AuditView(TenantModelView):
    allow_create = allow_edit = allow_delete = False
    column_list = ("created_at", "user", "action", "entity", "entity_id", "changes")
    column_details_list = column_list
    column_export_list = column_list
    column_labels = {"created_at": _l("Quando"), "user": _l("Quem"), "action": _l("Ação"), "entity": _l("Onde"),
                     "entity_id": _l("Registro"), "changes": _l("Alterações")}
    column_filters = (OrgDateTimeBetweenFilter(AuditLog.created_at, _l("Quando")),)
    column_default_sort = ("id", True)
    column_formatters = {
        "user": lambda v, c, m, n: _user(v, m),
        "action": lambda v, c, m, n: str(ACTION_LABELS.get(m.action, _("alterou"))),
        "entity": _entity_label,
        "entity_id": _record,
        "changes": _changes,
    }
    column_formatters_detail = column_formatters
    column_formatters_export = {"user": lambda v, c, m, n: _user(v, m), "changes": _changes_export}
    empty_message = _l("Nenhuma alteração registrada ainda.")
