-- Row-level security by org, as defence in depth behind the org filter every query carries.
-- A connection that sets `lembra.org_id` (SET LOCAL lembra.org_id = '42') sees only that org's
-- rows; one that does not set it (workers, the scheduler, migrations) is not restricted.
-- Owners are subject to it too (FORCE); superusers never are.
-- depends: 0002.default-templates

ALTER TABLE users ENABLE ROW LEVEL SECURITY;
ALTER TABLE users FORCE ROW LEVEL SECURITY;
CREATE POLICY users_org_isolation ON users USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE api_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE api_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY api_keys_org_isolation ON api_keys USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE contacts ENABLE ROW LEVEL SECURITY;
ALTER TABLE contacts FORCE ROW LEVEL SECURITY;
CREATE POLICY contacts_org_isolation ON contacts USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE preferences ENABLE ROW LEVEL SECURITY;
ALTER TABLE preferences FORCE ROW LEVEL SECURITY;
CREATE POLICY preferences_org_isolation ON preferences USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE appointments ENABLE ROW LEVEL SECURITY;
ALTER TABLE appointments FORCE ROW LEVEL SECURITY;
CREATE POLICY appointments_org_isolation ON appointments USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE channels ENABLE ROW LEVEL SECURITY;
ALTER TABLE channels FORCE ROW LEVEL SECURITY;
CREATE POLICY channels_org_isolation ON channels USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE reminder_rules ENABLE ROW LEVEL SECURITY;
ALTER TABLE reminder_rules FORCE ROW LEVEL SECURITY;
CREATE POLICY reminder_rules_org_isolation ON reminder_rules USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE reminder_rule_kinds ENABLE ROW LEVEL SECURITY;
ALTER TABLE reminder_rule_kinds FORCE ROW LEVEL SECURITY;
CREATE POLICY reminder_rule_kinds_org_isolation ON reminder_rule_kinds USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE flow_pointers ENABLE ROW LEVEL SECURITY;
ALTER TABLE flow_pointers FORCE ROW LEVEL SECURITY;
CREATE POLICY flow_pointers_org_isolation ON flow_pointers USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE flow_versions ENABLE ROW LEVEL SECURITY;
ALTER TABLE flow_versions FORCE ROW LEVEL SECURITY;
CREATE POLICY flow_versions_org_isolation ON flow_versions USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE enrollments ENABLE ROW LEVEL SECURITY;
ALTER TABLE enrollments FORCE ROW LEVEL SECURITY;
CREATE POLICY enrollments_org_isolation ON enrollments USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE enrollment_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE enrollment_events FORCE ROW LEVEL SECURITY;
CREATE POLICY enrollment_events_org_isolation ON enrollment_events USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE agents ENABLE ROW LEVEL SECURITY;
ALTER TABLE agents FORCE ROW LEVEL SECURITY;
CREATE POLICY agents_org_isolation ON agents USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE messages ENABLE ROW LEVEL SECURITY;
ALTER TABLE messages FORCE ROW LEVEL SECURITY;
CREATE POLICY messages_org_isolation ON messages USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE message_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE message_events FORCE ROW LEVEL SECURITY;
CREATE POLICY message_events_org_isolation ON message_events USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE inbound_messages ENABLE ROW LEVEL SECURITY;
ALTER TABLE inbound_messages FORCE ROW LEVEL SECURITY;
CREATE POLICY inbound_messages_org_isolation ON inbound_messages USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE sandbox_messages ENABLE ROW LEVEL SECURITY;
ALTER TABLE sandbox_messages FORCE ROW LEVEL SECURITY;
CREATE POLICY sandbox_messages_org_isolation ON sandbox_messages USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE inbox_items ENABLE ROW LEVEL SECURITY;
ALTER TABLE inbox_items FORCE ROW LEVEL SECURITY;
CREATE POLICY inbox_items_org_isolation ON inbox_items USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_log FORCE ROW LEVEL SECURITY;
CREATE POLICY audit_log_org_isolation ON audit_log USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
ALTER TABLE templates ENABLE ROW LEVEL SECURITY;
ALTER TABLE templates FORCE ROW LEVEL SECURITY;
CREATE POLICY templates_org_isolation ON templates USING (COALESCE(current_setting('lembra.org_id', true), '') = '' OR org_id IS NULL OR org_id = NULLIF(current_setting('lembra.org_id', true), '')::bigint);
