-- The scheduler's periodic populate pass looks only at what changed since its previous pass:
-- appointments changed or entering the horizon, and those whose contact or consent changed.
-- These indexes let it find them without reading every appointment of the org.
-- depends: 0015.early-statuses

CREATE INDEX appointments_org_updated ON appointments (org_id, updated_at);
CREATE INDEX appointments_org_starts ON appointments (org_id, starts_at);
CREATE INDEX contacts_org_updated ON contacts (org_id, updated_at);
CREATE INDEX preferences_org_updated ON preferences (org_id, updated_at);
