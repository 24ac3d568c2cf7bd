-- Who published a flow version, when no user of the clinic did: the demo seed ('demo'), a flow
-- brought in from a file ('import') or the REST API ('api'); 'user' when `created_by` names the
-- user. The flow list reads it ("Publicado por Lembra (demonstração)") instead of the audit rows the
-- demo used to write for its publishes (audit rows stay for what people do). NULL: not recorded
-- (a version published before this column).

ALTER TABLE flow_versions ADD COLUMN published_by TEXT
    CHECK (published_by IN ('user', 'demo', 'import', 'api'));

UPDATE flow_versions SET published_by = 'user' WHERE created_by IS NOT NULL;
UPDATE flow_versions SET published_by = 'demo'
WHERE created_by IS NULL AND id IN (
    SELECT entity_id FROM audit_log
    WHERE action = 'publish' AND entity = 'flow_versions' AND user_id IS NULL
      AND json_extract(changes, '$.publisher') = 'lembra-demo');
