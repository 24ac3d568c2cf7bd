"""Canais (channels): set up a clinic's account at a provider, check it, and link its phone.

The form shows only the chosen provider's fields, as the provider declares them (label, help with
where to find the value in its dashboard, format); "Testar conexão" asks the provider through the
gateway's `check()`; the details page gives the webhook URL to paste into the provider, and for
Evolution creates the instance and links the phone by QR code.
"""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace
from typing import Any

from flask import abort, current_app, flash, jsonify, redirect, request
from flask_admin import expose
from flask_admin.helpers import is_form_submitted
from markupsafe import Markup
from sqlalchemy import update

from admin.i18n import _, _l, translate
from admin.views.base import KIND_LABELS, TenantModelView, badge, org_id, runtime, write_audit
from admin.views.settings.channels import forms
from admin.views.settings.channels.messages import (
    CONNECTION_COLORS,
    CHOICE_LABELS,
    CONNECTION_LABELS,
    PROVIDER_LABELS,
    connect_error,
    connection_badge,
    egress_error,
    provider_error,
    status_detail_text,
)
from engine.core import clock
from engine.words.catalogue import describe
from engine.tenants.channels import create_channel
from engine.core.config import ENV_VARS
from engine.messaging.connect import (
    ChannelNotFound,
    connect_channel,
    connection_snapshot,
    recorded_state,
    supports_connect,
)
from engine.core.errors import DomainError
from engine.store.models import PROVIDERS, channels
from gateway import registry
from gateway.contract import ConnectInfo, Health, OutboundMessage
from gateway.errors import EgressRefused, ProviderError
from gateway.phones import InvalidPhone, normalize_phone

log = logging.getLogger(__name__)

_EMAIL = re.compile(r"[^@\s,;<>\"]+@[^@\s,;<>\"]+\.[^@\s,;<>\"]+")
#: LEMBRA_PUBLIC_URL's default: a loopback address no provider can reach.
_DEFAULT_PUBLIC_URL = ENV_VARS["LEMBRA_PUBLIC_URL"][0]
_LOCAL_HOSTS = re.compile(r"https?://(localhost|127\.[0-9.]+|0\.0\.0\.0|\[::1\])(?::\d+)?(/|$)")


def _connection_column(model: Any) -> Markup:
    if not supports_connect(model.provider):
        return Markup("—")
    return connection_badge(recorded_state(model.status_detail))


def _open_credentials(model: Any) -> dict[str, Any]:
    if not model.credentials:
        return {}
    return runtime().keyring.open(model.credentials, key_version=model.key_version, table="channels",
                                  org_id=model.org_id, row_id=model.id)



def webhook_info(provider: str, channel_id: int) -> dict[str, Any]:
    """The URL the provider must call for this channel, and whether LEMBRA_PUBLIC_URL makes it reachable."""
    public_url = runtime().settings.public_url.rstrip("/")
    return {
        "url": f"{public_url}/webhooks/{provider}/{channel_id}",
        "public_url": public_url,
        # The default (or any loopback address) is this machine: the provider's servers cannot call it.
        "unset": public_url == _DEFAULT_PUBLIC_URL.rstrip("/") or bool(_LOCAL_HOSTS.match(public_url)),
        "insecure": not public_url.startswith("https://"),
    }


def test_address(kind: str, raw: str) -> str | None:
    """The test's destination as the provider needs it (E.164 phone or e-mail), or None when malformed."""
    raw = raw.strip()
    if kind == "email":
        return raw if _EMAIL.fullmatch(raw) else None
    try:
        return normalize_phone(raw)
    except InvalidPhone:
        return None


def _check_message(provider: str, health: Health) -> tuple[str, str]:
    """(flash category, sentence) for what `check()` answered."""
    if provider == "sandbox":
        return "success", _("Sandbox: nada sai de verdade; o canal está pronto para testes.")
    if provider == "evolution":
        if health.state == "open":
            return "success", _("Conexão funcionando: o servidor Evolution aceitou a chave e o WhatsApp da clínica "
                                "está conectado.")
        if health.state in ("close", "connecting", "refused"):
            return "warning", _("O servidor Evolution aceitou a chave, mas o WhatsApp da clínica não está conectado "
                                "(%(estado)s). Use Conectar WhatsApp.", estado=CONNECTION_LABELS.get(
                                    health.state, health.state))
        return "error", _("A conexão falhou: %(erro)s", erro=connect_error(health.detail))
    if health.ok:
        return "success", _("Conexão funcionando: o provedor aceitou as credenciais. Nada foi enviado.")
    return "error", _("A conexão falhou: %(erro)s", erro=provider_error(health.detail or health.state, provider))


