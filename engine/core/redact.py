"""Redaction of provider payloads before they are kept for audit: the structure, ids, statuses
and error codes stay; phone numbers, names, e-mail addresses and message text go."""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"
#: Keys whose values are personal data in the providers' payloads, whatever they look like.
PII_KEYS = frozenset({
    "text", "body", "caption", "conversation", "from", "to", "phone", "wa_id", "recipient_id", "name",
    "profile", "pushname", "pushName", "remotejid", "remoteJid", "participant", "sender", "senderpn",
    "senderPn", "remoteJidAlt", "email", "subject", "display_phone_number", "contacts", "title",
    "description", "message", "number", "owner", "jid", "address", "ProfileName", "From", "To", "Body",
    "WaId", "AccountSid", "contents", "html", "headers",
})
_LOOKS_PERSONAL = re.compile(r"@|\d{8,}|\s")


def redact(value: Any, key: str | None = None) -> Any:
    """A copy of a JSON-like value with personal data replaced by '[redacted]'."""
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if key is not None and (key in PII_KEYS or key.lower() in PII_KEYS):
        return REDACTED if value not in (None, "") else value
    if isinstance(value, str) and (len(value) > 80 or _LOOKS_PERSONAL.search(value)):
        # Ids and statuses are short single tokens; anything else may be somebody's words.
        return REDACTED
    return value
