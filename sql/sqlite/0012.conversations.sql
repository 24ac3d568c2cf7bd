-- Conversations inbox (admin/views/conversations.py): a patient's reply that no keyword handled
-- waits for a person in the one store of inbound messages; these say who handled it and when.
-- The approved WhatsApp template a receptionist sends when Meta's 24 h window has closed.
-- depends: 0011.privacy

ALTER TABLE inbound_messages ADD COLUMN handled_at DATETIME;
ALTER TABLE inbound_messages ADD COLUMN handled_by BIGINT REFERENCES users(id);
CREATE INDEX inbound_org_handled ON inbound_messages (org_id, handled_at, received_at);

INSERT INTO templates (org_id, key, channel_kind, locale, subject, body, meta_template_name, meta_language, meta_parameters, updated_at)
VALUES (NULL, 'conversation_reopen', 'whatsapp', 'pt_BR', NULL, 'Olá, {{ nome }}! Aqui é da {{ clinica }}: recebemos sua mensagem e queremos responder. Responda esta mensagem para continuarmos a conversa.', 'conversation_reopen_v1', 'pt_BR', '["nome", "clinica"]', '2026-01-01 00:00:00.000000');
