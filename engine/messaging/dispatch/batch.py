"""What the checks before a send read, loaded for a whole batch of messages at once.

A worker task carries up to 200 message ids (`LEMBRA_SEND_BATCH`). Reading each message's org,
contact, appointment, consent, rule, run, channel, template and last inbound message one query
at a time cost ~9 statements per message; here each table is read once per batch, every query
scoped by the orgs of the batch, and rows are matched to their message by (org, id) so no row of
another org can be taken for one of this org.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Sequence

from sqlalchemy import and_, or_, select
from sqlalchemy.engine import Connection

from engine.store.dialect import in_pairs, in_values
from engine.queue.conversation_window import last_inbound, window_open
from engine.store.models import (
    meta_template_states,
    address_optouts,
    appointments,
    channel_pacing,
    channels,
    contacts,
    enrollments,
    messages,
    orgs,
    preferences,
    reminder_rules,
)
from engine.queue import address_optouts as addresses
from engine.messaging.templates import find_templates

#: The Meta customer-service window: free text only within this long after the patient wrote.
Key = tuple[int, int]  # (org_id, row id)

#: What a send reads of its `messages` row; the rest (a dozen timestamps, outcomes, the body
#: written at `sending`) is written by the send, not read, and converting it cost a worker about
#: 2 % of its time.
SEND_COLUMNS = tuple(messages.c[name] for name in (
    "id", "org_id", "purpose", "contact_id", "channel_kind", "channel_id", "appointment_id", "appointment_starts_at",
    "enrollment_id", "rule_id", "template_key", "respect_window", "payload", "idempotency_key", "status", "due_at",
    "expires_at", "attempts"))
#: What the checks and the render read of a message's contact and appointment (their
#: timestamps and external ids are not read, and would be converted for every row).
CONTACT_COLUMNS = tuple(contacts.c[name] for name in (
    "id", "org_id", "name", "phone", "email", "locale", "erased_at", "marketing_opted_out_at"))
APPOINTMENT_COLUMNS = tuple(appointments.c[name] for name in (
    "id", "org_id", "contact_id", "professional", "starts_at", "timezone", "mode", "location", "status"))


@dataclass
class Batch:
    """The rows a batch of messages needs, keyed by (org_id, id)."""

    messages: list[Any]
    orgs: dict[int, Any] = field(default_factory=dict)
    contacts: dict[Key, Any] = field(default_factory=dict)
    appointments: dict[Key, Any] = field(default_factory=dict)
    triggers: dict[Key, str] = field(default_factory=dict)
    run_statuses: dict[Key, str] = field(default_factory=dict)
    refusals: dict[tuple[int, int, str], str | None] = field(default_factory=dict)
    #: (org_id, kind) → the org's channels of that kind, the one to use first.
    channels: dict[tuple[int, str], list[Any]] = field(default_factory=dict)
    templates: dict[tuple[int, str, str, str], Any] = field(default_factory=dict)
    last_inbound: dict[tuple[int, int, int], datetime] = field(default_factory=dict)
    #: The orgs whose messages go through a Meta channel (engine/messaging/meta_categories.py).
    meta_orgs: list[int] = field(default_factory=list)
    #: (org_id, channel_id, Meta name, language) → the template's category at the WABA, for
    #: `meta_orgs`; read on the first Meta template checked (None until then).
    meta_categories: dict[tuple[int, int, str, str], str | None] | None = None

    def meta_category(self, conn: Connection, org_id: int, channel_id: int, name: str, language: str) -> str | None:
        """The WABA's category of a Meta template (None: never heard of). The batch's categories
        are read once, when the first template asks: a batch of free text (a conversation's
        questions) reads none."""
        if self.meta_categories is None:
            s = meta_template_states.c
            self.meta_categories = {(r.org_id, r.channel_id, r.name, r.language): r.category for r in conn.execute(
                select(s.org_id, s.channel_id, s.name, s.language, s.category)
                .where(in_values(conn, s.org_id, self.meta_orgs)))} if self.meta_orgs else {}
        return self.meta_categories.get((org_id, channel_id, name, language))

    def channel(self, org_id: int, kind: str) -> Any:
        """The org's channel for a kind: the default one if active, else any active one, else None
        (the same choice as `engine.tenants.channels.default_channel`)."""
        return next((c for c in self.channels.get((org_id, kind), ()) if c.status == "active"), None)

    def has_channel(self, org_id: int, kind: str) -> bool:
        """Whether the org has a channel of this kind at all (active or not)."""
        return bool(self.channels.get((org_id, kind)))

    def conversation_open(self, org_id: int, channel_id: int, contact_id: int, now: datetime) -> bool:
        """Whether the patient wrote on this channel within the last 24 hours."""
        return window_open(self.last_inbound.get((org_id, channel_id, contact_id)), now)


def load(conn: Connection, message_ids: Sequence[int], *, keyring: Any = None) -> Batch:
    """The claimed messages among `message_ids` (in that order) and everything their checks read."""
    order = {mid: i for i, mid in enumerate(message_ids)}
    rows = conn.execute(
        select(*SEND_COLUMNS).where(in_values(conn, messages.c.id, order), messages.c.status == "claimed")
    ).all()
    batch = Batch(messages=sorted(rows, key=lambda r: order[r.id]))
    if not rows:
        return batch
    org_ids = sorted({r.org_id for r in rows})
    batch.orgs = {o.id: o for o in conn.execute(select(orgs).where(in_values(conn, orgs.c.id, org_ids)))}
    batch.contacts = _by_key(conn, CONTACT_COLUMNS, org_ids, {r.contact_id for r in rows})
    appointment_ids = {r.appointment_id for r in rows if r.appointment_id is not None}
    if appointment_ids:
        batch.appointments = _by_key(conn, APPOINTMENT_COLUMNS, org_ids, appointment_ids)
    rule_ids = {r.rule_id for r in rows if r.rule_id is not None}
    if rule_ids:
        batch.triggers = {(r.org_id, r.id): r.trigger for r in conn.execute(
            select(reminder_rules.c.org_id, reminder_rules.c.id, reminder_rules.c.trigger).where(
                in_values(conn, reminder_rules.c.org_id, org_ids), in_values(conn, reminder_rules.c.id, sorted(rule_ids))))}
    enrollment_ids = {r.enrollment_id for r in rows if r.enrollment_id is not None}
    if enrollment_ids:
        batch.run_statuses = {(r.org_id, r.id): r.status for r in conn.execute(
            select(enrollments.c.org_id, enrollments.c.id, enrollments.c.status).where(
                in_values(conn, enrollments.c.org_id, org_ids),
                in_values(conn, enrollments.c.id, sorted(enrollment_ids)))).all()}
    batch.refusals = refusals(conn, batch.contacts, {(r.org_id, r.contact_id, r.channel_kind) for r in rows},
                              keyring=keyring)
    # With each channel, its pacing row's next slot (`paused_until`): a channel its provider
    # paused (Meta 130429, engine/queue/recipient_pacing.py) waits, at no extra statement.
    paced = and_(channel_pacing.c.channel_id == channels.c.id, channel_pacing.c.org_id == channels.c.org_id)
    for channel in conn.execute(select(channels, channel_pacing.c.next_slot_at.label("paused_until"))
                                .select_from(channels.outerjoin(channel_pacing, paced))
                                .where(in_values(conn, channels.c.org_id, org_ids))
                                .order_by(channels.c.is_default.desc(), channels.c.id)):
        batch.channels.setdefault((channel.org_id, channel.kind), []).append(channel)
    wanted = set()
    for r in rows:
        if r.template_key is not None and r.org_id in batch.orgs:
            contact = batch.contacts.get((r.org_id, r.contact_id))
            locale = (contact.locale if contact is not None else None) or batch.orgs[r.org_id].locale
            wanted.add((r.org_id, r.template_key, r.channel_kind, locale))
    batch.templates = find_templates(conn, wanted)
    batch.last_inbound = last_inbound(conn, {(r.org_id, r.contact_id) for r in rows})
    batch.meta_orgs = sorted({org for (org, _kind), found in batch.channels.items()
                              if any(c.provider == "meta" for c in found)})
    return batch


def _by_key(conn: Connection, columns: Sequence[Any], org_ids: Sequence[int], ids: Iterable[int]) -> dict[Key, Any]:
    """The rows of `columns`' table (its `org_id` and `id` among them) with these ids, of these orgs."""
    table = columns[0].table
    # `.all()`: one fetch of every row, where iterating the result fetched them one by one
    # (a third of the loop's CPU on a batch's 200 contacts, measured).
    return {(row.org_id, row.id): row for row in conn.execute(
        select(*columns).where(in_values(conn, table.c.org_id, org_ids), in_values(conn, table.c.id, sorted(ids)))
    ).all()}


