-- Console sessions carry the user's session generation; signing out, a password change or a
-- deactivation bumps it, and every cookie signed with an older one stops working.
-- depends: 0008.follow-up-templates

ALTER TABLE users ADD COLUMN session_generation INTEGER NOT NULL DEFAULT 0;
