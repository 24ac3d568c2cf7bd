"""Where the credential keyring comes from: the environment, or a key file in embedded mode."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url

from engine.core.config import ConfigError, Settings
from gateway.crypto import CryptoError, Keyring


def keyring_for(settings: Settings) -> Keyring:
    """The keyring from LEMBRA_SECRET_KEYS, or (SQLite only) from a key file next to the database.

    The embedded default must start with no setup, so it makes its own key on first start and
    keeps it beside the database file with owner-only permissions.
    """
    if settings.secret_keys:
        try:
            return Keyring.parse(settings.secret_keys)
        except CryptoError as exc:
            raise ConfigError(str(exc)) from None
    if not settings.is_sqlite:
        raise ConfigError("LEMBRA_SECRET_KEYS is required with PostgreSQL (generate one with `lembra keys generate`)")
    database = make_url(settings.database_url).database
    if not database or database == ":memory:":
        return Keyring.parse(Keyring.generate_spec())
    path = Path(database).expanduser().resolve().with_suffix(".key")
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(Keyring.generate_spec() + "\n")
    try:
        return Keyring.parse(path.read_text().strip())
    except CryptoError as exc:
        raise ConfigError(f"{path}: {exc}") from None
