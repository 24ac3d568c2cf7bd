-- Privacy (LGPD): opt-outs that follow the person's address, retention settings and runs, the
-- erasure tombstone, and messages whose text retention has removed.
-- depends: 0010.webhook-dedupe

-- An opt-out blocks the address for the whole org, whatever contact row carries it. `value` is
-- the normalised phone (E.164) or e-mail while a live contact of the org carries it; once the
-- last one is erased only `value_hash` is kept: HMAC-SHA256 with a key derived from the
-- credential keyring (version `hash_version`), so the refusal is still recognised without
-- keeping the plain address of an erased person. One row per address x refused channel kind.
CREATE TABLE address_optouts (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    address_kind    TEXT NOT NULL CHECK (address_kind IN ('phone', 'email')),
    value           TEXT,
    value_hash      TEXT,
    hash_version    INTEGER,
    channel_kind    TEXT NOT NULL CHECK (channel_kind IN ('whatsapp', 'email', 'sms')),
    contact_id      BIGINT REFERENCES contacts(id),
    source          TEXT NOT NULL,
    evidence        TEXT,
    created_at      DATETIME NOT NULL,
    CHECK (value IS NOT NULL OR value_hash IS NOT NULL)
);
CREATE UNIQUE INDEX address_optouts_value ON address_optouts (org_id, address_kind, value, channel_kind)
    WHERE value IS NOT NULL;
CREATE UNIQUE INDEX address_optouts_hash ON address_optouts (org_id, address_kind, value_hash, channel_kind)
    WHERE value_hash IS NOT NULL;
CREATE INDEX address_optouts_org_contact ON address_optouts (org_id, contact_id);

-- Retention per org (SPEC §10): message texts, inbound bodies, sandbox copies and webhook bodies
-- go after `retention_queue_days`; rows and events after `retention_events_days`. The floor of
-- 31 days keeps every row the dashboard counts (its last 30 days).
ALTER TABLE orgs ADD COLUMN retention_queue_days INTEGER NOT NULL DEFAULT 90 CHECK (retention_queue_days >= 7);
ALTER TABLE orgs ADD COLUMN retention_events_days INTEGER NOT NULL DEFAULT 730 CHECK (retention_events_days >= 31);

-- One row per org and local day: the scheduler runs retention once a day per fleet.
CREATE TABLE retention_runs (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    day             TEXT NOT NULL,
    started_at      DATETIME NOT NULL,
    finished_at     DATETIME,
    counts          TEXT
);
CREATE UNIQUE INDEX retention_runs_org_day ON retention_runs (org_id, day);

-- Who erased a contact (`user:ID`, `api_key:ID`, `cli:NAME`); `erased_at` says when.
ALTER TABLE contacts ADD COLUMN erased_by TEXT;
-- When retention (or an erasure) removed a message's text; the row and its counts stay.
ALTER TABLE messages ADD COLUMN anonymised_at DATETIME;
CREATE INDEX inbound_org_received ON inbound_messages (org_id, received_at);
