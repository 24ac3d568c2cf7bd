"""Opt-outs that follow the person's address, not the contact row (issue 9, point 11).

A patient who refused messages is often created again: a CSV export with another external id,
the clinic's software through the API, a parent booking for a child on the same phone. Every
opt-out therefore also blocks the *address* for the whole org, in `address_optouts` (one row per
address × refused channel kind), and every consent check also asks whether one of the contact's
addresses is blocked: populate's set-based insert, dispatch at send time, the follow-up engine's
enrolment and its message nodes.

Which addresses an opt-out blocks:

- a refusal of every kind (SAIR, a console opt-out) blocks the contact's phone and its e-mail for
  every kind: the person said "no more messages";
- a refusal of one kind (a provider's unsubscribe or complaint, the e-mail opt-out link) blocks
  the address that kind is sent to (the e-mail for `email`, the phone for `whatsapp`/`sms`).

The plain normalised value is kept while a live contact of the org carries the address (it is
in `contacts` then anyway, and populate joins on it in SQL). When the last contact carrying it
is erased, the row keeps only a keyed hash of it (HMAC-SHA256, key derived from the credential
keyring, the org in the message so two tenants' rows never correlate): the refusal is still
recognised when the same address comes back (`recognise`), without keeping the plain address of
a person who asked to be erased. A hash of a Brazilian phone without a key would not do: there
are few enough numbers to try them all.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import and_, delete, exists, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from engine.core import clock
from engine.store.models import CHANNEL_KINDS, address_optouts, contacts
from gateway.crypto import Keyring
from gateway.phones import InvalidPhone, normalize_phone

ADDRESS_KINDS = ("phone", "email")
#: The channel kinds each kind of address is written to.
SERVES = {"phone": ("whatsapp", "sms"), "email": ("email",)}
#: The keyring purpose of the hashes of erased persons' addresses.
HASH_PURPOSE = "address-optout"
#: Values per IN list.
_CHUNK = 500

Address = tuple[str, str]  # (address kind, normalised value)


# --- addresses ----------------------------------------------------------------------------------

def parse_address(raw: str | None) -> Address | None:
    """A sender's address as (kind, normalised value): an e-mail, or a phone in any spelling
    (a WhatsApp JID too); None when it is neither."""
    raw = (raw or "").strip()
    if not raw:
        return None
    if "@" in raw and "." in raw.split("@")[-1] and not raw.endswith("whatsapp.net"):
        return "email", raw.lower()
    try:
        return "phone", normalize_phone(raw)
    except InvalidPhone:
        return None


def addresses_of(phone: str | None, email: str | None) -> list[Address]:
    """The addresses a contact row carries (stored values are already normalised)."""
    out: list[Address] = []
    if phone:
        out.append(("phone", phone))
    if email:
        out.append(("email", email.strip().lower()))
    return out


def _contact_addresses(conn: Connection, org_id: int, contact_id: int) -> list[Address]:
    row = conn.execute(select(contacts.c.phone, contacts.c.email).where(
        contacts.c.org_id == org_id, contacts.c.id == contact_id)).first()
    return addresses_of(row.phone, row.email) if row is not None else []


# --- writing ------------------------------------------------------------------------------------

def _insert_ignoring(conn: Connection) -> Any:
    module = postgresql if conn.dialect.name == "postgresql" else sqlite
    return module.insert(address_optouts)


def block(conn: Connection, org_id: int, entries: Iterable[tuple[str, str, str]], *, contact_id: int | None,
          source: str, evidence: str | None) -> int:
    """Block each (address kind, value, channel kind) for the org; an existing block stays as it
    was (its first refusal is the evidence). Returns how many rows were added."""
    now = clock.now()
    rows = [{"org_id": org_id, "address_kind": akind, "value": value, "channel_kind": kind,
             "contact_id": contact_id, "source": source[:100], "evidence": (evidence or None) and evidence[:300],
             "created_at": now}
            for akind, value, kind in dict.fromkeys(entries)]
    if not rows:
        return 0
    added = 0
    for row in rows:  # a handful: an opt-out blocks at most two addresses × three kinds
        stmt = _insert_ignoring(conn).values(**row).on_conflict_do_nothing(
            index_elements=["org_id", "address_kind", "value", "channel_kind"],
            index_where=address_optouts.c.value.is_not(None))
        added += conn.execute(stmt.returning(address_optouts.c.id)).first() is not None
    return added


def entries_for(addresses: Sequence[Address], kinds: Iterable[str]) -> list[tuple[str, str, str]]:
    """What an opt-out of `kinds` blocks: every address × every kind for a refusal of all kinds,
    else the address each kind is sent to."""
    kinds = tuple(kinds)
    everything = set(kinds) >= set(CHANNEL_KINDS)
    return [(akind, value, kind) for akind, value in addresses for kind in kinds
            if everything or kind in SERVES[akind]]


def record_opt_out(conn: Connection, org_id: int, contact_id: int, kinds: Iterable[str], *, source: str,
                   evidence: str | None) -> int:
    """The address side of `engine.people.contacts.opt_out`: block what the contact's refusal covers."""
    return block(conn, org_id, entries_for(_contact_addresses(conn, org_id, contact_id), kinds),
                 contact_id=contact_id, source=source, evidence=evidence)


