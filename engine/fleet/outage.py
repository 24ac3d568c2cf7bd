"""How the scheduler says that the broker is down: once when it goes, a line a minute while it
lasts, and once when it is back. Not an ERROR with a traceback on every pass: an outage of an hour
would be thousands of them, and the one line that matters (when it began) would scroll away."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from engine.core import clock

#: How often a lasting outage is said again.
REMIND_EVERY = timedelta(minutes=1)


class BrokerOutage:
    """The outage the scheduler is in, if any, on the engine clock."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.since: datetime | None = None
        self._said_at: datetime | None = None
        self._failures = 0

    @property
    def active(self) -> bool:
        """Whether the broker was last found unreachable."""
        return self.since is not None

    def failed(self, reason: str) -> None:
        """The broker could not be reached (a hand-over or a probe failed, for `reason`: an
        error's type name or a one-line reason without credentials)."""
        now = clock.now()
        if self.since is None:
            self.since = self._said_at = now
            self._failures = 1
            self.log.error("broker unreachable: due work waits in the database until it answers again",
                           extra={"error": reason})
            return
        self._failures += 1
        assert self._said_at is not None
        if now - self._said_at >= REMIND_EVERY:
            self._said_at = now
            self.log.error("broker still unreachable", extra={"error": reason, "down_seconds": self._down(now),
                                                              "failed_attempts": self._failures})

    def answered(self) -> None:
        """The broker answered (a hand-over or a probe succeeded): the outage, if any, is over."""
        if self.since is None:
            return
        now = clock.now()
        self.log.warning("broker reachable again", extra={"down_seconds": self._down(now),
                                                          "failed_attempts": self._failures})
        self.since = self._said_at = None
        self._failures = 0

    def _down(self, now: datetime) -> int:
        assert self.since is not None
        return int((now - self.since).total_seconds())
