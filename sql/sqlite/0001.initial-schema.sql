-- Lembra initial schema (SQLite). The PostgreSQL twin lives in sql/postgresql/ with the same
-- tables, columns and indexes; tests/test_schema.py keeps the two in step.
-- Every table carries org_id; timestamps are UTC text written by the application.

CREATE TABLE orgs (
    id              INTEGER PRIMARY KEY,
    slug            TEXT NOT NULL UNIQUE,
    name            TEXT NOT NULL,
    timezone        TEXT NOT NULL DEFAULT 'America/Sao_Paulo',
    locale          TEXT NOT NULL DEFAULT 'pt_BR',
    state           TEXT,
    quiet_start     TEXT NOT NULL DEFAULT '08:00',
    quiet_end       TEXT NOT NULL DEFAULT '20:00',
    skip_sundays    BOOLEAN NOT NULL DEFAULT TRUE,
    skip_holidays   BOOLEAN NOT NULL DEFAULT TRUE,
    optout_keywords TEXT,
    confirm_keywords TEXT,
    cancel_keywords TEXT,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);

CREATE TABLE users (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    email           TEXT NOT NULL UNIQUE,
    password_hash   TEXT NOT NULL,
    role            TEXT NOT NULL CHECK (role IN ('owner', 'manager', 'agent')),
    active          BOOLEAN NOT NULL DEFAULT TRUE,
    last_login_at   DATETIME,
    created_at      DATETIME NOT NULL
);
CREATE INDEX users_org ON users (org_id);

CREATE TABLE api_keys (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    name            TEXT NOT NULL,
    prefix          TEXT NOT NULL,
    key_hash        TEXT NOT NULL UNIQUE,
    created_at      DATETIME NOT NULL,
    last_used_at    DATETIME,
    revoked_at      DATETIME
);
CREATE INDEX api_keys_org ON api_keys (org_id);