def block_sender(conn: Connection, org_id: int, raw_address: str | None, *, source: str,
                 evidence: str | None) -> int:
    """SAIR from an address no contact carries yet: the person behind it refused everything."""
    address = parse_address(raw_address)
    if address is None:
        return 0
    return block(conn, org_id, entries_for([address], CHANNEL_KINDS), contact_id=None, source=source,
                 evidence=evidence)


def lift(conn: Connection, org_id: int, contact_id: int, kind: str) -> int:
    """The contact that refused `kind` agreed again (engine.people.contacts.set_consent after its own
    opt-out): the refusals its opt-out made for its addresses go. Returns how many."""
    return conn.execute(delete(address_optouts).where(
        address_optouts.c.org_id == org_id, address_optouts.c.contact_id == contact_id,
        address_optouts.c.channel_kind == kind)).rowcount


# --- checking -----------------------------------------------------------------------------------

def refused_clause(org_id: int, kind: Any, phone: Any, email: Any) -> ColumnElement[bool]:
    """SQL: the channel kind `kind` is refused for an address `phone` or `email` (columns of the
    enclosing query: populate keeps its one set-based INSERT … SELECT)."""
    by_phone = address_optouts.alias("optout_phone")
    by_email = address_optouts.alias("optout_email")
    return or_(
        exists().where(by_phone.c.org_id == org_id, by_phone.c.address_kind == "phone",
                       by_phone.c.value == phone, by_phone.c.channel_kind == kind),
        exists().where(by_email.c.org_id == org_id, by_email.c.address_kind == "email",
                       by_email.c.value == email, by_email.c.channel_kind == kind),
    )


def refused_kinds_for(conn: Connection, org_id: int, addresses: Sequence[Address]) -> set[str]:
    """The channel kinds refused for any of these addresses."""
    if not addresses:
        return set()
    clauses = [and_(address_optouts.c.address_kind == akind, address_optouts.c.value == value)
               for akind, value in addresses]
    return set(conn.execute(select(address_optouts.c.channel_kind).distinct().where(
        address_optouts.c.org_id == org_id, or_(*clauses))).scalars())


def refused_kinds(conn: Connection, org_id: int, contact: Any, *, keyring: Keyring | None = None) -> set[str]:
    """The kinds refused for the contact's addresses (a row with `phone` and `email`). With a
    keyring, an erased person's hashed refusal of one of them is recognised first."""
    found = addresses_of(contact.phone, contact.email)
    if keyring is not None:
        recognise(conn, org_id, found, keyring=keyring)
    return refused_kinds_for(conn, org_id, found)


def contact_refused_kinds(conn: Connection, org_id: int, contact_id: int, *,
                          keyring: Keyring | None = None) -> set[str]:
    found = _contact_addresses(conn, org_id, contact_id)
    if keyring is not None:
        recognise(conn, org_id, found, keyring=keyring)
    return refused_kinds_for(conn, org_id, found)


