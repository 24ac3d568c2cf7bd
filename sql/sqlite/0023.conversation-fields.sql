-- Conversation fields (engine/flows/conversation/fields.py): what an org's flows may ask a patient
-- for (a date, a period of the day, a choice…), declared once per org. `harvest` says whether a
-- value is taken from any reply or only from the answer to the field's own question (a boolean's
-- stray "sim" must never open a gate). The values a run collects live on the run (enrollments.data).
-- depends: 0022.outbound-webhooks

CREATE TABLE conversation_fields (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    slug            TEXT NOT NULL,
    label           TEXT NOT NULL,
    type            TEXT NOT NULL CHECK (type IN ('text', 'number', 'date', 'time', 'period', 'boolean',
                                                  'choice', 'phone', 'email')),
    options         TEXT NOT NULL DEFAULT '[]',
    question        TEXT NOT NULL,
    template_key    TEXT,
    harvest         TEXT NOT NULL CHECK (harvest IN ('any_reply', 'when_asked')),
    maps_to         TEXT,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX conversation_fields_org_slug ON conversation_fields (org_id, slug);

ALTER TABLE enrollments ADD COLUMN data TEXT NOT NULL DEFAULT '{}';
-- Where an `ask` node is in its conversation: the field it asked for, how often it asked each.
ALTER TABLE enrollments ADD COLUMN ask_state TEXT;
-- A patient's messages that arrive within this many seconds of each other are read as one turn.
ALTER TABLE orgs ADD COLUMN reply_debounce_seconds INTEGER NOT NULL DEFAULT 8
    CHECK (reply_debounce_seconds BETWEEN 0 AND 120);
