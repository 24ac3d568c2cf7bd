-- The default reminders lost the line break before "Local:" ("às 14:00.Local: Rua …"): with
-- trim_blocks the newline right after {% if local %} is dropped. The break now comes before the
-- block. Clinic copies that still hold the very same fragment get the same fix.
-- depends: 0013.inbound-repoke

UPDATE templates
SET body = REPLACE(body,
    '{% if local %}' || char(10) || 'Local: {{ local }}{% endif %}' || char(10) || char(10) || char(10),
    char(10) || '{% if local %}Local: {{ local }}' || char(10) || '{% endif %}' || char(10) || char(10))
WHERE body LIKE '%{\% if local \%}' || char(10) || 'Local: {{ local }}{\% endif \%}%' ESCAPE '\';
