"""Auditoria: who changed what, read-only."""

from __future__ import annotations

import json
from typing import Any

from admin.i18n import _, _l
from admin.views.base import TenantModelView, org_id
from admin.views.filters import OrgDateTimeBetweenFilter
from engine.models import AuditLog, User

ACTION_LABELS = {"create": _l("criou"), "update": _l("alterou"), "delete": _l("excluiu"), "cancel": _l("cancelou"),
                 "retry": _l("reenviou"), "test_send": _l("testou"), "import": _l("importou"),
                 "revoke": _l("revogou"), "resolve": _l("resolveu"), "send": _l("enviou"), "record": _l("registrou")}


def _user(view: Any, model: Any) -> str:
    if model.user_id is None:
        return "API" if model.api_key_id else _("sistema")
    row = view.session.query(User.email).filter(User.org_id == org_id(), User.id == model.user_id).first()
    return row.email if row else _("usuário %(id)s", id=model.user_id)


class AuditView(TenantModelView):
    allow_create = allow_edit = allow_delete = False
    column_list = ("created_at", "user", "action", "entity", "entity_id", "changes")
    column_details_list = column_list
    column_export_list = column_list
    column_labels = {"created_at": _l("Quando"), "user": _l("Quem"), "action": _l("Ação"), "entity": _l("Onde"),
                     "entity_id": _l("Registro"), "changes": _l("Alterações")}
    column_filters = ("action", "entity", OrgDateTimeBetweenFilter(AuditLog.created_at, _l("Quando")))
    column_default_sort = ("id", True)
    column_formatters = {
        "user": lambda v, c, m, n: _user(v, m),
        "action": lambda v, c, m, n: ACTION_LABELS.get(m.action, m.action),
        "changes": lambda v, c, m, n: json.dumps(m.changes, ensure_ascii=False) if m.changes else "",
    }
    column_formatters_export = {"user": lambda v, c, m, n: _user(v, m),
                                "changes": lambda v, c, m, n: json.dumps(m.changes, ensure_ascii=False) if m.changes else ""}
    empty_message = _l("Nenhuma alteração registrada ainda.")
