"""The visual flow builder (issue 10): one page per flow that loads the React Flow bundle
(admin/frontend → admin/static/flows/builder.js), and the JSON endpoints the bundle calls.

The bundle never talks to the REST API (that one authenticates by API key): it calls these
endpoints with the console's session cookie and the CSRF token of the page's
`<meta name="csrf-token">` in `X-CSRFToken` (the app's CSRFProtect checks every POST). What they
answer is built by the REST API's serializers (`admin.api.services.flow_detail`, `issue_out`) so
a flow looks the same to both; what they change goes through `engine.flows.versions` and
`engine.flows.triggers`, the engine's one way of doing it.

- Every query is scoped by the signed-in user's org: another org's flow (or contact, or version)
  answers 404, as one that does not exist.
- Owners and managers change flows; an agent opens the builder read-only and gets 403 on a write.
- A draft the engine refuses is not written at all (`versions.update_flow` checks the whole body
  before it updates anything): the answer is a 422 listing each problem on its node.
- Every sentence a person reads comes from the catalogue (issues, refusals) or from `_()` here:
  the bundle gets its words from `ui_strings()` through the page, never from its own source.
"""

from __future__ import annotations

import functools
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

from flask import abort, jsonify, redirect, request, url_for
from flask_admin import expose
from flask_login import current_user
from sqlalchemy import or_, select
from sqlalchemy.engine import Connection
from werkzeug.routing import BuildError

from admin.api import services
from admin.api.core import ApiError
from admin.i18n import _, current_locale, translate
from admin.ids import parse_id
from admin.json_body import BodyRefused, request_json
from admin.views.base import KIND_LABELS, PURPOSE_LABELS, TenantPageView, db_session, local_dt, org_id, write_audit
from admin.views.followup import rehearse as rehearsing
from admin.views.costs import estimate
from admin.views.followup.exits import edge_words
from admin.views.followup.flow_list import FLOW_STATUS_LABELS, list_page, marketing_notices
from admin.views.settings.templates import preview
from engine.flows import queries, versions
from engine.flows.schema import CHANNEL_KINDS, json_schema
from engine.store.models import flow_pointers, templates, users
from engine.core.errors import DomainError
from engine.flows.conversation.fields import list_fields
from engine.words.catalogue import CATALOGUE
from engine.messaging.templates import find_template

#: The built bundle (admin/frontend/build.mjs writes it; tests/admin/test_builder_bundle.py checks it).
STATIC = Path(__file__).resolve().parents[2] / "static"
BUNDLE = STATIC / "flows" / "builder.js"
#: The fields of a flow the builder may change: the draft and the flow's own settings.
EDITABLE = ("name", "draft_graph", "trigger_config", "handoff_policy", "cancel_on_reply", "max_steps",
            "resume_grace_minutes")
#: The catalogue's `detail_*` sentences the node forms show for a value they refuse (forms.jsx problemOf).
FORM_DETAILS = ("detail_required", "detail_text", "detail_text_range", "detail_slug", "detail_integer_min",
                "detail_integer_range", "detail_list", "detail_repeated")

