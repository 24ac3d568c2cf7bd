"""The process's runtime: settings, database, keyring and provider pool, built once."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

from engine.core.config import Settings
from engine.store.db import Database
from engine.store.provider_pool import ProviderPool
from engine.store.keyring import keyring_for
from gateway.crypto import Keyring


@dataclass
class Runtime:
    """Everything an actor or a request needs to reach the database and the providers."""

    settings: Settings
    db: Database
    keyring: Keyring
    providers: ProviderPool

    @classmethod
    def build(cls, settings: Settings) -> "Runtime":
        db = Database(settings.database_url)
        keyring = keyring_for(settings)
        providers = ProviderPool(db, keyring, timeout=settings.send_timeout, public_url=settings.public_url,
                                 egress=settings.egress)
        return cls(settings=settings, db=db, keyring=keyring, providers=providers)

    def close(self) -> None:
        self.db.dispose()


_current: Optional[Runtime] = None
_lock = threading.Lock()


def current() -> Runtime:
    """The installed runtime, or one built from the environment on first use (worker processes)."""
    global _current
    with _lock:
        if _current is None:
            _current = Runtime.build(Settings.from_env())
        return _current


def install(runtime: Optional[Runtime]) -> Optional[Runtime]:
    """Install `runtime` as the process's runtime; returns the previous one."""
    global _current
    with _lock:
        previous, _current = _current, runtime
        return previous
