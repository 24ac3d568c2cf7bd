"""The provider instances a process sends through: one per channel, built from the channel row's
decrypted credentials and rebuilt when the row changes; and the sandbox's recorder."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import insert

from engine.core import clock
from engine.store.db import Database
from engine.store.dialect import insert_ignore
from engine.store.models import early_statuses, sandbox_messages
from gateway import registry
from gateway.contract import OutboundMessage, Provider, ProviderContext
from gateway.crypto import Keyring
from gateway.egress import STRICT, EgressPolicy


class DbSandboxRecorder:
    """Records what the sandbox provider 'sent' in `sandbox_messages`, in its own transaction,
    the way a real provider's side effect is independent of ours.

    Its receipts (`receipts_after`) are written, in the same transaction, as statuses that arrive
    later (`received_at` ahead) in `early_statuses`, where a real provider's status that came
    before its send waits: the scheduler applies each once it has arrived and the send is recorded
    (messaging.statuses.settle_early), through `apply_status` like any status webhook. So they need
    no thread, work with the embedded worker and with real ones, follow a test's clock, and a
    duplicate is one row (the table's key)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, org_id: int, channel_id: int, message: OutboundMessage, *,
               receipts_after: float = 0.0) -> str:
        """Record `message`; with `receipts_after` > 0 seconds, schedule its delivered and read."""
        provider_id = f"sbx-{uuid.uuid4().hex}"
        now = clock.now()
        with self.db.begin() as conn:
            conn.execute(insert(sandbox_messages).values(
                org_id=org_id,
                channel_id=channel_id,
                provider_message_id=provider_id,
                idempotency_key=message.idempotency_key,
                to_address=message.to,
                subject=message.subject,
                body=message.text,
                buttons=[{"id": b.id, "title": b.title} for b in message.buttons] or None,
                created_at=now,
            ))
            if receipts_after > 0:
                for status, factor in (("delivered", 1), ("read", 2)):
                    due = now + timedelta(seconds=receipts_after * factor)  # when it "arrives"
                    conn.execute(insert_ignore(conn, early_statuses, ("channel_id", "provider_message_id", "status"))
                                 .values(org_id=org_id, channel_id=channel_id, provider_message_id=provider_id,
                                         status=status, occurred_at=due,
                                         error_code=None, error_permanent=False, opt_out=False, reference=None,
                                         received_at=due))
        return provider_id


class ProviderPool:
    """Provider instances per channel, rebuilt when the channel row changes."""

    def __init__(self, db: Database, keyring: Keyring, *, timeout: float, public_url: str,
                 egress: EgressPolicy = STRICT) -> None:
        self.db = db
        self.keyring = keyring
        self.timeout = timeout
        self.public_url = public_url
        #: Where the channels' tenant-set addresses may connect (`Settings.egress`).
        self.egress = egress
        self.recorder = DbSandboxRecorder(db)
        self._cache: dict[int, tuple[Any, Provider]] = {}
        self._lock = threading.Lock()

    def get(self, channel: Any) -> Provider:
        """The provider for a `channels` row (decrypting its credentials once per version)."""
        # The sealed credentials themselves, not only the time of the change: two edits within one
        # clock tick (or a frozen clock) must not hand out a provider with the old URL and key.
        stamp = (channel.updated_at, channel.key_version, bytes(channel.credentials or b""))
        with self._lock:
            cached = self._cache.get(channel.id)
            if cached and cached[0] == stamp:
                return cached[1]
        config: dict[str, Any] = dict(channel.settings or {})
        if channel.credentials:
            config.update(self.keyring.open(
                channel.credentials, key_version=channel.key_version, table="channels",
                org_id=channel.org_id, row_id=channel.id,
            ))
        context = ProviderContext(
            org_id=channel.org_id, channel_id=channel.id, timeout=self.timeout,
            public_url=self.public_url, sandbox_recorder=self.recorder, egress=self.egress,
        )
        provider = registry.load(channel.provider)(config, context)
        with self._lock:
            self._cache[channel.id] = (stamp, provider)
        return provider
