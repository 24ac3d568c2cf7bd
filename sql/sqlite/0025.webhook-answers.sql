-- Outbound webhooks (issue 33): the console shows what the clinic's system answered to the last
-- attempt of each delivery, and "Reenviar" sends the same delivery again (same `webhook_id`, so the
-- receiver's dedupe still holds) instead of writing a new one.

-- The receiver's answer to the last attempt: its HTTP reason phrase and the first 2,000 characters
-- of its body, as text with control characters taken out (engine/tenants/webhooks/delivery.py),
-- and how long the attempt took. The clinic's own system's words, shown only to the org's admins
-- on its deliveries; never logged. NULL when no answer came (a timeout, a refused connection).
ALTER TABLE webhook_deliveries ADD COLUMN last_response_reason TEXT;
ALTER TABLE webhook_deliveries ADD COLUMN last_response_body TEXT;
ALTER TABLE webhook_deliveries ADD COLUMN last_duration_ms INTEGER;

-- A person's "Reenviar" puts the delivery back in the queue with a fresh round of retries:
-- `resend_base` is how many attempts came before it (the backoff counts from there), `resent_at`
-- when it was asked for.
ALTER TABLE webhook_deliveries ADD COLUMN resend_base INTEGER NOT NULL DEFAULT 0;
ALTER TABLE webhook_deliveries ADD COLUMN resent_at DATETIME;
