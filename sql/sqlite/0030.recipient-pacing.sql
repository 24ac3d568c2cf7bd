-- Fleet-wide spacing of the messages to one recipient from one channel (Meta refuses more than
-- about one every 6 s to the same person, error 131056). The recipient is a keyed hash of the
-- address (engine/queue/recipient_pacing.py), never the number itself.

CREATE TABLE recipient_pacing (
    channel_id      BIGINT NOT NULL REFERENCES channels(id),
    recipient       TEXT NOT NULL,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    next_allowed_at DATETIME NOT NULL,
    taken_by        TEXT NOT NULL,
    PRIMARY KEY (channel_id, recipient)
);
CREATE INDEX recipient_pacing_next_allowed ON recipient_pacing (next_allowed_at);