class BuilderError(Exception):
    """A request the builder answers with an error status and a sentence a person reads."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


# --- what the bundle reads ------------------------------------------------------------------------

def ui_strings() -> dict[str, Any]:
    """Every word the bundle shows, in the reader's language (the lead's catalogue translates them):
    the bundle holds no sentence of its own."""
    return {
        "node_types": {
            "trigger": {"name": _("Gatilho"), "help": _("Onde o fluxo começa. O que faz o paciente entrar fica "
                                                        "nas configurações do fluxo.")},
            "wait": {"name": _("Esperar"), "help": _("Espera um tempo fixo, ou um tempo entre um mínimo e um "
                                                     "máximo planejado pela IA.")},
            "condition": {"name": _("Condição"), "help": _("Confere dados do paciente, do agendamento ou do "
                                                           "acompanhamento e segue por Sim ou Não.")},
            "ai_classify": {"name": _("Classificar resposta (IA)"),
                            "help": _("Espera a resposta do paciente e a classifica; cada classe tem uma saída, "
                                      "além de Sem resposta e Outra resposta.")},
            "ask": {"name": _("Perguntar"), "help": _("Pergunta ao paciente o que o fluxo precisa saber (os campos "
                                                      "da conversa) e segue por Completo, Desistiu ou Sem resposta.")},
            "action": {"name": _("Enviar mensagem"), "help": _("Envia um modelo aprovado ou uma mensagem escrita "
                                                               "pela IA, com um modelo reserva.")},
            "do": {"name": _("Ação"), "help": _("Confirma, cancela, remarca ou marca a consulta, oferece horários "
                                                "livres, avisa a equipe ou passa a conversa para uma pessoa.")},
            "end": {"name": _("Fim"), "help": _("Encerra o acompanhamento com um resultado.")},
        },
        # Palette items that are a step type with a preset config (their own name and help).
        "palette": {
            "offer_slots": {"name": _("Oferecer horários"),
                            "help": _("Envia os horários livres que combinam com o que o paciente pediu e lê qual "
                                      "ele escolheu.")},
        },
        # The catalogue's words for a value a form refuses, as the server's validator says them.
        "details": {code: _(CATALOGUE[code].msgid) for code in FORM_DETAILS},
        # A line under a field that needs one.
        "help": {
            "fields": _("Clique nos campos para perguntar, na ordem em que forem escolhidos. Os campos da clínica "
                        "são cadastrados em Configuração → Campos."),
            "max_asks": _("Quantas vezes no máximo pergunta cada campo antes de seguir por Desistiu."),
            "signal": _("Um código curto que o sistema da clínica recebe, como reagendar_pedido."),
            "action_offer_slots": _("Saídas: Feito (escolheu um horário), Sem horário, Falhou e Sem resposta."),
            "action_move": _("Usa o horário escolhido numa oferta; sem oferta, a data e a hora coletadas."),
            "action_book": _("Usa o horário escolhido numa oferta; sem oferta, a data e a hora coletadas."),
        },
        "edges": edge_words(),
        "fields": {
            "mode": _("Modo"), "minutes": _("Duração"), "min_minutes": _("Espera mínima"),
            "max_minutes": _("Espera máxima"), "guidance": _("Orientação para a IA"),
            "checks": _("Verificações"), "combinator": _("Combinar verificações"), "classes": _("Classes"),
            "grace_minutes": _("Tempo para esperar a resposta"), "hint": _("Dica para a IA"),
            "keywords": _("Palavras-chave por classe"), "template": _("Modelo"),
            "channel_kinds": _("Canais, na ordem de preferência"), "prompt_hint": _("Instrução para a IA"),
            "fallback_template": _("Modelo reserva"), "max_chars": _("Tamanho máximo (caracteres)"),
            "outcome": _("Resultado"), "note": _("Observação"), "label": _("Nome da etapa"),
            "kind": _("O que inicia o fluxo"), "appointment_event": _("Evento do agendamento"),
            "event": _("Evento do contato"), "stage": _("Etapa do funil (opcional)"),
            "intent": _("Intenção da mensagem"),
            "repeat": _("Repetição"), "cooldown_minutes": _("Intervalo entre repetições"),
            "conditions": _("Condições para entrar"), "field": _("Campo"), "op": _("Operação"), "value": _("Valor"),
            "name": _("Nome do fluxo"), "handoff_policy": _("Quando uma pessoa da equipe assume a conversa"),
            "cancel_on_reply": _("Encerrar o acompanhamento quando o paciente responder"),
            "resume_grace_minutes": _("Retomar quanto tempo depois do fim do atendimento humano"),
            "max_steps": _("Limite de passos por paciente"),
            "fields": _("Campos a perguntar"), "max_asks": _("Insistir até quantas vezes"),
            "phrasing": _("Como perguntar"), "action": _("Ação"), "limit": _("Quantos horários oferecer"),
            "date_field": _("Campo com a data"), "period_field": _("Campo com o período"),
            "time_field": _("Campo com o horário"), "same_professional": _("Só horários do mesmo profissional"),
            "intro": _("Texto antes da lista"), "outro": _("Texto depois da lista"),
            "signal": _("Sinal para o sistema da clínica"), "flow_id": _("Fluxo a começar"),
        },
        "choices": {
            "mode": {"fixed": _("Tempo fixo"), "smart": _("Planejado pela IA (entre mínimo e máximo)"),
                     "template": _("Modelo aprovado"), "ai_message": _("Mensagem escrita pela IA")},
            "action": {"confirm": _("Confirmar"), "cancel": _("Cancelar"), "move": _("Remarcar"),
                       "book": _("Marcar consulta"), "offer_slots": _("Oferecer horários"),
                       "notify_staff": _("Avisar a equipe"), "handoff": _("Passar para uma pessoa"),
                       "set_stage": _("Mudar a etapa do contato"), "start_flow": _("Começar outro fluxo"),
                       "notify_clinic": _("Avisar o sistema da clínica")},
            "phrasing": {"question": _("Com a pergunta do campo"),
                         "ai": _("Com as palavras da IA (a pergunta do campo como base)")},
            "combinator": {"all": _("Todas precisam valer"), "any": _("Basta uma valer")},
            "outcome": {"converted": _("Convertido"), "exhausted": _("Esgotado (sem sucesso)"),
                        "custom": _("Outro")},
            "channel_kinds": {kind: str(KIND_LABELS.get(kind, kind)) for kind in CHANNEL_KINDS},
            "kind": {"manual": _("Manual (incluído por uma pessoa ou pela API)"),
                     "appointment": _("Evento de agendamento"), "event": _("Mudança de etapa do contato"),
                     "silence": _("Silêncio do paciente"),
                     "reminder_no_reply": _("Lembrete sem resposta"),
                     "handoff_ended": _("Fim de um atendimento humano"),
                     "intent": _("O que o paciente escreveu (a intenção da mensagem)")},
            "intent": {"reschedule": _("Quer remarcar"), "cancel": _("Quer cancelar"), "confirm": _("Confirma"),
                       "question": _("Tem uma dúvida"), "human": _("Quer falar com uma pessoa")},
            "appointment_event": {"created": _("Criado"), "confirmed": _("Confirmado"), "cancelled": _("Cancelado"),
                                  "completed": _("Realizado"), "no_show": _("Faltou")},
            "event": {"stage_changed": _("Mudou de etapa")},
            "repeat": {"once": _("Uma vez por paciente"), "always": _("Toda vez que o gatilho acontecer"),
                       "cooldown": _("De novo só depois de um intervalo")},
            "handoff_policy": {"pause": _("Pausar e retomar depois"), "cancel": _("Encerrar o acompanhamento"),
                               "allow": _("Continuar normalmente")},
            "field": {
                "contact.name": _("Nome do contato"), "contact.phone": _("Telefone do contato"),
                "contact.email": _("E-mail do contato"), "contact.locale": _("Idioma do contato"),
                "contact.stage": _("Etapa do contato"), "appointment.status": _("Situação do agendamento"),
                "appointment.starts_at": _("Início do agendamento"),
                "enrollment.steps": _("Passos já dados"), "enrollment.llm_calls": _("Chamadas à IA"),
                "enrollment.messages_sent": _("Mensagens enviadas"), "enrollment.replies": _("Respostas recebidas"),
                "enrollment.created_at": _("Entrada no fluxo"), "enrollment.last_reply_at": _("Última resposta"),
                "enrollment.last_outbound_at": _("Última mensagem enviada"),
                "enrollment.last_class": _("Última classe da resposta"),
            },
            "op": {
                "eq": _("é igual a"), "ne": _("é diferente de"), "in": _("é um destes"),
                "not_in": _("não é nenhum destes"), "exists": _("está preenchido"),
                "not_exists": _("está vazio"), "gt": _("maior que"), "gte": _("maior ou igual a"),
                "lt": _("menor que"), "lte": _("menor ou igual a"), "before_now": _("já passou"),
                "after_now": _("ainda não chegou"), "within_next_minutes": _("acontece nos próximos (minutos)"),
                "older_than_minutes": _("foi há mais de (minutos)"),
                "newer_than_minutes": _("foi há menos de (minutos)"),
            },
        },
        "ui": {
            "palette": _("Etapas"), "palette_help": _("Arraste uma etapa para o quadro e ligue as saídas às "
                                                      "próximas etapas."),
            "settings": _("Configurações do fluxo"), "node": _("Etapa"), "edge": _("Ligação"),
            "save": _("Salvar rascunho"), "saving": _("Salvando…"), "saved": _("Rascunho salvo às %(hora)s"),
            "unsaved": _("Alterações não salvas"), "save_failed": _("O rascunho não foi salvo."),
            "publish": _("Publicar"), "published": _("Versão %(versao)s publicada."),
            "disable": _("Desativar"), "disabled": _("Fluxo desativado."),
            "disable_title": _("Desativar o fluxo"),
            "disable_help": _("Ninguém mais entra no fluxo. E quem já está nele?"),
            "disable_finish": _("Deixar terminar"), "disable_cancel": _("Encerrar agora"),
            "rollback": _("Reverter para a versão %(versao)s"),
            "rolled_back": _("A versão %(versao)s voltou a ser a ativa."),
            "rollback_confirm": _("Os novos pacientes passam a entrar na versão %(versao)s. Continuar?"),
            "history": _("Histórico de versões"), "no_versions": _("Nenhuma versão publicada ainda."),
            "version": _("Versão %(versao)s"), "active_version": _("ativa"),
            "by_on": _("por %(quem)s em %(quando)s"), "unknown_user": _("alguém (usuário removido ou pela API)"),
            "problems": _("Problemas para publicar"), "flow_problem": _("No fluxo"),
            "no_problems": _("Nenhum problema encontrado na última verificação."),
            "read_only": _("Somente leitura: apenas proprietários e gestores alteram fluxos."),
            "delete_node": _("Excluir etapa"), "delete_edge": _("Excluir ligação"),
            "select_hint": _("Clique numa etapa para configurá-la, ou no quadro vazio para ver as configurações "
                             "do fluxo."),
            "days": _("dias"), "hours": _("horas"), "minutes": _("minutos"), "day": _("dia"), "hour": _("hora"),
            "minute": _("minuto"), "tab_problems": _("Problemas"), "tab_history": _("Versões"),
            "remove": _("Remover"), "add_check": _("Adicionar verificação"),
            "tags_help": _("Digite e tecle Enter; letras minúsculas sem acento, números ou _."),
            "none": _("— nenhum —"), "choose": _("— escolha —"), "preview": _("Pré-visualização"),
            "no_template_body": _("Este modelo não tem texto para este canal."),
            "values_help": _("Um valor por linha."),
            "back": _("Voltar aos fluxos"),
            "error": _("Algo deu errado. Recarregue a página e tente de novo."),
            "leave": _("Há alterações não salvas. Sair mesmo assim?"),
            "zoom_fit": _("Ajustar à tela"), "organize": _("Organizar"),
            "organize_help": _("Arruma as etapas da esquerda para a direita, seguindo as ligações."),
            "minimap_show": _("Mostrar miniatura"), "minimap_hide": _("Esconder miniatura"),
            "keywords_help": _("Separe as palavras por vírgula, ponto e vírgula ou Enter; um texto colado com "
                               "vírgulas vira várias palavras."),
            "classes_help": _("Escreva o nome da classe como quiser (\"Não quer\") e tecle Enter; cada classe "
                              "ganha uma saída com esse nome."),
            "no_fields": _("A clínica ainda não tem campos: cadastre-os em Configuração → Campos."), "close": _("Fechar"), "cancel": _("Cancelar"),
            "node_id": _("Identificador: %(id)s"),
            "config_read_only": _("Configuração (somente leitura)"),
            "config_api_only": _("O construtor ainda não edita esta etapa: a configuração muda pela API "
                                 "(/api/v1/flows) e é salva de volta como está."), "version_short": _("v%(versao)s"),
        },
        "status": {key: str(label) for key, label in FLOW_STATUS_LABELS.items()},
        "rehearse": rehearsing.ui_strings(),  # the "Testar" chat panel (rehearse.py)
        # React Flow's own accessibility texts (its `ariaLabelConfig`), which it would say in English.
        "aria": {
            "node.a11yDescription.default": _("Tecle Enter ou espaço para selecionar uma etapa; Delete para "
                                              "apagá-la e Esc para cancelar."),
            "node.a11yDescription.keyboardDisabled": _("Tecle Enter ou espaço para selecionar uma etapa; as setas "
                                                       "a movem, Delete a apaga e Esc cancela."),
            "move": _("Etapa movida para %(direction)s. Nova posição: x %(x)s, y %(y)s"),
            "directions": {"up": _("cima"), "down": _("baixo"), "left": _("a esquerda"), "right": _("a direita")},
            "edge.a11yDescription.default": _("Tecle Enter ou espaço para selecionar uma ligação; Delete para "
                                              "apagá-la e Esc para cancelar."),
            "controls.ariaLabel": _("Controles do quadro"), "controls.zoomIn.ariaLabel": _("Aproximar"),
            "controls.zoomOut.ariaLabel": _("Afastar"), "controls.fitView.ariaLabel": _("Ajustar à tela"),
            "controls.interactive.ariaLabel": _("Travar ou destravar o quadro"),
            "minimap.ariaLabel": _("Miniatura do fluxo"), "handle.ariaLabel": _("Ponto de ligação"),
        },
    }


def flow_state(conn: Connection, oid: int, flow_id: int) -> dict[str, Any]:
    """The flow as the builder reloads it: the REST API's detail (draft included), its version
    history with who published each and when (in the org's time zone), and when it was saved."""
    try:
        flow = services.flow_detail(conn, oid, flow_id)
    except ApiError:
        raise BuilderError(404, _("Fluxo não encontrado.")) from None
    emails = _user_emails(conn, oid)
    history = []
    for row in versions.list_versions(conn, oid, flow_id):
        history.append({**services.version_summary_out(row),
                        "created_by_email": emails.get(row.created_by) if row.created_by else None,
                        "created_at_text": local_dt(row.created_at)})
    flow["status_text"] = str(FLOW_STATUS_LABELS.get(flow["status"], flow["status"]))
    flow["updated_at_text"] = local_dt(flow["updated_at"], "%H:%M")
    return _jsonable({"flow": flow, "versions": history})


def _user_emails(conn: Connection, oid: int) -> dict[int, str]:
    return {int(row.id): row.email for row in conn.execute(
        select(users.c.id, users.c.email).where(users.c.org_id == oid))}


def template_choices(conn: Connection, oid: int) -> list[dict[str, Any]]:
    """The templates a message step may use (the org's own and the global defaults), each with
    its text per channel rendered on sample data, never a patient's."""
    locale = current_locale()
    pairs = conn.execute(select(templates.c.key, templates.c.channel_kind).distinct().where(
        or_(templates.c.org_id == oid, templates.c.org_id.is_(None)))).all()
    by_key: dict[str, dict[str, Any]] = {}
    for key, kind in sorted(pairs):
        row = find_template(conn, oid, key, kind, locale)
        if row is None:
            continue
        text, error = preview(row.body)
        entry = by_key.setdefault(key, {"key": key, "label": str(PURPOSE_LABELS.get(key, key)), "previews": {}})
        entry["previews"][kind] = {"channel": str(KIND_LABELS.get(kind, kind)), "text": text, "error": error}
    return list(by_key.values())


def field_choices(conn: Connection, oid: int) -> list[dict[str, str]]:
    """The org's conversation fields an `ask` step may collect and an action may read (slug, label, type)."""
    return [{"slug": field.slug, "label": field.label, "type": field.type} for field in list_fields(conn, oid)]


def flow_choices(conn: Connection, oid: int, flow_id: int) -> list[dict[str, Any]]:
    """The org's other flows a `start_flow` action may start, by name."""
    rows = conn.execute(select(flow_pointers.c.id, flow_pointers.c.name).where(
        flow_pointers.c.org_id == oid, flow_pointers.c.id != flow_id).order_by(flow_pointers.c.name))
    return [{"id": int(row.id), "name": row.name} for row in rows]


def bundle_version() -> str:
    """The sources hash in the bundle's first line (a cache-buster for its URL)."""
    return _bundle_first_line().removeprefix("/*! lembra-flow-builder sources-sha256:").split(" ")[0][:16]


@functools.cache
def _bundle_first_line() -> str:
    try:
        with BUNDLE.open(encoding="utf-8") as fh:
            return fh.readline().strip()
    except OSError:
        return ""


def _jsonable(value: Any) -> Any:
    """Instants as ISO 8601 (Flask would write an HTTP date) all the way down."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


def issues_out(issues: list[Any]) -> list[dict[str, Any]]:
    """Issues as the REST API writes them, with `message` in the reader's language."""
    english = current_locale() == "en"
    out = []
    for issue in issues:
        item = services.issue_out(issue)
        if english:
            item["message"] = item["message_en"]
        out.append(item)
    return out


# --- the view -------------------------------------------------------------------------------------

class FlowBuilderView(TenantPageView):
    """The builder (endpoint `flow_builder`, /admin/followup/builder/<id>/), reached from the Fluxos
    list; not in the menu. Every role opens it, owners and managers change it."""

    def is_visible(self) -> bool:
        return False

    def inaccessible_callback(self, name: str, **kwargs: Any) -> Any:
        if name == "page":
            return redirect(url_for("auth.login", next=request.full_path))
        return _error(401, _("Entre de novo para continuar."))

    # --- reads ------------------------------------------------------------------------------------
    @expose("/")
    def index(self) -> Any:
        """The builder opens a flow; without one, it shows the list of flows to pick it from."""
        return list_page(self)

    @expose("/<flow_id>/")
    def page(self, flow_id: str) -> Any:
        """The full-width canvas, with everything the bundle needs in one JSON blob."""
        oid, pk = org_id(), _flow_pk(flow_id)
        session = db_session()
        conn = session.connection()
        try:
            state = flow_state(conn, oid, pk)
        except BuilderError:
            session.rollback()
            abort(404)
        boot = {
            **state,
            "can_edit": bool(current_user.can_edit),
            "schema": json_schema(),
            "templates": template_choices(conn, oid),
            "fields": field_choices(conn, oid),
            "flows": flow_choices(conn, oid, pk),
            "strings": ui_strings(),
            "urls": {name: url_for(f".{name}", flow_id=pk) for name in
                     ("data", "save", "publish", "disable", "rollback", "rehearse")},
            "locale": current_locale(),
            "flows_url": _flows_url(),
        }
        # What the flow list says of this flow, above the canvas: its marketing templates, its cost.
        notices = marketing_notices(conn, oid, [pk]).get(pk, [])
        cost = estimate(conn, oid)
        flow_cost = cost.costs.by_flow.get(pk) if cost.costs else None
        session.rollback()  # read only; the scoped session is reused by the next request
        return self.render("admin/followup/builder.html", boot=boot, flow=state["flow"],
                           bundle_version=bundle_version(), notices=notices, cost=cost, flow_cost=flow_cost)

    @expose("/<flow_id>/data")
    def data(self, flow_id: str) -> Any:
        """The flow as saved: draft, settings, versions (what a reload shows)."""
        return self._answer(lambda conn, oid, pk: (200, flow_state(conn, oid, pk)), flow_id, write=False)

    # --- writes -----------------------------------------------------------------------------------
    @expose("/<flow_id>/draft", methods=("POST", "PATCH"))
    def save(self, flow_id: str) -> Any:
        """Save the draft and the flow's settings; nothing is written when anything is refused."""

        def run(conn: Connection, oid: int, pk: int) -> tuple[int, dict[str, Any]]:
            body = _body()
            unknown = set(body) - set(EDITABLE)
            if unknown or ("cancel_on_reply" in body and not isinstance(body["cancel_on_reply"], bool)):
                raise BuilderError(400, _("Pedido inválido."))
            _exists(conn, oid, pk)
            versions.update_flow(conn, oid, pk, **body)
            if body:
                write_audit(conn, "update", "flow_pointers", pk, services.flow_audit(body))
            return 200, flow_state(conn, oid, pk)

        return self._answer(run, flow_id, rejected=_("O rascunho não foi salvo: corrija os problemas apontados."))

    @expose("/<flow_id>/publish", methods=("POST",))
    def publish(self, flow_id: str) -> Any:
        """Publish the saved draft as a new version; 422 lists every broken rule on its node."""

        def run(conn: Connection, oid: int, pk: int) -> tuple[int, dict[str, Any]]:
            _exists(conn, oid, pk)
            row = versions.publish(conn, oid, pk, user_id=int(current_user.id))
            write_audit(conn, "publish", "flow_pointers", pk, {"version": row.version, "version_id": row.id})
            return 200, {**flow_state(conn, oid, pk), "published": row.version}

        return self._answer(run, flow_id, rejected=_("O fluxo não foi publicado: corrija os problemas apontados."))

    @expose("/<flow_id>/disable", methods=("POST",))
    def disable(self, flow_id: str) -> Any:
        """Stop new enrollments; `live` says whether the running ones finish or end now."""

        def run(conn: Connection, oid: int, pk: int) -> tuple[int, dict[str, Any]]:
            live = _body().get("live", "finish")
            if live not in versions.DISABLE_LIVE:
                raise BuilderError(400, _("Pedido inválido."))
            _exists(conn, oid, pk)
            cancelled = versions.disable(conn, oid, pk, live=live)
            write_audit(conn, "disable", "flow_pointers", pk, {"live": live, "cancelled": cancelled})
            return 200, {**flow_state(conn, oid, pk), "cancelled": cancelled}

        return self._answer(run, flow_id)

    @expose("/<flow_id>/rollback", methods=("POST",))
    def rollback(self, flow_id: str) -> Any:
        """Make an earlier version the active one (the draft stays as it is)."""

        def run(conn: Connection, oid: int, pk: int) -> tuple[int, dict[str, Any]]:
            number = _body().get("version")
            if isinstance(number, bool) or not isinstance(number, int):
                raise BuilderError(400, _("Pedido inválido."))
            _exists(conn, oid, pk)
            try:
                row = versions.rollback(conn, oid, pk, number)
            except versions.FlowNotFound:
                raise BuilderError(404, _("Versão não encontrada.")) from None
            write_audit(conn, "rollback", "flow_pointers", pk, {"version": row.version, "version_id": row.id})
            return 200, {**flow_state(conn, oid, pk), "rolled_back": row.version}

        return self._answer(run, flow_id)

    @expose("/<flow_id>/rehearse", methods=("POST",))
    def rehearse(self, flow_id: str) -> Any:
        """"Testar" as a chat: the patient's replies played against the draft or the published
        version (admin/views/followup/rehearse.py); nothing is sent and nothing is kept."""
        pk = parse_id(flow_id)
        if pk is None:
            return _error(404, _("Fluxo não encontrado."))
        if not current_user.can_edit:
            return _error(403, _("Apenas proprietários e gestores alteram fluxos."))
        session = db_session()
        try:
            body = _body()
            session.rollback()  # the rehearsal has its own transaction; hold no other meanwhile
            return jsonify(rehearsing.answer(session.connection(), org_id(), pk, body, ui_strings()))
        except BuilderError as exc:
            return _error(exc.status, exc.message, **exc.extra)
        except versions.FlowNotFound:
            return _error(404, _("Fluxo não encontrado."))
        except versions.FlowRejected as exc:
            return _error(422, _("O rascunho tem problemas: corrija-os para testá-lo."), issues=issues_out(exc.issues))
        except rehearsing.RehearsalRefused as exc:
            return _error(400, translate(exc.text), code=exc.code)
        finally:
            session.rollback()

    # --- plumbing ---------------------------------------------------------------------------------
    def _answer(self, run: Any, flow_id: str, *, write: bool = True, rejected: str | None = None) -> Any:
        """Run one request in the console's session: commit what `run` did, or roll all of it back
        and answer the error (a refused draft leaves no trace)."""
        pk = parse_id(flow_id)
        if pk is None:  # no row can have this id: the bundle reads a JSON 404, not the error page
            return _error(404, _("Fluxo não encontrado."))
        if write and not current_user.can_edit:
            return _error(403, _("Apenas proprietários e gestores alteram fluxos."))
        session = db_session()
        try:
            status, body = run(session.connection(), org_id(), pk)
        except BuilderError as exc:
            session.rollback()
            return _error(exc.status, exc.message, **exc.extra)
        except versions.FlowRejected as exc:
            session.rollback()
            return _error(422, rejected or _("Corrija os problemas apontados."), issues=issues_out(exc.issues))
        except versions.FlowNotFound:
            session.rollback()
            return _error(404, _("Fluxo não encontrado."))
        except versions.FlowNameTaken:
            session.rollback()
            return _error(409, _("Já existe um fluxo com esse nome."))
        except DomainError:
            session.rollback()
            return _error(400, _("Pedido inválido."))
        except Exception:
            session.rollback()
            raise
        if write:
            session.commit()
        else:
            session.rollback()
        response = jsonify(body)
        response.status_code = status
        return response


def _flow_pk(raw: str) -> int:
    """The flow id of the URL; anything that cannot be one is a 404 before the database sees it."""
    pk = parse_id(raw)
    if pk is None:
        abort(404)
    return pk


def _exists(conn: Connection, oid: int, pk: int) -> None:
    if queries.find_flow(conn, oid, pk) is None:
        raise BuilderError(404, _("Fluxo não encontrado."))


def _body() -> dict[str, Any]:
    """The request's JSON object, read by the REST API's strict parser (admin/json_body.py): a
    body it refuses is answered with the catalogue's sentence, its `code` and the `field`."""
    try:
        body = request_json()
    except BodyRefused as exc:
        raise BuilderError(exc.status, translate(exc.message), code=exc.code, field=exc.field) from None
    if not isinstance(body, dict):
        raise BuilderError(400, _("Pedido inválido."))
    return body


def _error(status: int, message: str, **extra: Any) -> Any:
    response = jsonify({"error": message, **extra})
    response.status_code = status
    return response


def _flows_url() -> str:
    try:
        return url_for("followup_flows.index")
    except BuildError:
        return url_for("admin.index")
