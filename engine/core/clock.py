"""One source of "now" for the engine, so tests can control time instead of sleeping."""

from __future__ import annotations

import contextlib
import threading
from contextvars import ContextVar
from datetime import datetime, timedelta, timezone
from typing import Iterator, Protocol

UTC = timezone.utc


class Clock(Protocol):
    """Anything that tells the current instant as an aware UTC datetime."""

    def now(self) -> datetime: ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class FrozenClock:
    """A clock that only moves when told to. Thread-safe, for tests and benchmarks."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FrozenClock needs an aware datetime")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, instant: datetime) -> None:
        if instant.tzinfo is None:
            raise ValueError("FrozenClock needs an aware datetime")
        with self._lock:
            self._now = instant.astimezone(UTC)

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now


_clock: Clock = SystemClock()
#: A clock for this context alone (a builder's rehearsal jumps over waits without moving the
#: process's clock, which every other request and worker thread reads).
_local: ContextVar[Clock | None] = ContextVar("lembra_local_clock", default=None)


def now() -> datetime:
    """The engine's current instant (aware, UTC): this context's clock when one is set."""
    local = _local.get()
    return (local or _clock).now()


@contextlib.contextmanager
def local(clock: Clock) -> Iterator[Clock]:
    """Use `clock` for `now()` in this context (thread, task) only, until the block ends."""
    token = _local.set(clock)
    try:
        yield clock
    finally:
        _local.reset(token)


def use(clock: Clock) -> Clock:
    """Install `clock` as the engine's clock; returns the previous one."""
    global _clock
    previous, _clock = _clock, clock
    return previous
