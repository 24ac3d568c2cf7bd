"""Modelos (templates); Canais (channels) live in admin/views/settings/channels/."""

from __future__ import annotations

import json
import re
from typing import Any

from flask import abort, flash, g, jsonify, request
from flask_admin import expose
from flask_admin.actions import action
from flask_admin.helpers import is_form_submitted
from markupsafe import Markup
from sqlalchemy import or_
from wtforms import SelectField, StringField, TextAreaField
from wtforms.validators import DataRequired, Length, Optional, ValidationError

from admin.i18n import _, _l, ngettext, translate
from admin.views.words import language_name
from admin.ids import parse_id
from admin.views.base import (
    KIND_LABELS,
    LOCALE_LABELS,
    PURPOSE_LABELS,
    TenantModelView,
    ids_of,
    is_editor,
    org_id,
    org_name,
    runtime,
    select_choices,
    write_audit,
)
from engine.messaging import meta_categories, meta_templates
from engine.words.catalogue import describe, known
from engine.messaging.meta_templates import NO_MAPPING, MetaMapping, WabaList
from engine.words.findings import Finding
from engine.store.models import CHANNEL_KINDS, Template
from engine.messaging.render import TemplateError, render_html, render_text, validate
from engine.messaging.template_edits import PREVIEW_VARIABLES, TEMPLATE_KEYS

#: The quick-reply buttons of a mapped template, in its order, as the form offers them.
BUTTON_LAYOUTS = (("", _l("Nenhum")), ("confirm,cancel", _l("Confirmar, Cancelar")),
                  ("cancel,confirm", _l("Cancelar, Confirmar")), ("confirm", _l("Só Confirmar")),
                  ("cancel", _l("Só Cancelar")))
#: The form field each part of a mapping is said on.
MAPPING_FIELDS = {"name": "meta_name", "language": "meta_lang", "parameters": "meta_params",
                  "buttons": "meta_button_layout", "": "meta_name"}


def template_error(exc: TemplateError) -> str:
    """A template's error in the reader's language when the engine gave a sentence for it (the render's
    bounds: "Modelo pesado demais: …", internal values), else as the engine wrote it."""
    return translate(exc.text) if exc.text is not None else str(exc)


def preview(body: str | None) -> tuple[str, str | None]:
    """The body rendered on sample data, or the rendering error (never patient data).

    The render is bounded (engine.messaging.render): a template too heavy to render is an error here too, never a
    request that runs for hours."""
    if not body:
        return "", None
    try:
        # The sample patient is made up; the clinic is the reader's own, as its patients will read it.
        return render_text(body, {**PREVIEW_VARIABLES, "clinica": org_name() or PREVIEW_VARIABLES["clinica"]}), None
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


def _text(value: Any) -> str:
    """A form field's text; a list (the model's value, when the request did not post the field) joined."""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return value.strip() if isinstance(value, str) else ""


def form_mapping(name: Any, language: Any, parameters: Any, buttons: Any) -> MetaMapping | None:
    """The mapping typed in the form (None when no Meta name is): parameters are variable names
    separated by commas or spaces ("{{ nome }}" is taken as "nome"), buttons a BUTTON_LAYOUTS value."""
    name_text = _text(name)
    if not name_text:
        return None
    names = tuple(p.strip("{} ") for p in re.split(r"[,;\s]+", _text(parameters).replace("{{", " ").replace("}}", " "))
                  if p.strip("{} "))
    return MetaMapping(name=name_text, language=_text(language),
                       parameters=names, buttons=tuple(b for b in _text(buttons).split(",") if b.strip()))


def preview_json(mapping: MetaMapping | None) -> str | None:
    """What Meta would receive for `mapping`, on sample data, as indented JSON."""
    payload = meta_templates.preview(mapping)
    return json.dumps(payload, ensure_ascii=False, indent=2) if payload is not None else None


