"""Whole-call limits for outbound HTTP: a deadline (connect + request + the whole answer) and a
cap on the answer's size.

A socket timeout bounds one read, not a call: a server that sends one byte every few seconds never
trips it and can hold a worker thread for hours, and one that answers 50 MB fills its memory.
urllib3's `Timeout(total=…)` is no better (it is the connect timeout plus a read timeout applied
per read). So a call runs inside a `Budget` (`with budget(seconds, max_bytes):`), kept per thread,
and the clients read and write through layers that ask it, before every blocking operation, how
long that operation may take: never past the deadline, which raises once it has passed. Each of
those operations is a single system call (or, for TLS, an `ssl` operation whose timeout CPython
applies as a deadline), so the call ends at its deadline whatever the server trickles.

- urllib3 (`gateway.http.Client`): `bounded_pools(manager)` gives a PoolManager's connections a
  response reader and a `send` that set the socket's timeout from the budget before each recv/send;
  the caller counts the answer's bytes against the cap as it reads it (`Budget.take`).
- httpx/httpcore (the `openai` package, `gateway.egress.httpx_client`): `BoundedBackend` wraps the
  network backend, so every read, write and TLS handshake of every connection asks the budget, and
  every byte read counts against the cap.
- smtplib (`gateway.egress.GuardedSMTP`): replies are read through `reader` (bounded, counted) and
  every command is sent after `bound_socket`.

Without a budget on the thread, both layers do exactly what the client would have done.
"""

from __future__ import annotations

import http.client
import io
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

__all__ = [
    "AnswerTooLarge",
    "BoundedBackend",
    "Budget",
    "DeadlineExceeded",
    "bound_socket",
    "bounded_pools",
    "budget",
    "current",
    "reader",
    "refuse_encoded",
]


class DeadlineExceeded(TimeoutError):
    """The call's deadline passed (a `socket.timeout`, so every client maps it as its read timeout)."""


class AnswerTooLarge(Exception):
    """The answer is larger than the call's cap (or compressed when an uncompressed one was asked
    for, so that its size could not be bounded before decoding it)."""


