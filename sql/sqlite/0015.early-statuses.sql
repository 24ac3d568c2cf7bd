-- A provider's status can arrive before Lembra has recorded the send it is about: a batch's
-- calls are settled together, after the slowest of them. Such a status waits here, keyed by
-- the provider's message id, until the send is recorded; the scheduler then applies it. Rows
-- never matched (statuses of messages sent from the phone itself) are dropped after a day.
-- depends: 0014.reminder-line-breaks

CREATE TABLE early_statuses (
    id                  INTEGER PRIMARY KEY,
    org_id              BIGINT NOT NULL REFERENCES orgs(id),
    channel_id          BIGINT NOT NULL REFERENCES channels(id),
    provider_message_id TEXT NOT NULL,
    status              TEXT NOT NULL,
    occurred_at         DATETIME NOT NULL,
    error_code          TEXT,
    error_permanent     BOOLEAN NOT NULL DEFAULT 1,
    opt_out             BOOLEAN NOT NULL DEFAULT 0,
    reference           TEXT,
    received_at         DATETIME NOT NULL
);
-- A replayed webhook parks nothing twice.
CREATE UNIQUE INDEX early_statuses_once ON early_statuses (channel_id, provider_message_id, status);
CREATE INDEX early_statuses_received ON early_statuses (received_at);
