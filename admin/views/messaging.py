"""Modelos (templates) and Canais (channels)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from flask import abort, current_app, flash, jsonify, redirect, request
from flask_admin import expose
from flask_admin.actions import action
from markupsafe import Markup
from sqlalchemy import or_, update
from wtforms import BooleanField, PasswordField, SelectField, StringField, TextAreaField
from wtforms.validators import DataRequired, Length, Optional, ValidationError

from admin.i18n import _, _l, ngettext, translate
from admin.ids import parse_id
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
from engine.connect import (
    ChannelNotFound,
    connect_channel,
    connection_snapshot,
    recorded_state,
    supports_connect,
)
from engine.models import CHANNEL_KINDS, PROVIDERS, Template, channels
from engine.orgs import DomainError
from engine.render import SAMPLE_VARIABLES, TemplateError, render_html, render_text, validate
from gateway.contract import ConnectInfo, OutboundMessage
from gateway.errors import EgressRefused, ProviderError

log = logging.getLogger(__name__)

TEMPLATE_KEYS = ("session_reminder", "session_confirmation", "session_cancellation", "confirm_ack", "cancel_ack",
                 "optout_confirmation")
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
            if exc.text is not None:
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
        "origin": lambda v, c, m, n: (
            Markup('<span class="badge badge-secondary">{}</span> <a href="{}">{}</a>').format(
                _("Padrão"), v.get_url(".create_view", **{"from": m.id}), _("Personalizar")) if is_editor() else
            Markup('<span class="badge badge-secondary">{}</span>').format(_("Padrão"))
        ) if m.org_id is None else Markup('<span class="badge badge-primary">{}</span>').format(_("Da clínica")),
        "body": lambda v, c, m, n: (m.body[:120] + "…") if len(m.body or "") > 120 else m.body,
    }
    column_formatters_detail = {"origin": column_formatters["origin"]}
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
            locale = SelectField(_l("Idioma"), choices=[("pt_BR", _l("Português")), ("en", _l("Inglês")),
                                                        ("es", _l("Espanhol"))])
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


# ------------------------------------------------------------------------------------------------
ALL_KEYS = sorted({k for keys in REQUIRED_KEYS.values() for k in keys} | {"from", "messaging_service_sid", "username", "password"})
CHANNEL_STATUSES = [("active", _l("Ativo")), ("disabled", _l("Desativado"))]


#: The phone's link as the console says it (Evolution's states; "error" is Lembra failing to ask).
CONNECTION_LABELS = {
    "open": _l("Conectado"), "connecting": _l("Aguardando leitura do QR"), "close": _l("Desconectado"),
    "refused": _l("Desconectado"), "error": _l("Sem resposta do servidor"),
}
CONNECTION_COLORS = {"open": "success", "connecting": "warning", "close": "danger", "refused": "danger",
                     "error": "secondary"}
#: What a provider error code means for the person linking the phone (the code is shown too).
CONNECT_ERRORS = {
    "unsupported": _l("Este canal não se conecta por QR code: só canais Evolution (o WhatsApp do celular da "
                      "clínica) têm essa etapa."),
    "connection_error": _l("O servidor Evolution não respondeu. Verifique se ele está no ar e se o endereço "
                           "(base_url) do canal está certo."),
    "connect_timeout": _l("O servidor Evolution não respondeu. Verifique se ele está no ar e se o endereço "
                          "(base_url) do canal está certo."),
    "timeout": _l("O servidor Evolution demorou demais para responder. Tente de novo em instantes."),
    "request_error": _l("O servidor Evolution não respondeu. Verifique se ele está no ar e se o endereço "
                        "(base_url) do canal está certo."),
    "unauthorized": _l("O Evolution recusou a chave de API do canal. Confira a api_key nas credenciais do canal."),
    "forbidden": _l("O Evolution recusou a chave de API do canal. Confira a api_key nas credenciais do canal."),
    "instance_not_found": _l("A instância configurada no canal não existe no Evolution. Confira o nome da "
                             "instância (instance) nas credenciais do canal."),
    "not_found": _l("O endereço do canal não parece ser um servidor Evolution API v2. Confira a base_url."),
    "not_configured": _l("Faltam credenciais neste canal (base_url, api_key ou instance). Edite o canal e "
                         "preencha."),
    "invalid_number": _l("Número de telefone inválido. Informe o número do WhatsApp da clínica com DDD, por "
                         "exemplo +55 16 99999-0000."),
    "connect_failed": _l("O Evolution não conseguiu iniciar a conexão. Tente de novo em alguns segundos."),
    "connection_closed": _l("A conexão do Evolution com o WhatsApp caiu. Gere um novo QR code."),
    "bad_response": _l("O Evolution respondeu algo inesperado. Confira se o servidor é um Evolution API v2."),
    "egress_refused": _l("Endereço não permitido: o base_url deste canal aponta para a rede interna (localhost, "
                         "rede privada ou link-local). Use um endereço público, ou peça a quem opera o Lembra "
                         "para liberá-lo em LEMBRA_PROVIDER_ALLOW."),
}


def connection_badge(state: str | None) -> Markup:
    """A badge for a connection state ("—" when none is known)."""
    if not state:
        return Markup("—")
    return Markup('<span class="badge badge-{}">{}</span>').format(
        CONNECTION_COLORS.get(state, "light"), CONNECTION_LABELS.get(state, state))


def connect_error(code: str | None) -> str:
    """What went wrong talking to the provider, in the reader's language, with the provider's code
    (never its body: that may echo a number or a key)."""
    code = (code or "").strip()[:60] or "error"
    if code in CONNECT_ERRORS:
        message = str(CONNECT_ERRORS[code])
    elif code.startswith(("http_5", "http_429")):
        message = _("O servidor Evolution está com problemas. Tente de novo em instantes.")
    else:
        message = _("Não foi possível falar com o servidor Evolution.")
    return _("%(mensagem)s (código: %(codigo)s)", mensagem=message, codigo=code)


def egress_error(exc: EgressRefused) -> str:
    """A tenant-set address that the egress guard refused, said the same whatever listens there."""
    return _("Endereço não permitido: %(endereco)s. Endereços internos (localhost, redes privadas, link-local) "
             "só podem ser usados se quem opera o Lembra os liberar em LEMBRA_PROVIDER_ALLOW.", endereco=exc.host)


def _connection_column(model: Any) -> Markup:
    if not supports_connect(model.provider):
        return Markup("—")
    return connection_badge(recorded_state(model.status_detail))


def _open_credentials(model: Any) -> dict[str, Any]:
    if not model.credentials:
        return {}
    return runtime().keyring.open(model.credentials, key_version=model.key_version, table="channels",
                                  org_id=model.org_id, row_id=model.id)


class ChannelView(TenantModelView):
    """Channels; credentials are write-only (a blank field keeps the stored value)."""

    column_list = ("name", "kind", "provider", "status", "connection", "is_default", "status_detail", "updated_at")
    column_details_list = ("name", "kind", "provider", "status", "connection", "is_default", "status_detail",
                           "configured", "min_interval_ms", "daily_cap", "created_at", "updated_at")
    column_export_list = ("name", "kind", "provider", "status", "is_default", "status_detail")
    column_labels = {"name": _l("Nome"), "kind": _l("Tipo"), "provider": _l("Provedor"), "status": _l("Status"),
                     "is_default": _l("Padrão"), "status_detail": _l("Detalhe"), "configured": _l("Credenciais"),
                     "min_interval_ms": _l("Intervalo mínimo (ms)"), "daily_cap": _l("Limite diário"),
                     "created_at": _l("Criado em"), "updated_at": _l("Atualizado em"),
                     "connection": _l("Conexão do WhatsApp")}
    column_formatters = {
        "status": lambda v, c, m, n: badge(m.status),
        # The last state the provider reported (webhook or this console), for channels that link a phone.
        "connection": lambda v, c, m, n: _connection_column(m),
        "kind": lambda v, c, m, n: KIND_LABELS.get(m.kind, m.kind),
        "configured": lambda v, c, m, n: _("configuradas (ocultas)") if m.credentials else _("nenhuma"),
    }
    column_formatters_detail = column_formatters
    column_formatters_export = {"status": lambda v, c, m, n: m.status}
    details_template = "admin/channel_details.html"
    empty_message = _l("Nenhum canal. Crie um canal (comece pelo Sandbox para testar sem enviar nada de verdade).")
    audit_entity = "channels"

    def scaffold_form(self) -> Any:
        attrs: dict[str, Any] = {
            "name": StringField(_l("Nome"), validators=[DataRequired(message=_l("Dê um nome ao canal.")),
                                                        Length(max=200)]),
            "kind": SelectField(_l("Tipo"), choices=[(k, KIND_LABELS[k]) for k in CHANNEL_KINDS]),
            "provider": SelectField(_l("Provedor"), choices=[(p, p) for p in PROVIDERS]),
            "status": SelectField(_l("Status"), choices=CHANNEL_STATUSES, default="active"),
            "is_default": BooleanField(_l("Canal padrão deste tipo"), default=True),
        }
        for key in ALL_KEYS:
            attrs[f"cred_{key}"] = PasswordField(
                key, validators=[Optional(), Length(max=2000)],
                description=_l("Só escrita: deixe em branco para manter o valor guardado."))
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

    def validate_form(self, form: Any) -> bool:
        return super().validate_form(form) and self._check_addresses(form)

    def _check_addresses(self, form: Any) -> bool:
        """A base_url or SMTP host typed here that resolves inside the network is a form error now
        (the guard refuses it again at every connection: that is the check that holds)."""
        policy = runtime().settings.egress
        ok = True
        for name, check in (("cred_base_url", policy.check_url), ("cred_host", policy.check_host)):
            field = getattr(form, name, None)
            if field is None or not field.data:
                continue
            try:
                check(str(field.data))
            except EgressRefused as exc:
                field.errors = [*field.errors, egress_error(exc)]
                ok = False
        return ok

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
            flash(_("Não foi possível salvar: %(erro)s", erro=exc), "error")
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
            flash(_("Informe o destino do teste."), "error")
            return back
        snapshot = SimpleNamespace(**{c: getattr(model, c) for c in (
            "id", "org_id", "provider", "kind", "settings", "credentials", "key_version", "updated_at")})
        self.session.rollback()  # no transaction held while the provider (or its recorder) works
        try:
            provider = runtime().providers.get(snapshot)
            result = provider.send(OutboundMessage(
                # The operator sends the test to themselves: it speaks their console language.
                to=to, text=_("Teste do Lembra: este canal está funcionando."),
                subject=_("Teste do Lembra") if snapshot.kind == "email" else None,
                idempotency_key=f"test-{snapshot.id}-{clock.now().timestamp()}"))
        except EgressRefused as exc:  # refused before any connection: nothing says what listens there
            flash(egress_error(exc), "error")
            status = "failed"
        except Exception as exc:  # provider errors carry codes, never credentials
            flash(_("O teste falhou: %(erro)s", erro=getattr(exc, "code", None) or type(exc).__name__), "error")
            status = "failed"
        else:
            flash(_("Teste enviado."), "success")
            status = "sent"
        write_audit(self.session.connection(), "test_send", "channels", snapshot.id, {"status": status})
        self.session.commit()
        return back

    # --- linking the clinic's phone (Evolution's QR code) -----------------------------------------
    def can_connect(self, model: Any) -> bool:
        """Whether the details page offers "Conectar WhatsApp" for this channel."""
        return self.can_edit and supports_connect(model.provider)

    def _connectable(self, id: int) -> Any:
        model = self.get_one(id)  # 404 for another org's channel
        if not self.can_edit:
            abort(403)  # linking a number is configuration: owner / manager only
        return model

    @expose("/connect/<int:id>/", methods=("GET", "POST"))
    def connect_view(self, id: int) -> Any:
        """The "Conectar WhatsApp" page: state badge, QR code, pairing code, polling.

        GET is read-only on Evolution: it asks the state and, only while a session is already
        waiting for a scan (`connecting`), the QR code being shown, which Evolution returns without
        touching the session. Starting a session (from `close`) or asking a pairing code for a
        number does change Evolution — a new Baileys socket, a new QR cycle that counts toward its
        QR limit — so it is a POST with the CSRF token: a prefetch, a reload or another site's
        <img> cannot trigger it. The POST answers with the page itself (no redirect): the pairing
        code exists only in Evolution's answer to that call and is not put in the session cookie.
        """
        model = self._connectable(id)
        back = redirect(self.get_url(".details_view", id=model.id))
        if not supports_connect(model.provider):
            flash(connect_error("unsupported"), "warning")
            return back
        channel = SimpleNamespace(id=int(model.id), name=model.name, provider=model.provider)
        oid = org_id()
        self.session.rollback()  # no transaction held while Evolution answers
        error: str | None = None
        info: ConnectInfo | None = None
        pairing = request.method == "POST" and request.form.get("pairing") == "1"
        number = (request.form.get("number") or "").strip()[:40] if pairing else ""
        if request.method == "POST":
            if pairing and not number:
                state, error = "error", _("Informe o número do WhatsApp da clínica para receber o código.")
            else:
                try:
                    info = connect_channel(runtime(), oid, channel.id, number=number or None, notify=False)
                    state = info.state or "connecting"
                except ChannelNotFound:
                    abort(404)
                except ProviderError as exc:
                    state, error = "error", connect_error(exc.code)
                except Exception as exc:  # noqa: BLE001 - a broken keyring or an odd provider: a message, never a 500
                    # The type only: an exception's message may hold the server's URL.
                    log.warning("connect on channel %s failed: %s", channel.id, type(exc).__name__)
                    state, error = "error", connect_error(type(exc).__name__)
            write_audit(self.session.connection(), "connect", "channels", channel.id,
                        {"pairing_code": pairing, "result": state if error is None else "failed"})
            self.session.commit()
        else:
            state, info, error = self._snapshot(oid, channel.id)
        if pairing and info is not None and state != "open" and not info.pairing_code and error is None:
            # Evolution makes a pairing code only when a session starts with the number; one that is
            # already waiting for a scan keeps its QR code.
            error = _("O Evolution não devolveu um código de pareamento: a conexão já tinha começado pelo QR code. "
                      "Use o QR code, ou desconecte a instância no Evolution e peça o código de novo.")
        response = self.render(
            "admin/channel_connect.html", channel=channel, state=state, badge=connection_badge(state),
            qr=info.qr_code_base64 if info is not None and state != "open" else None,
            pairing_code=_pairing(info.pairing_code) if info is not None and state != "open" else None,
            number=number, error=error,
        )
        return _no_store(response)

    @expose("/connect/<int:id>/state", methods=("GET",))
    def connect_state(self, id: int) -> Any:
        """JSON for the page's polling: the state (and its label), and while waiting for a scan the
        current QR code (Evolution renews it every few seconds). Read-only on Evolution, as GET above."""
        model = self._connectable(id)
        if not supports_connect(model.provider):
            abort(404)
        channel_id = int(model.id)
        oid = org_id()
        self.session.rollback()
        state, info, error = self._snapshot(oid, channel_id)
        return _no_store(jsonify({
            "state": state, "label": str(CONNECTION_LABELS.get(state, state)),
            "color": CONNECTION_COLORS.get(state, "light"), "connected": state == "open",
            "qr": info.qr_code_base64 if info is not None and state != "open" else None, "error": error,
        }))

    def _snapshot(self, oid: int, channel_id: int) -> tuple[str, ConnectInfo | None, str | None]:
        """(state, current QR info, error message) without changing anything on Evolution."""
        try:
            # The operator is looking at the state: a disconnected number needs no inbox item too.
            snapshot = connection_snapshot(runtime(), oid, channel_id, notify=False)
        except ChannelNotFound:
            abort(404)
        except ProviderError as exc:
            return "error", None, connect_error(exc.code)
        except Exception as exc:  # noqa: BLE001 - never a 500 (nor a traceback with a URL) for a provider problem
            log.warning("connection state of channel %s failed: %s", channel_id, type(exc).__name__)
            return "error", None, connect_error(type(exc).__name__)
        health = snapshot.health
        if health.state == "error":
            return "error", None, connect_error(health.detail)
        return health.state, snapshot.info, None


def _pairing(code: str | None) -> str | None:
    """An 8-character pairing code as WhatsApp shows it (ABCD-EFGH)."""
    if not code:
        return None
    code = code.strip()
    return f"{code[:4]}-{code[4:]}" if len(code) == 8 and "-" not in code else code


def _no_store(response: Any) -> Any:
    # A QR code or pairing code links a phone to the clinic's number: no cache keeps it.
    response = current_app.make_response(response)
    response.headers["Cache-Control"] = "no-store"
    return response
