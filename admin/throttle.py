"""Sign-in throttling: failed attempts are counted per account and per client address, in a
store every web process shares (Redis when the broker is Redis), so a password cannot be
guessed faster by spreading attempts over processes or over accounts."""

from __future__ import annotations

import hashlib
import logging
import time

from limits import RateLimitItem, parse
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

log = logging.getLogger(__name__)

#: Failed sign-ins allowed per account, and per client address, before the form says "wait".
PER_ACCOUNT: RateLimitItem = parse("5/15minutes")
PER_ADDRESS: RateLimitItem = parse("50/15minutes")


class LoginThrottle:
    """Counts failed sign-ins; `retry_after` says how long a blocked caller must wait."""

    def __init__(self, storage_url: str) -> None:
        self._limiter = MovingWindowRateLimiter(storage_from_string(storage_url))

    @staticmethod
    def _account(email: str) -> str:
        # Keys in a shared store carry no e-mail address.
        return hashlib.sha256(email.strip().lower().encode()).hexdigest()[:32]

    def _keys(self, email: str, address: str) -> list[tuple[RateLimitItem, tuple[str, ...]]]:
        return [(PER_ACCOUNT, ("login", "account", self._account(email))),
                (PER_ADDRESS, ("login", "address", address or "-"))]

    def retry_after(self, email: str, address: str) -> int:
        """Seconds until this account/address may try again; 0 when it may try now.

        A store that cannot be reached lets the attempt through (logged): an outage of the
        counter must not lock every receptionist out of the console."""
        try:
            for item, key in self._keys(email, address):
                if not self._limiter.test(item, *key):
                    reset = self._limiter.get_window_stats(item, *key).reset_time
                    return max(1, int(reset - time.time()) + 1)
        except Exception as exc:  # noqa: BLE001 - any store failure: fail open, say so
            log.warning("login throttle unavailable: %s", type(exc).__name__)
        return 0

    def failed(self, email: str, address: str) -> None:
        """Count one failed attempt against the account and the address."""
        try:
            for item, key in self._keys(email, address):
                self._limiter.hit(item, *key)
        except Exception as exc:  # noqa: BLE001
            log.warning("login throttle unavailable: %s", type(exc).__name__)

    def succeeded(self, email: str) -> None:
        """A correct password clears the account's count (the address keeps its own)."""
        try:
            self._limiter.clear(PER_ACCOUNT, "login", "account", self._account(email))
        except Exception as exc:  # noqa: BLE001
            log.warning("login throttle unavailable: %s", type(exc).__name__)
