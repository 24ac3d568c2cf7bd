-- A provider's replay of a delivery (the same bytes to the same channel) adds no webhook_events
-- row: the SHA-256 of the raw body is unique per channel (issue 9, point 10). Rows logged before
-- this have no hash (NULL), which the unique index lets be.
-- depends: 0009.session-generation

ALTER TABLE webhook_events ADD COLUMN body_sha256 TEXT;
CREATE UNIQUE INDEX webhook_events_delivery ON webhook_events (channel_id, body_sha256);
