"""Hooks: how a lower layer announces a change that an upper layer acts on, without importing it.

An appointment that is created or cancelled starts or ends follow-up runs, and flows also book
and move appointments: the appointments sit below the flows that act on them, and announce their
changes through a hook the flows package connects when it is imported. A hook nobody connected
refuses to fire rather than drop the announcement: a process that changes appointments without
having loaded the flows would otherwise skip their triggers silently.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

R = TypeVar("R", bound=Callable[..., Any])


class HookNotConnected(RuntimeError):
    """A hook fired before its receiver was connected (the receiving package was never imported)."""


class Hook(Generic[R]):
    """One announcement, with the one receiver its upper layer connects (in the caller's transaction)."""

    def __init__(self, name: str, receiver_module: str) -> None:
        self.name = name
        #: The module that connects the receiver, named so that the error says what to import.
        self.receiver_module = receiver_module
        self._receiver: R | None = None

    def connect(self, receiver: R) -> R:
        """Set the receiver (connecting the same function again is harmless); usable as a decorator."""
        if self._receiver is not None and self._receiver is not receiver:
            raise ValueError(f"hook {self.name!r} already has a receiver")
        self._receiver = receiver
        return receiver

    def fire(self, *args: Any, **kwargs: Any) -> Any:
        """Call the receiver and return what it returns; HookNotConnected when there is none."""
        if self._receiver is None:
            raise HookNotConnected(f"hook {self.name!r} has no receiver: import {self.receiver_module}")
        return self._receiver(*args, **kwargs)
