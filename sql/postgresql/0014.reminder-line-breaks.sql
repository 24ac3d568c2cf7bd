-- The default reminders lost the line break before "Local:" ("às 14:00.Local: Rua …"): with
-- trim_blocks the newline right after {% if local %} is dropped. The break now comes before the
-- block. Clinic copies that still hold the very same fragment get the same fix.
-- depends: 0013.inbound-repoke

UPDATE templates
SET body = REPLACE(body,
    '{% if local %}' || chr(10) || 'Local: {{ local }}{% endif %}' || chr(10) || chr(10) || chr(10),
    chr(10) || '{% if local %}Local: {{ local }}' || chr(10) || '{% endif %}' || chr(10) || chr(10))
WHERE body LIKE '%{\% if local \%}' || chr(10) || 'Local: {{ local }}{\% endif \%}%' ESCAPE '\';
