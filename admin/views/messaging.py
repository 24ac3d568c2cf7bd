"""Modelos (templates); Canais (channels) live in admin/views/channels/."""

from __future__ import annotations

from typing import Any

from flask import abort, flash, jsonify, request
from flask_admin import expose
from flask_admin.actions import action
from markupsafe import Markup
from sqlalchemy import or_
from wtforms import SelectField, StringField, TextAreaField
from wtforms.validators import DataRequired, Length, Optional, ValidationError

from admin.i18n import _, _l, ngettext, translate
from admin.ids import parse_id
from admin.views.base import (
    KIND_LABELS,
    LOCALE_LABELS,
    PURPOSE_LABELS,
    TenantModelView,
    ids_of,
    is_editor,
    org_id,
    write_audit,
)
from engine.models import CHANNEL_KINDS, Template
from engine.render import SAMPLE_VARIABLES, TemplateError, render_html, render_text, validate

TEMPLATE_KEYS = ("session_reminder", "session_confirmation", "session_cancellation", "confirm_ack", "cancel_ack",
                 "optout_confirmation", "conversation_reopen", "followup_checkin", "followup_rebook",
                 "followup_reply_ack")
PREVIEW_VARIABLES = {**SAMPLE_VARIABLES, "link_descadastro": "https://exemplo.invalid/descadastro"}


def template_error(exc: TemplateError) -> str:
    """A template's error in the reader's language when the engine gave a sentence for it (the render's
    bounds: "Modelo pesado demais: …", internal values), else as the engine wrote it."""
    return translate(exc.text) if exc.text is not None else str(exc)


def preview(body: str | None) -> tuple[str, str | None]:
    """The body rendered on sample data, or the rendering error (never patient data).

    The render is bounded (engine.render): a template too heavy to render is an error here too, never a
    request that runs for hours."""
    if not body:
        return "", None
    try:
        return render_text(body, PREVIEW_VARIABLES), None
    except TemplateError as exc:
        return "", template_error(exc)


def _template_check(field: Any) -> None:
    if field.data:
        try:
            validate(field.data)
        except TemplateError as exc:
            raise ValidationError(_("Erro no modelo: %(erro)s", erro=template_error(exc))) from None


def _bounds_check(field: Any, render: Any) -> None:
    """Refuse a subject or HTML body that goes past the render's bounds (or prints an internal value) on
    sample data: it would fail on every send. Other errors (a variable only known at send time) stay
    allowed there, as before."""
    if field.data:
        try:
            render(field.data, PREVIEW_VARIABLES)
        except TemplateError as exc:
            if exc.whatever_the_data:
                raise ValidationError(_("Erro ao renderizar com dados de exemplo: %(erro)s",
                                        erro=template_error(exc))) from None


