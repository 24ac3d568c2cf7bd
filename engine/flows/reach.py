"""How the contacts of one claim can be reached: the channel kinds each consented to, less those
refused for their addresses, and each org's channel of a kind.

A node that sends (`action`, `ask`, `offer_slots`) reads these for its contact. Read per step,
they were three queries a step (preferences, address refusals, channels: 1.6 ms of a template
step's 2.6 ms of reads in `bench/flows.py --with-send --inline-profile`); here they are read once
for the whole claim, on the first node that asks, so a claim of plain waits reads nothing."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from sqlalchemy import select
from sqlalchemy.engine import Connection

from engine.queue.address_optouts import addresses_of, matching
from engine.store.dialect import in_pairs
from engine.store.models import preferences
from engine.tenants.channels import default_channel, default_channels


class Reach:
    """What the claim's nodes may read about reaching its contacts, loaded once on first use."""

    def __init__(self, people: Iterable[tuple[int, Any]]) -> None:
        #: (org_id, contact id) → the contact's row (its `phone` and `email`).
        self._people = {(org_id, contact.id): contact for org_id, contact in people}
        self._orgs = {org_id for org_id, _ in self._people}
        self._kinds: dict[tuple[int, int], set[str]] | None = None
        self._channels: dict[tuple[int, str], Any] | None = None

    def kinds(self, conn: Connection, org_id: int, contact: Any) -> set[str]:
        """The kinds the contact consented to, less those refused for any of their addresses."""
        if (org_id, contact.id) not in self._people:  # not one of the claim's: read it alone
            return Reach([(org_id, contact)]).kinds(conn, org_id, contact)
        if self._kinds is None:
            self._kinds = self._load_kinds(conn)
        return set(self._kinds.get((org_id, contact.id), ()))

    def channel(self, conn: Connection, org_id: int, kind: str) -> Any:
        """The org's channel for a kind (`engine.tenants.channels.default_channel`'s choice)."""
        if org_id not in self._orgs:  # not one of the claim's orgs: read it alone
            return default_channel(conn, org_id, kind)
        if self._channels is None:
            self._channels = default_channels(conn, self._orgs)
        return self._channels.get((org_id, kind))

    def _load_kinds(self, conn: Connection) -> dict[tuple[int, int], set[str]]:
        consented: dict[tuple[int, int], set[str]] = defaultdict(set)
        for row in conn.execute(select(preferences.c.org_id, preferences.c.contact_id, preferences.c.kind).where(
                in_pairs(conn, (preferences.c.org_id, preferences.c.contact_id), self._people),
                preferences.c.opted_in.is_(True), preferences.c.opted_out_at.is_(None))):
            consented[(row.org_id, row.contact_id)].add(row.kind)
        by_org: dict[int, list[tuple[int, Any]]] = defaultdict(list)
        for (org_id, contact_id), contact in self._people.items():
            if consented.get((org_id, contact_id)):
                by_org[org_id].append((contact_id, addresses_of(contact.phone, contact.email)))
        for org_id, owners in by_org.items():
            refused = matching(conn, org_id, [address for _, found in owners for address in found])
            for contact_id, found in owners:
                for address in found:
                    consented[(org_id, contact_id)] -= refused.get(address, set())
        return consented
