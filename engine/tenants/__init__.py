"""The clinics: orgs and their users, channels and their credentials, API keys, and the audit trail of what was done."""
