-- Console language per user; NULL follows the org's locale (pt_BR by default).
-- depends: 0005.api

ALTER TABLE users ADD COLUMN locale TEXT CHECK (locale IN ('pt_BR', 'en'));
