"""What both email providers share: checking the message, the HTML fallback, the MIME build.

Nothing here logs or puts an address, a name or a body in an exception message: errors carry
codes only.
"""

from __future__ import annotations

import hashlib
import html
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from email import policy
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from typing import Any, Mapping

from gateway.contract import OutboundMessage
from gateway.errors import PermanentError

#: Headers the provider writes itself; `OutboundMessage.headers` may not replace them.
RESERVED_HEADERS = frozenset({
    "from", "to", "cc", "bcc", "subject", "message-id", "date", "sender", "return-path",
    "mime-version", "content-type", "content-transfer-encoding", "content-disposition",
})
#: RFC 5322 field name: printable US-ASCII except ':' (and we also refuse space).
_FIELD_NAME = re.compile(r"^[!-9;-~]{1,76}$")


@dataclass(frozen=True)
class EmailParts:
    """A checked, normalised message: what either provider puts on the wire."""

    to: str
    subject: str
    text: str
    html: str
    headers: dict[str, str]


def text_to_html(text: str) -> str:
    """A minimal, safe HTML rendering of a plain-text body: escaped, newlines as <br>."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    body = "<br>\n".join(html.escape(line, quote=True) for line in lines)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"></head>\n'
        f'<body><div style="font-family:sans-serif;white-space:normal">{body}</div></body></html>\n'
    )


def _config_str(config: Mapping[str, Any], key: str) -> str | None:
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        value = str(value)
    value = value.strip()
    return value or None


def sender(config: Mapping[str, Any]) -> tuple[str, str | None]:
    """(`from_email`, `from_name`) from the channel config; a missing/invalid address breaks the channel."""
    from_email = _config_str(config, "from_email")
    if from_email is None:
        raise PermanentError("from_email is not configured", code="config_missing", channel_broken=True)
    try:
        address = Address(addr_spec=from_email)
    except (ValueError, TypeError, IndexError):
        raise PermanentError("from_email is not a valid address", code="config_invalid", channel_broken=True) from None
    if not address.username or not address.domain:
        raise PermanentError("from_email is not a valid address", code="config_invalid", channel_broken=True)
    from_email = f"{address.username}@{ascii_domain(address.domain, code='config_invalid')}"
    name = _config_str(config, "from_name")
    if name is not None and any(c in name for c in "\r\n\0"):
        raise PermanentError("from_name has a line break", code="config_invalid", channel_broken=True)
    return from_email, name


def sender_domain(from_email: str) -> str:
    """The domain part of the sender address (for Message-ID and EHLO)."""
    return from_email.rpartition("@")[2] or "localhost"


def check_recipient(to: str) -> str:
    """The recipient as one bare addr-spec; PermanentError('invalid_address') otherwise."""
    if not isinstance(to, str):
        raise PermanentError("recipient is not an e-mail address", code="invalid_address")
    to = to.strip()
    if not to or "@" not in to or any(c in to for c in "\r\n\0,;<>\"") or any(c.isspace() for c in to):
        raise PermanentError("recipient is not an e-mail address", code="invalid_address")
    try:
        address = Address(addr_spec=to)
    except (ValueError, TypeError, IndexError):
        raise PermanentError("recipient is not an e-mail address", code="invalid_address") from None
    if not address.username or not address.domain or "." not in address.domain.strip("."):
        raise PermanentError("recipient is not an e-mail address", code="invalid_address")
    return f"{address.username}@{ascii_domain(address.domain, code='invalid_address')}"


def ascii_domain(domain: str, *, code: str) -> str:
    """An internationalised domain in its ASCII (IDNA) form, so no relay needs SMTPUTF8.
    (Non-ASCII local parts are refused by the address parser: they would need SMTPUTF8.)"""
    if domain.isascii():
        return domain
    try:
        return domain.encode("idna").decode("ascii")
    except UnicodeError:
        raise PermanentError("domain cannot be written in ASCII", code=code) from None


def check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Extra headers (List-Unsubscribe & co.), refusing header injection and reserved names."""
    checked: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not _FIELD_NAME.fullmatch(name):
            raise PermanentError("extra header has an invalid name", code="bad_header")
        if name.lower() in RESERVED_HEADERS:
            raise PermanentError("extra header would replace a reserved header", code="bad_header")
        if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            raise PermanentError("extra header has an invalid value", code="bad_header")
        if len(name) + 2 + len(value) > 998:  # RFC 5322 §2.1.1 line limit
            raise PermanentError("extra header is too long", code="bad_header")
        checked[name] = value
    return checked


def prepare(message: OutboundMessage) -> EmailParts:
    """Check and normalise a message for email: subject required, HTML part always present."""
    subject = message.subject if isinstance(message.subject, str) else ""
    subject = " ".join(subject.split())  # a rendered subject must not smuggle a line break
    if not subject:
        raise PermanentError("an email needs a subject", code="no_subject")
    text = message.text if isinstance(message.text, str) else ""
    if not text.strip():
        raise PermanentError("an email needs a text body", code="no_text")
    html_body = message.html if isinstance(message.html, str) and message.html.strip() else text_to_html(text)
    return EmailParts(
        to=check_recipient(message.to),
        subject=subject,
        text=text,
        html=html_body,
        headers=check_headers(message.headers),
    )


def message_id(domain: str, *, idempotency_key: str | None, scope: str) -> str:
    """A Message-ID, with angle brackets. Derived from the idempotency key when there is one, so a
    retried send carries the same Message-ID (receivers may then drop the duplicate; not guaranteed)."""
    if idempotency_key:
        digest = hashlib.sha256(f"{scope}:{idempotency_key}".encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return f"<lembra.{digest}@{domain}>"
    return make_msgid(idstring="lembra", domain=domain)


#: Serialisation policy: structured headers are folded as usual; headers stored raw stay verbatim.
#: 7bit: bodies go quoted-printable/base64, so no relay needs 8BITMIME.
BUILD_POLICY = policy.SMTP.clone(cte_type="7bit")
WIRE_POLICY = BUILD_POLICY.clone(refold_source="none")


def build_mime(
    parts: EmailParts,
    *,
    from_email: str,
    from_name: str | None,
    msg_id: str,
    now: datetime | None = None,
) -> EmailMessage:
    """multipart/alternative with the text part first and the HTML part last (the preferred one)."""
    email = EmailMessage(policy=BUILD_POLICY)
    try:
        email["From"] = Address(display_name=from_name or "", addr_spec=from_email)
        email["To"] = Address(addr_spec=parts.to)
    except (ValueError, TypeError, IndexError):
        raise PermanentError("address cannot be written in a header", code="invalid_address") from None
    email["Subject"] = parts.subject
    email["Date"] = format_datetime(now or datetime.now(timezone.utc))
    email["Message-ID"] = msg_id
    for name, value in parts.headers.items():
        if value.isascii():
            # Verbatim: the default folding would turn a long List-Unsubscribe URL into RFC 2047
            # encoded-words, which receivers do not decode in that header (RFC 2369 / 8058).
            email.set_raw(name, value)
        else:
            email[name] = value
    email.set_content(parts.text, subtype="plain", charset="utf-8")
    email.add_alternative(parts.html, subtype="html", charset="utf-8")
    return email


def to_bytes(email: EmailMessage) -> bytes:
    """The message as it goes on the wire (CRLF line ends)."""
    return email.as_bytes(policy=WIRE_POLICY)
