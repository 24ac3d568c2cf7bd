-- A default template read "Sua sessão com  foi agendada" when the appointment has no professional,
-- and "Olá, !" when the patient's name is unknown: the optional values now sit inside their own
-- {% if %}, so a missing one leaves no hole, no double space and no dangling "com".
-- (tests/test_default_templates.py renders every default with each optional value missing.)
-- Only the defaults change: a clinic's own copy is its own text.
-- depends: 0023.conversation-fields

UPDATE templates
SET body = REPLACE(body, ' com {{ profissional }}', '{% if profissional %} com {{ profissional }}{% endif %}')
WHERE org_id IS NULL AND body LIKE '% com {{ profissional }}%';

UPDATE templates
SET body = REPLACE(body, ', {{ nome }}', '{% if nome %}, {{ nome }}{% endif %}')
WHERE org_id IS NULL AND body LIKE '%, {{ nome }}%';

UPDATE templates
SET subject = REPLACE(subject, ', {{ nome }}', '{% if nome %}, {{ nome }}{% endif %}')
WHERE org_id IS NULL AND subject LIKE '%, {{ nome }}%';
