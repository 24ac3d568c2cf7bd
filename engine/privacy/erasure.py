"""Erasure of one contact (LGPD art. 18, VI; issue 9 point 13): the person is anonymised
everywhere, nothing more is sent to them, and what is left is a tombstone and the counts.

`erase_contact` runs in the caller's transaction (the console, `DELETE /api/v1/contacts/<id>`,
`lembra contacts erase`) and:

- cancels every message not sent yet and ends every live follow-up run (`contact_erased`);
- removes the name, phone, e-mail and language from the contact, which keeps `erased_at`,
  `erased_by` (who: `user:ID`, `api_key:ID`, `cli:NAME`) and its external id: the clinic's own
  reference, so an import or the API cannot create the erased person again under it;
- removes the text of every message to them (the rows, their statuses and timestamps stay, so
  every count stays), the text and sender of every reply from them, the sandbox's copies of what
  was sent to them, the run data their follow-ups kept, and the values in the audit trail's
  details about them (which fields changed, by whom and when stay);
- keeps their refusals (`address_optouts`) recognisable without their address: an address no
  other live contact of the org carries is kept only as a keyed hash (engine/queue/address_optouts.py).

The consent record of the tombstone (`preferences`: kinds, dates, sources) stays as evidence.
Other contacts on the same phone (a family) keep their own data and messages.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError
from engine.flows.lifecycle import end_live
from engine.store.models import (
    audit_log,
    contacts,
    enrollments,
    inbound_messages,
    messages,
    sandbox_messages,
)
from engine.queue.outbox import cancel_open
from engine.queue import address_optouts as addresses
from engine.privacy.retention import anonymise_messages
from gateway.crypto import Keyring

REASON = "contact_erased"
#: What an erased value in the audit trail becomes.
ERASED = "[erased]"
#: Audit entities that name a contact, and those that name one of its messages.
CONTACT_ENTITIES = ("contact", "contacts")
MESSAGE_ENTITIES = ("message", "messages")
#: Keys of a message's audit details that carry what was written to the patient.
MESSAGE_TEXT_KEYS = ("text", "subject", "body")


class ContactNotFound(DomainError):
    """No such contact in the org (or it was erased already)."""


@dataclass
class Erased:
    """What one erasure did: the tombstone and counts (no personal data)."""

    contact_id: int
    erased_at: datetime
    erased_by: str
    messages_cancelled: int = 0
    enrollments_ended: int = 0
    messages_anonymised: int = 0
    replies_anonymised: int = 0
    sandbox_anonymised: int = 0
    audit_scrubbed: int = 0
    addresses_hashed: int = 0

    def counts(self) -> dict[str, Any]:
        out = asdict(self)
        out["erased_at"] = self.erased_at.isoformat()
        return out


def live_contact(conn: Connection, org_id: int, contact_id: int) -> Any:
    """The org's contact that is not erased; ContactNotFound otherwise."""
    query = select(contacts).where(contacts.c.org_id == org_id, contacts.c.id == contact_id,
                                   contacts.c.erased_at.is_(None))
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    row = conn.execute(query).first()
    if row is None:
        raise ContactNotFound("no such contact")
    return row


def preview(conn: Connection, org_id: int, contact_id: int) -> dict[str, int]:
    """What an erasure would do, for a confirmation page (counts only)."""
    from sqlalchemy import func

    from engine.flows.lifecycle import LIVE
    from engine.store.models import OPEN_STATUSES

    live_contact(conn, org_id, contact_id)
    count = lambda table, *where: int(conn.execute(
        select(func.count()).select_from(table).where(table.c.org_id == org_id, *where)).scalar_one())
    return {
        "messages": count(messages, messages.c.contact_id == contact_id),
        "messages_to_cancel": count(messages, messages.c.contact_id == contact_id,
                                    messages.c.status.in_(OPEN_STATUSES)),
        "enrollments_to_end": count(enrollments, enrollments.c.contact_id == contact_id,
                                    enrollments.c.status.in_(LIVE)),
        "replies": count(inbound_messages, inbound_messages.c.contact_id == contact_id),
        "sharing_phone": len(addresses.sharing_phone(conn, org_id, contact_id)),
    }


