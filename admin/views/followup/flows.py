"""Fluxos de follow-up: the org's flows (status, active version, live enrollments, last published
by whom and when) with a way into the builder, and "Novo fluxo" for owners and managers.

The page itself is flow_list.py's (the builder shows it too). Every query is scoped by the
signed-in user's org.
"""

from __future__ import annotations

from typing import Any

from flask import flash, redirect, request, url_for
from flask_admin import expose
from flask_login import current_user

from admin.i18n import _, translate
from admin.views.base import TenantPageView, db_session, org_id, write_audit
from admin.views.followup.flow_list import list_page
from engine.flows import versions


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
