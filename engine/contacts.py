"""Contacts and their consent: one preferences row per contact × channel kind. Opting out of a
kind blocks that kind; SAIR opts out of every kind and stops every flow."""

from __future__ import annotations

from typing import Iterable

from sqlalchemy import and_, insert, select, update
from sqlalchemy.engine import Connection

from engine import clock
from engine.dialect import insert_ignore
from engine.models import CHANNEL_KINDS, contacts, messages, preferences
from engine.orgs import DomainError
from engine.outbox import cancel_open
from engine.privacy import addresses
from gateway.phones import InvalidPhone, normalize_phone


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
    the whole org (engine/privacy/addresses.py), every open message of those kinds cancelled,
    and — when every kind is refused — every live enrollment cancelled.
    Returns the ids of the cancelled messages."""
    kinds = tuple(kinds)
    now = clock.now()
    _ensure_rows(conn, org_id, contact_id, kinds)
    conn.execute(
        update(preferences)
        .where(preferences.c.org_id == org_id, preferences.c.contact_id == contact_id,
               preferences.c.kind.in_(kinds), preferences.c.opted_out_at.is_(None))
        .values(opted_in=False, opted_out_at=now, source=source, evidence=evidence, updated_at=now)
    )
    addresses.record_opt_out(conn, org_id, contact_id, kinds, source=source, evidence=evidence)
    cancelled = cancel_open(
        conn, org_id,
        and_(messages.c.contact_id == contact_id, messages.c.channel_kind.in_(kinds),
             messages.c.purpose != "optout_confirmation"),
        "opted_out",
    )
    if set(kinds) >= set(CHANNEL_KINDS):
        from engine.flows.replies import on_opt_out

        on_opt_out(conn, org_id, [contact_id])
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
