-- The scheduler looks, once a minute, for patient messages stored but never acted on (a poke the
-- broker lost): a partial index keeps that look to the few rows still waiting.
-- depends: 0011.privacy

CREATE INDEX inbound_unprocessed ON inbound_messages (received_at) WHERE processed_at IS NULL;
