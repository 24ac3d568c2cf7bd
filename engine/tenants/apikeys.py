"""API keys: one org each, `lembra_<prefix>_<secret>`, shown once and stored as a SHA-256 hash.

The secret has 256 bits of entropy, so a plain hash (no salt, no slow KDF) cannot be brute-forced
and lets a request find its key with one indexed lookup. The prefix is stored in clear so an
operator can tell keys apart without ever seeing one again.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError
from engine.store.models import api_keys

KEY_PREFIX = "lembra"
#: `last_used_at` is written at most this often per key, so reads do not all become writes.
LAST_USED_GRANULARITY = timedelta(minutes=1)


@dataclass(frozen=True)
class ApiKeyIdentity:
    """Who is calling: the key's id and its org."""

    id: int
    org_id: int
    name: str


@dataclass(frozen=True)
class NewApiKey:
    id: int
    prefix: str
    key: str  # the only time the whole key exists outside the caller's software


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def create_key(conn: Connection, *, org_id: int, name: str) -> NewApiKey:
    """Create a key for the org; the returned `key` is never stored and cannot be shown again."""
    name = (name or "").strip()
    if not name:
        raise DomainError("name must not be empty")
    if len(name) > 200:
        raise DomainError("name must have at most 200 characters")
    prefix = secrets.token_hex(4)
    key = f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    key_id = int(conn.execute(
        insert(api_keys).values(org_id=org_id, name=name, prefix=prefix, key_hash=hash_key(key),
                                created_at=clock.now()).returning(api_keys.c.id)
    ).scalar_one())
    return NewApiKey(id=key_id, prefix=prefix, key=key)


def authenticate(conn: Connection, presented: str | None) -> ApiKeyIdentity | None:
    """The live key matching `presented`, or None (unknown, malformed or revoked). Notes the use."""
    if not presented or len(presented) > 200:
        return None
    parts = presented.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    digest = hash_key(presented)
    row = conn.execute(
        select(api_keys.c.id, api_keys.c.org_id, api_keys.c.name, api_keys.c.key_hash, api_keys.c.prefix,
               api_keys.c.revoked_at, api_keys.c.last_used_at)
        .where(api_keys.c.key_hash == digest)
    ).first()
    if row is None or not hmac.compare_digest(row.key_hash, digest) or row.prefix != parts[1]:
        return None
    if row.revoked_at is not None:
        return None
    now = clock.now()
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_GRANULARITY:
        conn.execute(update(api_keys).where(api_keys.c.id == row.id).values(last_used_at=now))
    return ApiKeyIdentity(id=int(row.id), org_id=int(row.org_id), name=row.name)


def revoke(conn: Connection, org_id: int, key_id: int) -> bool:
    """Revoke one of the org's keys; False when it is unknown to the org or already revoked."""
    result = conn.execute(
        update(api_keys)
        .where(api_keys.c.org_id == org_id, api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
        .values(revoked_at=clock.now())
    )
    return result.rowcount == 1


def list_keys(conn: Connection, org_id: int) -> list[Any]:
    """The org's keys, newest first (never a hash)."""
    return list(conn.execute(
        select(api_keys.c.id, api_keys.c.name, api_keys.c.prefix, api_keys.c.created_at,
               api_keys.c.last_used_at, api_keys.c.revoked_at)
        .where(api_keys.c.org_id == org_id).order_by(api_keys.c.id.desc())
    ))