class Budget:
    """One call's limits: its deadline (on the monotonic clock) and how many answer bytes it may read."""

    def __init__(self, seconds: float, max_bytes: int) -> None:
        if seconds <= 0 or max_bytes <= 0:
            raise ValueError("a budget needs a positive deadline and size cap")
        self.seconds = float(seconds)
        self.max_bytes = int(max_bytes)
        self.deadline = time.monotonic() + self.seconds
        self.received = 0

    def left(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self.deadline - time.monotonic()

    def timeout(self, timeout: float | None = None) -> float:
        """How long the next blocking operation may take: `timeout` at most, never past the
        deadline. Raises DeadlineExceeded once the deadline has passed."""
        left = self.left()
        if left <= 0:
            raise DeadlineExceeded(f"the call's deadline of {self.seconds:g} s passed")
        return left if timeout is None else min(float(timeout), left)

    def take(self, count: int) -> None:
        """Count `count` more bytes of the answer; raise AnswerTooLarge past the cap."""
        self.received += count
        if self.received > self.max_bytes:
            raise AnswerTooLarge(f"the answer is larger than {self.max_bytes} bytes")


_local = threading.local()


def current() -> Budget | None:
    """The budget of the call this thread is making, if any."""
    return getattr(_local, "budget", None)


@contextmanager
def budget(seconds: float, max_bytes: int) -> Iterator[Budget]:
    """Run one call within `seconds` (connect included) reading at most `max_bytes` of answer."""
    previous = current()
    _local.budget = limits = Budget(seconds, max_bytes)
    try:
        yield limits
    finally:
        _local.budget = previous


# ------------------------------------------------------------------------------------ urllib3


class _BudgetedSocketReader(io.RawIOBase):
    """A socket's raw reader (`socket.SocketIO`) that sets the socket's timeout from the budget
    before each recv, so that the status line, the headers and the body are all read by the
    deadline, however slowly they come; with `counts`, every byte read counts against the cap."""

    def __init__(self, sock: socket.socket, *, counts: bool = False) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._counts = counts

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        limits = current()
        if limits is not None:
            self._sock.settimeout(limits.timeout())
        count = self._raw.readinto(buffer)
        if limits is not None and self._counts and count:
            limits.take(count)
        return count

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def reader(sock: socket.socket) -> io.BufferedReader:
    """A buffered reader of `sock` (what `sock.makefile("rb")` gives) whose every recv is bounded
    by the thread's budget and counts against its cap: for line protocols (SMTP's replies)."""
    return io.BufferedReader(_BudgetedSocketReader(sock, counts=True))


def bound_socket(sock: socket.socket | None) -> None:
    """Give `sock` what is left of the thread's budget as its timeout, before a send (a
    `sendall`'s timeout bounds the whole send); raise DeadlineExceeded once it has passed."""
    limits = current()
    if limits is not None and sock is not None:
        sock.settimeout(limits.timeout())


class _BudgetedFile:
    """What http.client's response is given instead of its socket: `makefile` is all it calls."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_BudgetedSocketReader(self._sock))


class _BudgetedHTTPResponse(http.client.HTTPResponse):
    """http.client's response, reading its socket through `_BudgetedSocketReader`."""

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(_BudgetedFile(sock), *args, **kwargs)  # type: ignore[arg-type]


class _BudgetedConnectionMixin:
    """urllib3's connection with every send and recv bounded by the thread's budget (see the module)."""

    sock: Any
    response_class = _BudgetedHTTPResponse

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        limits = current()
        if limits is not None:  # the TLS handshake that follows gets what is left, not a fresh timeout
            sock.settimeout(max(limits.left(), 0.001))
        return sock

    def send(self, data: Any) -> None:
        bound_socket(self.sock)
        super().send(data)  # type: ignore[misc]


@lru_cache(maxsize=None)
def _budgeted_pool(pool_class: type) -> type:
    connection_class = type(f"Budgeted{pool_class.ConnectionCls.__name__}",  # type: ignore[attr-defined]
                            (_BudgetedConnectionMixin, pool_class.ConnectionCls), {})  # type: ignore[attr-defined]
    return type(f"Budgeted{pool_class.__name__}", (pool_class,), {"ConnectionCls": connection_class})


def bounded_pools(manager: Any) -> Any:
    """`manager` (a urllib3 PoolManager or ProxyManager), its connections bounded by the thread's
    budget from now on (the classes are subclassed, so the egress guard's stay underneath)."""
    manager.pool_classes_by_scheme = {scheme: _budgeted_pool(cls)
                                      for scheme, cls in manager.pool_classes_by_scheme.items()}
    return manager


# --------------------------------------------------------------------------------- httpcore


def refuse_encoded(response: Any) -> None:
    """An httpx response hook (run before the body is read): refuse an answer that comes
    compressed although the client asked for `identity`, because the cap counts the bytes read,
    and a few kB of gzip can decode to gigabytes."""
    encoding = (response.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        response.close()
        raise AnswerTooLarge("a compressed answer, which was not asked for")



class BoundedBackend:
    """An httpcore network backend whose streams ask the thread's budget before each read, write
    and TLS handshake, and count what they read against its cap. `httpcore` is the module the
    backend belongs to (httpcore or httpcore2: the one the installed `openai` uses)."""

    def __init__(self, inner: Any, httpcore: Any) -> None:
        self._inner = inner
        self._httpcore = httpcore

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> Any:
        timeout = _bounded(self._httpcore.ConnectTimeout, timeout)
        stream = self._inner.connect_tcp(host, port, timeout=timeout, local_address=local_address,
                                         socket_options=socket_options)
        return _stream_class(self._httpcore)(stream)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> Any:
        raise self._httpcore.ConnectError("unix sockets are not used for tenant-set addresses")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _bounded(error: type[Exception], timeout: float | None) -> float | None:
    """`timeout` bounded by the thread's budget; `error` (an httpcore timeout) once it has passed."""
    limits = current()
    if limits is None:
        return timeout
    try:
        return limits.timeout(timeout)
    except DeadlineExceeded as exc:
        raise error(str(exc)) from None


@lru_cache(maxsize=2)
def _stream_class(httpcore: Any) -> type:
    class BoundedStream(httpcore.NetworkStream):  # type: ignore[misc,name-defined]
        """A network stream whose every operation is bounded by the thread's budget."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            data: bytes = self._inner.read(max_bytes, _bounded(httpcore.ReadTimeout, timeout))
            limits = current()
            if limits is not None:
                limits.take(len(data))
            return data

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._inner.write(buffer, _bounded(httpcore.WriteTimeout, timeout))

        def close(self) -> None:
            self._inner.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                      timeout: float | None = None) -> Any:
            return BoundedStream(self._inner.start_tls(ssl_context, server_hostname,
                                                       _bounded(httpcore.ConnectTimeout, timeout)))

        def get_extra_info(self, info: str) -> Any:
            return self._inner.get_extra_info(info)

    return BoundedStream