def matching(conn: Connection, org_id: int, addresses: Iterable[Address]) -> dict[Address, set[str]]:
    """For many addresses at once (an import batch): each blocked one → its refused kinds."""
    wanted: dict[str, list[str]] = defaultdict(list)
    for akind, value in dict.fromkeys(addresses):
        wanted[akind].append(value)
    out: dict[Address, set[str]] = defaultdict(set)
    for akind, values in wanted.items():
        for start in range(0, len(values), _CHUNK):
            for row in conn.execute(select(address_optouts.c.value, address_optouts.c.channel_kind).where(
                    address_optouts.c.org_id == org_id, address_optouts.c.address_kind == akind,
                    address_optouts.c.value.in_(values[start:start + _CHUNK]))):
                out[(akind, row.value)].add(row.channel_kind)
    return dict(out)


# --- erased persons: keyed hashes ---------------------------------------------------------------

def address_hash(keyring: Keyring, org_id: int, address_kind: str, value: str, version: int | None = None) -> str:
    """HMAC-SHA256 of one org's address under key `version` (the current one by default)."""
    key = keyring.derive(HASH_PURPOSE, version)
    return hmac.new(key, f"{org_id}|{address_kind}|{value}".encode(), hashlib.sha256).hexdigest()


def has_hashed(conn: Connection, org_id: int) -> bool:
    """Whether the org keeps any erased person's refusal (most orgs never do: no hashing then)."""
    return conn.execute(select(address_optouts.c.id).where(
        address_optouts.c.org_id == org_id, address_optouts.c.value.is_(None)).limit(1)).first() is not None


def _keep_older(conn: Connection, org_id: int, first: Any, second: Any) -> tuple[Any, Any]:
    """Two rows for one refusal: delete the younger one; returns (kept, deleted)."""
    kept, dropped = (first, second) if first.created_at <= second.created_at else (second, first)
    conn.execute(delete(address_optouts).where(address_optouts.c.org_id == org_id,
                                               address_optouts.c.id == dropped.id))
    return kept, dropped


def recognise(conn: Connection, org_id: int, addresses: Sequence[Address], *, keyring: Keyring | None = None) -> int:
    """An address an erased person had refused is carried by a contact again: its hashed
    refusal gets the plain value back, so every plain check (populate's SQL included) sees it.
    Hashes under every configured key version are tried. Returns how many rows were recognised.

    Without `keyring` the process's runtime keyring is used, and only when the org keeps hashes."""
    if not addresses or not has_hashed(conn, org_id):
        return 0
    if keyring is None:
        from engine.store.runtime import current

        keyring = current().keyring
    candidates: dict[tuple[str, str, int], str] = {}
    for akind, value in addresses:
        for version in keyring.versions():
            candidates[(akind, address_hash(keyring, org_id, akind, value, version), version)] = value
    ao = address_optouts.c
    rows = conn.execute(select(address_optouts).where(
        ao.org_id == org_id, ao.value.is_(None), ao.value_hash.in_(sorted({k[1] for k in candidates})))).all()
    done = 0
    for row in rows:
        value = candidates.get((row.address_kind, row.value_hash, row.hash_version))
        if value is None:
            continue
        plain = conn.execute(select(address_optouts).where(
            ao.org_id == org_id, ao.address_kind == row.address_kind, ao.value == value,
            ao.channel_kind == row.channel_kind)).first()
        if plain is not None:
            kept, _ = _keep_older(conn, org_id, plain, row)
            if kept.id == plain.id:
                done += 1
                continue
        conn.execute(update(address_optouts).where(ao.org_id == org_id, ao.id == row.id)
                     .values(value=value, value_hash=None, hash_version=None))
        done += 1
    return done


def carried_by_others(conn: Connection, org_id: int, address: Address, contact_id: int) -> bool:
    """Whether another live contact of the org carries this address."""
    akind, value = address
    column = contacts.c.phone if akind == "phone" else contacts.c.email
    return conn.execute(select(contacts.c.id).where(
        contacts.c.org_id == org_id, contacts.c.id != contact_id, contacts.c.erased_at.is_(None),
        column == value).limit(1)).first() is not None