def erase_contact(conn: Connection, org_id: int, contact_id: int, *, by: str, keyring: Keyring) -> Erased:
    """Erase one contact of the org, in the caller's transaction; see the module doc."""
    contact = live_contact(conn, org_id, contact_id)
    now = clock.now()
    result = Erased(contact_id=contact_id, erased_at=now, erased_by=by[:200])
    mine = messages.c.contact_id == contact_id
    # 1. Nothing more goes out: open messages, then live runs (and their follow-ups).
    result.messages_cancelled = len(cancel_open(conn, org_id, mine, REASON))
    result.enrollments_ended = len(end_live(conn, org_id, enrollments.c.contact_id == contact_id,
                                            status="cancelled", outcome="opted_out", reason=REASON))
    conn.execute(update(enrollments).where(enrollments.c.org_id == org_id, enrollments.c.contact_id == contact_id)
                 .values(trigger_payload=None, last_error=None, timing_plan=None))
    # 2. What was written to them, and the sandbox's copies of it.
    sent = conn.execute(select(messages.c.idempotency_key, messages.c.provider_message_id)
                        .where(messages.c.org_id == org_id, mine)).all()
    keys = [row.idempotency_key for row in sent]
    provider_ids = [row.provider_message_id for row in sent if row.provider_message_id]
    result.messages_anonymised = anonymise_messages(conn, org_id, mine)
    for start in range(0, max(len(keys), len(provider_ids)), 500):
        clauses = []
        if keys[start:start + 500]:
            clauses.append(sandbox_messages.c.idempotency_key.in_(keys[start:start + 500]))
        if provider_ids[start:start + 500]:
            clauses.append(sandbox_messages.c.provider_message_id.in_(provider_ids[start:start + 500]))
        result.sandbox_anonymised += conn.execute(
            update(sandbox_messages).where(sandbox_messages.c.org_id == org_id, or_(*clauses))
            .values(to_address="", subject=None, body=None, buttons=None)).rowcount
    # 3. What they wrote: replies linked to them, and those from their number before they were a contact.
    found = addresses.addresses_of(contact.phone, contact.email)
    reply_ids = set(conn.execute(select(inbound_messages.c.id).where(
        inbound_messages.c.org_id == org_id, inbound_messages.c.contact_id == contact_id)).scalars())
    reply_ids |= _unlinked_replies(conn, org_id, contact_id, found)
    if reply_ids:
        ids = sorted(reply_ids)
        for start in range(0, len(ids), 500):
            conn.execute(update(inbound_messages).where(inbound_messages.c.org_id == org_id,
                                                        inbound_messages.c.id.in_(ids[start:start + 500]))
                         .values(text=None, from_address=None, button_payload=None, audio=None))
    result.replies_anonymised = len(reply_ids)
    # 4. The audit trail keeps who did what and when, not the values.
    result.audit_scrubbed = _scrub_audit(conn, org_id, contact_id)
    # 5. Their refusals stay recognisable; the address of a person no one else is, goes.
    result.addresses_hashed = addresses.pseudonymise(conn, keyring, org_id, contact_id, found)
    # 6. The tombstone.
    conn.execute(update(contacts).where(contacts.c.org_id == org_id, contacts.c.id == contact_id).values(
        name=None, phone=None, email=None, locale=None, erased_at=now, erased_by=result.erased_by, updated_at=now))
    return result


def _unlinked_replies(conn: Connection, org_id: int, contact_id: int, found: list[addresses.Address]) -> set[int]:
    """Replies never linked to a contact (they came before the contact existed) from an address
    of this one that no other live contact carries."""
    out: set[int] = set()
    for address in found:
        if addresses.carried_by_others(conn, org_id, address, contact_id):
            continue
        akind, value = address
        # A cheap pre-filter on the raw sender (a phone arrives in many spellings), then the exact test.
        needle = value if akind == "email" else value[-8:]
        rows = conn.execute(select(inbound_messages.c.id, inbound_messages.c.from_address).where(
            inbound_messages.c.org_id == org_id, inbound_messages.c.contact_id.is_(None),
            inbound_messages.c.from_address.like(f"%{needle}%"))).all()
        out |= {row.id for row in rows if addresses.parse_address(row.from_address) == address}
    return out


def _scrub_audit(conn: Connection, org_id: int, contact_id: int) -> int:
    message_ids = list(conn.execute(select(messages.c.id).where(
        messages.c.org_id == org_id, messages.c.contact_id == contact_id)).scalars())
    about = and_(audit_log.c.entity.in_(CONTACT_ENTITIES), audit_log.c.entity_id == contact_id)
    if message_ids:
        about = or_(about, and_(audit_log.c.entity.in_(MESSAGE_ENTITIES), audit_log.c.entity_id.in_(message_ids)))
    scrubbed = 0
    for row in conn.execute(select(audit_log.c.id, audit_log.c.entity, audit_log.c.changes)
                            .where(audit_log.c.org_id == org_id, about)).all():
        if not isinstance(row.changes, dict) or not row.changes:
            continue
        if row.entity in CONTACT_ENTITIES:
            changes = {key: ERASED for key in row.changes}
        else:
            changes = {key: (ERASED if key in MESSAGE_TEXT_KEYS else value) for key, value in row.changes.items()}
        if changes != row.changes:
            conn.execute(update(audit_log).where(audit_log.c.org_id == org_id, audit_log.c.id == row.id)
                         .values(changes=changes))
            scrubbed += 1
    return scrubbed