class TemplateView(TenantModelView):
    """The org's overrides plus the global defaults (read-only, marked "Padrão"). A WhatsApp
    template's Meta mapping (engine.messaging.meta_templates) is edited on the same form: an override uses its
    default's until given its own, the form offers the templates of the clinic's WABA, and a save
    is refused when the mapping cannot work at Meta."""

    column_list = ("key", "channel_kind", "locale", "origin", "subject", "body", "meta", "updated_at")
    column_details_list = ("key", "channel_kind", "locale", "origin", "subject", "body", "body_html", "meta",
                           "updated_at")
    column_export_list = ("key", "channel_kind", "locale", "origin", "subject", "body")
    column_labels = {"key": _l("Finalidade"), "channel_kind": _l("Canal"), "locale": _l("Idioma"),
                     "origin": _l("Origem"), "subject": _l("Assunto"), "body": _l("Texto"),
                     "body_html": _l("HTML (e-mail)"), "updated_at": _l("Atualizado em"),
                     "meta": _l("Modelo aprovado na Meta")}
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
        "meta": lambda v, c, m, n: v._meta_cell(m),
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
            key = SelectField(_l("Finalidade"), choices=select_choices((k, PURPOSE_LABELS[k]) for k in TEMPLATE_KEYS))
            channel_kind = SelectField(_l("Canal"), choices=select_choices((k, KIND_LABELS[k]) for k in CHANNEL_KINDS))
            locale = SelectField(_l("Idioma"), choices=select_choices(LOCALE_LABELS.items()))
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
            # Not the model's column names: the view writes the mapping itself (on_model_change).
            meta_name = StringField(
                _l("Modelo aprovado na Meta (nome)"), validators=[Optional(), Length(max=512)],
                render_kw={"list": "lembra-waba-names", "autocomplete": "off"},
                description=_l("Só para WhatsApp pela API oficial da Meta: o modelo aprovado que sai quando o "
                               "paciente não escreve há mais de 24 horas. Em branco, vale o do modelo padrão."))
            meta_lang = StringField(_l("Idioma do modelo na Meta"), validators=[Optional(), Length(max=20)],
                                    description=_l("Como no Gerenciador do WhatsApp: <code>pt_BR</code>, <code>en_US</code>, "
                                                    "<code>es</code>…"))
            meta_params = StringField(
                _l("Variáveis do modelo na Meta, na ordem"), validators=[Optional(), Length(max=600)],
                description=_l("Uma variável do Lembra para cada {{1}}, {{2}}… do texto aprovado, separadas por "
                               "vírgula. Exemplo: nome, profissional, data, hora."))
            meta_button_layout = SelectField(_l("Botões de resposta rápida do modelo na Meta, na ordem"),
                                             choices=select_choices(BUTTON_LAYOUTS), default="")

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
                # The override starts with what its default sends through Meta.
                self._fill_mapping(form, self._effective(row)[0])
        return form

    def on_form_prefill(self, form: Any, id: Any) -> None:
        if request.method == "GET":
            self._fill_mapping(form, self._effective(self.get_one(id))[0])

    # --- the Meta mapping ------------------------------------------------------------------------

    def _meta_cell(self, row: Any) -> Markup:
        """What a WhatsApp template sends through Meta outside the window, as the list shows it."""
        if row.channel_kind != "whatsapp":
            return Markup("—")
        if "lembra_template_defaults" not in g:
            g.lembra_template_defaults = {(t.key, t.channel_kind, t.locale): t for t in
                                          self.session.query(Template).filter(Template.org_id.is_(None))}
        default = g.lembra_template_defaults.get((row.key, row.channel_kind, row.locale)) if row.org_id else None
        mapping, inherited = meta_templates.effective(row, default)
        if mapping is None:
            return Markup('<span class="text-muted">{}</span>').format(_("nenhum"))
        cell = Markup("<code>{}</code> · {}").format(mapping.name, language_name(mapping.language))
        if inherited:
            cell += Markup(' <span class="badge badge-secondary">{}</span>').format(_("do padrão"))
        return cell + self._state_cell(mapping)

    def _state_cell(self, mapping: MetaMapping) -> Markup:
        """The category and status the WABA gives the mapped template (as last heard, from its list
        or Meta's webhooks), and the marketing flag: it costs about 9× a utility one in Brazil."""
        if "lembra_meta_states" not in g:
            conn = self.session.connection()
            channel = meta_templates.meta_channel(conn, org_id())
            g.lembra_meta_states = meta_categories.states(conn, org_id(), channel.id) if channel is not None else {}
        state = g.lembra_meta_states.get((mapping.name, mapping.language))
        if state is None:
            return Markup()
        cell = Markup()
        if state.category:
            code = f"waba_category_{state.category.lower()}"
            label = translate(describe(code)) if known(code) else state.category
            cell += Markup(' <span class="badge badge-{}" data-category="{}">{}</span>').format(
                "danger" if state.marketing else "info", state.category, label)
        if state.status:
            cell += Markup(' <span class="badge badge-light" data-status="{}">{}</span>').format(
                state.status, translate(meta_templates.status_text(state.status)))
        if state.marketing:
            cell += Markup('<div class="alert alert-warning small p-1 mt-1 mb-0" data-marketing>{}</div>').format(
                translate(describe("waba_marketing_flag", name=mapping.name)))
        return cell

    def _default(self, key: Any, kind: Any, locale: Any) -> Any:
        return self.session.query(Template).filter(Template.org_id.is_(None), Template.key == key,
                                                   Template.channel_kind == kind, Template.locale == locale).first()

    def _effective(self, row: Any) -> tuple[MetaMapping | None, bool]:
        default = self._default(row.key, row.channel_kind, row.locale) if row.org_id is not None else None
        return meta_templates.effective(row, default)

    @staticmethod
    def _fill_mapping(form: Any, mapping: MetaMapping | None) -> None:
        form.meta_name.data = mapping.name if mapping else ""
        form.meta_lang.data = mapping.language if mapping else ""
        form.meta_params.data = ", ".join(mapping.parameters) if mapping else ""
        layout = ",".join(mapping.buttons) if mapping else ""
        form.meta_button_layout.data = layout if layout in dict(BUTTON_LAYOUTS) else ""

    def _typed_mapping(self, form: Any) -> tuple[MetaMapping | None, MetaMapping | None]:
        """(the template's own mapping as typed, None when it is its default's; its default's)."""
        typed = form_mapping(form.meta_name.data, form.meta_lang.data, form.meta_params.data,
                             form.meta_button_layout.data)
        default = self._default(form.key.data, form.channel_kind.data, form.locale.data)
        inherited = MetaMapping.of(default) if default is not None else None
        return (None if typed == inherited else typed), inherited

    def _waba(self) -> tuple[Any, WabaList | None]:
        """(the org's Meta channel or None, its WABA's templates), read once per request. The session's
        transaction ends first: no transaction waits on Meta."""
        if "lembra_waba" not in g:
            channel = meta_templates.meta_channel(self.session.connection(), org_id())
            waba = None
            if channel is not None:
                self.session.rollback()
                waba = meta_templates.read_waba(runtime().providers, channel)
                # What the list says of each template's category and status is recorded as read.
                meta_categories.record_waba(runtime().db, channel, waba)
            g.lembra_waba = (channel, waba)
        return g.lembra_waba

    def validate_form(self, form: Any) -> bool:
        ok = super().validate_form(form)
        if not ok or not hasattr(form, "meta_name") or not is_form_submitted():
            return ok
        own, inherited = self._typed_mapping(form)
        kind = form.channel_kind.data
        channel, waba = self._waba() if kind == "whatsapp" else (None, None)
        result = meta_templates.review(form.key.data, kind, own or inherited, own=own is not None,
                                       on_meta=channel is not None, waba=waba)
        for finding in result.errors:
            field = getattr(form, MAPPING_FIELDS.get(finding.field, "meta_name"))
            field.errors = [*field.errors, translate(finding.text)]
        for finding in result.warnings:
            flash(translate(finding.text), "warning")
        return not result.errors

    def on_model_change(self, form: Any, model: Any, is_created: bool) -> None:
        if hasattr(form, "meta_name"):
            with self.session.no_autoflush:  # the new row is in the session, not complete yet
                own, _inherited = self._typed_mapping(form)
            for column, value in (own.columns() if own is not None else NO_MAPPING).items():
                setattr(model, column, value)
        super().on_model_change(form, model, is_created)

    def render(self, template: str, **kwargs: Any) -> Any:
        form = kwargs.get("form")
        if form is not None and hasattr(form, "body"):
            kwargs["preview"], kwargs["preview_error"] = preview(form.body.data)
        if form is not None and hasattr(form, "meta_name"):
            own, inherited = self._typed_mapping(form)
            kwargs["meta_preview"] = preview_json(own or inherited)
            kwargs["meta_inherited"] = own is None and inherited is not None
            channel, waba = self._waba()
            kwargs["meta_channel"] = channel is not None
            kwargs["waba_templates"] = [(t, [translate(f.text) for f in meta_templates.unusable(t)])
                                        for t in meta_templates.offered(waba)]
            kwargs["waba_problem"] = translate(waba.problem.text) if waba is not None and waba.problem else None
            kwargs["status_text"] = lambda status: translate(meta_templates.status_text(status))
        return super().render(template, **kwargs)

    @expose("/preview/", methods=("POST",))
    def preview(self) -> Any:
        text, error = preview(request.form.get("body", "")[:10_000])
        form = request.form
        typed = form_mapping(form.get("meta_name", "")[:512], form.get("meta_lang", "")[:20],
                             form.get("meta_params", "")[:600], form.get("meta_button_layout", "")[:40])
        meta, meta_error = None, None
        default = self._default(form.get("key"), form.get("channel_kind"), form.get("locale"))
        inherited = MetaMapping.of(default) if default is not None else None
        problems: list[Finding] = []
        if typed is not None and typed != inherited:
            problems = meta_templates.format_findings(form.get("key", ""), form.get("channel_kind", ""), typed)
        if problems:
            meta_error = " ".join(translate(p.text) for p in problems)
        else:
            meta = preview_json(typed or inherited)
        return jsonify({"text": text, "error": error, "meta": meta, "meta_error": meta_error,
                        "meta_inherited": (typed is None or typed == inherited) and inherited is not None})