def pseudonymise(conn: Connection, keyring: Keyring, org_id: int, contact_id: int,
                 addresses: Sequence[Address]) -> int:
    """At erasure: the refusals of the contact's addresses that no other live contact carries
    keep only the keyed hash of the address. Returns how many rows were hashed."""
    ao = address_optouts.c
    version = keyring.current_version
    done = 0
    for address in addresses:
        if carried_by_others(conn, org_id, address, contact_id):
            continue  # still another person's address on file: nothing of this one's is kept extra
        akind, value = address
        digest = address_hash(keyring, org_id, akind, value, version)
        for row in conn.execute(select(address_optouts).where(
                ao.org_id == org_id, ao.address_kind == akind, ao.value == value)).all():
            hashed = conn.execute(select(address_optouts).where(
                ao.org_id == org_id, ao.address_kind == akind, ao.value_hash == digest,
                ao.channel_kind == row.channel_kind)).first()
            if hashed is not None:
                kept, _ = _keep_older(conn, org_id, row, hashed)
                if kept.id == hashed.id:
                    done += 1
                    continue
            conn.execute(update(address_optouts).where(ao.org_id == org_id, ao.id == row.id)
                         .values(value=None, value_hash=digest, hash_version=version))
            done += 1
    return done


# --- contacts that share a phone (a dedupe hint) ------------------------------------------------

def sharing_phone(conn: Connection, org_id: int, contact_id: int) -> list[int]:
    """The other live contacts of the org with the same phone, oldest first."""
    other = contacts.alias("other")
    return [int(cid) for cid in conn.execute(
        select(other.c.id).select_from(other.join(contacts, and_(
            contacts.c.org_id == org_id, contacts.c.id == contact_id, contacts.c.phone == other.c.phone)))
        .where(other.c.org_id == org_id, other.c.id != contact_id, other.c.erased_at.is_(None))
        .order_by(other.c.id)).scalars()]


def shared_phones(conn: Connection, org_id: int, *, limit: int = 100) -> list[list[int]]:
    """Groups of live contacts of the org that share one phone (each group's ids, oldest first),
    the biggest groups first: likely duplicates, or a family on one number."""
    groups = conn.execute(
        select(contacts.c.phone, func.count().label("n"), func.min(contacts.c.id).label("first"))
        .where(contacts.c.org_id == org_id, contacts.c.erased_at.is_(None), contacts.c.phone.is_not(None))
        .group_by(contacts.c.phone).having(func.count() > 1)
        .order_by(func.count().desc(), func.min(contacts.c.id)).limit(limit)).all()
    out = []
    for group in groups:
        out.append([int(cid) for cid in conn.execute(select(contacts.c.id).where(
            contacts.c.org_id == org_id, contacts.c.erased_at.is_(None), contacts.c.phone == group.phone)
            .order_by(contacts.c.id)).scalars()])
    return out


def contact_fields(conn: Connection, contact: Any) -> dict[str, Any]:
    """What the API (and any other reader) says about a contact row: the kinds refused for its
    phone or e-mail by whichever contact carried them — so a new contact on a refused address
    says so at once — and the other live contacts on the same phone (a dedupe hint)."""
    return {
        "address_opted_out": sorted(refused_kinds(conn, contact.org_id, contact)),
        "shares_phone_with": sharing_phone(conn, contact.org_id, contact.id),
    }


# --- marketing only (Meta's 131050) -------------------------------------------------------------

#: The reason a marketing send to such a person is refused before it goes (the catalogue's).
MARKETING_OPTED_OUT = "marketing_opted_out"


def block_marketing(conn: Connection, org_id: int, contact_id: int) -> int:
    """The person stopped this business's marketing messages (Meta's 131050): every live contact
    of the org on the same phone is marked, so a marketing template to them is refused before it
    is sent; utility reminders and replies still go. Returns how many contacts it marked (0 when
    they already were: a repeated error or webhook changes nothing)."""
    row = conn.execute(select(contacts.c.phone).where(contacts.c.org_id == org_id, contacts.c.id == contact_id)).first()
    if row is None:
        return 0
    same_person = contacts.c.id == contact_id
    if row.phone:
        same_person = or_(same_person, contacts.c.phone == row.phone)
    return conn.execute(update(contacts).where(
        contacts.c.org_id == org_id, same_person, contacts.c.erased_at.is_(None),
        contacts.c.marketing_opted_out_at.is_(None)).values(marketing_opted_out_at=clock.now())).rowcount
