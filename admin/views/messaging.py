"""Modelos (templates) and Canais (channels)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from flask import abort, flash, jsonify, redirect, request
from flask_admin import expose
from flask_admin.actions import action
from markupsafe import Markup
from sqlalchemy import or_, update
from wtforms import BooleanField, PasswordField, SelectField, StringField, TextAreaField
from wtforms.validators import DataRequired, Length, Optional, ValidationError

from admin.views.base import (
    KIND_LABELS,
    PURPOSE_LABELS,
    TenantModelView,
    badge,
    ids_of,
    is_editor,
    org_id,
    runtime,
    write_audit,
)
from engine import clock
from engine.channels import REQUIRED_KEYS, create_channel
from engine.models import CHANNEL_KINDS, PROVIDERS, Template, channels
from engine.orgs import DomainError
from engine.render import SAMPLE_VARIABLES, TemplateError, render_text, validate
from gateway.contract import OutboundMessage

TEMPLATE_KEYS = ("session_reminder", "session_confirmation", "session_cancellation", "confirm_ack", "cancel_ack",
                 "optout_confirmation")
PREVIEW_VARIABLES = {**SAMPLE_VARIABLES, "link_descadastro": "https://exemplo.invalid/descadastro"}


def preview(body: str | None) -> tuple[str, str | None]:
    """The body rendered on sample data, or the rendering error (never patient data)."""
    if not body:
        return "", None
    try:
        return render_text(body, PREVIEW_VARIABLES), None
    except TemplateError as exc:
        return "", str(exc)


def _template_check(field: Any) -> None:
    if field.data:
        try:
            validate(field.data)
        except TemplateError as exc:
            raise ValidationError(f"Erro no modelo: {exc}") from None


class TemplateView(TenantModelView):
    """The org's overrides plus the global defaults (read-only, marked "Padrão")."""

    column_list = ("key", "channel_kind", "locale", "origin", "subject", "body", "updated_at")
    column_details_list = ("key", "channel_kind", "locale", "origin", "subject", "body", "body_html", "updated_at")
    column_export_list = ("key", "channel_kind", "locale", "origin", "subject", "body")
    column_labels = {"key": "Finalidade", "channel_kind": "Canal", "locale": "Idioma", "origin": "Origem",
                     "subject": "Assunto", "body": "Texto", "body_html": "HTML (e-mail)", "updated_at": "Atualizado em"}
    column_filters = ("key", "channel_kind")
    column_default_sort = ("key", False)
    edit_template = "admin/template_edit.html"
    create_template = "admin/template_edit.html"
    allow_delete = True
    empty_message = "Nenhum modelo encontrado com esse filtro."
    audit_entity = "templates"

    column_formatters = {
        "key": lambda v, c, m, n: PURPOSE_LABELS.get(m.key, m.key),
        "channel_kind": lambda v, c, m, n: KIND_LABELS.get(m.channel_kind, m.channel_kind),
        "origin": lambda v, c, m, n: (
            Markup('<span class="badge badge-secondary">Padrão</span> <a href="{}">Personalizar</a>').format(
                v.get_url(".create_view", **{"from": m.id})) if is_editor() else
            Markup('<span class="badge badge-secondary">Padrão</span>')
        ) if m.org_id is None else Markup('<span class="badge badge-primary">Da clínica</span>'),
        "body": lambda v, c, m, n: (m.body[:120] + "…") if len(m.body or "") > 120 else m.body,
    }
    column_formatters_detail = {"origin": column_formatters["origin"]}
    column_formatters_export = {"origin": lambda v, c, m, n: "padrão" if m.org_id is None else "clínica"}

    def scope(self, query: Any) -> Any:
        return query.filter(or_(Template.org_id == org_id(), Template.org_id.is_(None)))

    def get_one(self, id: Any) -> Any:
        row = super().get_one(id)
        # Global defaults can be read, never changed or deleted: "Personalizar" creates an override.
        if row.org_id is None and request.endpoint != f"{self.endpoint}.details_view":
            abort(404)
        return row

    @action("delete", "Excluir", "Excluir os modelos da clínica selecionados? Os padrões voltam a valer.")
    def action_delete(self, ids: Any) -> None:
        # Only the org's own overrides: the global defaults in the list are never deletable.
        conn = self.session.connection()
        own = self.session.query(Template).filter(Template.org_id == org_id(), Template.id.in_(ids_of(ids))).all()
        for row in own:
            write_audit(conn, "delete", "templates", row.id, {"key": row.key, "channel_kind": row.channel_kind})
            self.session.delete(row)
        self.session.commit()
        flash(f"{len(own)} modelo(s) excluído(s).", "success")

    def scaffold_form(self) -> Any:
        class TemplateForm(self.form_base_class):  # type: ignore[name-defined,misc]
            key = SelectField("Finalidade", choices=[(k, PURPOSE_LABELS[k]) for k in TEMPLATE_KEYS])
            channel_kind = SelectField("Canal", choices=[(k, KIND_LABELS[k]) for k in CHANNEL_KINDS])
            locale = SelectField("Idioma", choices=[("pt_BR", "Português"), ("en", "Inglês"), ("es", "Espanhol")])
            subject = StringField("Assunto (e-mail)", validators=[Optional(), Length(max=300)])
            body = TextAreaField("Texto", validators=[DataRequired(message="Escreva o texto."), Length(max=10_000)],
                                 render_kw={"rows": 8},
                                 description="Variáveis: {{ nome }}, {{ profissional }}, {{ data }}, {{ hora }}, "
                                             "{{ dia_semana }}, {{ data_completa }}, {{ local }}, {{ clinica }}.")
            body_html = TextAreaField("HTML (e-mail, opcional)", validators=[Optional(), Length(max=100_000)],
                                      render_kw={"rows": 4})

            def validate_body(self, field: Any) -> None:
                _template_check(field)
                _, error = preview(field.data)
                if error:
                    raise ValidationError(f"Erro ao renderizar com dados de exemplo: {error}")

            def validate_subject(self, field: Any) -> None:
                _template_check(field)

            def validate_body_html(self, field: Any) -> None:
                _template_check(field)
        return TemplateForm

    def create_form(self, obj: Any = None) -> Any:
        form = super().create_form(obj)
        source = request.args.get("from", "")
        if request.method == "GET" and source.isdigit():
            row = self.get_query().filter(Template.id == int(source)).one_or_none()
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