CREATE TABLE contacts (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    name            TEXT,
    phone           TEXT,
    email           TEXT,
    external_id     TEXT,
    locale          TEXT,
    erased_at       DATETIME,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX contacts_org_external ON contacts (org_id, external_id) WHERE external_id IS NOT NULL;
CREATE INDEX contacts_org_phone ON contacts (org_id, phone);
CREATE INDEX contacts_org_email ON contacts (org_id, email);

-- The consent record: one row per contact x channel kind.
CREATE TABLE preferences (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    contact_id      BIGINT NOT NULL REFERENCES contacts(id),
    kind            TEXT NOT NULL CHECK (kind IN ('whatsapp', 'email', 'sms')),
    opted_in        BOOLEAN NOT NULL DEFAULT FALSE,
    opted_in_at     DATETIME,
    opted_out_at    DATETIME,
    source          TEXT,
    evidence        TEXT,
    updated_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX preferences_contact_kind ON preferences (org_id, contact_id, kind);

CREATE TABLE appointments (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    contact_id      BIGINT NOT NULL REFERENCES contacts(id),
    professional    TEXT,
    starts_at       DATETIME NOT NULL,
    timezone        TEXT NOT NULL,
    mode            TEXT,
    location        TEXT,
    status          TEXT NOT NULL DEFAULT 'scheduled'
                    CHECK (status IN ('scheduled', 'confirmed', 'cancelled', 'completed', 'no_show')),
    external_id     TEXT,
    confirmed_at    DATETIME,
    cancelled_at    DATETIME,
    cancel_source   TEXT,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX appointments_org_external ON appointments (org_id, external_id) WHERE external_id IS NOT NULL;
CREATE INDEX appointments_upcoming ON appointments (starts_at) WHERE status IN ('scheduled', 'confirmed');
CREATE INDEX appointments_org_contact ON appointments (org_id, contact_id);

CREATE TABLE channels (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    kind            TEXT NOT NULL CHECK (kind IN ('whatsapp', 'email', 'sms')),
    provider        TEXT NOT NULL
                    CHECK (provider IN ('evolution', 'meta', 'smtp', 'resend', 'twilio', 'zenvia', 'sandbox')),
    name            TEXT NOT NULL,
    credentials     BLOB,
    key_version     INTEGER,
    settings        TEXT NOT NULL DEFAULT '{}',
    status          TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled', 'broken')),
    status_detail   TEXT,
    is_default      BOOLEAN NOT NULL DEFAULT FALSE,
    min_interval_ms INTEGER,
    daily_cap       INTEGER,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);
CREATE INDEX channels_org_kind ON channels (org_id, kind);
CREATE UNIQUE INDEX channels_one_default ON channels (org_id, kind) WHERE is_default;

-- org_id NULL rows are the global defaults every org inherits until it overrides them.
CREATE TABLE templates (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT REFERENCES orgs(id),
    key             TEXT NOT NULL,
    channel_kind    TEXT NOT NULL CHECK (channel_kind IN ('whatsapp', 'email', 'sms')),
    locale          TEXT NOT NULL DEFAULT 'pt_BR',
    subject         TEXT,
    body            TEXT NOT NULL,
    body_html       TEXT,
    meta_template_name TEXT,
    meta_language   TEXT,
    meta_parameters TEXT,
    updated_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX templates_org_override ON templates (org_id, key, channel_kind, locale) WHERE org_id IS NOT NULL;
CREATE UNIQUE INDEX templates_global ON templates (key, channel_kind, locale) WHERE org_id IS NULL;

CREATE TABLE reminder_rules (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    name            TEXT NOT NULL,
    purpose         TEXT NOT NULL,
    template_key    TEXT NOT NULL,
    trigger         TEXT NOT NULL CHECK (trigger IN ('before_start', 'after_start', 'on_create', 'on_cancel')),
    offset_minutes  INTEGER NOT NULL DEFAULT 0,
    respect_window  BOOLEAN NOT NULL DEFAULT TRUE,
    active          BOOLEAN NOT NULL DEFAULT TRUE,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);
CREATE INDEX reminder_rules_org ON reminder_rules (org_id) WHERE active;

-- Channel kinds of a rule in order of preference (position 0 first).
CREATE TABLE reminder_rule_kinds (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    rule_id         BIGINT NOT NULL REFERENCES reminder_rules(id) ON DELETE CASCADE,
    kind            TEXT NOT NULL CHECK (kind IN ('whatsapp', 'email', 'sms')),
    position        INTEGER NOT NULL
);
CREATE UNIQUE INDEX reminder_rule_kinds_rule_kind ON reminder_rule_kinds (rule_id, kind);

-- Follow-up flows: a pointer names the flow, versions are immutable, enrollments pin one.
CREATE TABLE flow_pointers (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    name            TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'active', 'disabled')),
    active_version_id BIGINT,
    draft_graph     TEXT NOT NULL DEFAULT '{"nodes": [], "edges": []}',
    handoff_policy  TEXT NOT NULL DEFAULT 'pause' CHECK (handoff_policy IN ('pause', 'cancel', 'allow')),
    cancel_on_reply BOOLEAN NOT NULL DEFAULT FALSE,
    trigger_config  TEXT NOT NULL DEFAULT '{}',
    max_steps       INTEGER NOT NULL DEFAULT 30,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX flow_pointers_org_name ON flow_pointers (org_id, name);

CREATE TABLE flow_versions (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    pointer_id      BIGINT NOT NULL REFERENCES flow_pointers(id),
    version         INTEGER NOT NULL,
    graph           TEXT NOT NULL,
    created_by      BIGINT REFERENCES users(id),
    created_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX flow_versions_pointer_version ON flow_versions (pointer_id, version);

CREATE TABLE enrollments (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    pointer_id      BIGINT NOT NULL REFERENCES flow_pointers(id),
    version_id      BIGINT NOT NULL REFERENCES flow_versions(id),
    contact_id      BIGINT NOT NULL REFERENCES contacts(id),
    appointment_id  BIGINT REFERENCES appointments(id),
    current_node_id TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'active'
                    CHECK (status IN ('active', 'waiting_reply', 'paused_handoff', 'completed', 'cancelled', 'dead')),
    next_eval_at    DATETIME,
    lease_until     DATETIME,
    attempts        INTEGER NOT NULL DEFAULT 0,
    max_attempts    INTEGER NOT NULL DEFAULT 5,
    steps           INTEGER NOT NULL DEFAULT 0,
    llm_calls       INTEGER NOT NULL DEFAULT 0,
    timing_plan     TEXT,
    last_error      TEXT,
    outcome         TEXT CHECK (outcome IN ('converted', 'replied', 'exhausted', 'opted_out', 'handoff', 'custom')),
    cancel_reason   TEXT,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX enrollments_one_live ON enrollments (pointer_id, contact_id)
    WHERE status IN ('active', 'waiting_reply', 'paused_handoff');
CREATE INDEX enrollments_due ON enrollments (next_eval_at) WHERE status IN ('active', 'waiting_reply');
CREATE INDEX enrollments_org_contact ON enrollments (org_id, contact_id);

CREATE TABLE enrollment_events (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    enrollment_id   BIGINT NOT NULL REFERENCES enrollments(id),
    node_id         TEXT,
    event_type      TEXT NOT NULL,
    payload         TEXT,
    idempotency_key TEXT NOT NULL,
    created_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX enrollment_events_idem ON enrollment_events (enrollment_id, idempotency_key);

CREATE TABLE agents (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    name            TEXT NOT NULL,
    persona         TEXT,
    llm_base_url    TEXT,
    llm_model       TEXT,
    llm_api_key     BLOB,
    key_version     INTEGER,
    handoff_policy  TEXT NOT NULL DEFAULT 'pause' CHECK (handoff_policy IN ('pause', 'cancel', 'allow')),
    followup_enabled BOOLEAN NOT NULL DEFAULT FALSE,
    flow_pointer_ids TEXT NOT NULL DEFAULT '[]',
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);
CREATE INDEX agents_org ON agents (org_id);

-- The outbox and the queue in one table: every send of every purpose is a row here.
CREATE TABLE messages (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    purpose         TEXT NOT NULL,
    contact_id      BIGINT NOT NULL REFERENCES contacts(id),
    channel_kind    TEXT NOT NULL CHECK (channel_kind IN ('whatsapp', 'email', 'sms')),
    channel_id      BIGINT REFERENCES channels(id),
    appointment_id  BIGINT REFERENCES appointments(id),
    appointment_starts_at DATETIME,
    enrollment_id   BIGINT REFERENCES enrollments(id),
    rule_id         BIGINT REFERENCES reminder_rules(id),
    template_key    TEXT,
    respect_window  BOOLEAN NOT NULL DEFAULT TRUE,
    payload         TEXT,
    idempotency_key TEXT NOT NULL,
    status          TEXT NOT NULL
                    CHECK (status IN ('new', 'pending', 'claimed', 'sending', 'sent', 'delivered', 'read',
                                      'failed', 'unknown', 'cancelled', 'expired', 'dead', 'skipped')),
    nominal_due_at  DATETIME,
    due_at          DATETIME,
    next_attempt_at DATETIME,
    expires_at      DATETIME,
    attempts        INTEGER NOT NULL DEFAULT 0,
    lease_until     DATETIME,
    claimed_by      TEXT,
    provider_message_id TEXT,
    subject         TEXT,
    body            TEXT,
    error_code      TEXT,
    error_detail    TEXT,
    skip_reason     TEXT,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL,
    sent_at         DATETIME,
    delivered_at    DATETIME,
    read_at         DATETIME,
    failed_at       DATETIME
);
CREATE UNIQUE INDEX messages_org_idempotency ON messages (org_id, idempotency_key);
CREATE INDEX messages_due ON messages (next_attempt_at) WHERE status = 'pending';
CREATE INDEX messages_leased ON messages (lease_until) WHERE status IN ('claimed', 'sending');
CREATE INDEX messages_new ON messages (id) WHERE status = 'new';
CREATE INDEX messages_org_contact_status ON messages (org_id, contact_id, status);
CREATE INDEX messages_org_appointment ON messages (org_id, appointment_id);
CREATE INDEX messages_org_created ON messages (org_id, created_at);
CREATE INDEX messages_provider_id ON messages (channel_id, provider_message_id) WHERE provider_message_id IS NOT NULL;

-- Append-only history of every transition of a message.
CREATE TABLE message_events (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    message_id      BIGINT NOT NULL REFERENCES messages(id),
    event           TEXT NOT NULL,
    attempt         INTEGER,
    provider_status TEXT,
    detail          TEXT,
    created_at      DATETIME NOT NULL
);
CREATE INDEX message_events_message ON message_events (message_id);
CREATE INDEX message_events_org_created ON message_events (org_id, created_at);

CREATE TABLE inbound_messages (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    channel_id      BIGINT NOT NULL REFERENCES channels(id),
    provider_message_id TEXT NOT NULL,
    contact_id      BIGINT REFERENCES contacts(id),
    from_address    TEXT,
    text            TEXT,
    button_payload  TEXT,
    intent          TEXT,
    in_reply_to     TEXT,
    received_at     DATETIME NOT NULL,
    processed_at    DATETIME,
    outcome         TEXT
);
CREATE UNIQUE INDEX inbound_channel_provider_id ON inbound_messages (channel_id, provider_message_id);
CREATE INDEX inbound_org_contact ON inbound_messages (org_id, contact_id, received_at);

-- What the sandbox provider "sent": it records instead of sending. No unique key on purpose,
-- so a double send would show up as two rows.
CREATE TABLE sandbox_messages (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    channel_id      BIGINT NOT NULL REFERENCES channels(id),
    provider_message_id TEXT NOT NULL,
    idempotency_key TEXT,
    to_address      TEXT NOT NULL,
    subject         TEXT,
    body            TEXT,
    buttons         TEXT,
    created_at      DATETIME NOT NULL
);
CREATE INDEX sandbox_messages_org_created ON sandbox_messages (org_id, created_at);
CREATE INDEX sandbox_messages_idempotency ON sandbox_messages (org_id, idempotency_key);

-- Things an operator must look at: dead or unknown-outcome messages, patient cancellations,
-- broken channels, dead enrollments.
CREATE TABLE inbox_items (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    kind            TEXT NOT NULL,
    message_id      BIGINT REFERENCES messages(id),
    appointment_id  BIGINT REFERENCES appointments(id),
    enrollment_id   BIGINT REFERENCES enrollments(id),
    channel_id      BIGINT REFERENCES channels(id),
    detail          TEXT,
    dedupe_key      TEXT NOT NULL,
    created_at      DATETIME NOT NULL,
    resolved_at     DATETIME,
    resolved_by     BIGINT REFERENCES users(id)
);
CREATE UNIQUE INDEX inbox_items_dedupe ON inbox_items (org_id, dedupe_key);
CREATE INDEX inbox_items_open ON inbox_items (org_id, created_at) WHERE resolved_at IS NULL;

CREATE TABLE audit_log (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    user_id         BIGINT REFERENCES users(id),
    api_key_id      BIGINT REFERENCES api_keys(id),
    action          TEXT NOT NULL,
    entity          TEXT NOT NULL,
    entity_id       BIGINT,
    changes         TEXT,
    created_at      DATETIME NOT NULL
);
CREATE INDEX audit_log_org_created ON audit_log (org_id, created_at);
