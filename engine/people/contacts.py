"""Contacts and their consent: one preferences row per contact × channel kind. Opting out of a
kind blocks that kind; SAIR opts out of every kind and stops every flow."""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Sequence

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql import Select

from engine.core import clock
from engine.store.dialect import insert_ignore
from engine.core.errors import DomainError
from engine.core.hooks import Hook
from engine.store.models import CHANNEL_KINDS, contacts, messages, preferences
from engine.queue.outbox import cancel_open
from engine.queue import address_optouts as addresses
from engine.tenants.webhooks import events as webhooks
from gateway.phones import InvalidPhone, normalize_phone

#: How a patient can give consent at the clinic (`preferences.source` when the console records
#: it; `evidence` then names who recorded it, `user:ID`). The API writes `api`, the CSV import
#: `clinic` with the import as evidence.
CONSENT_METHODS = ("reception_verbal", "signed_form", "whatsapp", "phone_call")
#: Shortest run of digits in a search term that is also looked for in phone numbers.
PHONE_DIGITS_MIN = 2
#: A contact refused every channel kind: (conn, org_id, contact_ids). Their live follow-up runs
#: end, in the caller's transaction (engine.flows.replies).
opted_out_everywhere: Hook[Callable[[Connection, int, Sequence[int]], Any]] = Hook(
    "opted_out_everywhere", "engine.flows.replies")


class ExternalIdTaken(DomainError):
    """Another contact of the org already has that external id."""


def external_id_taken(conn: Connection, org_id: int, external_id: str, *, other_than: int | None = None) -> bool:
    """Whether another contact of the org has this external id. The clinic's system names one
    patient by it: a second row would make every upsert ambiguous (the unique index refuses it
    too, but as a database error, which the console would answer with a 500)."""
    query = select(contacts.c.id).where(contacts.c.org_id == org_id, contacts.c.external_id == external_id)
    if other_than is not None:
        query = query.where(contacts.c.id != other_than)
    return conn.execute(query.limit(1)).first() is not None


def create_contact(
    conn: Connection,
    *,
    org_id: int,
    name: str | None,
    phone: str | None = None,
    email: str | None = None,
    external_id: str | None = None,
    locale: str | None = None,
    consent: Iterable[str] = (),
    consent_source: str = "clinic",
    consent_evidence: str | None = None,
) -> int:
    """Create a contact (phone normalised to E.164) and record consent for the given kinds."""
    normalized = None
    if phone:
        try:
            normalized = normalize_phone(phone)
        except InvalidPhone:
            raise DomainError("phone is not a valid phone number") from None
    if email is not None and "@" not in email:
        raise DomainError("email is not a valid e-mail address")
    consent = tuple(consent)
    for kind in consent:  # validated before anything is written
        if kind not in CHANNEL_KINDS:
            raise DomainError(f"kind must be one of {', '.join(CHANNEL_KINDS)}")
    if external_id is not None and external_id_taken(conn, org_id, external_id):
        raise ExternalIdTaken("external_id is already used by another contact")
    now = clock.now()
    email = email.strip().lower() if email else None
    contact_id = int(conn.execute(
        insert(contacts).values(
            org_id=org_id, name=name, phone=normalized, email=email,
            external_id=external_id, locale=locale, created_at=now, updated_at=now,
        ).returning(contacts.c.id)
    ).scalar_one())
    for kind in consent:
        set_consent(conn, org_id, contact_id, kind, source=consent_source, evidence=consent_evidence)
    # An erased person's refusal of this address holds for the new contact too.
    addresses.recognise(conn, org_id, addresses.addresses_of(normalized, email))
    return contact_id


def set_consent(
    conn: Connection, org_id: int, contact_id: int, kind: str, *, source: str, evidence: str | None = None
) -> None:
    """Record that the contact agreed to receive messages of `kind` (clears an earlier opt-out,
    and the refusals of its addresses that this contact's opt-out made; another contact's
    refusal of the same phone or e-mail stands)."""
    if kind not in CHANNEL_KINDS:
        raise DomainError(f"kind must be one of {', '.join(CHANNEL_KINDS)}")
    now = clock.now()
    _ensure_rows(conn, org_id, contact_id, (kind,))
    refused_before = conn.execute(select(preferences.c.opted_out_at).where(
        preferences.c.org_id == org_id, preferences.c.contact_id == contact_id, preferences.c.kind == kind)).scalar()
    conn.execute(
        update(preferences)
        .where(preferences.c.org_id == org_id, preferences.c.contact_id == contact_id, preferences.c.kind == kind)
        .values(opted_in=True, opted_in_at=now, opted_out_at=None, source=source, evidence=evidence, updated_at=now)
    )
    if refused_before is not None:
        addresses.lift(conn, org_id, contact_id, kind)


