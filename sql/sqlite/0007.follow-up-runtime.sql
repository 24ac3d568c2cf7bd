-- Follow-up flows runtime (SPEC §7): the enrollment's compare-and-set stamp and what its nodes
-- need to remember, the repeat policy's claims ledger, and the default follow-up templates.
-- depends: 0006.user-locale

-- `revision` is bumped by every claim and every change, so a wake that carries an older one is
-- stale. The rest is what nodes and conditions read: when the node was entered, the reply a
-- waiting node has not read yet, counters, the trigger that started the run.
ALTER TABLE enrollments ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;
ALTER TABLE enrollments ADD COLUMN node_entered_at DATETIME;
ALTER TABLE enrollments ADD COLUMN pending_inbound_id BIGINT REFERENCES inbound_messages(id);
ALTER TABLE enrollments ADD COLUMN paused_status TEXT CHECK (paused_status IN ('active', 'waiting_reply'));
ALTER TABLE enrollments ADD COLUMN agent_id BIGINT REFERENCES agents(id);
ALTER TABLE enrollments ADD COLUMN trigger_kind TEXT;
ALTER TABLE enrollments ADD COLUMN trigger_key TEXT;
ALTER TABLE enrollments ADD COLUMN trigger_payload TEXT;
ALTER TABLE enrollments ADD COLUMN messages_sent INTEGER NOT NULL DEFAULT 0;
ALTER TABLE enrollments ADD COLUMN replies INTEGER NOT NULL DEFAULT 0;
ALTER TABLE enrollments ADD COLUMN last_reply_at DATETIME;
ALTER TABLE enrollments ADD COLUMN last_outbound_at DATETIME;
ALTER TABLE enrollments ADD COLUMN last_class TEXT;
ALTER TABLE enrollments ADD COLUMN ended_at DATETIME;
CREATE INDEX enrollments_leased ON enrollments (lease_until) WHERE lease_until IS NOT NULL;
CREATE INDEX enrollments_org_pointer_status ON enrollments (org_id, pointer_id, status);
CREATE INDEX enrollment_events_org_enrollment ON enrollment_events (org_id, enrollment_id, id);

-- How long after a hand-off ends a paused enrollment resumes.
ALTER TABLE flow_pointers ADD COLUMN resume_grace_minutes INTEGER NOT NULL DEFAULT 30;

-- The repeat policy: one row per (flow, dedupe key). `once` keys a contact, `always` a contact
-- and trigger, `cooldown` a contact whose claim is overwritten once it is older than the
-- cooldown, manual enrolment its caller's key. A unique index, not a SELECT, decides.
CREATE TABLE flow_claims (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    pointer_id      BIGINT NOT NULL REFERENCES flow_pointers(id),
    contact_id      BIGINT NOT NULL REFERENCES contacts(id),
    dedupe_key      TEXT NOT NULL,
    enrollment_id   BIGINT REFERENCES enrollments(id),
    claimed_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX flow_claims_pointer_key ON flow_claims (pointer_id, dedupe_key);
CREATE INDEX flow_claims_org_contact ON flow_claims (org_id, contact_id);

CREATE INDEX messages_enrollment ON messages (enrollment_id) WHERE enrollment_id IS NOT NULL;
CREATE INDEX messages_org_sent ON messages (org_id, sent_at) WHERE sent_at IS NOT NULL;
