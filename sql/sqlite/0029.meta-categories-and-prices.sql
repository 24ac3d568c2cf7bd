-- Meta's categories and prices (issue 34).
--
-- What the WhatsApp Business Account (WABA) says of each of its templates: its category (UTILITY,
-- MARKETING, AUTHENTICATION) and its status (APPROVED, PENDING, REJECTED, PAUSED, DISABLED), and
-- when and why the last change came (`reason`: Meta's reason for a status, or the category it had
-- before). One row per channel × Meta name × language, not a column of `templates`: a global
-- default's mapping is shared by every clinic, while a category is the clinic's WABA's own.
-- Filled by the sync from the WABA's list and by the webhooks message_template_status_update and
-- template_category_update (engine/messaging/meta_categories.py).
CREATE TABLE meta_template_states (
    id                  INTEGER PRIMARY KEY,
    org_id              BIGINT NOT NULL REFERENCES orgs(id),
    channel_id          BIGINT NOT NULL REFERENCES channels(id),
    name                TEXT NOT NULL,
    language            TEXT NOT NULL,
    category            TEXT,
    status              TEXT,
    previous_category   TEXT,
    reason              TEXT,
    changed_at          DATETIME,
    updated_at          DATETIME NOT NULL
);
CREATE UNIQUE INDEX meta_template_states_key ON meta_template_states (org_id, channel_id, name, language);

-- Every Meta send records how Meta bills it: the category (the template's, or "service" for the
-- free text Lembra sends inside the customer-service window), whether it fell inside that free
-- window, and the recipient's country (ISO 3166 alpha-2) that picks the rate.
ALTER TABLE messages ADD COLUMN price_category TEXT;
ALTER TABLE messages ADD COLUMN price_free BOOLEAN;
ALTER TABLE messages ADD COLUMN price_country TEXT;

-- Meta's 131050: the person stopped marketing messages from this business. Utility reminders
-- still go; a marketing template to the contact is refused before it is sent.
ALTER TABLE contacts ADD COLUMN marketing_opted_out_at DATETIME;
