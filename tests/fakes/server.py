"""A scriptable HTTP server on loopback that provider fakes build on.

A fake records every request exactly as received (method, path, query, headers, raw body) and
answers from a handler the test controls, so tests assert on what went over the wire. A reply's
body may be a `Streamed` one: written a chunk at a time (a trickle, or 50 MB never held whole),
which records how much of it the client took before hanging up.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs, urlsplit


@dataclass
class Recorded:
    """One request as the fake received it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> dict[str, list[str]]:
        return parse_qs(self.body.decode(), keep_blank_values=True)

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


@dataclass
class Reply:
    """What the fake answers."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0

    def encoded(self) -> bytes:
        if self.body is None:
            return b""
        if isinstance(self.body, (bytes, str)):
            return self.body if isinstance(self.body, bytes) else self.body.encode()
        return json.dumps(self.body).encode()


@dataclass
class Streamed:
    """A body written chunk by chunk, `interval` seconds apart, generated as it goes (never whole in
    memory). `length` is announced as Content-Length. After the reply, `sent` is how many bytes the
    client took and `finished` whether all of them went out (False: the client hung up first)."""

    chunks: Callable[[], Iterable[bytes]]
    length: int
    interval: float = 0.0
    sent: int = 0
    finished: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def trickle(cls, payload: bytes, interval: float) -> "Streamed":
        """`payload` one byte every `interval` seconds."""
        return cls(lambda: (payload[i:i + 1] for i in range(len(payload))), len(payload), interval)

    @classmethod
    def huge(cls, size: int, chunk: bytes = b" " * 65536) -> "Streamed":
        """`size` bytes (spaces, valid JSON whitespace), as fast as the client reads them."""
        def chunks() -> Iterable[bytes]:
            left = size
            while left > 0:
                yield chunk[:left]
                left -= len(chunk)
        return cls(chunks, size)

    def write(self, wfile: Any) -> None:
        try:
            for piece in self.chunks():
                if self.interval:
                    threading.Event().wait(self.interval)
                wfile.write(piece)
                wfile.flush()
                self.sent += len(piece)
            self.finished = True
        except OSError:  # the client hung up
            pass
        finally:
            self.done.set()


Handler = Callable[[Recorded], Reply]


class FakeServer:
    """`with FakeServer(handler) as fake:` serves on 127.0.0.1:<free port> until the block ends."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        fake = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                recorded = Recorded(self.command, parts.path, parse_qs(parts.query), dict(self.headers.items()), body)
                with fake._lock:
                    fake.requests.append(recorded)
                reply = fake.handler(recorded)
                if reply.delay:
                    threading.Event().wait(reply.delay)
                streamed = reply.body if isinstance(reply.body, Streamed) else None
                payload = b"" if streamed is not None else reply.encoded()
                self.send_response(reply.status)
                headers = {"Content-Type": "application/json", **reply.headers}
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(streamed.length if streamed is not None else len(payload)))
                self.end_headers()
                if streamed is not None:
                    self.wfile.flush()
                    streamed.write(self.wfile)
                    self.close_connection = not streamed.finished
                else:
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