# ------------------------------------------------------------------------------------------------
ALL_KEYS = sorted({k for keys in REQUIRED_KEYS.values() for k in keys} | {"from", "messaging_service_sid", "username", "password"})
CHANNEL_STATUSES = [("active", "Ativo"), ("disabled", "Desativado")]


def _open_credentials(model: Any) -> dict[str, Any]:
    if not model.credentials:
        return {}
    return runtime().keyring.open(model.credentials, key_version=model.key_version, table="channels",
                                  org_id=model.org_id, row_id=model.id)


class ChannelView(TenantModelView):
    """Channels; credentials are write-only (a blank field keeps the stored value)."""

    column_list = ("name", "kind", "provider", "status", "is_default", "status_detail", "updated_at")
    column_details_list = ("name", "kind", "provider", "status", "is_default", "status_detail", "configured",
                           "min_interval_ms", "daily_cap", "created_at", "updated_at")
    column_export_list = ("name", "kind", "provider", "status", "is_default", "status_detail")
    column_labels = {"name": "Nome", "kind": "Tipo", "provider": "Provedor", "status": "Status", "is_default": "Padrão",
                     "status_detail": "Detalhe", "configured": "Credenciais", "min_interval_ms": "Intervalo mínimo (ms)",
                     "daily_cap": "Limite diário", "created_at": "Criado em", "updated_at": "Atualizado em"}
    column_formatters = {
        "status": lambda v, c, m, n: badge(m.status),
        "kind": lambda v, c, m, n: KIND_LABELS.get(m.kind, m.kind),
        "configured": lambda v, c, m, n: "configuradas (ocultas)" if m.credentials else "nenhuma",
    }
    column_formatters_detail = column_formatters
    column_formatters_export = {"status": lambda v, c, m, n: m.status}
    details_template = "admin/channel_details.html"
    empty_message = "Nenhum canal. Crie um canal (comece pelo Sandbox para testar sem enviar nada de verdade)."
    audit_entity = "channels"

    def scaffold_form(self) -> Any:
        attrs: dict[str, Any] = {
            "name": StringField("Nome", validators=[DataRequired(message="Dê um nome ao canal."), Length(max=200)]),
            "kind": SelectField("Tipo", choices=[(k, KIND_LABELS[k]) for k in CHANNEL_KINDS]),
            "provider": SelectField("Provedor", choices=[(p, p) for p in PROVIDERS]),
            "status": SelectField("Status", choices=CHANNEL_STATUSES, default="active"),
            "is_default": BooleanField("Canal padrão deste tipo", default=True),
        }
        for key in ALL_KEYS:
            attrs[f"cred_{key}"] = PasswordField(
                key, validators=[Optional(), Length(max=2000)],
                description="Só escrita: deixe em branco para manter o valor guardado.")
        return type("ChannelForm", (self.form_base_class,), attrs)

    def _trim(self, form: Any, obj: Any) -> Any:
        if obj is not None:
            provider = obj.provider
            # The provider's keys and the ones already stored (their names only; values never leave).
            keep = set(REQUIRED_KEYS.get(provider, ())) | set(_open_credentials(obj)) \
                | ({"from", "messaging_service_sid"} if provider == "twilio" else set()) \
                | ({"username", "password"} if provider == "smtp" else set()) \
                | ({"webhook_secret"} if provider == "sandbox" else set())
            for key in ALL_KEYS:
                if key not in keep:
                    delattr(form, f"cred_{key}")
            for name in ("kind", "provider"):
                getattr(form, name).render_kw = {"disabled": True}
                getattr(form, name).validators = [Optional()]
        return form

    def edit_form(self, obj: Any = None) -> Any:
        form = super().edit_form(obj)
        return self._trim(form, obj)

    def _credentials(self, form: Any) -> dict[str, str]:
        return {name[5:]: field.data for name, field in form._fields.items()
                if name.startswith("cred_") and field.data}

    def create_model(self, form: Any) -> Any:
        conn = self.session.connection()
        creds = self._credentials(form)
        try:
            channel_id = create_channel(conn, runtime().keyring, org_id=org_id(), kind=form.kind.data,
                                        provider=form.provider.data, name=form.name.data, credentials=creds or None,
                                        is_default=bool(form.is_default.data))
            if form.status.data != "active":
                conn.execute(update(channels).where(channels.c.org_id == org_id(), channels.c.id == channel_id)
                             .values(status=form.status.data))
            write_audit(conn, "create", "channels", channel_id, {
                "name": form.name.data, "kind": form.kind.data, "provider": form.provider.data,
                "credential_keys": sorted(creds)})
            self.session.commit()
        except DomainError as exc:
            self.session.rollback()
            flash(f"Não foi possível salvar: {exc}", "error")
            return False
        return self.get_one(channel_id)

    def update_model(self, form: Any, model: Any) -> bool:
        conn = self.session.connection()
        oid, cid = org_id(), int(model.id)
        values: dict[str, Any] = {}
        for name in ("name", "status", "is_default"):
            new = bool(form.is_default.data) if name == "is_default" else form[name].data
            if getattr(model, name) != new:
                values[name] = new
        new_creds = self._credentials(form)
        changes: dict[str, Any] = dict(values)
        if new_creds:
            merged = {**_open_credentials(model), **new_creds}
            sealed = runtime().keyring.seal(merged, table="channels", org_id=oid, row_id=cid)
            values.update(credentials=sealed.ciphertext, key_version=sealed.key_version)
            changes["credential_keys_changed"] = sorted(new_creds)
        if values:
            if values.get("is_default"):
                conn.execute(update(channels).where(channels.c.org_id == oid, channels.c.kind == model.kind)
                             .values(is_default=False))
            conn.execute(update(channels).where(channels.c.org_id == oid, channels.c.id == cid)
                         .values(**values, updated_at=clock.now()))
            write_audit(conn, "update", "channels", cid, changes)
        self.session.commit()
        return True

    @expose("/test/<int:id>/", methods=("POST",))
    def send_test(self, id: int) -> Any:
        model = self.get_one(id)  # 404 for another org's channel
        if not self.can_edit:
            abort(403)
        to = (request.form.get("to") or "").strip()[:200]
        back = redirect(self.get_url(".details_view", id=model.id))
        if not to:
            flash("Informe o destino do teste.", "error")
            return back
        snapshot = SimpleNamespace(**{c: getattr(model, c) for c in (
            "id", "org_id", "provider", "kind", "settings", "credentials", "key_version", "updated_at")})
        self.session.rollback()  # no transaction held while the provider (or its recorder) works
        try:
            provider = runtime().providers.get(snapshot)
            result = provider.send(OutboundMessage(
                to=to, text="Teste do Lembra: este canal está funcionando.",
                subject="Teste do Lembra" if snapshot.kind == "email" else None,
                idempotency_key=f"test-{snapshot.id}-{clock.now().timestamp()}"))
        except Exception as exc:  # provider errors carry codes, never credentials
            flash(f"O teste falhou: {getattr(exc, 'code', None) or type(exc).__name__}", "error")
            status = "failed"
        else:
            flash("Teste enviado.", "success")
            status = "sent"
        write_audit(self.session.connection(), "test_send", "channels", snapshot.id, {"status": status})
        self.session.commit()
        return back
