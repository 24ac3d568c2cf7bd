"""Campos: the org's conversation fields (what a flow's `ask` step may collect from a patient), listed,
created, changed and deleted from the console.

The engine (engine/flows/conversation/fields.py) is the one validator: a save it refuses lists its
findings, each shown beside the input it is about in the catalogue's words, and nothing is written.
The API lets a field go even when a published flow asks for it (the flow is refused at its next
publish); the console, where a person clicks, refuses that delete and names the flow instead, so a
live flow never loses a field under it. Owners and managers only; another org's field is a 404.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import abort, flash, redirect, request, url_for
from flask_admin import expose
from sqlalchemy import select
from sqlalchemy.engine import Connection

from admin.i18n import _, _l, translate
from admin.views.base import db_session, org_id, write_audit
from admin.views.settings.gated import AdminPageView, path_id
from engine.flows.conversation import fields as engine_fields
from engine.flows.conversation.fields import FIELD_TYPES, FieldNotFound, FieldRejected
from engine.flows.validate import validate_for_publish
from engine.store.models import flow_pointers, flow_versions
from engine.words.catalogue import describe

#: Each type the engine supports, as the clinic reads it.
TYPE_LABELS = {"text": _l("Texto"), "number": _l("Número"), "date": _l("Data"), "time": _l("Horário"),
               "period": _l("Período do dia"), "boolean": _l("Sim ou não"), "choice": _l("Escolha"),
               "phone": _l("Telefone"), "email": _l("E-mail")}
assert set(TYPE_LABELS) == set(FIELD_TYPES), "every field type needs a label"
#: The form's inputs: the engine's names, as posted.
INPUTS = ("label", "slug", "type", "options", "question")


def flows_asking(conn: Connection, oid: int, slug: str) -> list[str]:
    """Names of the org's published flows whose active version collects `slug`. The engine's own
    publish check answers it: validated as if the field were gone, such a flow says `unknown_field`."""
    rows = conn.execute(select(flow_pointers.c.name, flow_pointers.c.trigger_config, flow_pointers.c.max_steps,
                               flow_versions.c.graph)
                        .join(flow_versions, (flow_versions.c.id == flow_pointers.c.active_version_id)
                              & (flow_versions.c.org_id == flow_pointers.c.org_id))
                        .where(flow_pointers.c.org_id == oid, flow_pointers.c.status == "active")
                        .order_by(flow_pointers.c.name)).all()
    names = []
    for row in rows:
        issues = validate_for_publish(row.graph, trigger_config=row.trigger_config, max_steps=row.max_steps,
                                      field_exists=lambda s: s != slug)
        if any(i.code == "unknown_field" and i.params.get("field") == slug for i in issues):
            names.append(row.name)
    return names


def posted(form: Mapping[str, Any]) -> dict[str, Any]:
    """The form as the engine takes a field: options one per line, and only for a choice (other
    types send none, so switching a choice to a date drops them instead of being refused)."""
    data = {name: (form.get(name) or "").strip() for name in INPUTS}
    lines = [line.strip() for line in data.pop("options").splitlines() if line.strip()]
    data["options"] = lines if data["type"] == "choice" else []
    return data


def errors_of(exc: FieldRejected) -> dict[str, list[str]]:
    """The engine's findings as sentences by input ("" for the field as a whole)."""
    out: dict[str, list[str]] = {}
    for finding in exc.findings:
        where = finding.field if finding.field in INPUTS else ""
        out.setdefault(where, []).append(translate(finding.text))
    return out


def _field_or_404(conn: Any, oid: int, field_id: int) -> Any:
    """The org's field `field_id`; another org's or a missing one is a 404."""
    try:
        return engine_fields.get_field(conn, oid, field_id)
    except FieldNotFound:
        abort(404)

class FieldsView(AdminPageView):
    """Campos (endpoint `settings_fields`, /admin/settings/fields/)."""

    @expose("/")
    def index(self) -> Any:
        """Every field of the org, by identifier."""
        session = db_session()
        found = engine_fields.list_fields(session.connection(), org_id())
        session.rollback()
        return self.render("admin/settings/fields.html", fields=found, type_labels=TYPE_LABELS)

    @expose("/new/", methods=("GET", "POST"))
    def create(self) -> Any:
        """The empty form; a POST declares the field, or shows what to fix with nothing written."""
        values: dict[str, Any] = {"label": "", "slug": "", "type": "text", "options": "", "question": ""}
        errors: dict[str, list[str]] = {}
        if request.method == "POST":
            values = {name: request.form.get(name, "") for name in INPUTS}
            session = db_session()
            conn = session.connection()
            try:
                field = engine_fields.create_field(conn, org_id(), posted(request.form))
            except FieldRejected as exc:
                session.rollback()
                errors = errors_of(exc)
            else:
                write_audit(conn, "create", "conversation_fields", field.id,
                            {k: v for k, v in field.as_dict().items() if k != "id"})
                session.commit()
                flash(_("Campo “%(nome)s” criado.", nome=field.label), "success")
                return redirect(url_for(".index"))
        return self._form(values, errors, field_id=None)

    @expose("/<int:field_id>/edit/", methods=("GET", "POST"))
    def edit(self, field_id: int) -> Any:
        """One field's form; a POST saves it whole or not at all."""
        field_id = path_id(field_id)
        session = db_session()
        conn = session.connection()
        oid = org_id()
        field = _field_or_404(conn, oid, field_id)
        errors: dict[str, list[str]] = {}
        if request.method == "POST":
            values = {name: request.form.get(name, "") for name in INPUTS}
            changes = posted(request.form)
            try:
                saved = engine_fields.update_field(conn, oid, field_id, changes)
            except FieldRejected as exc:
                session.rollback()
                errors = errors_of(exc)
            else:
                before = field.as_dict()
                write_audit(conn, "update", "conversation_fields", field_id,
                            {k: v for k, v in saved.as_dict().items() if k != "id" and before.get(k) != v})
                session.commit()
                flash(_("Campo “%(nome)s” salvo.", nome=saved.label), "success")
                return redirect(url_for(".index"))
        else:
            session.rollback()
            values = {"label": field.label, "slug": field.slug, "type": field.type, "question": field.question,
                      "options": "\n".join(o.value for o in field.options)}
        return self._form(values, errors, field_id=field_id)

    @expose("/<int:field_id>/delete/", methods=("POST",))
    def delete(self, field_id: int) -> Any:
        """Delete a field no published flow asks for; otherwise say which flows do."""
        field_id = path_id(field_id)
        session = db_session()
        conn = session.connection()
        oid = org_id()
        field = _field_or_404(conn, oid, field_id)
        users = flows_asking(conn, oid, field.slug)
        if users:
            session.rollback()
            flash(translate(describe("field_in_published_flow", field=field.label, flows=", ".join(users))), "error")
            return redirect(url_for(".index"))
        engine_fields.delete_field(conn, oid, field_id)
        write_audit(conn, "delete", "conversation_fields", field_id, {"slug": field.slug})
        session.commit()
        flash(_("Campo “%(nome)s” apagado.", nome=field.label), "success")
        return redirect(url_for(".index"))

    def _form(self, values: Mapping[str, Any], errors: Mapping[str, list[str]], *, field_id: int | None) -> Any:
        return self.render("admin/settings/field_form.html", values=values, errors=errors, field_id=field_id,
                           type_labels=TYPE_LABELS, types=FIELD_TYPES)
