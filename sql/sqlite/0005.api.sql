-- REST API: hand-off and stage events sent by a clinic's software for the follow-up engine.
-- depends: 0004.pacing-and-webhook-log

CREATE TABLE contact_events (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    contact_id      BIGINT NOT NULL REFERENCES contacts(id),
    type            TEXT NOT NULL,
    payload         TEXT,
    created_at      DATETIME NOT NULL
);
CREATE INDEX contact_events_org_contact ON contact_events (org_id, contact_id, id);