def opt_out(
    conn: Connection,
    org_id: int,
    contact_id: int,
    *,
    kinds: Iterable[str] = CHANNEL_KINDS,
    source: str,
    evidence: str | None = None,
) -> list[int]:
    """Opt the contact out of `kinds` (all by default): preferences, the refused addresses for
    the whole org (engine/queue/address_optouts.py), every open message of those kinds cancelled,
    and — when every kind is refused — every live enrollment cancelled.
    Returns the ids of the cancelled messages."""
    kinds = tuple(kinds)
    now = clock.now()
    _ensure_rows(conn, org_id, contact_id, kinds)
    refused = conn.execute(
        update(preferences)
        .where(preferences.c.org_id == org_id, preferences.c.contact_id == contact_id,
               preferences.c.kind.in_(kinds), preferences.c.opted_out_at.is_(None))
        .values(opted_in=False, opted_out_at=now, source=source, evidence=evidence, updated_at=now)
        .returning(preferences.c.kind)
    ).scalars().all()
    if refused:  # the clinic's system hears of a refusal once, not of every repeated SAIR
        webhooks.contact_opted_out(conn, org_id, contact_id, channel_kinds=refused, source=source)
    addresses.record_opt_out(conn, org_id, contact_id, kinds, source=source, evidence=evidence)
    cancelled = cancel_open(
        conn, org_id,
        and_(messages.c.contact_id == contact_id, messages.c.channel_kind.in_(kinds),
             messages.c.purpose != "optout_confirmation"),
        "opted_out",
    )
    if set(kinds) >= set(CHANNEL_KINDS):
        opted_out_everywhere.fire(conn, org_id, [contact_id])
    return cancelled


def _ensure_rows(conn: Connection, org_id: int, contact_id: int, kinds: Iterable[str]) -> None:
    now = clock.now()
    for kind in kinds:
        conn.execute(insert_ignore(conn, preferences, ("org_id", "contact_id", "kind")).values(
            org_id=org_id, contact_id=contact_id, kind=kind, opted_in=False, updated_at=now,
        ))


def find_by_address(conn: Connection, org_id: int, address: str) -> int | None:
    """The org's (oldest) contact with that phone (any spelling) or e-mail; None if unknown."""
    found = find_all_by_address(conn, org_id, address)
    return found[0] if found else None


def find_all_by_address(conn: Connection, org_id: int, address: str) -> list[int]:
    """Every contact of the org with that phone (any spelling) or e-mail, oldest first. Several
    contacts often share one number (a parent books for the children)."""
    if "@" in address and "." in address.split("@")[-1] and not address.endswith("whatsapp.net"):
        column, value = contacts.c.email, address.strip().lower()
    else:
        try:
            column, value = contacts.c.phone, normalize_phone(address)
        except InvalidPhone:
            return []
    return [int(cid) for cid in conn.execute(
        select(contacts.c.id).where(contacts.c.org_id == org_id, column == value, contacts.c.erased_at.is_(None))
        .order_by(contacts.c.id)
    ).scalars()]


def matching(org_id: int, text: str) -> Select:
    """The ids of the org's (not erased) contacts that every word of `text` matches: a word
    matches a contact when it is part of the name, the e-mail or the external id, or when its
    digits are part of the phone — phones are stored in E.164, so "(16) 99988-7766" finds
    "+5516999887766"."""
    query = select(contacts.c.id).where(contacts.c.org_id == org_id, contacts.c.erased_at.is_(None))
    text = text.replace("\x00", "").strip()
    # A phone typed with spaces ("16 9 9988 7766") is one number, not four words.
    words = [text] if _PHONE_LIKE.fullmatch(text) else text.split()
    for word in words:
        like = f"%{_escape_like(word)}%"
        clauses = [contacts.c.name.ilike(like, escape="\\"), contacts.c.email.ilike(like, escape="\\"),
                   contacts.c.external_id.ilike(like, escape="\\")]
        digits = re.sub(r"\D", "", word).lstrip("0")  # a leading 0 is the trunk prefix ("016…"), not in E.164
        if len(digits) >= PHONE_DIGITS_MIN:
            clauses.append(contacts.c.phone.like(f"%{digits}%"))
        query = query.where(or_(*clauses))
    return query


_PHONE_LIKE = re.compile(r"\+?[\d\s().\-]*\d[\d\s().\-]*")


def _escape_like(word: str) -> str:
    """`word` with LIKE's wildcards taken literally (a search for "50%" is not "50 anything")."""
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
