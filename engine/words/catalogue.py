"""The one catalogue of codes a person may read: every reason, status and error that reaches
the console, the API's `details` or the CLI is a code here with its pt-BR sentence. The console's
English catalog (admin/translations/en) translates the sentence; `describe` binds parameters.
A sentence with a count is an `Np_` pair (singular, plural) that the reader's language picks
with ngettext from the count parameter: never "(s)".
"""

from __future__ import annotations

from typing import Any

from engine.words.texts import N_, Np_, Text

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
    "missing_no_reply": N_("Falta a saída para quando o paciente não responde. Ligue a saída “Sem resposta” à próxima etapa."),
    "missing_fallback": N_("Falta a saída para respostas que não se encaixam em nenhuma classe. Ligue a saída “Outra resposta” à próxima etapa."),
    "grace_too_short": N_("O tempo para esperar a resposta é curto demais (%(minutes)s min). Use pelo menos %(min)s minutos."),
    "ai_after_24h": N_("As esperas antes desta mensagem da IA podem somar %(hours)s horas; depois de 24 horas o WhatsApp só aceita modelos aprovados. Escolha um modelo reserva."),
    "ai_after_24h_cycle": N_("Esta mensagem da IA está num ciclo com espera, ou depois de um, e por isso pode sair depois de qualquer tempo de espera, mesmo mais de 24 horas. Escolha um modelo reserva."),
    "cycle_without_wait": N_("Esta etapa está num ciclo sem espera, que repetiria sem parar. Coloque no ciclo uma espera de pelo menos %(minutes)s minutos."),
    "too_many_steps": N_("O fluxo tem %(count)s etapas, mais que o limite de %(max_steps)s passos por paciente. Aumente o limite ou simplifique o fluxo."),
    "unknown_field": N_("A clínica não tem o campo %(field)s. Crie o campo em Campos ou tire-o desta etapa."),
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
    # flow builder: class names (i33/builder)
    "detail_label_class": N_("dê nomes só às classes da lista de classes"),
    "detail_cooldown_required": N_("obrigatório quando a repetição é com intervalo (cooldown)"),
    "detail_cooldown_forbidden": N_("só vale quando a repetição é com intervalo (cooldown); remova-o"),
    "detail_no_value": N_("esta operação não usa valor; deixe-o vazio"),
    "detail_class_value": N_("escolha uma das classes da etapa de origem"),
    "detail_unstorable": N_("tem um caractere que não pode ser guardado (NUL ou metade de um caractere Unicode); "
                            "remova-o"),
    "detail_not_finite": N_("use um número finito; NaN e Infinity não existem em JSON"),
    "detail_number_range": N_("número grande demais; use inteiros de até 19 dígitos e decimais finitos"),
    "detail_too_deep": N_("aninha mais de %(max)s níveis; simplifique-o"),
    # --- flow steps (engine/flows/runtime.py, nodes.py, triggers.py, replies.py) ---------------
    "trigger_fired": N_("O fluxo começou."),
    "silence_broken": N_("O paciente respondeu (ou recebeu outra mensagem) antes da hora, então este acompanhamento não foi mais necessário."),
    "wait_elapsed": N_("A espera terminou."),
    "wait_replied": N_("O paciente respondeu durante a espera; o fluxo seguiu pela saída “Respondeu”."),
    "condition_true": N_("A condição foi atendida (saída Sim)."),
    "condition_false": N_("A condição não foi atendida (saída Não)."),
    "no_reply": N_("O paciente não respondeu dentro do prazo; o fluxo seguiu pela saída “Sem resposta”."),
    "classified": N_("A resposta do paciente foi entendida como %(class)s."),
    "not_classified": N_("A resposta do paciente não se encaixou em nenhuma classe; o fluxo seguiu pela saída “Outra resposta”."),
    "no_usable_channel": N_("Nenhum canal pôde ser usado: o paciente não autorizou, não tem endereço ou a clínica não tem esse canal. A etapa foi pulada."),
    "message_queued": N_("A mensagem foi para a fila de envio."),
    "message_already_queued": N_("Esta mensagem sobre o horário da consulta já vai (ou já foi) para o paciente por uma regra de lembrete; o fluxo não a repetiu."),
    "window_closed_template": N_("A janela de 24 horas do WhatsApp estava fechada; foi para a fila o modelo aprovado."),
    "window_closed": N_("A janela de 24 horas do WhatsApp está fechada e a etapa não tem modelo reserva. Escolha um modelo reserva para esta etapa."),
    "human_holds_template": N_("Uma pessoa da equipe está na conversa; foi para a fila o modelo, sem usar a IA."),
    "human_holds": N_("Uma pessoa da equipe está na conversa e a etapa não tem modelo reserva; a mensagem foi pulada."),
    "ai_message_queued": N_("A mensagem escrita pela IA foi para a fila de envio."),
    "ai_fallback_template": N_("A IA não escreveu uma mensagem utilizável; foi para a fila o modelo reserva."),
    "ai_no_text": N_("A IA não escreveu uma mensagem utilizável e a etapa não tem modelo reserva. Escolha um modelo reserva ou confira o agente."),
    "ai_unavailable": N_("O serviço de IA não respondeu (%(code)s). O Lembra tenta de novo mais tarde; confira as configurações do agente se continuar."),
    "floor_busy": N_("Outro fluxo está fazendo uma pergunta a este paciente; este espera a vez para perguntar."),
    # A `do` node's actions (engine/flows/actions/).
    "do_clinic_notified": N_("O fluxo avisou o sistema da clínica (%(signal)s)."),
    "do_stage_set": N_("O paciente passou para a etapa %(stage)s do funil."),
    "do_flow_started": N_("O fluxo começou outro fluxo para o paciente."),
    "do_flow_not_started": N_("O outro fluxo não começou para este paciente (ele já está nele, o fluxo não está publicado ou ativado por um assistente, ou a regra de repetição não deixa); o fluxo seguiu pela saída “Falhou”."),
    "do": N_("O fluxo executou a ação desta etapa."),
    "flow_moved": N_("Remarcada por um fluxo, na conversa com o paciente."),
    "flow_booked": N_("Marcada por um fluxo, na conversa com o paciente."),
    "do_confirmed": N_("O fluxo confirmou a consulta."),
    "do_already_confirmed": N_("A consulta já estava confirmada; o fluxo seguiu pela saída “Feito”."),
    "do_cancelled": N_("O fluxo cancelou a consulta a pedido do paciente."),
    "do_already_cancelled": N_("A consulta já estava cancelada; o fluxo seguiu pela saída “Feito”."),
    "do_appointment_not_live": N_("A consulta não está mais marcada (foi cancelada, realizada ou perdida); o fluxo seguiu pela saída “Falhou”."),
    "do_no_appointment": N_("Esta execução não tem consulta; o fluxo seguiu pela saída “Falhou”."),
    "do_no_time": N_("O fluxo ainda não sabe para quando marcar (nenhum horário escolhido, nem data e hora coletadas); seguiu pela saída “Falhou”."),
    "do_slot_taken": N_("O horário %(starts_at)s não está mais livre; o fluxo seguiu pela saída “Sem horário”."),
    "do_already_there": N_("A consulta já estava neste horário; o fluxo seguiu pela saída “Feito”."),
    "do_moved": N_("O fluxo remarcou a consulta para %(starts_at)s; os lembretes foram refeitos para o novo horário."),
    "do_booked": N_("O fluxo marcou uma nova consulta para %(starts_at)s; os lembretes foram planejados."),
    "do_agenda_unreachable": N_("O sistema de agenda da clínica não respondeu; o fluxo seguiu pela saída “Falhou”."),
    "do_no_free_slots": N_("Não há horários livres que atendam ao pedido; o fluxo seguiu pela saída “Sem horário”."),
    "do_slots_offered": Np_("O fluxo ofereceu %(offered)s horário livre ao paciente e espera a escolha.",
                            "O fluxo ofereceu %(offered)s horários livres ao paciente e espera a escolha.",
                            number="offered"),
    "do_slot_picked": N_("O paciente escolheu o horário %(starts_at)s."),
    "do_no_pick": N_("O paciente não escolheu nenhum dos horários oferecidos; o fluxo seguiu pela saída “Falhou”."),
    "do_staff_notified": N_("O fluxo avisou a equipe em Pendências."),
    "do_handed_off": N_("O fluxo passou a conversa para uma pessoa da equipe."),
    # An `ask` node's turns (engine/flows/nodes.py: _ask).
    "ask_question": N_("O fluxo perguntou ao paciente o campo %(field)s (vez %(ask)s)."),
    "ask_value_refused": N_("O paciente deu um valor que não serve para %(field)s; o fluxo explicou e perguntou de novo (vez %(ask)s)."),
    "ask_complete": N_("O paciente informou tudo o que a etapa pedia; o fluxo seguiu pela saída “Completo”."),
    "ask_gave_up": N_("O paciente não informou %(field)s depois do número máximo de perguntas; o fluxo seguiu pela saída “Desistiu”."),
    "ask_opted_out": N_("O paciente pediu para não receber mais mensagens; o fluxo foi encerrado."),
    "ask_wants_person": N_("O paciente pediu para falar com uma pessoa; a conversa foi passada à equipe."),
    "ask_unknown_field": N_("A etapa pede o campo %(field)s, que a clínica apagou. Crie o campo de novo ou tire-o da etapa e publique o fluxo."),
    "ended": N_("O fluxo terminou."),
    "node_error": N_("Um erro interno impediu esta etapa. O Lembra tenta de novo mais tarde."),
    "max_steps": N_("O paciente chegou ao limite de passos do fluxo, que foi encerrado."),
    "claim_expired": N_("O processo que cuidava desta etapa parou no meio; o Lembra tenta de novo."),
    "claim_not_started": N_("Nenhum processo começou esta etapa a tempo (a fila de tarefas pode ter ficado fora do ar); ela voltou para a fila sem contar como tentativa."),
    "stale_wake": N_("Um aviso atrasado para uma etapa que o paciente já tinha deixado foi ignorado."),
    # How a run paused by a hand-off resumes (engine/flows/replies.py: resume_at).
    "resumed_node_deadline": N_("O atendimento humano terminou. O fluxo retoma no prazo que esta etapa já tinha "
                                "antes da pausa: o paciente não perde tempo para responder e a espera não fica "
                                "mais longa."),
    "resumed_after_grace": N_("O atendimento humano terminou. O fluxo retoma depois do tempo de retomada do fluxo "
                              "(%(minutes)s min), porque o prazo que esta etapa tinha vence antes disso ou já "
                              "venceu."),
    "resumed_ask_again": N_("O atendimento humano terminou e o prazo para responder à pergunta desta etapa já tinha "
                            "vencido: o fluxo pergunta de novo depois do tempo de retomada (%(minutes)s min)."),
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
    # A refusal lists its first issues (engine/flows/issues.py MAX_ISSUES) and counts the rest.
    "more_issues": Np_("E mais %(count)s problema, mostrado depois que estes forem corrigidos.",
                       "E mais %(count)s problemas, mostrados depois que estes forem corrigidos."),
    # --- request bodies and documents from outside (engine/core/strict_json.py, admin/json_body.py) ----
    "body_not_json": N_("O pedido não é um JSON válido em UTF-8. Confira o que foi enviado e envie de novo."),
    "body_too_large": N_("O pedido passa do limite de %(max)s KB. Envie um pedido menor."),
    "body_too_deep": N_("O JSON do pedido aninha mais de %(max)s níveis. Envie um documento mais simples."),
    "body_invalid_value": N_("O pedido não foi aceito (%(field)s: %(detail)s)."),
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
    "llm_url_invalid": N_("o endereço da API do agente não pode ser usado; corrija-o no agente"),
    "answer_too_large": N_("resposta grande demais"),
    # --- egress (gateway/egress.py): a tenant-set address that points inside the network -----------
    "egress_refused": N_("endereço não permitido: ele aponta para a rede interna (localhost, rede privada ou "
                         "link-local); use um endereço público ou peça a quem opera o Lembra para liberá-lo "
                         "em LEMBRA_PROVIDER_ALLOW"),
    # --- outbound webhooks (engine/tenants/webhooks): an endpoint refused, a delivery's last error ----
    "webhook_event_types": N_("Escolha pelo menos um destes eventos, cada um uma vez: %(choices)s."),
    "webhook_timeout": N_("O sistema da clínica não respondeu a tempo. O aviso será enviado de novo."),
    "webhook_connection_error": N_("Não foi possível conectar ao sistema da clínica. O aviso será enviado de "
                                   "novo."),
    "webhook_server_error": N_("O sistema da clínica respondeu com um erro dele. O aviso será enviado de novo."),
    "webhook_throttled": N_("O sistema da clínica pediu para esperar (muitos avisos). O aviso será enviado de "
                            "novo mais tarde."),
    "webhook_request_error": N_("O envio ao sistema da clínica falhou no meio. O aviso será enviado de novo."),
    "webhook_refused": N_("O sistema da clínica recusou o aviso, e ele não será enviado de novo. Confira o "
                          "endereço e o que o sistema espera receber."),
    "webhook_interrupted": N_("O envio foi interrompido (o processo que enviava parou). O aviso será enviado de "
                              "novo, com o mesmo webhook-id."),
    "webhook_endpoint_inactive": N_("O endereço foi desativado antes do envio, então o aviso não foi enviado."),
    "webhook_secret_unreadable": N_("O segredo deste endereço não pode ser lido (a chave que o guardou não "
                                    "está mais configurada). Gere um segredo novo para o endereço."),
    # --- addresses a tenant types (gateway/egress.py `endpoint`), and the secrets bound to them ----
    "url_invalid": N_("Este endereço não pode ser usado. Escreva http:// ou https://, o nome do servidor, sem "
                      "espaços nem acentos, e, se preciso, a porta e o caminho, como "
                      "https://api.exemplo.com.br/v1."),
    "url_credentials": N_("Não coloque usuário nem senha no endereço (nada antes de um @). Informe a chave no "
                          "campo dela."),
    "url_ip_spelling": N_("Escreva o endereço IP como quatro números decimais separados por pontos, por exemplo "
                          "203.0.113.10 (sem zeros à esquerda nem hexadecimal)."),
    "credentials_cleared_new_endpoint": N_("O endereço mudou para outro servidor, então as chaves e senhas "
                                           "guardadas para o endereço anterior foram apagadas: elas nunca são "
                                           "enviadas a um servidor novo. Informe-as de novo, se o novo servidor "
                                           "pedir."),
    "credential_retype_new_endpoint": N_("O endereço mudou para outro servidor: informe este valor de novo (o "
                                         "guardado era do endereço anterior e não é enviado a um servidor novo)."),
    # === messages: statuses, provider errors, skip reasons, reply outcomes ====================
    # Read through engine/words/reasons.py (message_reason, status_label, event_label, reply_outcome),
    # which maps a raw code to its key here; a code the catalogue already gives another meaning
    # (timeout, connection_error, window_closed, http_*: the AI's and the flow steps') has its
    # send-side sentence under its own key (send_timeout, ...).
    # --- message statuses (engine/store/models.py MESSAGE_STATUSES), as labels
    "message_status_new": N_("Aguardando o horário de envio"),
    "message_status_pending": N_("Agendada"),
    "message_status_claimed": N_("Preparando o envio"),
    "message_status_sending": N_("Enviando"),
    "message_status_sent": N_("Enviada"),
    "message_status_delivered": N_("Entregue"),
    "message_status_read": N_("Lida"),
    "message_status_failed": N_("Falhou"),
    "message_status_unknown": N_("Envio incerto"),
    "message_status_cancelled": N_("Cancelada"),
    "message_status_expired": N_("Expirou"),
    "message_status_dead": N_("Sem sucesso após várias tentativas"),
    "message_status_skipped": N_("Não enviada"),
    # --- message events (message_events.event), as labels
    "message_event_queued": N_("Entrou na fila"),
    "message_event_planned": N_("Horário de envio recalculado"),
    "message_event_claimed": N_("Separada para envio"),
    "message_event_reclaimed": N_("Voltou para a fila"),
    "message_event_sending": N_("Envio iniciado"),
    "message_event_sent": N_("Enviada ao provedor"),
    "message_event_delivered": N_("Entregue"),
    "message_event_read": N_("Lida"),
    "message_event_failed": N_("Falhou"),
    "message_event_retried": N_("Nova tentativa agendada"),
    "message_event_deferred": N_("Adiada"),
    "message_event_unknown": N_("Envio incerto"),
    "message_event_dead": N_("Sem sucesso após várias tentativas"),
    "message_event_expired": N_("Expirou"),
    "message_event_cancelled": N_("Cancelada"),
    "message_event_skipped": N_("Pulada"),
    # --- why the engine did not send, or postponed, a message (engine/messaging/dispatch/, outbox.py, populate.py,
    # rules.py, replan.py; the console's Fila); opted_out, address_opted_out, contact_erased,
    # enrollment_stopped, too_late, no_allowed_instant and the flow reasons above are reused
    "appointment_changed": N_("O agendamento mudou (outro horário, cancelado ou concluído) antes do envio, então este"
                              " lembrete foi cancelado; se ainda valer, um novo lembrete foi programado."),
    "appointment_cancelled": N_("O agendamento foi cancelado antes do envio; o lembrete não saiu."),
    "appointment_moved": N_("O agendamento mudou de horário antes do envio; este lembrete foi cancelado e outro foi "
                            "programado para o novo horário."),
    "outside_sending_window": N_("Fora do horário de envio da clínica; a mensagem sai no próximo horário permitido."),
    "pacing": N_("Para não parecer spam, este número envia com intervalo; a mensagem sai no próximo horário livre."),
    "daily_cap": N_("O número atingiu o limite diário de envios; a mensagem sai no próximo dia."),
    "expired_before_send": N_("O prazo desta mensagem acabou antes que ela saísse, e depois disso ela não faria mais "
                              "sentido. Nada saiu; se ainda for útil, fale com o paciente por outro meio."),
    "retry_after_expiry": N_("O envio falhou e a próxima tentativa cairia depois do prazo desta mensagem, então o "
                             "Lembra desistiu. Nada saiu; se ainda for útil, fale com o paciente por outro meio."),
    "retry_after_expiry_error": N_("A próxima tentativa cairia depois do prazo desta mensagem, então o Lembra "
                                   "desistiu; se ainda for útil, fale com o paciente por outro meio. O último "
                                   "erro foi: %(error)s"),
    "worker_lost": N_("O processo de envio parou no meio da chamada ao provedor; não dá para saber se a mensagem "
                      "saiu. Confira com o paciente antes de reenviar."),
    "lease_expired": N_("O processo de envio parou no meio; como o provedor descarta envios repetidos, o Lembra tenta"
                        " de novo sem risco de duplicar."),
    "lease_expired_before_call": N_("O envio demorou a começar e o que restava da reserva da mensagem não bastava "
                                    "para a chamada ao provedor; nada saiu, e o Lembra tenta de novo."),
    "outcome_unknown": N_("O provedor não confirmou o envio; não dá para saber se a mensagem saiu. Confira com o "
                          "paciente antes de reenviar."),
    "unexpected_error": N_("Um erro inesperado aconteceu durante o envio; não dá para saber se a mensagem saiu. "
                           "Confira com o paciente antes de reenviar e avise quem opera o Lembra."),
    "cancelled_by_operator": N_("Alguém da equipe cancelou esta mensagem na Fila."),
    "retried_by_operator": N_("Alguém da equipe pediu um novo envio desta mensagem na Fila."),
    "no_channel": N_("A clínica não tem um canal deste tipo (WhatsApp, SMS ou e-mail). Configure o canal em "
                     "Configuração e reenvie."),
    "channel_unavailable": N_("O canal desta mensagem está desativado ou com problema. O Lembra tenta de novo; "
                              "confira o canal em Configuração."),
    "channel_misconfigured": N_("As credenciais guardadas deste canal não puderam ser lidas. O Lembra tenta de novo; "
                                "salve as credenciais do canal outra vez em Configuração."),
    "template_error": N_("O modelo de mensagem tem um erro e não pôde ser montado. Corrija o modelo e reenvie."),
    "no_address": N_("O paciente não tem telefone ou e-mail para este canal. Complete o cadastro e reenvie."),
    "permanent": N_("O provedor recusou a mensagem de vez, sem dizer o motivo. Confira o contato e o canal antes de "
                    "reenviar."),
    "transient": N_("O provedor falhou por enquanto, sem dizer o motivo; o Lembra tenta de novo mais tarde."),
    "provider_failed": N_("O provedor avisou que a mensagem não foi entregue, sem dizer o motivo. Confira o telefone "
                          "ou o e-mail do paciente e reenvie."),
    # --- provider errors (providers/*, gateway/http.py): what the provider answered, and what to do
    "config_missing": N_("Falta configurar o canal (chave, remetente ou servidor). Complete o canal em Configuração e"
                         " reenvie."),
    "config_invalid": N_("A configuração do canal tem um valor inválido (remetente, porta, segurança ou certificado)."
                         " Corrija o canal em Configuração e reenvie."),
    "not_configured": N_("O canal não está completamente configurado. Complete-o em Configuração e reenvie."),
    "misconfigured": N_("Falta no canal do WhatsApp o identificador do número ou o token de acesso. Complete o canal "
                        "em Configuração e reenvie."),
    "invalid_number": N_("O telefone do paciente não é um número válido. Corrija o telefone no cadastro e reenvie."),
    "invalid_address": N_("O e-mail do paciente não é um endereço válido. Corrija o e-mail no cadastro e reenvie."),
    "empty_text": N_("A mensagem ficou sem texto. Confira o modelo de mensagem e reenvie."),
    "no_subject": N_("O e-mail ficou sem assunto. Preencha o assunto no modelo de mensagem e reenvie."),
    "no_text": N_("O e-mail ficou sem texto. Preencha o texto no modelo de mensagem e reenvie."),
    "bad_header": N_("Um cabeçalho extra do canal de e-mail é inválido. Corrija-o em Configuração e reenvie."),
    "bad_response": N_("O provedor respondeu de um jeito inesperado; não dá para saber se a mensagem saiu. Confira "
                       "com o paciente antes de reenviar."),
    "no_message_id": N_("O provedor aceitou a mensagem mas não devolveu o identificador dela, então não dá para "
                        "acompanhar a entrega. Confira com o paciente antes de reenviar."),
    "unsupported": N_("Este provedor não tem esta função."),
    "connect_failed": N_("Não foi possível iniciar a conexão do WhatsApp. Tente conectar o número de novo em "
                         "Configuração."),
    "connection_closed": N_("O WhatsApp do número da clínica está desconectado. Conecte o número de novo (QR code) em"
                            " Configuração; o Lembra tenta de novo."),
    "not_on_whatsapp": N_("Este número não tem WhatsApp. Confira o telefone no cadastro ou use SMS ou e-mail."),
    "bad_request": N_("O provedor recusou o pedido. Confira o telefone do paciente e o texto da mensagem, e reenvie."),
    "unauthorized": N_("O provedor recusou a chave de acesso do canal. Confira a chave em Configuração e reenvie."),
    "forbidden": N_("O provedor negou acesso ao canal. Confira a chave e as permissões do canal em Configuração."),
    "instance_name_in_use": N_("Já existe uma conexão com este nome no servidor do WhatsApp. Dê outro nome ao canal."),
    "instance_not_found": N_("A conexão do WhatsApp deste canal não existe mais no servidor. Conecte o número de novo"
                             " em Configuração."),
    "not_found": N_("O endereço do provedor não foi encontrado. Confira o endereço do servidor em Configuração."),
    "connect_timeout": N_("Não foi possível falar com o provedor a tempo; nada saiu e o Lembra tenta de novo."),
    "send_timeout": N_("O provedor não respondeu a tempo; a mensagem pode ter saído ou não. O Lembra só tenta de novo"
                       " quando não há risco de duplicar; senão, confira com o paciente."),
    "send_connection_error": N_("Não foi possível conectar ao provedor; nada saiu e o Lembra tenta de novo."),
    "provider_answer_too_large": N_("O provedor respondeu com uma resposta grande demais, que não foi lida; a "
                                    "mensagem pode ter saído ou não. O Lembra só tenta de novo quando não há risco de"
                                    " duplicar; senão, confira com o paciente."),
    "request_error": N_("O pedido ao provedor falhou no caminho; o Lembra tenta de novo."),
    "provider_throttled": N_("O provedor pediu para esperar (muitos envios em pouco tempo); o Lembra tenta de novo "
                             "mais tarde."),
    "provider_error": N_("O provedor teve um erro interno; o Lembra tenta de novo mais tarde."),
    "send_http_credentials": N_("O provedor recusou as credenciais do canal (HTTP %(status)s). Confira a chave ou o "
                                "token em Configuração e reenvie."),
    "send_http_server": N_("O provedor teve um erro (HTTP %(status)s); o Lembra tenta de novo mais tarde."),
    "send_http_refused": N_("O provedor recusou o pedido (HTTP %(status)s). Confira o contato e o canal; se "
                            "continuar, avise quem opera o Lembra."),
    "provider_code": N_("O provedor recusou ou não entregou a mensagem (código %(code)s do provedor). Confira o "
                        "contato e o canal; se continuar, avise quem opera o Lembra."),
    "unknown_code": N_("Aconteceu algo que o Lembra ainda não sabe descrever (código interno %(code)s). Se continuar,"
                       " avise quem opera o Lembra."),
    "sandbox_permanent": N_("O sandbox recusou a mensagem de propósito (teste de falha permanente). Nada saiu; num "
                            "canal real, confira o número e reenvie."),
    "sandbox_transient": N_("O sandbox simulou de propósito uma falha passageira (teste). Nada saiu; o Lembra tenta "
                            "de novo, como faria num canal real."),
    "sandbox_no_recorder": N_("O sandbox não tem onde guardar a mensagem de teste. Avise quem opera o Lembra."),
    # --- WhatsApp Cloud API (providers/meta: its named codes and Graph error numbers)
    "template_required": N_("A janela de 24 horas do WhatsApp estava fechada e esta mensagem não tem modelo aprovado."
                            " Cadastre o nome do modelo aprovado na Meta e reenvie."),
    "waba_missing": N_("O canal do WhatsApp oficial não tem a identificação da conta do WhatsApp Business (WABA) "
                       "ou o token de acesso. Preencha os dois no canal, em Configuração → Canais."),
    "send_window_closed": N_("O paciente não escreve há mais de 24 horas, e fora dessa janela o WhatsApp só aceita "
                             "modelos aprovados. Envie um modelo aprovado."),
    "undeliverable": N_("O WhatsApp não conseguiu entregar: o número pode não ter WhatsApp, o aplicativo pode estar "
                        "desatualizado ou os termos não foram aceitos. Confira o telefone ou use SMS ou e-mail."),
    "throughput": N_("O WhatsApp está recebendo mensagens deste número rápido demais; o Lembra espera e tenta de "
                     "novo."),
    "pair_rate_limit": N_("Muitas mensagens para este paciente em pouco tempo; o Lembra espera e tenta de novo."),
    "spam_rate_limit": N_("O WhatsApp restringiu o número da clínica por suspeita de spam. Nada saiu; diminua os "
                          "envios e confira a qualidade do número no gerenciador da Meta."),
    "marketing_limit": N_("O paciente atingiu o limite de mensagens de marketing do WhatsApp; o Lembra tenta de novo "
                          "mais tarde."),
    "marketing_opted_out": N_("O paciente pediu para não receber mensagens de marketing desta clínica no WhatsApp; "
                              "modelos de marketing para ele não saem mais. Lembretes de utilidade continuam saindo."),
    "unsupported_type": N_("O WhatsApp não aceita este tipo de mensagem. Use texto ou um modelo aprovado."),
    "generic_error": N_("O WhatsApp teve um erro interno; o Lembra tenta de novo mais tarde."),
    "experiment": N_("O número do paciente faz parte de um teste da Meta e não recebe esta mensagem. Use SMS ou "
                     "e-mail."),
    "media_error": N_("O WhatsApp não conseguiu carregar o anexo da mensagem. Confira o anexo e reenvie."),
    "token_invalid": N_("O token de acesso da Meta expirou ou é inválido. Gere um token novo e salve-o no canal em "
                        "Configuração."),
    "account_restricted": N_("A Meta bloqueou a conta do WhatsApp da clínica por violar as políticas. Confira os "
                             "avisos no gerenciador da Meta."),
    "account_locked": N_("A conta do WhatsApp da clínica está trancada. Confira os avisos no gerenciador da Meta."),
    "waba_rate_limit": N_("A conta do WhatsApp da clínica atingiu o limite de pedidos; o Lembra tenta de novo mais "
                          "tarde."),
    "meta_invalid_parameter": N_("A Meta recusou um dado do pedido (parâmetro inválido). Confira o telefone do "
                                 "paciente e o modelo de mensagem, e reenvie."),
    "meta_template_params": N_("O número de variáveis não bate com o modelo aprovado na Meta. Corrija o modelo de "
                               "mensagem e reenvie."),
    "meta_template_missing": N_("Este modelo não existe na Meta, ou não neste idioma. Confira o nome e o idioma do "
                                "modelo aprovado."),
    "meta_template_format": N_("As variáveis não estão no formato que o modelo aprovado na Meta espera. Corrija o "
                               "modelo de mensagem e reenvie."),
    "meta_template_paused": N_("A Meta pausou ou desativou este modelo por baixa qualidade. Revise o modelo no "
                               "gerenciador da Meta ou use outro."),
    "meta_template": N_("A Meta recusou o modelo de mensagem (erro %(code)s da Meta). Confira o modelo aprovado na "
                        "Meta e reenvie."),
    "meta_error": N_("O WhatsApp recusou a mensagem (erro %(code)s da Meta). Confira o telefone e o modelo; se "
                     "continuar, avise quem opera o Lembra."),
    # --- e-mail (providers/email: SMTP and Resend)
    "timeout_after_data": N_("O servidor de e-mail parou de responder depois de receber a mensagem; não dá para saber"
                             " se ela saiu. Confira com o paciente antes de reenviar."),
    "disconnected_after_data": N_("O servidor de e-mail desligou depois de receber a mensagem; não dá para saber se "
                                  "ela saiu. Confira com o paciente antes de reenviar."),
    "starttls_unsupported": N_("O servidor de e-mail não oferece conexão segura (STARTTLS). Mude a segurança do canal"
                               " em Configuração ou use outro servidor."),
    "auth_unsupported": N_("O servidor de e-mail não aceita o tipo de login do Lembra. Confira o servidor e a "
                           "segurança do canal em Configuração."),
    "smtp_recipient_refused": N_("O servidor de e-mail recusou o endereço do paciente. Confira o e-mail no cadastro e"
                                 " reenvie."),
    "smtp_unsupported": N_("O servidor de e-mail não tem um recurso de que o Lembra precisa. Use outro servidor ou "
                           "confira o canal em Configuração."),
    "tls_certificate": N_("O certificado do servidor de e-mail não é válido. Confira o endereço do servidor ou o "
                          "certificado em Configuração."),
    "tls_interrupted": N_("A conexão segura com o servidor de e-mail caiu; o Lembra tenta de novo."),
    "tls_error": N_("A conexão segura com o servidor de e-mail falhou. Confira a segurança e a porta do canal em "
                    "Configuração."),
    "disconnected": N_("O servidor de e-mail fechou a conexão; o Lembra tenta de novo."),
    "connection_refused": N_("O servidor de e-mail recusou a conexão; o Lembra tenta de novo. Se continuar, confira o"
                             " servidor e a porta em Configuração."),
    "dns_error": N_("O endereço do servidor de e-mail não foi encontrado; o Lembra tenta de novo. Se continuar, "
                    "confira o servidor em Configuração."),
    "smtp_error": N_("O servidor de e-mail teve um erro; o Lembra tenta de novo."),
    "smtp_deferred": N_("O servidor de e-mail adiou a mensagem (código %(code)s); o Lembra tenta de novo."),
    "smtp_login_refused": N_("O servidor de e-mail recusou o usuário ou a senha do canal (código %(code)s). Confira o"
                             " login em Configuração."),
    "smtp_refused": N_("O servidor de e-mail recusou a mensagem (código %(code)s). Confira o e-mail do paciente e o "
                       "canal; se continuar, avise quem opera o Lembra."),
    "hard_bounce": N_("O e-mail voltou: o endereço não existe ou não aceita mensagens. Corrija o e-mail no cadastro."),
    "soft_bounce": N_("O e-mail voltou por um problema passageiro (caixa cheia ou servidor fora do ar). Reenvie mais "
                      "tarde."),
    "complained": N_("O paciente marcou o e-mail como spam; ele não recebe mais e-mails da clínica."),
    "suppressed": N_("O provedor não enviou porque este e-mail já voltou ou foi marcado como spam antes. Confira o "
                     "e-mail no cadastro."),
    "send_failed": N_("O provedor de e-mail não conseguiu enviar. Confira o canal em Configuração e reenvie."),
    "validation_error": N_("O provedor de e-mail recusou o pedido (dados inválidos). Confira o e-mail do paciente e o"
                           " remetente do canal, e reenvie."),
    "email_quota_daily": N_("A cota diária de e-mails do provedor acabou; o Lembra tenta de novo mais tarde."),
    "monthly_quota_exceeded": N_("A cota mensal de e-mails do provedor acabou e o canal foi pausado. Amplie o plano "
                                 "no provedor ou espere o próximo mês."),
    "concurrent_idempotent_requests": N_("O mesmo envio ainda estava em andamento no provedor; o Lembra tenta de "
                                         "novo."),
    "invalid_idempotent_request": N_("O provedor já recebeu um pedido diferente com a mesma chave deste envio; nada "
                                     "saiu. Avise quem opera o Lembra."),
    "email_api_key_refused": N_("O provedor de e-mail recusou a chave de API do canal. Confira a chave em "
                                "Configuração."),
    "invalid_from_address": N_("O remetente do canal de e-mail não é válido ou o domínio não foi verificado no "
                               "provedor. Confira o remetente em Configuração."),
    # --- SMS (providers/sms: Twilio error numbers, Zenvia statuses)
    "sms_stop": N_("O paciente respondeu STOP por SMS e não recebe mais SMS deste número; só volta a receber se "
                   "responder START."),
    "sms_not_mobile": N_("O número não é de celular e não recebe SMS. Confira o telefone no cadastro."),
    "sms_unreachable": N_("O celular do paciente estava desligado ou sem sinal; reenvie mais tarde."),
    "sms_blocked": N_("O número do paciente bloqueou as mensagens, ou a operadora bloqueou a entrega. Fale com o "
                      "paciente por outro meio."),
    "sms_unknown_number": N_("O número não existe ou não está mais ativo. Confira o telefone no cadastro."),
    "sms_filtered": N_("A operadora bloqueou a mensagem como spam. Revise o texto do modelo de mensagem e reenvie."),
    "sms_carrier_error": N_("A operadora não entregou, sem dizer o motivo; reenvie mais tarde."),
    "sms_account_refused": N_("O provedor de SMS recusou a conta ou o token do canal. Confira a conta em "
                              "Configuração."),
    "sms_rejected": N_("A operadora ou o provedor recusou a mensagem. Confira o telefone e o texto, e reenvie."),
    "sms_not_delivered": N_("A operadora não conseguiu entregar (celular desligado ou sem sinal); reenvie mais tarde."),
    "provider_cancelled": N_("O envio foi cancelado no provedor antes de sair."),
    # --- what became of a patient's message (inbound_messages.outcome, engine/messaging/inbound.py)
    "reply_pending": N_("Recebida, ainda sendo processada."),
    "reply_free_text": N_("O paciente escreveu sem usar uma palavra-chave; leia e responda pela conversa, se preciso."),
    "reply_unknown_contact": N_("A mensagem veio de um número sem cadastro. Cadastre o contato com este telefone para"
                                " responder."),
    "reply_no_appointment": N_("O paciente respondeu, mas não há agendamento para confirmar ou cancelar."),
    "reply_opted_out": N_("O paciente pediu para sair: não recebe mais mensagens e recebeu a confirmação."),
    "reply_already_opted_out": N_("O paciente pediu para sair de novo; ele já estava descadastrado."),
    "reply_confirmed": N_("O paciente confirmou o agendamento."),
    "reply_staff_message": N_("Enviada pelo celular da clínica: uma pessoa da equipe assumiu a conversa."),
    "reply_cancelled": N_("O paciente cancelou o agendamento; veja em Pendências se é preciso remarcar."),
    "reply_appointment_scheduled": N_("O paciente respondeu, mas o agendamento não pôde mudar; nada mudou."),
    "reply_appointment_confirmed": N_("O paciente respondeu, mas o agendamento já estava confirmado; nada mudou."),
    "reply_appointment_cancelled": N_("O paciente respondeu, mas o agendamento já estava cancelado; nada mudou."),
    "reply_appointment_completed": N_("O paciente respondeu, mas a sessão já tinha acontecido; nada mudou."),
    "reply_appointment_no_show": N_("O paciente respondeu, mas o agendamento já estava marcado como falta; nada "
                                    "mudou."),
    "reply_voice_note": N_("Áudio recebido — ouça e responda."),
    # --- voice notes (engine/messaging/voice.py, inbound_messages.voice_reason) --------------
    "voice_transcribed": N_("Transcrito de um áudio."),
    "transcription_model_required": N_("Informe o modelo do servidor de transcrição, por exemplo whisper-1."),
    "voice_no_transcriber": N_("A clínica não tem um serviço de transcrição configurado, então o áudio não foi "
                               "transcrito."),
    "voice_transcription_failed": N_("O serviço de transcrição deu erro e o áudio não foi transcrito."),
    "voice_transcription_timeout": N_("O serviço de transcrição demorou demais e o áudio não foi transcrito."),
    "voice_transcription_unavailable": N_("A configuração de transcrição da clínica não pode ser usada (o "
                                          "endereço foi recusado ou a chave não abre). Informe-a de novo."),
    "voice_too_large": N_("O áudio é grande demais para o Lembra baixar; ouça-o no celular da clínica."),
    "voice_too_long": N_("O áudio é longo demais para transcrever."),
    "voice_download_failed": N_("O provedor não entregou o áudio ao Lembra; ouça-o no celular da clínica."),
    "voice_transcript_empty": N_("A transcrição do áudio saiu vazia."),
    "reply_other": N_("O Lembra recebeu a mensagem, mas não sabe descrever o que fez com ela (código interno "
                      "%(code)s)."),
    # --- answering as the patient on the sandbox (admin/sandbox_chat.py, `lembra sandbox reply`) ------------
    "sandbox_reply_org": N_("Não há clínica com o identificador %(slug)s."),
    "sandbox_reply_no_channel": N_("A clínica não tem um canal de WhatsApp do sandbox. Crie um em Configuração → "
                                   "Canais, com o provedor sandbox."),
    "sandbox_reply_channel": N_("O canal %(channel)s não é um canal do sandbox desta clínica."),
    "sandbox_reply_email": N_("E-mails não recebem resposta pelo sandbox: só mensagens de WhatsApp e SMS."),
    "sandbox_reply_phone": N_("Use o telefone no formato E.164: + e o código do país, sem espaços, como "
                              "+5511987654321."),
    "sandbox_reply_empty": N_("Escreva a resposta do paciente."),
    "sandbox_reply_too_long": N_("A resposta passa de %(max)s caracteres. Encurte o texto."),
    "sandbox_reply_button": N_("A última mensagem enviada a este telefone não tem esse botão (botões: %(buttons)s)."),
    "sandbox_reply_refused": N_("Resposta recusada: %(motivo)s"),
    # --- what a follow-up flow made of a reply its waiting step took (engine/messaging/conversations.py
    # FlowReading, shown in Conversas)
    "flow_reply_reading": N_("O fluxo %(flow)s está lendo esta resposta; ela só fica para responder se o fluxo "
                             "não a entender."),
    "flow_reply_understood": N_("O fluxo %(flow)s entendeu a resposta como “%(class)s” e seguiu para a etapa "
                                "“%(step)s”."),
    "flow_reply_understood_ended": N_("O fluxo %(flow)s entendeu a resposta como “%(class)s” e encerrou o "
                                      "acompanhamento."),
    "flow_reply_replied": N_("O fluxo %(flow)s recebeu a resposta durante a espera e seguiu para a etapa "
                             "“%(step)s”."),
    "flow_reply_replied_ended": N_("O fluxo %(flow)s recebeu a resposta durante a espera e encerrou o "
                                   "acompanhamento."),
    "flow_reply_not_understood": N_("O fluxo %(flow)s não entendeu esta resposta e seguiu pela saída “Outra resposta”, para "
                                    "a etapa “%(step)s”. Leia e responda, se preciso."),
    "flow_reply_stopped": N_("O fluxo %(flow)s leu esta resposta, mas parou sem tratá-la. %(why)s Leia e "
                             "responda, se preciso."),
    "flow_reply_late": N_("O fluxo %(flow)s ainda não conseguiu ler esta resposta (o serviço de IA ou o "
                          "processamento está atrasado). Leia e responda, se preciso."),
    "flow_reply_dropped": N_("O fluxo %(flow)s não chegou a ler esta resposta: o acompanhamento foi encerrado, "
                             "pausado por atendimento humano ou parou por erro. Leia e responda, se preciso."),
    # --- privacy (engine/privacy): refusals that follow the address, erasure, retention -------
    "address_opted_out": N_("Outro cadastro com o mesmo telefone ou e-mail pediu para não receber mensagens por "
                            "este canal; o pedido vale para o endereço, qualquer que seja o cadastro."),
    "contact_erased": N_("Os dados do paciente foram apagados a pedido (LGPD); nada mais é enviado a ele."),
    # --- conversations (engine/messaging/conversations.py): answering a patient from the console ----------
    "conversation_window_closed": N_("O paciente escreveu há mais de 24 horas; fora dessa janela o WhatsApp só "
                                     "aceita modelos aprovados. Envie o modelo aprovado para retomar a conversa; "
                                     "quando o paciente responder, você pode escrever livremente."),
    "conversation_window_closed_no_template": N_("O paciente escreveu há mais de 24 horas; fora dessa janela o "
                                                 "WhatsApp só aceita modelos aprovados, e o modelo "
                                                 "para retomar a conversa (conversation_reopen) não tem nome "
                                                 "aprovado na Meta. Peça a quem opera o Lembra para configurá-lo."),
    "conversation_unknown_contact": N_("Este número não é de nenhum contato cadastrado, então não dá para "
                                       "responder por aqui. Cadastre o contato com este telefone e responda de novo."),
    "conversation_no_channel": N_("A clínica não tem um canal ativo deste tipo para responder. Confira os canais "
                                  "em Configuração."),
    "conversation_text_required": N_("Escreva a resposta antes de enviar."),
    "conversation_text_too_long": N_("A resposta passa de %(max)s caracteres. Encurte o texto."),
    "conversation_already_sent": N_("Esta resposta já tinha sido enviada; nada foi enviado de novo."),
    "conversation_template_not_needed": N_("A conversa está aberta: escreva a resposta, sem precisar do modelo."),
    "conversation_reply_queued": N_("A resposta foi para a fila de envio e sai pelo mesmo canal em instantes."),
    # --- desk (admin/views/desk): writing first, and a contact who refused messages ---------------------
    "conversation_opted_out": N_("O paciente não consentiu em receber mensagens por este canal, ou pediu para "
                                 "não receber mais; nada pode ser enviado a ele por aqui."),
    "conversation_window_not_open": N_("O paciente não escreveu por este canal nas últimas 24 horas; fora dessa "
                                       "janela o WhatsApp só aceita modelos aprovados. Envie o modelo aprovado para "
                                       "começar a conversa; quando o paciente responder, você pode escrever "
                                       "livremente."),
    "conversation_window_not_open_no_template": N_("O paciente não escreveu por este canal nas últimas 24 horas; "
                                                   "fora dessa janela o WhatsApp só aceita modelos aprovados, e o "
                                                   "modelo para retomar a conversa (conversation_reopen) não tem "
                                                   "nome aprovado na Meta. Peça a quem opera o Lembra para "
                                                   "configurá-lo."),
    # --- why a reminder of an appointment does not go (engine/reminders/windows.py skip reasons, and
    # engine/people/appointments.reminder_outlook for the rules that queued nothing) ------------------
    "too_late": N_("A hora deste lembrete já tinha passado quando ele entrou na fila; ele não é enviado."),
    "no_allowed_instant": N_("Não há horário de envio permitido entre agora e o início da sessão (janela de envio da clínica)."),
    "appointment_in_past": N_("O horário do agendamento já passou; nenhum lembrete é enviado."),
    "reminder_no_consent": N_("O paciente não consentiu em receber mensagens por nenhum canal desta regra."),
    "reminder_no_channel": N_("A clínica não tem um canal ativo para os canais que o paciente aceitou nesta regra."),
    "reminder_no_address": N_("O paciente não tem telefone ou e-mail para os canais desta regra."),
    # --- a template's Meta mapping (engine/messaging/meta_templates.py): refusals and warnings at save -----
    "waba_template_unmapped": N_("Pelo WhatsApp oficial (Meta), esta mensagem também sai fora da janela de 24 horas, "
                                 "e aí a Meta só aceita um modelo aprovado. Informe o nome, o idioma e as variáveis "
                                 "do modelo aprovado na conta da clínica."),
    "waba_only_whatsapp": N_("Só modelos de WhatsApp têm um modelo aprovado na Meta. Deixe o mapeamento da Meta "
                             "em branco neste canal."),
    "waba_name_invalid": N_("O nome de um modelo da Meta tem só letras minúsculas sem acento, números e _ (até 512), "
                            "como lembrete_sessao. Copie o nome como aparece no Gerenciador do WhatsApp."),
    "waba_language_invalid": N_("O idioma de um modelo da Meta é um código como pt_BR, en_US ou es. Copie-o como "
                                "aparece no Gerenciador do WhatsApp."),
    "waba_parameters_too_many": N_("Use no máximo %(max)s variáveis."),
    "waba_parameter_unknown": N_("A variável %(variable)s não existe. Use uma destas: %(variables)s."),
    "waba_buttons_not_here": N_("Só o lembrete de sessão e a confirmação de agendamento têm os botões Confirmar e "
                                "Cancelar. Deixe os botões deste modelo em branco."),
    "waba_buttons_invalid": N_("Os botões são Confirmar e Cancelar, cada um no máximo uma vez, na ordem dos botões "
                               "de resposta rápida do modelo aprovado."),
    "waba_template_not_found": N_("A conta do WhatsApp da clínica (WABA) não tem o modelo %(name)s em %(language)s. "
                                  "Crie-o na Meta e espere a aprovação, ou escolha um dos modelos da conta."),
    "waba_template_language": N_("O modelo %(name)s existe na Meta em %(languages)s, mas não em %(language)s. "
                                 "Escolha um desses idiomas ou crie o modelo em %(language)s."),
    "waba_template_not_approved": N_("O modelo %(name)s (%(language)s) está %(status)s na Meta, e só modelos "
                                     "aprovados podem ser enviados. Espere a aprovação ou escolha outro modelo."),
    "waba_template_parameter_count": N_("O modelo %(name)s na Meta tem %(expected)s variáveis no texto, e o "
                                        "mapeamento lista %(given)s. Liste uma variável do Lembra para cada {{n}} "
                                        "do modelo, na ordem."),
    "waba_template_named_parameters": N_("O modelo %(name)s usa variáveis com nome ({{nome}}), e o Lembra preenche "
                                         "variáveis numeradas ({{1}}, {{2}}…). Crie o modelo na Meta com "
                                         "variáveis do tipo número."),
    "waba_template_header": N_("O modelo %(name)s tem um cabeçalho com imagem, documento ou variável, que o Lembra "
                               "não preenche. Use um modelo sem cabeçalho ou com um cabeçalho de texto fixo."),
    "waba_template_buttons": N_("O modelo %(name)s na Meta tem %(count)s botões de resposta rápida, e o mapeamento "
                                "indica %(given)s. Indique um botão do Lembra (Confirmar, Cancelar) para cada "
                                "resposta rápida do modelo, na ordem, com as respostas rápidas antes dos outros "
                                "botões."),
    "waba_template_button_value": N_("O modelo %(name)s tem um botão que precisa de um valor no envio (um link com "
                                     "variável ou um código), que o Lembra não preenche. Use um modelo sem esse "
                                     "botão."),
    "waba_channel_no_waba": N_("O canal do WhatsApp oficial não tem a identificação da conta do WhatsApp Business "
                               "(WABA), então o Lembra não conferiu o modelo na Meta. Preencha a WABA no canal, em "
                               "Configuração → Canais."),
    "waba_templates_unreachable": N_("A Meta não respondeu agora à consulta dos modelos da conta do WhatsApp, então "
                                     "o Lembra não conferiu o modelo. O que foi salvo vale; confira o nome, o idioma "
                                     "e as variáveis quando a Meta voltar."),
    "waba_templates_refused": N_("A Meta recusou a consulta dos modelos da conta do WhatsApp, então o Lembra não "
                                 "conferiu o modelo. Confira no canal o token de acesso (com a permissão "
                                 "whatsapp_business_management) e a identificação da conta (WABA)."),
    "waba_templates_address_refused": N_("O endereço da API do canal do WhatsApp oficial aponta para a rede interna "
                                         "e não é permitido, então o Lembra não conferiu o modelo na Meta. Corrija o "
                                         "endereço no canal, ou peça a quem opera o Lembra para liberá-lo em "
                                         "LEMBRA_PROVIDER_ALLOW."),
    "waba_no_channel": N_("O WhatsApp da clínica não sai pela API oficial da Meta, então não há modelos aprovados "
                          "para listar. Configure um canal Meta como padrão do WhatsApp, em Configuração → Canais."),
    "template_default_read_only": N_("Os modelos padrão não mudam. Personalize o modelo (crie o da clínica) e "
                                          "mude esse."),
    "template_exists": N_("A clínica já tem seu próprio modelo para esta finalidade, canal e idioma. Mude esse."),
    "template_no_default": N_("Não há modelo padrão para esta finalidade, canal e idioma. Escreva o texto."),
    "template_text_invalid": N_("O texto do modelo tem um erro: %(error)s"),
    "waba_status_approved": N_("aprovado"),
    "waba_status_pending": N_("em análise"),
    "waba_status_rejected": N_("rejeitado"),
    "waba_status_paused": N_("pausado"),
    "waba_status_disabled": N_("desativado"),
    "waba_status_in_appeal": N_("em recurso"),
    "waba_status_pending_deletion": N_("sendo excluído"),
    "waba_status_deleted": N_("excluído"),
    "waba_status_limit_exceeded": N_("acima do limite de modelos"),
    # --- Meta's categories and prices (engine/messaging/meta_categories.py, engine/messaging/pricing) ---
    "waba_category_utility": N_("utilidade"),
    "waba_category_marketing": N_("marketing"),
    "waba_category_authentication": N_("autenticação"),
    "waba_marketing_flag": N_("A Meta classificou o modelo %(name)s como marketing. No Brasil uma mensagem de "
                              "marketing custa cerca de 9 vezes uma de utilidade, e a Meta limita quantas mensagens "
                              "de marketing cada pessoa recebe. Reescreva o modelo como lembrete de utilidade (só o "
                              "agendamento, sem oferta) e envie-o de novo para aprovação."),
    "waba_marketing_flags": Np_("%(count)s modelo do WhatsApp da clínica sai como marketing na Meta: custa cerca de "
                                "9 vezes mais que um de utilidade no Brasil e tem limite de mensagens por pessoa. "
                                "Veja em Configuração → Modelos.",
                                "%(count)s modelos do WhatsApp da clínica saem como marketing na Meta: custam cerca de "
                                "9 vezes mais que os de utilidade no Brasil e têm limite de mensagens por pessoa. "
                                "Veja em Configuração → Modelos."),
    "flow_marketing_template": N_("Este fluxo envia o modelo “%(template)s”, que a Meta classificou como marketing: "
                                  "custa cerca de 9 vezes mais que um de utilidade no Brasil, tem limite de mensagens "
                                  "por pessoa e não chega a quem recusou marketing. Use um modelo de utilidade."),
    "price_file_broken": N_("A tabela de preços da Meta não pôde ser lida (%(error)s); o custo estimado não é "
                            "mostrado. Corrija o arquivo indicado em LEMBRA_META_PRICES."),
    "price_unpriced": Np_("%(count)s mensagem foi para um país sem preço na tabela e não entra na soma.",
                          "%(count)s mensagens foram para países sem preço na tabela e não entram na soma."),
    # --- a change of rules or of the sending window (engine/reminders/rules.py, engine/reminders/replan.py) ----------
    "rule_changed": N_("A regra deste lembrete foi desligada ou deixou de usar este canal; "
                       "o lembrete foi cancelado."),
    "replanned": N_("A regra deste lembrete ou o horário permitido da clínica mudou; o lembrete foi reagendado."),
    # --- the database roles (engine/store/app_role.py, engine/store/migrate.py): said by the CLI and at start -
    "row_security_bypassed": N_("O Lembra se conecta ao PostgreSQL como %(role)s, um superusuário ou papel com "
                                "BYPASSRLS: a segurança por linha, que separa as clínicas no próprio banco, não vale "
                                "para ele. Conecte web, workers e agendador com um papel sem esses poderes (veja "
                                "LEMBRA_OWNER_DATABASE_URL e `lembra db upgrade`)."),
    "app_role_created": N_("O papel da aplicação %(role)s foi criado sem superusuário nem BYPASSRLS e pode ler e "
                           "gravar as tabelas do Lembra; a segurança por linha vale para ele."),
    "app_role_granted": N_("O papel da aplicação %(role)s pode ler e gravar as tabelas do Lembra; a segurança por "
                           "linha vale para ele."),
    "app_role_cannot_create": N_("O papel %(role)s de DATABASE_URL não existe, e o dono do banco (%(owner)s) não "
                                 "pode criar papéis. Peça a quem administra o PostgreSQL para rodar %(command)s "
                                 "(com a senha de DATABASE_URL) e rode `lembra db upgrade` de novo."),
    "migration_needs_owner": N_("O papel de DATABASE_URL não pode mudar o esquema do banco, e isso é o certo para "
                                "a aplicação. Rode `lembra db upgrade` com LEMBRA_OWNER_DATABASE_URL apontando "
                                "para o dono do esquema."),
    # --- POST /api/v1/understand (admin/api/understand.py): a request the reader cannot take ------------------
    "understand_text": N_("Envie a resposta do paciente em text: um texto de 1 a %(max)s caracteres."),
    "understand_instant": N_("Use uma data e hora ISO 8601 com o fuso, por exemplo 2026-12-07T10:00:00-03:00."),
    "understand_appointment_both": N_("Informe o agendamento por appointment_id ou por appointment_at, não pelos "
                                      "dois."),
    "understand_intents": N_("Use uma lista de intenções entre: %(choices)s."),
    "understand_pending": N_("Use uma lista de campos aguardados entre: %(choices)s."),
    "understand_body": N_("Envie um objeto JSON com o campo text."),
    # --- conversation fields (engine/flows/conversation/): a field that cannot be saved, a value refused ---------
    "field_options_only_choice": N_("Só um campo de escolha tem opções. Tire as opções ou mude o tipo para escolha."),
    "field_option_shape": N_("Cada opção é um texto, ou um objeto com value e label. Corrija as opções."),
    "field_boolean_when_asked": N_("Um campo sim/não só é lido na resposta à sua própria pergunta, para que um "
                                   "\"sim\" solto nunca abra um caminho. Use when_asked."),
    "field_maps_to_type": N_("Só um campo do tipo %(types)s pode ser copiado para %(target)s. Mude o tipo ou o destino."),
    "field_slug_taken": N_("A clínica já tem um campo %(slug)s. Escolha outro identificador ou mude aquele."),
    "field_too_many": N_("A clínica já tem %(max)s campos, o limite. Apague um que não use mais."),
    "field_value_date": N_("Não entendi a data. Pode dizer o dia, por exemplo \"sexta\" ou \"12/12\"?"),
    "field_value_past": N_("Essa data já passou. Pode dizer um dia a partir de hoje?"),
    "field_value_horizon": N_("Essa data está longe demais: a agenda vai até %(days)s dias à frente. Pode dizer um "
                              "dia mais perto?"),
    "field_value_time": N_("Não entendi o horário. Pode dizer a hora, por exemplo \"15h\" ou \"9:30\"?"),
    "field_value_phone": N_("Não entendi o telefone. Pode mandar o número com DDD?"),
    "field_value_email": N_("Não entendi o e-mail. Pode mandar o endereço completo, como nome@exemplo.com?"),
    # --- the built-in agenda and free times (engine/people/agenda/) ------------------------------------------
    "agenda_name": N_("Dê ao profissional um nome de 1 a %(max)s caracteres."),
    "agenda_name_taken": N_("Já existe um profissional com este nome. Use outro nome."),
    "agenda_slot_minutes": N_("A duração do horário deve ser um número inteiro de %(min)s a %(max)s minutos."),
    "agenda_weekday": N_("Use um dia da semana de 0 (segunda) a 6 (domingo)."),
    "agenda_time": N_("Use um horário HH:MM, como 08:00 ou 13:30."),
    "agenda_interval_order": N_("O fim do expediente (%(ends)s) deve ser depois do início (%(starts)s)."),
    "agenda_overlap": N_("Dois intervalos do mesmo dia se sobrepõem (%(first)s e %(second)s). Ajuste-os para que um "
                         "termine antes de o outro começar."),
    "agenda_too_many_hours": N_("Use no máximo %(max)s intervalos por semana."),
    "agenda_no_professional": N_("Este profissional não existe nesta clínica."),
    "agenda_date": N_("Use uma data AAAA-MM-DD, como 2026-12-11."),
    "agenda_date_order": N_("A data final (%(date_to)s) não pode ser antes da inicial (%(date_from)s)."),
    "agenda_period": N_("Use um período do dia entre: %(choices)s."),
    "agenda_limit": N_("Peça de %(min)s a %(max)s horários."),
    "agenda_exclude_weekdays": N_("Use dias da semana de 0 (segunda) a 6 (domingo), separados por vírgula."),
    "agenda_url": N_("Use um endereço http(s) que a clínica consiga receber, sem usuário nem senha."),
    "agenda_url_refused": N_("O endereço %(host)s não é permitido: ele aponta para a rede interna."),
    "availability_timeout": N_("O sistema da clínica não respondeu a tempo (%(seconds)s s) ao pedido de horários livres."),
    "availability_unreachable": N_("Não foi possível falar com o sistema da clínica para buscar horários livres."),
    "availability_http": N_("O sistema da clínica recusou o pedido de horários livres (HTTP %(status)s)."),
    "availability_bad_answer": N_("O sistema da clínica respondeu ao pedido de horários livres num formato inválido "
                                  "(%(detail)s)."),
    "availability_refused": N_("O endereço de horários livres da clínica (%(host)s) não é permitido: ele aponta para "
                               "a rede interna."),
    # --- the builder's rehearsal, "Testar" (engine/messaging/rehearsal.py) -------------------------------------
    "rehearsal_bad_version": N_("Escolha testar o rascunho ou a versão publicada."),
    "rehearsal_bad_replies": N_("As respostas do paciente precisam ser textos, sem nenhuma vazia."),
    "rehearsal_too_many_replies": N_("O teste vai até %(max)s respostas do paciente. Clique em Recomeçar."),
    "rehearsal_reply_too_long": N_("A resposta passa de %(max)s caracteres. Encurte o texto."),
    "rehearsal_not_published": N_("Este fluxo ainda não tem versão publicada. Teste o rascunho ou publique-o."),
    "rehearsal_no_channel": N_("A clínica não tem um canal de WhatsApp ou SMS: o teste precisa de um para simular "
                               "as respostas do paciente."),
    "rehearsal_not_started": N_("O paciente de teste não pôde entrar no fluxo."),
    # --- console settings pages (admin/views/settings/: fields, webhooks) ---------------------------------------
    "field_in_published_flow": N_("O campo %(field)s não foi apagado: o fluxo publicado %(flows)s pergunta por ele. "
                                  "Tire o campo do fluxo e publique de novo, depois apague o campo."),
    "webhook_delivery_pending": N_("Na fila: será enviado na próxima tentativa."),
    "webhook_delivery_delivered": N_("Entregue: o sistema da clínica confirmou o recebimento."),
    "webhook_delivery_dead": N_("Não entregue: o Lembra parou de tentar."),
    "webhook_resend_inactive": N_("Este endereço está desativado. Ative-o para reenviar."),
    "webhook_resend_pending": N_("Este aviso ainda está na fila: ele será enviado sem precisar reenviar."),
    # --- the REST API and the CLI (admin/api/, admin/cli/): naming a contact, refusing a send, modes -------
    "api_contact_ref_one": N_("Informe o paciente por contact_id ou por contact_external_id, um dos dois."),
    "api_contact_not_found": N_("Este paciente não existe nesta clínica."),
    "api_message_no_consent": N_("O paciente não consentiu em receber mensagens por este canal; nada foi enviado."),
    "api_message_opted_out": N_("O paciente pediu para não receber mensagens por este canal; nada foi enviado."),
    "api_message_address_opted_out": N_("Este telefone ou e-mail pediu para não receber mensagens por este canal; "
                                        "nada foi enviado."),
    "api_idempotency_key_required": N_("Envie o cabeçalho Idempotency-Key com uma chave única deste pedido (até 200 "
                                       "caracteres visíveis, sem espaços): repetir a chave não envia de novo."),
    "api_conversation_not_open": N_("Esta conversa não estava esperando resposta; nada mudou."),
    "mode_in_person": N_("Presencial"),
    "mode_online": N_("Online"),
    "mode_phone": N_("Por telefone"),
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
    return Text(entry.msgid, params, plural=entry.plural, number=entry.number)


def known(code: str) -> bool:
    """Whether `code` has a sentence."""
    return code in CATALOGUE