class TemplateView(TenantModelView):
    """The org's overrides plus the global defaults (read-only, marked "Padrão")."""

    column_list = ("key", "channel_kind", "locale", "origin", "subject", "body", "updated_at")
    column_details_list = ("key", "channel_kind", "locale", "origin", "subject", "body", "body_html", "updated_at")
    column_export_list = ("key", "channel_kind", "locale", "origin", "subject", "body")
    column_labels = {"key": _l("Finalidade"), "channel_kind": _l("Canal"), "locale": _l("Idioma"),
                     "origin": _l("Origem"), "subject": _l("Assunto"), "body": _l("Texto"),
                     "body_html": _l("HTML (e-mail)"), "updated_at": _l("Atualizado em")}
    column_filters = ("key", "channel_kind")
    column_default_sort = ("key", False)
    edit_template = "admin/template_edit.html"
    create_template = "admin/template_edit.html"
    allow_delete = True
    empty_message = _l("Nenhum modelo encontrado com esse filtro.")
    audit_entity = "templates"

    column_formatters = {
        "key": lambda v, c, m, n: PURPOSE_LABELS.get(m.key, m.key),
        "channel_kind": lambda v, c, m, n: KIND_LABELS.get(m.channel_kind, m.channel_kind),
        "locale": lambda v, c, m, n: LOCALE_LABELS.get(m.locale, m.locale),
        "origin": lambda v, c, m, n: (
            Markup('<span class="badge badge-secondary">{}</span> <a href="{}">{}</a>').format(
                _("Padrão"), v.get_url(".create_view", **{"from": m.id}), _("Personalizar")) if is_editor() else
            Markup('<span class="badge badge-secondary">{}</span>').format(_("Padrão"))
        ) if m.org_id is None else Markup('<span class="badge badge-primary">{}</span>').format(_("Da clínica")),
        "body": lambda v, c, m, n: (m.body[:120] + "…") if len(m.body or "") > 120 else m.body,
    }
    column_formatters_detail = {k: f for k, f in column_formatters.items() if k != "body"}  # the whole text there
    column_formatters_export = {"origin": lambda v, c, m, n: _("padrão") if m.org_id is None else _("clínica")}

    def scope(self, query: Any) -> Any:
        return query.filter(or_(Template.org_id == org_id(), Template.org_id.is_(None)))

    def get_one(self, id: Any) -> Any:
        row = super().get_one(id)
        # Global defaults can be read, never changed or deleted: "Personalizar" (Customize) creates an override.
        if row.org_id is None and request.endpoint != f"{self.endpoint}.details_view":
            abort(404)
        return row

    @action("delete", _l("Excluir"), _l("Excluir os modelos da clínica selecionados? Os padrões voltam a valer."))
    def action_delete(self, ids: Any) -> None:
        # Only the org's own overrides: the global defaults in the list are never deletable.
        conn = self.session.connection()
        own = self.session.query(Template).filter(Template.org_id == org_id(), Template.id.in_(ids_of(ids))).all()
        for row in own:
            write_audit(conn, "delete", "templates", row.id, {"key": row.key, "channel_kind": row.channel_kind})
            self.session.delete(row)
        self.session.commit()
        flash(ngettext("%(num)d modelo excluído.", "%(num)d modelos excluídos.", len(own)), "success")

    def scaffold_form(self) -> Any:
        class TemplateForm(self.form_base_class):  # type: ignore[name-defined,misc]
            key = SelectField(_l("Finalidade"), choices=[(k, PURPOSE_LABELS[k]) for k in TEMPLATE_KEYS])
            channel_kind = SelectField(_l("Canal"), choices=[(k, KIND_LABELS[k]) for k in CHANNEL_KINDS])
            locale = SelectField(_l("Idioma"), choices=list(LOCALE_LABELS.items()))
            subject = StringField(_l("Assunto (e-mail)"), validators=[Optional(), Length(max=300)])
            body = TextAreaField(_l("Texto"), validators=[DataRequired(message=_l("Escreva o texto.")),
                                                          Length(max=10_000)],
                                 render_kw={"rows": 8},
                                 # The variable names stay Portuguese: they are what the template body uses.
                                 description=_l("Variáveis: %(variaveis)s.", variaveis="{{ nome }}, "
                                                "{{ profissional }}, {{ data }}, {{ hora }}, {{ dia_semana }}, "
                                                "{{ data_completa }}, {{ local }}, {{ clinica }}"))
            body_html = TextAreaField(_l("HTML (e-mail, opcional)"), validators=[Optional(), Length(max=100_000)],
                                      render_kw={"rows": 4})

            def validate_body(self, field: Any) -> None:
                _template_check(field)
                error = preview(field.data)[1]
                if error:
                    raise ValidationError(_("Erro ao renderizar com dados de exemplo: %(erro)s", erro=error))

            def validate_subject(self, field: Any) -> None:
                _template_check(field)
                _bounds_check(field, render_text)

            def validate_body_html(self, field: Any) -> None:
                _template_check(field)
                _bounds_check(field, render_html)
        return TemplateForm

    def create_form(self, obj: Any = None) -> Any:
        form = super().create_form(obj)
        # An id no row can have ("²", past bigint) is no template to copy, not a database error.
        source = parse_id(request.args.get("from", ""))
        if request.method == "GET" and source is not None:
            row = self.get_query().filter(Template.id == source).one_or_none()
            if row is not None:
                for name in ("key", "channel_kind", "locale", "subject", "body", "body_html"):
                    getattr(form, name).data = getattr(row, name)
        return form

    def render(self, template: str, **kwargs: Any) -> Any:
        form = kwargs.get("form")
        if form is not None and hasattr(form, "body"):
            kwargs["preview"], kwargs["preview_error"] = preview(form.body.data)
        return super().render(template, **kwargs)

    @expose("/preview/", methods=("POST",))
    def preview(self) -> Any:
        text, error = preview(request.form.get("body", "")[:10_000])
        return jsonify({"text": text, "error": error})