def refusals(conn: Connection, contact_rows: dict[Key, Any], wanted: set[tuple[int, int, str]], *,
             keyring: Any = None) -> dict[tuple[int, int, str], str | None]:
    """For each (org, contact, kind): why the contact may not get a message of that kind — no
    consent or their own opt-out (`opted_out`), or a refusal of one of their addresses by
    whichever contact carried it (`address_opted_out`, engine/queue/address_optouts.py) — or None."""
    if not wanted:
        return {}
    org_ids = sorted({org for org, _, _ in wanted})
    p = preferences.c
    consent = {(r.org_id, r.contact_id, r.kind): r for r in conn.execute(
        select(p.org_id, p.contact_id, p.kind, p.opted_in, p.opted_out_at).where(
            in_pairs(conn, (p.org_id, p.contact_id), {(org, cid) for org, cid, _ in wanted}))).all()}
    found: dict[tuple[int, int], list[addresses.Address]] = {}
    for org, cid, _ in wanted:
        row = contact_rows.get((org, cid))
        found[(org, cid)] = addresses.addresses_of(row.phone, row.email) if row is not None else []
    values = sorted({value for found_ in found.values() for _, value in found_})
    optouts = _optouts(conn, org_ids, values)
    hashed = {r.org_id for r in optouts if r.value is None}
    if keyring is not None and hashed:
        # An erased person's refusal (kept hashed) of an address a contact carries again gets its
        # plain value back first; then read again.
        for org in hashed:
            addresses.recognise(conn, org, sorted({a for (o, _), of in found.items() if o == org for a in of}),
                                keyring=keyring)
        optouts = _optouts(conn, org_ids, values)
    refused: dict[tuple[int, str, str], set[str]] = defaultdict(set)
    for r in optouts:
        if r.value is not None:
            refused[(r.org_id, r.address_kind, r.value)].add(r.channel_kind)
    out: dict[tuple[int, int, str], str | None] = {}
    for org, cid, kind in wanted:
        pref = consent.get((org, cid, kind))
        if not (pref and pref.opted_in and pref.opted_out_at is None):
            out[(org, cid, kind)] = "opted_out"
        elif any(kind in refused.get((org, akind, value), ()) for akind, value in found[(org, cid)]):
            out[(org, cid, kind)] = "address_opted_out"
        else:
            out[(org, cid, kind)] = None
    return out


def _optouts(conn: Connection, org_ids: Sequence[int], values: Sequence[str]) -> list[Any]:
    """The orgs' address refusals of these values, and any hashed ones (an erased person's)."""
    ao = address_optouts.c
    return conn.execute(select(ao.org_id, ao.address_kind, ao.value, ao.channel_kind).where(
        in_values(conn, ao.org_id, org_ids), or_(in_values(conn, ao.value, values), ao.value.is_(None)))).all()


def refusal(conn: Connection, org_id: int, contact_id: int, kind: str, *, keyring: Any = None) -> str | None:
    """`refusals` for one contact and kind."""
    row = conn.execute(select(contacts).where(contacts.c.org_id == org_id, contacts.c.id == contact_id)).first()
    rows = {(org_id, contact_id): row} if row is not None else {}
    return refusals(conn, rows, {(org_id, contact_id, kind)}, keyring=keyring)[(org_id, contact_id, kind)]
