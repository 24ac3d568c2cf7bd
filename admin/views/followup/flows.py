"""Fluxos de follow-up: the org's flows (trigger, status, active version, live runs, runs this week,
conversion, last published by whom and when) with a way into the builder, and "Novo fluxo",
Duplicar and Apagar for owners and managers (POST with the CSRF token, audited).

The page itself is flow_list.py's (the builder shows it too). Every query is scoped by the
signed-in user's org.
"""

from __future__ import annotations

from typing import Any

from flask import abort, flash, redirect, request, url_for
from flask_admin import expose
from flask_login import current_user

from admin.i18n import _, ngettext, translate
from admin.views.base import TenantPageView, db_session, org_id, write_audit
from admin.views.followup.flow_list import list_page
from engine.flows import list_actions, versions

#: Names a copy may take: "Cópia de X", then "Cópia de X (2)"… (a flow's name is at most 120 characters).
COPY_NAMES = 20
MAX_NAME = 120


def copy_names(name: str) -> list[str]:
    """The names a copy of flow `name` tries, in order, each cut to fit."""
    out = []
    for n in range(1, COPY_NAMES + 1):
        suffix = "" if n == 1 else f" ({n})"
        base = _("Cópia de %(nome)s", nome=name)
        out.append(base[:MAX_NAME - len(suffix)].rstrip() + suffix)
    return out


def refusal(exc: list_actions.FlowInUse) -> str:
    """Why a flow cannot be deleted, in the manager's words."""
    if exc.why == "live":
        return ngettext("Este fluxo tem %(num)d execução em andamento: espere que termine ou cancele-a na fila "
                        "antes de apagá-lo.",
                        "Este fluxo tem %(num)d execuções em andamento: espere que terminem ou cancele-as na fila "
                        "antes de apagá-lo.", exc.count)
    if exc.why == "started_by":
        return _("O fluxo %(outro)s começa este fluxo: tire essa etapa dele antes de apagar este.", outro=exc.other)
    return _("Este fluxo já acompanhou pacientes: para guardar o histórico dessas execuções ele não pode ser "
             "apagado. Desative-o no construtor para que não comece mais ninguém.")


class FlowListView(TenantPageView):
    """Fluxos (endpoint `followup_flows`, /admin/followup/flows/): every role reads, owners and
    managers create (the builder is where a flow is changed)."""

    @expose("/")
    def index(self) -> Any:
        """The list, newest flow first."""
        return list_page(self)

    @expose("/new/", methods=("POST",))
    def create(self) -> Any:
        """Create an empty draft and open it in the builder (the app's CSRFProtect checked the token)."""
        if not current_user.can_edit:
            return _("Apenas proprietários e gestores alteram fluxos."), 403
        name = (request.form.get("name") or "").strip()
        session = db_session()
        conn = session.connection()
        try:
            flow_id = versions.create_flow(conn, org_id(), name=name)
        except versions.FlowRejected as exc:
            session.rollback()
            for issue in exc.issues:
                flash(translate(issue.message), "error")
            return redirect(url_for(".index"))
        except versions.FlowNameTaken:
            session.rollback()
            flash(_("Já existe um fluxo com esse nome."), "error")
            return redirect(url_for(".index"))
        write_audit(conn, "create", "flow_pointers", flow_id, {"name": name})
        session.commit()
        return redirect(url_for("flow_builder.page", flow_id=flow_id))

    @expose("/<int:flow_id>/duplicate/", methods=("POST",))
    def duplicate(self, flow_id: int) -> Any:
        """A draft copy "Cópia de X" of one of the org's flows, unpublished; another org's flow is 404."""
        if not current_user.can_edit:
            return _("Apenas proprietários e gestores alteram fluxos."), 403
        session = db_session()
        conn = session.connection()
        oid = org_id()
        try:
            source = versions.get_flow(conn, oid, flow_id)
            copy_id = list_actions.duplicate_flow(conn, oid, flow_id, names=copy_names(source.name))
        except versions.FlowNotFound:
            session.rollback()
            abort(404)
        except (versions.FlowNameTaken, versions.FlowRejected):
            session.rollback()
            flash(_("Não foi possível dar um nome à cópia: renomeie as cópias anteriores e tente de novo."), "error")
            return redirect(url_for(".index"))
        write_audit(conn, "duplicate", "flow_pointers", copy_id, {"copied_from": flow_id})
        session.commit()
        flash(_("Cópia criada como rascunho: publique-a no construtor quando estiver pronta."), "success")
        return redirect(url_for(".index"))

    @expose("/<int:flow_id>/delete/", methods=("POST",))
    def delete(self, flow_id: int) -> Any:
        """Delete one of the org's flows that never ran; refused, with a sentence, for one with live or
        past runs (its history stays) or started by another flow; another org's flow is 404."""
        if not current_user.can_edit:
            return _("Apenas proprietários e gestores alteram fluxos."), 403
        session = db_session()
        conn = session.connection()
        try:
            flow = list_actions.delete_flow(conn, org_id(), flow_id)
        except versions.FlowNotFound:
            session.rollback()
            abort(404)
        except list_actions.FlowInUse as exc:
            session.rollback()
            flash(refusal(exc), "error")
            return redirect(url_for(".index"))
        write_audit(conn, "delete", "flow_pointers", flow_id, {"name": flow.name})
        session.commit()
        flash(_("Fluxo apagado."), "success")
        return redirect(url_for(".index"))
