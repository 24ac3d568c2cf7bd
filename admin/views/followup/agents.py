"""Agentes: the org's AI assistant profiles — persona, LLM settings (an OpenAI-compatible base
URL, a model, an API key), the default hand-off policy and which flows each may start.

Written through `engine.flows.agents` (the key sealed for its row by `set_api_key`). The key is
write-only: no page, form or export ever holds it; the console says only whether one is set. A
blank key field keeps the stored one, unless the base URL now points to another endpoint (scheme,
host, port): then the stored key is cleared and must be typed again. "Testar conexão" makes one
real classify call through the agent's own client (`ai.factory.ai_for`), with the key stored for
the agent's base URL or none, so the egress guard, the call's deadline and the key binding apply
exactly as they do for the worker: a base URL inside the network is refused before anything is
sent, and said so.

Owners and managers edit and test; agents (the role) read.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from flask import abort, flash, redirect
from flask_admin import expose
from markupsafe import Markup
from sqlalchemy import select
from wtforms import BooleanField, PasswordField, SelectField, SelectMultipleField, StringField, TextAreaField
from wtforms.fields.choices import SelectChoice
from wtforms.validators import DataRequired, Length, Optional, ValidationError
from wtforms.widgets import CheckboxInput

from admin.i18n import _, _l, translate
from admin.views.base import TenantModelView, db_session, is_editor, org_id, org_timezone, runtime, write_audit
from admin.views.settings.channels import egress_error
from engine.core import clock
from engine.words.catalogue import describe
from engine.flows import agents as agent_ops
from engine.flows import queries
from engine.flows.ai.base import AIContext, AIError
from engine.flows.ai.builtin import BuiltinAI
from engine.flows.ai.factory import ai_for
from engine.store.models import FlowPointer, Org
from engine.core.errors import DomainError
from gateway.egress import EgressRefused, InvalidAddress

HANDOFF_LABELS = {
    "pause": _l("Pausar o follow-up enquanto a pessoa atende"),
    "cancel": _l("Encerrar o follow-up"),
    "allow": _l("Deixar o follow-up seguir"),
}
#: A base URL the form takes: http(s) with a host; the egress guard then checks where it resolves.
URL_PATTERN = re.compile(r"^https?://[^\s/?#]+(?:[/?#]\S*)?$", re.IGNORECASE)
#: How long "Testar conexão" may take, connect to the answer's last byte (the worker's deadline is longer).
TEST_TIMEOUT = 10.0
#: The class the test classification offers the model (any answer in the schema proves the path).
TEST_CLASSES = ("ok",)


def _flow_choices() -> list[SelectChoice]:
    """The org's flows, as the form's options (another org's id is then not a valid choice)."""
    return [SelectChoice(int(r.id), r.name) for r in db_session().query(FlowPointer.id, FlowPointer.name)
            .filter(FlowPointer.org_id == org_id()).order_by(FlowPointer.name).all()]


class CheckboxList:
    """A multiple choice as one checkbox per option: a Ctrl-click list box loses a selection with one
    plain click, and nobody at a clinic's front desk knows Ctrl-click."""

    def __call__(self, field: Any, **kwargs: Any) -> Markup:
        options = list(field)
        if not options:
            return Markup('<p class="text-muted mb-0" id="{}">{}</p>').format(
                field.id, _("Nenhum fluxo ainda: crie e publique um fluxo em Fluxos."))
        items = [Markup('<div class="form-check">{} {}</div>').format(
            option(class_="form-check-input"), option.label(class_="form-check-label")) for option in options]
        return Markup('<div id="{}" class="lembra-checkboxes">{}</div>').format(field.id, Markup("").join(items))


def _handoff_choices() -> list[SelectChoice]:
    """The hand-off policies as options, labelled in the reader's language."""
    return [SelectChoice(k, v) for k, v in HANDOFF_LABELS.items()]


def _flow_ids(model: Any) -> list[int]:
    ids = model.flow_pointer_ids if isinstance(model.flow_pointer_ids, list) else []
    return [int(i) for i in ids if isinstance(i, (int, str)) and str(i).isdigit()]


def _flows(view: Any, model: Any) -> str:
    ids = _flow_ids(model)
    if not ids:
        return _("nenhum")
    names = dict(view.session.query(FlowPointer.id, FlowPointer.name).filter(
        FlowPointer.org_id == org_id(), FlowPointer.id.in_(ids)).all())
    return ", ".join(names[i] for i in ids if i in names) or _("nenhum")


def _key_state(model: Any) -> Markup:
    # That a key is stored, never any part of it.
    if model.llm_api_key is not None:
        return Markup('<span class="badge badge-success">{}</span>').format(_("definida"))
    return Markup('<span class="badge badge-secondary">{}</span>').format(_("não definida"))


def _llm(model: Any) -> str:
    if model.llm_base_url and model.llm_model:
        return f"{model.llm_model} @ {model.llm_base_url}"
    return _("IA embutida (palavras-chave e modelos, sem chamar um modelo)")


class AgentView(TenantModelView):
    """Agentes (endpoint `followup_agents`)."""

    allow_create = True
    allow_edit = True
    allow_delete = False  # runs keep pointing at the agent that started them
    column_list = ("name", "llm", "key_state", "handoff_policy", "followup_enabled", "flows")
    column_details_list = ("name", "persona", "llm_base_url", "llm_model", "key_state", "handoff_policy",
                           "followup_enabled", "flows", "created_at", "updated_at")
    column_export_list = ("name", "llm_base_url", "llm_model", "handoff_policy", "followup_enabled", "flows")
    column_labels = {"name": _l("Nome"), "persona": _l("Persona"), "llm": _l("Modelo de IA"),
                     "llm_base_url": _l("Endereço da API (base URL)"), "llm_model": _l("Nome do modelo"),
                     "key_state": _l("Chave de API"), "handoff_policy": _l("Atendimento humano (padrão)"),
                     "followup_enabled": _l("Inicia follow-ups"), "flows": _l("Fluxos que pode iniciar"),
                     "created_at": _l("Criado em"), "updated_at": _l("Atualizado em")}
    column_formatters = {
        "llm": lambda v, c, m, n: _llm(m),
        "key_state": lambda v, c, m, n: _key_state(m),
        "handoff_policy": lambda v, c, m, n: HANDOFF_LABELS.get(m.handoff_policy, m.handoff_policy),
        "flows": lambda v, c, m, n: _flows(v, m),
    }
    column_formatters_detail = column_formatters
    column_formatters_export = {"flows": lambda v, c, m, n: _flows(v, m)}
    column_searchable_list = ("name",)
    column_sortable_list = ("name",)
    column_default_sort = ("name", False)
    details_template = "admin/followup/agent_details.html"
    empty_message = _l("Nenhum agente. Crie um para escolher quais fluxos de follow-up começam sozinhos e, se "
                       "quiser, ligar um modelo de IA.")
    audit_entity = "agents"

    def scaffold_form(self) -> Any:
        class AgentForm(self.form_base_class):  # type: ignore[name-defined,misc]
            name = StringField(_l("Nome"), validators=[DataRequired(message=_l("Dê um nome ao agente.")),
                                                       Length(max=200)])
            persona = TextAreaField(_l("Persona"), validators=[Optional(), Length(max=2000)],
                                    description=_l("Como o agente se apresenta e escreve, por exemplo “Sou a Lia, "
                                                   "da recepção; escrevo de forma breve e gentil”."))
            llm_base_url = StringField(_l("Endereço da API (base URL)"), validators=[Optional(), Length(max=500)],
                                       description=_l("Um servidor compatível com a API da OpenAI, por exemplo "
                                                      "https://api.openai.com/v1. Em branco: a IA embutida."))
            llm_model = StringField(_l("Nome do modelo"), validators=[Optional(), Length(max=200)])
            # Not named after the column: the form is never filled from the row's sealed key.
            new_api_key = PasswordField(_l("Chave de API"), validators=[Optional(), Length(max=500)],
                                        description=_l("Só escrita: deixe em branco para manter a chave guardada. "
                                                       "Se o endereço da API mudar para outro servidor, a chave "
                                                       "guardada é apagada e precisa ser informada de novo."))
            clear_api_key = BooleanField(_l("Remover a chave guardada"))
            handoff_policy = SelectField(_l("Atendimento humano (padrão)"),
                                         choices=_handoff_choices, default="pause")
            followup_enabled = BooleanField(_l("Inicia follow-ups automaticamente"))
            flow_ids = SelectMultipleField(_l("Fluxos que pode iniciar"), coerce=int, validators=[Optional()],
                                           description=_l("Só os fluxos marcados começam sozinhos pelo gatilho."),
                                           widget=CheckboxList(), option_widget=CheckboxInput())

            def validate_llm_base_url(self, field: Any) -> None:
                value = (field.data or "").strip()
                if value and not URL_PATTERN.match(value):
                    raise ValidationError(_("Informe um endereço que comece com http:// ou https://."))

        return AgentForm

    def _with_choices(self, form: Any) -> Any:
        form.flow_ids.choices = _flow_choices()
        return form

    def create_form(self, obj: Any = None) -> Any:
        return self._with_choices(super().create_form(obj))

    def edit_form(self, obj: Any = None) -> Any:
        return self._with_choices(super().edit_form(obj))

    def on_form_prefill(self, form: Any, id: Any) -> None:
        form.flow_ids.data = _flow_ids(self.get_one(id))

    def validate_form(self, form: Any) -> bool:
        ok = super().validate_form(form)
        if not hasattr(form, "llm_base_url"):  # the list's action and delete forms
            return ok
        url, model = (form.llm_base_url.data or "").strip(), (form.llm_model.data or "").strip()
        if bool(url) != bool(model):
            (form.llm_model if url else form.llm_base_url).errors.append(
                _("Informe o endereço e o modelo juntos, ou deixe os dois em branco para usar a IA embutida."))
            ok = False
        if url and not form.llm_base_url.errors:
            try:
                runtime().settings.egress.check_url(url)  # read as the HTTP client reads it (egress.endpoint)
            except InvalidAddress as exc:
                form.llm_base_url.errors.append(translate(describe(exc.code)))
                ok = False
            except EgressRefused as exc:
                form.llm_base_url.errors.append(egress_error(exc))
                ok = False
        return ok

    def _values(self, form: Any) -> dict[str, Any]:
        return {"name": form.name.data.strip(), "persona": (form.persona.data or "").strip() or None,
                "llm_base_url": (form.llm_base_url.data or "").strip() or None,
                "llm_model": (form.llm_model.data or "").strip() or None,
                "handoff_policy": form.handoff_policy.data, "followup_enabled": bool(form.followup_enabled.data),
                "flow_ids": sorted(set(form.flow_ids.data or ()))}

    def create_model(self, form: Any) -> Any:
        conn = self.session.connection()
        values = self._values(form)
        key = form.new_api_key.data or None
        try:
            agent_id = agent_ops.create_agent(conn, runtime().keyring, org_id(), llm_api_key=key,
                                              egress=runtime().settings.egress, **values)
        except DomainError as exc:
            self.session.rollback()
            flash(_("Não foi possível salvar: %(erro)s", erro=exc), "error")
            return False
        write_audit(conn, "create", self.audit_entity, agent_id, {**values, "api_key_set": key is not None})
        self.session.commit()
        return self.get_one(agent_id)

    def update_model(self, form: Any, model: Any) -> bool:
        conn = self.session.connection()
        oid, aid = org_id(), int(model.id)
        values = self._values(form)
        before = {"name": model.name, "persona": model.persona, "llm_base_url": model.llm_base_url,
                  "llm_model": model.llm_model, "handoff_policy": model.handoff_policy,
                  "followup_enabled": bool(model.followup_enabled), "flow_ids": sorted(_flow_ids(model))}
        changes = {k: v for k, v in values.items() if before[k] != v}
        cleared = False
        try:
            if changes:
                # First the URL (a new endpoint clears the stored key), then a typed key, sealed for it.
                cleared = agent_ops.update_agent(conn, oid, aid, egress=runtime().settings.egress, **changes)
            if form.new_api_key.data:
                agent_ops.set_api_key(conn, runtime().keyring, oid, aid, form.new_api_key.data)
                changes["api_key_changed"] = True  # that it changed, never the value
            elif cleared:
                changes["api_key_removed"] = "new_endpoint"
            elif form.clear_api_key.data and model.llm_api_key is not None:
                agent_ops.set_api_key(conn, runtime().keyring, oid, aid, None)
                changes["api_key_removed"] = True
        except DomainError as exc:
            self.session.rollback()
            flash(_("Não foi possível salvar: %(erro)s", erro=exc), "error")
            return False
        if changes:
            write_audit(conn, "update", self.audit_entity, aid, changes)
        self.session.commit()
        if changes.get("api_key_removed") == "new_endpoint":
            flash(translate(describe("credentials_cleared_new_endpoint")), "warning")
        return True

    def render(self, template: str, **kwargs: Any) -> Any:
        kwargs.setdefault("lembra_is_editor", is_editor())
        return super().render(template, **kwargs)

    # --- testar conexão -------------------------------------------------------------------------------
    @expose("/test/<int:id>/", methods=("POST",))
    def test_view(self, id: int) -> Any:
        """One real call through the agent's client; says in the reader's language how it went."""
        model = self.get_one(id)  # another org's agent: 404, whoever asks
        if not is_editor():
            abort(403)
        back = redirect(self.get_url(".details_view", id=model.id))
        conn = self.session.connection()
        org = conn.execute(select(Org.name).where(Org.id == org_id())).first()
        # A snapshot, so no transaction is held while the LLM server answers.
        snapshot = SimpleNamespace(**{c: getattr(model, c) for c in (
            "id", "org_id", "llm_base_url", "llm_model", "llm_api_key", "key_version", "persona")})
        org_name, timezone = (org.name if org is not None else ""), org_timezone()
        self.session.rollback()
        ai = ai_for(snapshot, runtime().keyring, timeout=TEST_TIMEOUT, egress=runtime().settings.egress)
        if isinstance(ai, BuiltinAI):
            flash(_("Este agente usa a IA embutida, que não chama nenhum servidor: não há conexão para testar. "
                    "Informe o endereço e o modelo para ligar um modelo de IA."), "warning")
            return back
        context = AIContext(org_name=org_name, persona=snapshot.persona, contact_first_name=None, locale="pt_BR",
                            timezone=timezone, now=clock.now())
        try:
            answer = ai.classify(text="Teste de conexão do Lembra.", classes=TEST_CLASSES, keywords={}, hint=None,
                                 context=context)
        except AIError as exc:
            status = exc.code
            if exc.code == "egress_refused":
                flash(_("A conexão falhou: endereço não permitido. O endereço da API deste agente aponta para a "
                        "rede interna (localhost, rede privada ou link-local); use um endereço público ou peça a "
                        "quem opera o Lembra para liberá-lo em LEMBRA_PROVIDER_ALLOW. Nada foi enviado."), "error")
            else:
                flash(_("A conexão falhou: %(motivo)s.", motivo=_sentence(exc.code)), "error")
        else:
            if answer.reason == "ai_malformed":
                status = "ai_malformed"
                flash(_("O servidor respondeu, mas fora do formato esperado. Confira se o modelo aceita respostas "
                        "em JSON (structured outputs)."), "warning")
            else:
                status = "ok"
                flash(_("Conexão funcionando: o modelo %(modelo)s respondeu.", modelo=snapshot.llm_model), "success")
        write_audit(self.session.connection(), "test_connection", self.audit_entity, snapshot.id, {"result": status})
        self.session.commit()
        return back


def _sentence(code: str | None) -> str:
    text = queries.sentence(code)
    return translate(text) if text is not None else _("erro desconhecido")


__all__ = ["HANDOFF_LABELS", "AgentView"]
