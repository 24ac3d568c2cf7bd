-- The built-in agenda: professionals, their weekly hours and the org's availability webhook, from
-- which free times are offered (engine/people/agenda/, docs/agenda.md).
-- depends: 0020.enrollment-claim-started

-- A professional whose hours make the free times; `slot_minutes` is the length of one slot and
-- of one appointment with them. The name is unique per org: an appointment that only carries the
-- text `appointments.professional` is matched to a professional by it.
CREATE TABLE professionals (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    name            TEXT NOT NULL,
    slot_minutes    INTEGER NOT NULL DEFAULT 30 CHECK (slot_minutes BETWEEN 5 AND 480),
    active          BOOLEAN NOT NULL DEFAULT TRUE,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL
);
CREATE UNIQUE INDEX professionals_org_name ON professionals (org_id, name);

-- One interval of a weekday (0 = Monday … 6 = Sunday) in the org's wall-clock time, 'HH:MM';
-- several intervals a day make breaks (08:00–12:00 and 13:00–18:00: lunch at 12:00).
CREATE TABLE professional_hours (
    id              INTEGER PRIMARY KEY,
    org_id          BIGINT NOT NULL REFERENCES orgs(id),
    professional_id BIGINT NOT NULL REFERENCES professionals(id),
    weekday         INTEGER NOT NULL CHECK (weekday BETWEEN 0 AND 6),
    starts          TEXT NOT NULL,
    ends            TEXT NOT NULL,
    CHECK (starts < ends)
);
CREATE INDEX professional_hours_professional ON professional_hours (org_id, professional_id, weekday);

-- Who the appointment is with, when known; the text `professional` stays for display and imports.
ALTER TABLE appointments ADD COLUMN professional_id BIGINT REFERENCES professionals(id);
-- "What does this professional have booked between these days?" is asked for every slot search.
CREATE INDEX appointments_professional_starts ON appointments (org_id, professional_id, starts_at)
    WHERE professional_id IS NOT NULL;

-- When set, free times come from the clinic's own system (GET with the constraints, JSON slots
-- back) instead of the built-in agenda.
ALTER TABLE orgs ADD COLUMN availability_url TEXT;
