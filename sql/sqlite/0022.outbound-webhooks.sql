-- Outbound webhooks (issue 32): the clinic's own system hears about appointments confirmed,
-- cancelled, booked and moved, contacts that opted out and follow-up runs that ended
-- (engine/tenants/webhooks, docs/webhooks.md).
-- depends: 0021.agenda

-- Where an org's events go. `secret` is the endpoint's signing secret (`whsec_…`), sealed with the
-- credential keyring for this row like a channel's credentials (gateway/crypto.py): shown once
-- when made or rotated, never stored in the clear. `event_types` is the JSON list subscribed to.
CREATE TABLE webhook_endpoints (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    url             TEXT NOT NULL,
    description     TEXT,
    secret          BLOB,
    key_version     INTEGER,
    event_types     TEXT NOT NULL,
    active          BOOLEAN NOT NULL DEFAULT TRUE,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);
CREATE INDEX webhook_endpoints_org ON webhook_endpoints (org_id, active);

-- One row per event and subscribed endpoint, written in the transaction of the change it tells
-- about (an event exists if and only if its change committed), then delivered at least once:
-- the same `webhook_id` on every attempt, so the receiver can drop a repeat. A claim leases the
-- row (`lease_until`, `revision` bumped); the actor stamps `claim_started_at` as it begins, so a
-- lease that runs out tells a claim no worker took (back free) from an attempt cut short (counted,
-- retried after its backoff). `last_error` is a catalogue code, never a body.
CREATE TABLE webhook_deliveries (
    id               INTEGER PRIMARY KEY,
    org_id           BIGINT NOT NULL REFERENCES orgs(id),
    endpoint_id      BIGINT NOT NULL REFERENCES webhook_endpoints(id) ON DELETE CASCADE,
    event_type       TEXT NOT NULL,
    webhook_id       TEXT NOT NULL,
    payload          TEXT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  DATETIME,
    lease_until      DATETIME,
    claim_started_at DATETIME,
    revision         INTEGER NOT NULL DEFAULT 0,
    last_status_code INTEGER,
    last_error       TEXT,
    last_attempt_at  DATETIME,
    created_at       DATETIME NOT NULL,
    delivered_at     DATETIME
);
CREATE UNIQUE INDEX webhook_deliveries_webhook_id ON webhook_deliveries (webhook_id);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at, id)
    WHERE status = 'pending' AND lease_until IS NULL;
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (lease_until) WHERE lease_until IS NOT NULL;
CREATE INDEX webhook_deliveries_org_endpoint ON webhook_deliveries (org_id, endpoint_id, id);

