-- The clinic's own phone (engine/messaging/clinic_phone.py): a message the clinic's number sent
-- from its phone or WhatsApp Web is stored with the conversation's messages, flagged `from_me`,
-- and hands the conversation to the staff. The hand-off ends after `orgs.staff_quiet_minutes`
-- without another such message (0: only a person ends it); `quiet_until` is that moment, kept on
-- the contact's latest staff message alone.
ALTER TABLE inbound_messages ADD COLUMN from_me BOOLEAN NOT NULL DEFAULT 0;
ALTER TABLE inbound_messages ADD COLUMN quiet_until DATETIME;
CREATE INDEX inbound_messages_quiet_until ON inbound_messages (quiet_until) WHERE quiet_until IS NOT NULL;
ALTER TABLE orgs ADD COLUMN staff_quiet_minutes INTEGER NOT NULL DEFAULT 30
    CHECK (staff_quiet_minutes BETWEEN 0 AND 1440);
