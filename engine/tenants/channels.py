"""Channels: a clinic's account at a provider, with encrypted credentials (the provider
instances the workers send through are in `engine.store.provider_pool`)."""

from __future__ import annotations

import secrets
from typing import Any, Iterable, Mapping

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError
from engine.store.models import CHANNEL_KINDS, channels
from engine.store.provider_pool import ProviderPool
from gateway import registry
from gateway.crypto import Keyring

#: Credential keys each provider needs (more are accepted: `base_url`, `from_name`, …).
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "sandbox": (),
    "evolution": ("base_url", "api_key", "instance", "webhook_secret"),
    "meta": ("phone_number_id", "access_token", "app_secret", "verify_token"),
    "smtp": ("host", "port", "security", "from_email"),
    "resend": ("api_key", "from_email", "webhook_secret"),
    "twilio": ("account_sid", "auth_token"),
    "zenvia": ("api_token", "from"),
}
#: Pacing a provider gets unless told otherwise: Evolution numbers are banned when they blast.
DEFAULT_PACING: dict[str, tuple[int, int]] = {"evolution": (3000, 500)}


def create_channel(
    conn: Connection,
    keyring: Keyring,
    *,
    org_id: int,
    kind: str,
    provider: str,
    name: str,
    credentials: Mapping[str, Any] | None = None,
    settings: Mapping[str, Any] | None = None,
    is_default: bool = True,
    min_interval_ms: int | None = None,
    daily_cap: int | None = None,
) -> int:
    """Create a channel; credentials are sealed to the new row before the transaction ends."""
    if kind not in CHANNEL_KINDS:
        raise DomainError(f"kind must be one of {', '.join(CHANNEL_KINDS)}")
    try:
        provider_cls = registry.load(provider)
    except registry.UnknownProvider as exc:
        raise DomainError(str(exc)) from None
    if kind not in provider_cls.kinds:
        raise DomainError(f"provider {provider!r} does not send {kind}")
    missing = [key for key in REQUIRED_KEYS.get(provider, ()) if not (credentials or {}).get(key)]
    if provider == "twilio" and not ((credentials or {}).get("from") or (credentials or {}).get("messaging_service_sid")):
        missing.append("from (or messaging_service_sid)")
    if missing:
        raise DomainError(f"missing credential keys for {provider}: {', '.join(missing)}")
    if provider == "sandbox" and not (credentials or {}).get("webhook_secret") \
            and not (settings or {}).get("webhook_secret"):
        # Its webhook takes a patient's SAIR or CANCELAR: never without a secret (new_webhook_secret).
        credentials = {**(credentials or {}), "webhook_secret": new_webhook_secret()}
    if min_interval_ms is None and daily_cap is None and provider in DEFAULT_PACING:
        min_interval_ms, daily_cap = DEFAULT_PACING[provider]
    now = clock.now()
    if is_default:
        conn.execute(
            update(channels).where(channels.c.org_id == org_id, channels.c.kind == kind).values(is_default=False)
        )
    channel_id = int(conn.execute(
        insert(channels).values(
            org_id=org_id, kind=kind, provider=provider, name=name, settings=dict(settings or {}),
            status="active", is_default=is_default, min_interval_ms=min_interval_ms, daily_cap=daily_cap,
            created_at=now, updated_at=now,
        ).returning(channels.c.id)
    ).scalar_one())
    if credentials:
        sealed = keyring.seal(credentials, table="channels", org_id=org_id, row_id=channel_id)
        conn.execute(
            update(channels).where(channels.c.id == channel_id, channels.c.org_id == org_id)
            .values(credentials=sealed.ciphertext, key_version=sealed.key_version)
        )
    return channel_id


def new_webhook_secret() -> str:
    """A fresh shared secret for a webhook (256 bits, URL- and header-safe)."""
    return secrets.token_urlsafe(32)


def sandbox_webhook_secret(conn: Connection, keyring: Keyring, pool: ProviderPool, channel: Any) -> str:
    """The secret a sandbox channel's webhook requires (`X-Sandbox-Secret`). A channel created
    before every sandbox channel got one at creation gets one now, sealed like any credential."""
    secret = pool.get(channel).config.get("webhook_secret")
    if secret:
        return str(secret)
    current = conn.execute(select(channels).where(channels.c.org_id == channel.org_id, channels.c.id == channel.id)
                           .with_for_update()).one()
    stored = keyring.open(current.credentials, key_version=current.key_version, table="channels",
                          org_id=current.org_id, row_id=current.id) if current.credentials else {}
    if stored.get("webhook_secret"):
        return str(stored["webhook_secret"])  # another request got there first
    secret = new_webhook_secret()
    sealed = keyring.seal({**stored, "webhook_secret": secret}, table="channels", org_id=current.org_id,
                          row_id=current.id)
    conn.execute(update(channels).where(channels.c.org_id == current.org_id, channels.c.id == current.id)
                 .values(credentials=sealed.ciphertext, key_version=sealed.key_version, updated_at=clock.now()))
    return secret


def default_channel(conn: Connection, org_id: int, kind: str) -> Any:
    """The org's channel for a kind: the default one if active, else any active one, else None."""
    return default_channels(conn, [org_id], kind).get((org_id, kind))


def default_channels(conn: Connection, org_ids: Iterable[int], kind: str | None = None) -> dict[tuple[int, str], Any]:
    """Each org's channel of each kind (of `kind` only, if given), chosen as `default_channel`
    chooses it, in one query: (org_id, kind) → the row."""
    query = select(channels).where(channels.c.org_id.in_(sorted(set(org_ids))), channels.c.status == "active")
    if kind is not None:
        query = query.where(channels.c.kind == kind)
    chosen: dict[tuple[int, str], Any] = {}
    for row in conn.execute(query.order_by(channels.c.org_id, channels.c.kind, channels.c.is_default.desc(),
                                           channels.c.id)):
        chosen.setdefault((row.org_id, row.kind), row)
    return chosen
