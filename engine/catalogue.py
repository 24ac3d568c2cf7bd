"""The one catalogue of codes a person may read: every reason, status and error that reaches
the console, the API's `details` or the CLI is a code here with its pt-BR sentence. The console's
English catalog (admin/translations/en) translates the sentence; `describe` binds parameters.
"""

from __future__ import annotations

from typing import Any

from engine.texts import N_, Text

CATALOGUE: dict[str, Text] = {
    # --- flow publish rules (engine/flows/validate.py) -----------------------------------------
    "invalid_graph": N_("O fluxo salvo está malformado (%(field)s: %(detail)s). Recarregue o editor e salve de novo."),
    "invalid_node": N_("Uma etapa está malformada (%(field)s: %(detail)s). Corrija a etapa ou apague-a e crie de novo."),
    "invalid_edge": N_("Uma ligação está malformada (%(field)s: %(detail)s). Apague a ligação e refaça-a."),
    "duplicate_node_id": N_("%(count)s etapas usam o mesmo identificador. Dê a cada etapa um identificador próprio."),
    "invalid_config": N_("A configuração desta etapa tem um problema em %(field)s: %(detail)s."),
    "invalid_trigger": N_("A configuração do gatilho do fluxo tem um problema em %(field)s: %(detail)s."),
    "invalid_max_steps": N_("O limite de passos por paciente deve ser um número inteiro de 1 a 200. Corrija o limite."),
    "trigger_count": N_("O fluxo precisa de exatamente um gatilho, mas tem %(count)s. Deixe um gatilho só."),
    "unreachable": N_("Nenhum caminho a partir do gatilho chega a esta etapa. Ligue-a ao fluxo ou apague-a."),
    "no_path_to_end": N_("Esta etapa está num ciclo que nunca chega a um fim. Dê ao ciclo uma saída que leve a uma etapa de fim."),
    "dead_end": N_("Esta etapa não tem saída. Ligue-a à próxima etapa ou a uma etapa de fim."),
    "edge_unknown_node": N_("Uma ligação usa uma etapa que não existe (%(node)s). Apague a ligação ou refaça-a."),
    "edge_not_allowed": N_("Esta etapa não pode ter uma saída do tipo %(condition)s (e uma etapa de fim não tem saídas). Apague essa ligação."),
    "missing_edge": N_("Falta a saída %(which)s desta etapa. Ligue essa saída à próxima etapa."),
    "duplicate_edge": N_("Esta etapa tem mais de uma saída %(which)s. Deixe só uma."),
    "class_without_edge": N_("A resposta da classe %(class)s não leva a lugar nenhum. Ligue a saída dessa classe à próxima etapa."),
    "unknown_class": N_("Há uma saída para a classe %(class)s, que esta etapa não tem. Adicione a classe à etapa ou corrija a saída."),
    "missing_no_reply": N_("Falta a saída para quando o paciente não responde. Ligue a saída sem resposta à próxima etapa."),
    "missing_fallback": N_("Falta a saída para respostas que não se encaixam em nenhuma classe. Ligue a saída padrão à próxima etapa."),
    "grace_too_short": N_("O tempo para esperar a resposta é curto demais (%(minutes)s min). Use pelo menos %(min)s minutos."),
    "ai_after_24h": N_("As esperas antes desta mensagem da IA podem somar %(hours)s horas; depois de 24 horas o WhatsApp só aceita modelos aprovados. Escolha um modelo reserva."),
    "ai_after_24h_cycle": N_("Esta mensagem da IA está num ciclo com espera, ou depois de um, e por isso pode sair depois de qualquer tempo de espera, mesmo mais de 24 horas. Escolha um modelo reserva."),
    "cycle_without_wait": N_("Esta etapa está num ciclo sem espera, que repetiria sem parar. Coloque no ciclo uma espera de pelo menos %(minutes)s minutos."),
    "too_many_steps": N_("O fluxo tem %(count)s etapas, mais que o limite de %(max_steps)s passos por paciente. Aumente o limite ou simplifique o fluxo."),
    "unknown_template": N_("O modelo de mensagem %(template)s não existe. Crie o modelo ou escolha outro."),
    "detail_required": N_("campo obrigatório; preencha-o"),
    "detail_unknown_field": N_("campo desconhecido; remova-o"),
    "detail_invalid": N_("valor inválido; corrija-o"),
    "detail_object": N_("deve ser um objeto com campos; refaça-o no editor"),
    "detail_integer": N_("use um número inteiro"),
    "detail_integer_range": N_("use um número inteiro de %(min)s a %(max)s"),
    "detail_integer_min": N_("use um número inteiro a partir de %(min)s"),
    "detail_number": N_("use um número"),
    "detail_boolean": N_("use verdadeiro ou falso"),
    "detail_text": N_("use um texto de até %(max)s caracteres"),
    "detail_text_range": N_("use um texto de %(min)s a %(max)s caracteres"),
    "detail_text_any": N_("use um texto"),
    "detail_choice": N_("use um destes valores: %(choices)s"),
    "detail_list": N_("use uma lista de %(min)s a %(max)s itens"),
    "detail_too_many": N_("use no máximo %(max)s itens"),
    "detail_repeated": N_("há itens repetidos; deixe cada um uma vez só"),
    "detail_slug": N_("use de 1 a %(max)s letras minúsculas sem acento, números ou _, começando por uma letra"),
    "detail_node_id": N_("use de 1 a 64 letras sem acento, números, _ ou -"),
    "detail_reserved_class": N_("no_reply é reservado para a saída sem resposta; use outro nome"),
    "detail_min_over_max": N_("o tempo mínimo não pode passar do máximo; ajuste os dois"),
    "detail_keyword_class": N_("informe palavras-chave só para classes da lista de classes"),
    "detail_cooldown_required": N_("obrigatório quando a repetição é com intervalo (cooldown)"),
    "detail_cooldown_forbidden": N_("só vale quando a repetição é com intervalo (cooldown); remova-o"),
    "detail_no_value": N_("esta operação não usa valor; deixe-o vazio"),
    "detail_class_value": N_("escolha uma das classes da etapa de origem"),
    # --- flow steps (engine/flows/runtime.py, nodes.py, triggers.py, replies.py) ---------------
    "trigger_fired": N_("O fluxo começou."),
    "silence_broken": N_("O paciente respondeu (ou recebeu outra mensagem) antes da hora, então este acompanhamento não foi mais necessário."),
    "wait_elapsed": N_("A espera terminou."),
    "wait_replied": N_("O paciente respondeu durante a espera; o fluxo seguiu pela saída de resposta."),
    "condition_true": N_("A condição foi atendida (saída Sim)."),
    "condition_false": N_("A condição não foi atendida (saída Não)."),
    "no_reply": N_("O paciente não respondeu dentro do prazo; o fluxo seguiu pela saída sem resposta."),
    "classified": N_("A resposta do paciente foi entendida como %(class)s."),
    "not_classified": N_("A resposta do paciente não se encaixou em nenhuma classe; o fluxo seguiu pela saída padrão."),
    "no_usable_channel": N_("Nenhum canal pôde ser usado: o paciente não autorizou, não tem endereço ou a clínica não tem esse canal. A etapa foi pulada."),
    "message_queued": N_("A mensagem foi para a fila de envio."),
    "window_closed_template": N_("A janela de 24 horas do WhatsApp estava fechada; foi para a fila o modelo aprovado."),
    "window_closed": N_("A janela de 24 horas do WhatsApp está fechada e a etapa não tem modelo reserva. Escolha um modelo reserva para esta etapa."),
    "human_holds_template": N_("Uma pessoa da equipe está na conversa; foi para a fila o modelo, sem usar a IA."),
    "human_holds": N_("Uma pessoa da equipe está na conversa e a etapa não tem modelo reserva; a mensagem foi pulada."),
    "ai_message_queued": N_("A mensagem escrita pela IA foi para a fila de envio."),
    "ai_fallback_template": N_("A IA não escreveu uma mensagem utilizável; foi para a fila o modelo reserva."),
    "ai_no_text": N_("A IA não escreveu uma mensagem utilizável e a etapa não tem modelo reserva. Escolha um modelo reserva ou confira o agente."),
    "ai_unavailable": N_("O serviço de IA não respondeu (%(code)s). O Lembra tenta de novo mais tarde; confira as configurações do agente se continuar."),
    "ended": N_("O fluxo terminou."),
    "node_error": N_("Um erro interno impediu esta etapa. O Lembra tenta de novo mais tarde."),
    "max_steps": N_("O paciente chegou ao limite de passos do fluxo, que foi encerrado."),
    "claim_expired": N_("O processo que cuidava desta etapa parou no meio; o Lembra tenta de novo."),
    "stale_wake": N_("Um aviso atrasado para uma etapa que o paciente já tinha deixado foi ignorado."),
    # Why a run ended or a contact was not enrolled.
    "opted_out": N_("O paciente pediu para não receber mais mensagens."),
    "replied": N_("O paciente respondeu e o fluxo termina quando há resposta."),
    "handoff": N_("Uma pessoa da equipe assumiu a conversa."),
    "flow_disabled": N_("O fluxo foi desativado."),
    "cancelled_by_clinic": N_("A clínica cancelou este acompanhamento."),
    "enrollment_stopped": N_("O acompanhamento desta mensagem foi encerrado ou pausado antes do envio."),
    "enrolled": N_("O paciente entrou no fluxo."),
    "flow_not_found": N_("Este fluxo não existe."),
    "already_enrolled_with_key": N_("Este pedido já foi feito antes com a mesma chave."),
    "flow_not_active": N_("O fluxo não está publicado ou foi desativado. Publique o fluxo antes de incluir pacientes."),
    "contact_not_found": N_("Este paciente não existe."),
    "contact_opted_out": N_("O paciente pediu para não receber mensagens."),
    "no_agent_enables_flow": N_("Nenhum agente ativo pode iniciar este fluxo. Habilite o fluxo em um agente."),
    "trigger_conditions_not_met": N_("O paciente não atende às condições do gatilho."),
    "repeat_policy": N_("O paciente já passou por este fluxo, e a regra de repetição não permite de novo agora."),
    "already_live": N_("O paciente já está neste fluxo."),
    # Flow settings.
    "invalid_handoff_policy": N_("A política de atendimento humano deve ser pausar, cancelar ou permitir."),
    "invalid_resume_grace": N_("O tempo para retomar depois do atendimento humano deve ser de 0 a 10080 minutos."),
    "invalid_name": N_("Dê ao fluxo um nome de 1 a 120 caracteres."),
    # What the AI answered, and why it could not (engine/flows/ai).
    "builtin_keywords": N_("palavras-chave"),
    "builtin_template": N_("modelo de mensagem"),
    "builtin_max": N_("tempo máximo"),
    "no_match": N_("nenhuma classe reconhecida"),
    "no_waits": N_("nada a planejar"),
    "ai_ok": N_("resposta da IA"),
    "ai_partial": N_("resposta da IA incompleta"),
    "ai_malformed": N_("resposta da IA fora do formato"),
    "too_long": N_("texto longo demais"),
    "timeout": N_("tempo esgotado"),
    "connection_error": N_("sem conexão"),
    "rate_limited": N_("limite de uso atingido"),
    "server_error": N_("erro no servidor da IA"),
    "http_400": N_("pedido recusado"),
    "http_401": N_("chave de API recusada"),
    "http_403": N_("acesso negado"),
    "http_404": N_("modelo ou endereço não encontrado"),
    "http_409": N_("conflito"),
    "http_413": N_("pedido grande demais"),
    "http_422": N_("pedido inválido"),
    "http_error": N_("erro do serviço de IA"),
    "llm_key_unreadable": N_("a chave de API guardada não pode ser lida; salve-a de novo"),
    # --- egress (gateway/egress.py): a tenant-set address that points inside the network -----------
    "egress_refused": N_("endereço não permitido: ele aponta para a rede interna (localhost, rede privada ou "
                         "link-local); use um endereço público ou peça a quem opera o Lembra para liberá-lo "
                         "em LEMBRA_PROVIDER_ALLOW"),
    # --- privacy (engine/privacy): refusals that follow the address, erasure, retention -------
    "address_opted_out": N_("Outro cadastro com o mesmo telefone ou e-mail pediu para não receber mensagens por "
                            "este canal; o pedido vale para o endereço, qualquer que seja o cadastro."),
    "contact_erased": N_("Os dados do paciente foram apagados a pedido (LGPD); nada mais é enviado a ele."),
}


class UnknownCode(KeyError):
    """A code that the catalogue does not hold: a bug, caught by tests/test_catalogue.py."""


def describe(code: str, /, **params: Any) -> Text:
    """The sentence for `code` with its parameters bound (a parameter may itself be called
    `code`); unknown codes raise UnknownCode."""
    try:
        entry = CATALOGUE[code]
    except KeyError:
        raise UnknownCode(code) from None
    return Text(entry.msgid, params)


def known(code: str) -> bool:
    """Whether `code` has a sentence."""
    return code in CATALOGUE
