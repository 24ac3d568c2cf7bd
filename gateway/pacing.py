"""Send pacing against WhatsApp bans (Evolution): a minimum interval between two sends from one
number, with jitter, and a daily cap — enforced across every worker process on every machine.

The arithmetic lives here; the shared state lives wherever the engine keeps it (a row per
channel in the database), reached through `PacingStore`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol


@dataclass(frozen=True)
class PacingPolicy:
    """`min_interval` between sends (plus up to `jitter` more), at most `daily_cap` per local day."""

    min_interval: timedelta
    jitter: timedelta
    daily_cap: int | None

    @classmethod
    def from_channel(cls, min_interval_ms: int | None, daily_cap: int | None) -> "PacingPolicy | None":
        """None when the channel is not paced at all."""
        if not min_interval_ms and not daily_cap:
            return None
        interval = timedelta(milliseconds=min_interval_ms or 0)
        return cls(min_interval=interval, jitter=interval / 2, daily_cap=daily_cap)

    def next_gap(self, rng: random.Random | None = None) -> timedelta:
        """The wait after one send before the next may start."""
        spread = (rng or random).random()
        return self.min_interval + self.jitter * spread


@dataclass(frozen=True)
class Reservation:
    """A slot to send at `at`; `over_cap` when the day's cap is used up (then `at` is tomorrow)."""

    at: datetime
    over_cap: bool = False


class PacingStore(Protocol):
    """Atomically reserve the channel's next send slot."""

    def reserve(self, channel_id: int, policy: PacingPolicy, now: datetime, day: str,
                next_day_start: datetime) -> Reservation: ...
