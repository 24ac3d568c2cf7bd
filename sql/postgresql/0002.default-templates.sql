-- Global default templates (pt-BR). Orgs inherit them until they save an override.
-- depends: 0001.initial-schema

INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'session_reminder', 'whatsapp', 'pt_BR', NULL, 'Olá, {{ nome }}! Lembrete: sua sessão com {{ profissional }} é {{ dia_semana }}, {{ data }}, às {{ hora }}.{% if local %}' || chr(10) || 'Local: {{ local }}{% endif %}' || chr(10) || '' || chr(10) || '' || chr(10) || 'Para confirmar, responda OK. Para cancelar, responda CANCELAR.' || chr(10) || 'Para não receber mais mensagens, responda SAIR.' || chr(10) || '' || chr(10) || '{{ clinica }}', 'session_reminder_v1', 'pt_BR', '["nome", "profissional", "data", "hora", "modalidade"]', now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'session_reminder', 'sms', 'pt_BR', NULL, '{{ clinica }}: lembrete da sua sessão {{ dia_semana }}, {{ data }}, às {{ hora }} com {{ profissional }}. Responda OK para confirmar, CANCELAR para cancelar, SAIR para parar.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'session_reminder', 'email', 'pt_BR', 'Lembrete: sua sessão {{ dia_semana }}, {{ data }}, às {{ hora }}', 'Olá, {{ nome }}!' || chr(10) || '' || chr(10) || 'Lembrete: sua sessão com {{ profissional }} é {{ data_completa }}, às {{ hora }}.{% if local %}' || chr(10) || 'Local: {{ local }}{% endif %}' || chr(10) || '' || chr(10) || '' || chr(10) || 'Se não puder comparecer, avise a clínica.' || chr(10) || '' || chr(10) || '{{ clinica }}', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'session_confirmation', 'whatsapp', 'pt_BR', NULL, 'Olá, {{ nome }}! Sua sessão com {{ profissional }} foi agendada para {{ data_completa }}, às {{ hora }}.' || chr(10) || '' || chr(10) || '{{ clinica }}', 'session_confirmation_v1', 'pt_BR', '["nome", "profissional", "data", "hora"]', now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'session_confirmation', 'sms', 'pt_BR', NULL, '{{ clinica }}: sessão agendada para {{ data }} às {{ hora }} com {{ profissional }}.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'session_confirmation', 'email', 'pt_BR', 'Sessão agendada: {{ data }}, às {{ hora }}', 'Olá, {{ nome }}!' || chr(10) || '' || chr(10) || 'Sua sessão com {{ profissional }} foi agendada para {{ data_completa }}, às {{ hora }}.' || chr(10) || '' || chr(10) || '{{ clinica }}', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'session_cancellation', 'whatsapp', 'pt_BR', NULL, 'Olá, {{ nome }}. Sua sessão de {{ data }}, às {{ hora }}, com {{ profissional }} foi cancelada. Para remarcar, fale com a clínica.' || chr(10) || '' || chr(10) || '{{ clinica }}', 'session_cancellation_v1', 'pt_BR', '["nome", "data", "hora", "profissional"]', now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'session_cancellation', 'sms', 'pt_BR', NULL, '{{ clinica }}: sua sessão de {{ data }} às {{ hora }} foi cancelada. Para remarcar, fale com a clínica.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'session_cancellation', 'email', 'pt_BR', 'Sessão cancelada: {{ data }}, às {{ hora }}', 'Olá, {{ nome }}.' || chr(10) || '' || chr(10) || 'Sua sessão de {{ data_completa }}, às {{ hora }}, com {{ profissional }} foi cancelada. Para remarcar, fale com a clínica.' || chr(10) || '' || chr(10) || '{{ clinica }}', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'confirm_ack', 'whatsapp', 'pt_BR', NULL, 'Obrigado, {{ nome }}! Sua presença está confirmada para {{ dia_semana }}, {{ data }}, às {{ hora }}.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'confirm_ack', 'sms', 'pt_BR', NULL, '{{ clinica }}: presença confirmada para {{ data }} às {{ hora }}. Obrigado!', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'confirm_ack', 'email', 'pt_BR', 'Presença confirmada: {{ data }}, às {{ hora }}', 'Obrigado, {{ nome }}! Sua presença está confirmada para {{ data_completa }}, às {{ hora }}.' || chr(10) || '' || chr(10) || '{{ clinica }}', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'cancel_ack', 'whatsapp', 'pt_BR', NULL, 'Tudo bem, {{ nome }}. Sua sessão de {{ data }}, às {{ hora }}, foi cancelada e a clínica foi avisada.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'cancel_ack', 'sms', 'pt_BR', NULL, '{{ clinica }}: sessão de {{ data }} às {{ hora }} cancelada. A clínica foi avisada.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'cancel_ack', 'email', 'pt_BR', 'Sessão cancelada: {{ data }}, às {{ hora }}', 'Tudo bem, {{ nome }}. Sua sessão de {{ data_completa }}, às {{ hora }}, foi cancelada e a clínica foi avisada.' || chr(10) || '' || chr(10) || '{{ clinica }}', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'optout_confirmation', 'whatsapp', 'pt_BR', NULL, 'Pronto: você não receberá mais mensagens automáticas da {{ clinica }}. Se mudar de ideia, fale com a clínica.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'optout_confirmation', 'sms', 'pt_BR', NULL, '{{ clinica }}: você não receberá mais mensagens automáticas.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'optout_confirmation', 'email', 'pt_BR', 'Você não receberá mais mensagens da {{ clinica }}', 'Pronto: você não receberá mais mensagens automáticas da {{ clinica }}. Se mudar de ideia, fale com a clínica.', NULL, NULL, NULL, now());