class ChannelView(TenantModelView):
    """Channels; credentials are write-only secrets (a blank secret keeps the stored value)."""

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
        "provider": lambda v, c, m, n: PROVIDER_LABELS.get(m.provider, m.provider),
        "status_detail": lambda v, c, m, n: status_detail_text(m.status_detail, m.provider),
        "configured": lambda v, c, m, n: _("configuradas (ocultas)") if m.credentials else _("nenhuma"),
    }
    column_formatters_detail = column_formatters
    column_formatters_export = {"status": lambda v, c, m, n: m.status, "provider": lambda v, c, m, n: m.provider,
                                "status_detail": lambda v, c, m, n: m.status_detail}
    details_template = "admin/channel_details.html"
    create_template = "admin/channel_form.html"
    edit_template = "admin/channel_form.html"
    empty_message = _l("Nenhum canal. Crie um canal (comece pelo Sandbox para testar sem enviar nada de verdade).")
    audit_entity = "channels"

    # --- the form: only the chosen provider's fields ---------------------------------------------
    def scaffold_form(self) -> Any:
        return type("ChannelForm", (self.form_base_class,), forms.form_attributes())

    def _chosen(self) -> str:
        """The provider a new channel is for: the one posted, else ?provider=, else the first."""
        value = request.form.get("provider") if request.method == "POST" else request.args.get("provider")
        return value if value in PROVIDERS else PROVIDERS[0]

    def create_form(self, obj: Any = None) -> Any:
        form = super().create_form(obj)
        chosen = self._chosen()
        if request.method == "POST":
            forms.keep_only(form, chosen)  # what another provider's fields hold is neither read nor checked
        elif not form.provider.data or form.provider.data not in PROVIDERS or "provider" in request.args:
            form.provider.data = chosen
            form.kind.data = forms.provider_kinds(chosen)[0] if forms.provider_kinds(chosen) else form.kind.data
        return form

    def edit_form(self, obj: Any = None) -> Any:
        form = super().edit_form(obj)
        if obj is not None:
            forms.keep_only(form, obj.provider)
            if request.method == "GET":
                forms.show_stored(form, obj.provider, _open_credentials(obj))
                forms.show_settings(form, obj.provider, obj.settings or {})
            for name in ("kind", "provider"):  # a channel's provider and kind are fixed once created
                getattr(form, name).render_kw = {"disabled": True}
                getattr(form, name).validators = []
                getattr(form, name).data = getattr(obj, name)
        return form

    def validate_form(self, form: Any) -> bool:
        ok = super().validate_form(form)
        if not hasattr(form, "provider"):  # the list's action and delete forms
            return ok
        if not is_form_submitted():
            # Flask-Admin asks on every GET too: checking then would greet a blank new channel with
            # "Preencha este campo." under each field before anything was typed.
            return ok
        model = self._editing()
        provider = model.provider if model is not None else form.provider.data
        stored = _open_credentials(model) if model is not None else {}
        if model is None and form.kind.data not in forms.provider_kinds(provider):
            form.kind.errors = [*form.kind.errors, _("Este provedor não envia por este tipo de canal. Escolha: %(tipos)s.",
                                                     tipos=", ".join(str(KIND_LABELS[k])
                                                                     for k in forms.provider_kinds(provider)))]
            ok = False
        ok = forms.check_settings(form, provider) and ok
        return forms.check_credentials(form, provider, stored, runtime().settings.egress) and ok

    def _editing(self) -> Any:
        if request.endpoint != f"{self.endpoint}.edit_view":
            return None
        return self.get_one(request.args.get("id", ""))

    def render(self, template: str, **kwargs: Any) -> Any:
        form = kwargs.get("form")
        if template == "admin/channel_form.html" and form is not None and hasattr(form, "provider"):
            model = kwargs.get("model")
            current = model.provider if model is not None else (form.provider.data or PROVIDERS[0])
            shown = (current,) if model is not None else PROVIDERS
            kwargs["provider_specs"] = [(name, PROVIDER_LABELS.get(name, name), forms.provider_fields(name),
                                         forms.provider_kinds(name)) for name in shown]
            kwargs["current_provider"] = current
            kwargs["choice_labels"] = CHOICE_LABELS
            # The names of the stored values (a secret shows "Guardado"), never the values.
            kwargs["stored_keys"] = set(_open_credentials(model)) if model is not None else set()
        return super().render(template, **kwargs)

    def create_model(self, form: Any) -> Any:
        conn = self.session.connection()
        provider = form.provider.data
        creds = forms.credentials(form, provider, generate=True)
        try:
            channel_id = create_channel(conn, runtime().keyring, org_id=org_id(), kind=form.kind.data,
                                        provider=provider, name=form.name.data, credentials=creds or None,
                                        settings=forms.settings_of(form, provider, {}),
                                        is_default=bool(form.is_default.data))
            if form.status.data != "active":
                conn.execute(update(channels).where(channels.c.org_id == org_id(), channels.c.id == channel_id)
                             .values(status=form.status.data))
            write_audit(conn, "create", "channels", channel_id, {
                "name": form.name.data, "kind": form.kind.data, "provider": provider,
                "credential_keys": sorted(creds)})
            self.session.commit()
        except DomainError:
            # The form checked what create_channel checks; this is a race or a bug, said without its English.
            self.session.rollback()
            flash(_("Não foi possível salvar o canal. Confira os campos e tente de novo."), "error")
            return False
        return self.get_one(channel_id)

    def get_save_return_url(self, model: Any, is_created: bool = False) -> str:
        # After saving, the channel's page: the webhook URL to paste and the next steps are there
        # (the sandbox has no provider to paste anything into: back to the list).
        if model is not None and getattr(model, "id", None) is not None and model.provider != "sandbox":
            return self.get_url(".details_view", id=model.id)
        return super().get_save_return_url(model, is_created)

    def update_model(self, form: Any, model: Any) -> bool:
        conn = self.session.connection()
        oid, cid = org_id(), int(model.id)
        values: dict[str, Any] = {}
        for name in ("name", "status", "is_default"):
            new = bool(form.is_default.data) if name == "is_default" else form[name].data
            if getattr(model, name) != new:
                values[name] = new
        settings = forms.settings_of(form, model.provider, model.settings or {})
        if settings != (model.settings or {}):
            values["settings"] = settings
            changes_settings = sorted(k for k in settings.keys() | (model.settings or {}).keys()
                                      if settings.get(k) != (model.settings or {}).get(k))
        else:
            changes_settings = []
        stored = _open_credentials(model)
        merged, dropped = forms.updated_credentials(form, model.provider, stored)
        changed = sorted(k for k in merged.keys() | stored.keys() if merged.get(k) != stored.get(k))
        changes: dict[str, Any] = {key: value for key, value in values.items() if key != "settings"}
        if changes_settings:
            changes["settings_changed"] = changes_settings
        if changed:
            sealed = runtime().keyring.seal(merged, table="channels", org_id=oid, row_id=cid)
            values.update(credentials=sealed.ciphertext, key_version=sealed.key_version)
            changes["credential_keys_changed"] = changed
        if dropped:
            changes["credential_keys_dropped"] = sorted(dropped)  # the new server never gets the old secrets
        if values:
            if values.get("is_default"):
                conn.execute(update(channels).where(channels.c.org_id == oid, channels.c.kind == model.kind)
                             .values(is_default=False))
            conn.execute(update(channels).where(channels.c.org_id == oid, channels.c.id == cid)
                         .values(**values, updated_at=clock.now()))
            write_audit(conn, "update", "channels", cid, changes)
        self.session.commit()
        if dropped:
            flash(translate(describe("credentials_cleared_new_endpoint")), "warning")
        return True

    # --- the details page: webhook URL, checks -----------------------------------------------
    def render_details_extras(self, model: Any) -> dict[str, Any]:
        """What channel_details.html shows below the table (no credential value ever)."""
        try:
            cls = registry.load(model.provider)
        except registry.UnknownProvider:
            cls = None
        return {
            "webhook": webhook_info(model.provider, int(model.id)),
            "checks_connection": bool(cls is not None and cls.checks_connection),
            "provider_label": PROVIDER_LABELS.get(model.provider, model.provider),
            "creates_instance": cls is not None and hasattr(cls, "create_instance"),
        }

    def _snapshot_row(self, model: Any) -> SimpleNamespace:
        return SimpleNamespace(**{c: getattr(model, c) for c in (
            "id", "org_id", "provider", "kind", "settings", "credentials", "key_version", "updated_at")})

    def _editable(self, id: int) -> Any:
        model = self.get_one(id)  # 404 for another org's channel
        if model is None:
            abort(404)
        if not self.can_edit:
            abort(403)  # configuration: owner / manager only
        return model

    @expose("/test/<int:id>/", methods=("POST",))
    def send_test(self, id: int) -> Any:
        model = self._editable(id)
        raw = (request.form.get("to") or "").strip()[:200]
        back = redirect(self.get_url(".details_view", id=model.id))
        if not raw:
            flash(_("Informe o destino do teste."), "error")
            return back
        to = test_address(model.kind, raw)
        if to is None:
            flash(_("Endereço inválido: informe um e-mail completo, como voce@clinica.com.br.") if model.kind == "email"
                  else _("Número inválido: informe o celular com DDD, por exemplo +55 16 99999-0000."), "error")
            return back
        snapshot = self._snapshot_row(model)
        self.session.rollback()  # no transaction held while the provider (or its recorder) works
        try:
            provider = runtime().providers.get(snapshot)
            provider.send(OutboundMessage(
                # The operator sends the test to themselves: it speaks their console language.
                to=to, text=_("Teste do Lembra: este canal está funcionando."),
                subject=_("Teste do Lembra") if snapshot.kind == "email" else None,
                idempotency_key=f"test-{snapshot.id}-{clock.now().timestamp()}"))
        except EgressRefused as exc:  # refused before any connection: nothing says what listens there
            flash(egress_error(exc), "error")
            status = "failed"
        except ProviderError as exc:  # codes only, never the provider's body or a credential
            flash(_("O teste falhou: %(erro)s", erro=provider_error(exc.code, snapshot.provider)), "error")
            status = "failed"
        except Exception as exc:  # noqa: BLE001 - a broken keyring or an odd provider: a message, never a 500
            log.warning("test send on channel %s failed: %s", snapshot.id, type(exc).__name__)
            flash(_("O teste falhou: %(erro)s", erro=provider_error(type(exc).__name__)), "error")
            status = "failed"
        else:
            flash(_("Teste enviado ao sandbox (nada sai de verdade): veja-o na caixa do sandbox.")
                  if snapshot.provider == "sandbox" else _("Teste enviado."), "success")
            status = "sent"
        write_audit(self.session.connection(), "test_send", "channels", snapshot.id, {"status": status})
        self.session.commit()
        return back

    @expose("/check/<int:id>/", methods=("POST",))
    def check_view(self, id: int) -> Any:
        """"Testar conexão": the provider's `check()` (sends nothing); the answer as a flash."""
        model = self._editable(id)
        back = redirect(self.get_url(".details_view", id=model.id))
        snapshot = self._snapshot_row(model)
        self.session.rollback()  # no transaction held while the provider answers
        result = "failed"
        try:
            provider = runtime().providers.get(snapshot)
            if not provider.checks_connection:
                flash(_("Este provedor não tem um teste de conexão que não envie nada. Use o envio de teste "
                        "abaixo, para o seu próprio número."), "info")
                result = "unsupported"
            else:
                category, message = _check_message(snapshot.provider, provider.check())
                flash(message, category)
                result = "ok" if category == "success" else "failed"
        except EgressRefused as exc:
            flash(egress_error(exc), "error")
        except ProviderError as exc:
            flash(_("A conexão falhou: %(erro)s", erro=provider_error(exc.code, snapshot.provider)), "error")
        except Exception as exc:  # noqa: BLE001 - never a 500 (nor a traceback with a URL) for a provider problem
            log.warning("connection check on channel %s failed: %s", snapshot.id, type(exc).__name__)
            flash(_("A conexão falhou: %(erro)s", erro=provider_error(type(exc).__name__)), "error")
        write_audit(self.session.connection(), "check", "channels", snapshot.id, {"result": result})
        self.session.commit()
        return back

    @expose("/instance/<int:id>/", methods=("POST",))
    def create_instance_view(self, id: int) -> Any:
        """Evolution: create the channel's instance (webhook included) on the server, then the QR page.
        An instance that already exists gets this channel's webhook set instead."""
        model = self._editable(id)
        back = redirect(self.get_url(".details_view", id=model.id))
        snapshot = self._snapshot_row(model)
        self.session.rollback()
        result = "failed"
        if not supports_connect(snapshot.provider):
            abort(404)  # only Evolution has instances
        try:
            provider: Any = runtime().providers.get(snapshot)
            try:
                provider.create_instance()
                result = "created"
            except ProviderError as exc:
                if exc.code != "instance_name_in_use":
                    raise
                provider.configure_webhook()  # the instance exists: point its webhook here
                result = "webhook_set"
        except EgressRefused as exc:
            flash(egress_error(exc), "error")
        except ProviderError as exc:
            flash(connect_error(exc.code), "error")
        except Exception as exc:  # noqa: BLE001 - a message, never a 500
            log.warning("create instance on channel %s failed: %s", snapshot.id, type(exc).__name__)
            flash(connect_error(type(exc).__name__), "error")
        write_audit(self.session.connection(), "create_instance", "channels", snapshot.id, {"result": result})
        self.session.commit()
        if result == "failed":
            return back
        flash(_("Instância criada no Evolution, com o webhook deste canal. Agora leia o QR code com o celular "
                "da clínica.") if result == "created" else
              _("A instância já existia no Evolution: o webhook dela agora aponta para este canal. Conecte o "
                "celular pelo QR code, se ainda não estiver conectado."), "success")
        return redirect(self.get_url(".connect_view", id=snapshot.id))

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
