-- Global default follow-up templates (pt-BR), used by the demo flow and offered by the builder.
-- depends: 0007.follow-up-runtime

INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'followup_checkin', 'whatsapp', 'pt_BR', NULL, 'Olá, {{ nome }}! Passando para saber se ficou alguma dúvida. Quer que a gente reserve um horário para você?' || chr(10) || '' || chr(10) || '{{ clinica }}', 'followup_checkin_v1', 'pt_BR', '["nome"]', now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'followup_checkin', 'sms', 'pt_BR', NULL, '{{ clinica }}: oi, {{ nome }}! Ficou alguma dúvida? Responda esta mensagem e reservamos um horário para você. SAIR para parar.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'followup_checkin', 'email', 'pt_BR', 'Podemos ajudar, {{ nome }}?', 'Olá, {{ nome }}!' || chr(10) || '' || chr(10) || 'Passando para saber se ficou alguma dúvida. Responda este e-mail e reservamos um horário para você.' || chr(10) || '' || chr(10) || '{{ clinica }}', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'followup_rebook', 'whatsapp', 'pt_BR', NULL, 'Olá, {{ nome }}! Sentimos sua falta na consulta. Quer remarcar? Responda com o melhor dia e horário para você.' || chr(10) || '' || chr(10) || '{{ clinica }}', 'followup_rebook_v1', 'pt_BR', '["nome"]', now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'followup_rebook', 'sms', 'pt_BR', NULL, '{{ clinica }}: sentimos sua falta, {{ nome }}. Quer remarcar? Responda com o melhor dia e horário. SAIR para parar.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'followup_rebook', 'email', 'pt_BR', 'Vamos remarcar, {{ nome }}?', 'Olá, {{ nome }}!' || chr(10) || '' || chr(10) || 'Sentimos sua falta na consulta. Quer remarcar? Responda este e-mail com o melhor dia e horário para você.' || chr(10) || '' || chr(10) || '{{ clinica }}', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'followup_reply_ack', 'whatsapp', 'pt_BR', NULL, 'Obrigado, {{ nome }}! Recebemos sua resposta e a equipe da {{ clinica }} vai falar com você em breve.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'followup_reply_ack', 'sms', 'pt_BR', NULL, '{{ clinica }}: obrigado, {{ nome }}! Recebemos sua resposta e vamos falar com você em breve.', NULL, NULL, NULL, now());
INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'followup_reply_ack', 'email', 'pt_BR', 'Recebemos sua resposta', 'Obrigado, {{ nome }}!' || chr(10) || '' || chr(10) || 'Recebemos sua resposta e a equipe vai falar com você em breve.' || chr(10) || '' || chr(10) || '{{ clinica }}', NULL, NULL, NULL, now());
