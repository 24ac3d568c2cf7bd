-- Fleet-wide send pacing per channel (Evolution: minimum interval with jitter and a daily cap),
-- and the redacted log of every accepted webhook delivery.
-- depends: 0002.default-templates

CREATE TABLE channel_pacing (
    channel_id      INTEGER PRIMARY KEY REFERENCES channels(id),
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    next_slot_at    DATETIME NOT NULL,
    day             TEXT NOT NULL,
    sent_today      INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE webhook_events (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    channel_id      BIGINT NOT NULL REFERENCES channels(id),
    provider        TEXT NOT NULL,
    events          INTEGER NOT NULL,
    body            TEXT,
    received_at     DATETIME NOT NULL
);
CREATE INDEX webhook_events_org_received ON webhook_events (org_id, received_at);
