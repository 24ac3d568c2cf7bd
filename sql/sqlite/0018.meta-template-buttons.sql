-- A template's Meta mapping (issue 30): the approved template's name, language and body parameters
-- were already here; its quick-reply buttons join them, as the ordered actions of the template's
-- buttons ("confirm", "cancel"). What the provider did before stays what it does: the default
-- reminder (and any template mapped by hand) sends Confirmar first and Cancelar second, every
-- other mapped template no buttons. An org's override whose Meta name is NULL keeps NULL: it now
-- uses the mapping of the global default it overrides (engine/messaging/meta_templates.py).
-- depends: 0017.claim-order-index

ALTER TABLE templates ADD COLUMN meta_buttons TEXT;

UPDATE templates SET meta_buttons = '["confirm", "cancel"]'
WHERE key = 'session_reminder' AND channel_kind = 'whatsapp' AND meta_template_name IS NOT NULL;
UPDATE templates SET meta_buttons = '[]'
WHERE meta_template_name IS NOT NULL AND meta_buttons IS NULL;
