"""The consent evidence of one contact (LGPD art. 8 §2: the controller proves the consent):
what they agreed to, when and how, and every opt-out — theirs, and the refusals of their
addresses by whichever contact carried them — as one JSON document.

Built from what the engine keeps anyway: `preferences` (per kind: agreed when, from which
source and evidence; refused when), `address_optouts` (the refusals that follow the phone and
e-mail), the replies that asked to stop (`inbound_messages` with intent `optout`), and the audit
trail's entries about the contact (who wrote it, when, which fields). No message text.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError
from engine.store.models import (
    CHANNEL_KINDS,
    address_optouts,
    audit_log,
    channels,
    contacts,
    inbound_messages,
    preferences,
)
from engine.queue import address_optouts as addresses

FORMAT = "lembra.consent-evidence/1"


class ContactNotFound(DomainError):
    """No such contact in the org."""


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def evidence(conn: Connection, org_id: int, contact_id: int) -> dict[str, Any]:
    """The consent-evidence document of one contact of the org (an erased one too: its
    tombstone and consent record remain, its addresses do not)."""
    contact = conn.execute(select(contacts).where(contacts.c.org_id == org_id, contacts.c.id == contact_id)).first()
    if contact is None:
        raise ContactNotFound("no such contact")
    prefs = {p.kind: p for p in conn.execute(select(preferences).where(
        preferences.c.org_id == org_id, preferences.c.contact_id == contact_id))}
    consent = []
    for kind in CHANNEL_KINDS:
        p = prefs.get(kind)
        if p is None:
            consent.append({"channel_kind": kind, "status": "never_asked", "agreed_at": None, "refused_at": None,
                            "source": None, "evidence": None})
            continue
        status = "refused" if p.opted_out_at is not None else ("agreed" if p.opted_in else "not_agreed")
        consent.append({"channel_kind": kind, "status": status, "agreed_at": _iso(p.opted_in_at),
                        "refused_at": _iso(p.opted_out_at), "source": p.source, "evidence": p.evidence})

    opt_outs: list[dict[str, Any]] = []
    for p in prefs.values():
        if p.opted_out_at is not None:
            opt_outs.append({"at": _iso(p.opted_out_at), "scope": "contact", "channel_kinds": [p.kind],
                             "source": p.source, "evidence": p.evidence, "address": None, "by_this_contact": True})
    found = addresses.addresses_of(contact.phone, contact.email)
    clauses = [address_optouts.c.contact_id == contact_id]
    clauses += [and_(address_optouts.c.address_kind == akind, address_optouts.c.value == value)
                for akind, value in found]
    grouped: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in conn.execute(select(address_optouts).where(address_optouts.c.org_id == org_id, or_(*clauses))
                            .order_by(address_optouts.c.created_at, address_optouts.c.id)):
        key = (row.address_kind, row.value, row.value_hash, row.created_at, row.source, row.evidence, row.contact_id)
        entry = grouped.setdefault(key, {
            "at": _iso(row.created_at), "scope": "address", "channel_kinds": [], "source": row.source,
            "evidence": row.evidence, "address": row.address_kind,
            "address_kept": "hashed" if row.value is None else "plain",
            "by_this_contact": row.contact_id == contact_id})
        entry["channel_kinds"].append(row.channel_kind)
    opt_outs.extend(grouped.values())
    replies = [{"at": _iso(r.received_at), "channel_kind": r.kind, "inbound_id": r.id, "outcome": r.outcome}
               for r in conn.execute(
                   select(inbound_messages.c.id, inbound_messages.c.received_at, inbound_messages.c.outcome,
                          channels.c.kind)
                   .join(channels, and_(channels.c.id == inbound_messages.c.channel_id, channels.c.org_id == org_id))
                   .where(inbound_messages.c.org_id == org_id, inbound_messages.c.contact_id == contact_id,
                          inbound_messages.c.intent == "optout")
                   .order_by(inbound_messages.c.received_at, inbound_messages.c.id))]
    for reply in replies:
        opt_outs.append({"at": reply["at"], "scope": "reply", "channel_kinds": list(CHANNEL_KINDS),
                         "source": f"reply:{reply['channel_kind']}", "evidence": f"inbound:{reply['inbound_id']}",
                         "address": None, "by_this_contact": True})
    opt_outs.sort(key=lambda o: (o["at"] or "", o["scope"]))
    history = [{"at": _iso(a.created_at), "action": a.action,
                "by": f"user:{a.user_id}" if a.user_id else (f"api_key:{a.api_key_id}" if a.api_key_id else "system"),
                "fields": sorted(a.changes) if isinstance(a.changes, dict) else [],
                "consent": a.changes.get("consent") if isinstance(a.changes, dict)
                and isinstance(a.changes.get("consent"), list) else None}
               for a in conn.execute(select(audit_log).where(
                   audit_log.c.org_id == org_id, audit_log.c.entity.in_(("contact", "contacts")),
                   audit_log.c.entity_id == contact_id).order_by(audit_log.c.created_at, audit_log.c.id))]
    return {
        "format": FORMAT,
        "generated_at": _iso(clock.now()),
        "contact": {"id": contact.id, "external_id": contact.external_id, "name": contact.name,
                    "phone": contact.phone, "email": contact.email, "created_at": _iso(contact.created_at),
                    "erased_at": _iso(contact.erased_at), "erased_by": contact.erased_by},
        "consent": consent,
        "opt_outs": opt_outs,
        "refused_now": sorted({p.kind for p in prefs.values() if p.opted_out_at is not None}
                              | addresses.refused_kinds_for(conn, org_id, found)),
        "history": history,
    }
