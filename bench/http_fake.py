"""A loopback fake of Meta's WhatsApp Cloud API send endpoint, for bench/throughput.py.

    python bench/http_fake.py --port 0 --ready-file /tmp/fake.port

It runs as its own process (started by the benchmark), so its CPU is measured apart from the
workers', and it answers what Lembra's Meta provider (providers/meta/provider.py) expects:

- `POST /<version>/<phone_number_id>/messages` with `Authorization: Bearer <token>` and a JSON
  body → `200 {"messaging_product":"whatsapp","contacts":[{"input":to,"wa_id":to}],
  "messages":[{"id":"wamid.<unique>"}]}`; without a Bearer token → 401 with Meta's error 190;
  a body that is not JSON → 400 with Meta's error 100;
- `GET /stats` → how many times each `biz_opaque_callback_data` arrived (the benchmark checks
  0 duplicates / 0 lost against the database), the request count, and one sample body (so the
  bare-wire client posts exactly what Lembra posted);
- `GET /arrivals` → every send as `[monotonic, to, reference, text]` in arrival order: when it
  arrived on this machine's monotonic clock (`time.monotonic()`, CLOCK_MONOTONIC, the same in
  every process), for bench/conversations.py's turn latency;
- `GET /count` → `{"sends": n}`, the sends so far, cheap enough to poll every second (the
  benchmark's progress; counting `sent` rows in the database every second cost PostgreSQL
  0.5 s a poll over a million-row table);
- `POST /reset` → forget the counts (between phases).

Why hand-written on asyncio rather than http.server: the fake must not be the bottleneck of
either the engine or the bare `requests` baseline. A single asyncio process parsing just the
request line, the headers it needs and Content-Length answers tens of thousands of keep-alive
(HTTP/1.1) requests per second, far more than a thread-per-connection server on 2 cores. It
needs nothing beyond the standard library, so it starts in the venv of whichever checkout runs
the benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

#: Requests larger than this are refused: Lembra's bodies are ~1 KiB.
MAX_BODY = 1 << 20
_wamid = itertools.count(1)


class FakeState:
    """What arrived: per-reference counts (the duplicate/lost check), totals, a sample body."""

    def __init__(self) -> None:
        self.references: Counter[str] = Counter()
        self.requests = 0
        self.sends = 0
        self.without_reference = 0
        self.refused = 0
        self.sample_body: Any = None
        self.sample_path: str | None = None
        #: (monotonic arrival, to, reference, text body or None) per send, in arrival order.
        self.arrivals: list[tuple[float, str, str | None, str | None]] = []

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def stats(self) -> dict[str, Any]:
        return {"requests": self.requests, "sends": self.sends, "without_reference": self.without_reference,
                "refused": self.refused, "distinct_references": len(self.references),
                "duplicates": sum(1 for c in self.references.values() if c > 1),
                "references": dict(self.references), "sample_body": self.sample_body,
                "sample_path": self.sample_path, "pid": os.getpid()}


def _response(status: int, reason: str, body: bytes, close: bool = False) -> bytes:
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n")
    return head.encode("ascii") + body


def _meta_error(code: int, message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": code,
                                 "fbtrace_id": "AbCdEfGhIjKlMnOp"}}).encode()


class Handler(asyncio.Protocol):
    """One keep-alive connection: parse pipelined requests out of the byte stream as they come."""

    def __init__(self, state: FakeState, prefix: str) -> None:
        self.state = state
        self.prefix = prefix  # the wamid prefix: unique per fake run
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > 65536:
                    self._close(400)
                return
            head = bytes(self.buffer[:end]).decode("latin-1")
            lines = head.split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                self._close(400)
                return
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                self._close(400)
                return
            if length > MAX_BODY or "chunked" in headers.get("transfer-encoding", "").lower():
                self._close(413)  # requests sends Content-Length for json=: chunking is not needed
                return
            if len(self.buffer) < end + 4 + length:
                return  # the body is still arriving
            body = bytes(self.buffer[end + 4:end + 4 + length])
            del self.buffer[:end + 4 + length]
            close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
            assert self.transport is not None
            self.transport.write(self._answer(method, target, headers, body, close))
            if close:
                self.transport.close()
                return

    def _close(self, status: int) -> None:
        if self.transport is not None:
            self.transport.write(_response(status, "Bad Request", b"{}", close=True))
            self.transport.close()

    def _answer(self, method: str, target: str, headers: dict[str, str], body: bytes, close: bool) -> bytes:
        state = self.state
        state.requests += 1
        path = target.split("?", 1)[0]
        if method == "POST" and path.endswith("/messages"):
            if not headers.get("authorization", "").startswith("Bearer ") or len(headers["authorization"]) < 12:
                state.refused += 1
                return _response(401, "Unauthorized", _meta_error(190, "Invalid OAuth access token.",
                                                                  "OAuthException"), close)
            try:
                data = json.loads(body)
                to = data["to"]
            except (ValueError, KeyError, TypeError):
                state.refused += 1
                return _response(400, "Bad Request", _meta_error(100, "Invalid parameter", "OAuthException"), close)
            reference = data.get("biz_opaque_callback_data")
            if isinstance(reference, str) and reference:
                state.references[reference] += 1
            else:
                state.without_reference += 1
            state.sends += 1
            text = data.get("text")
            state.arrivals.append((time.monotonic(), str(to), reference if isinstance(reference, str) else None,
                                   text.get("body") if isinstance(text, dict) else None))
            if state.sample_body is None and not str(reference).startswith("wire-"):
                state.sample_body, state.sample_path = data, path
            answer = (b'{"messaging_product":"whatsapp","contacts":[{"input":"%s","wa_id":"%s"}],'
                      b'"messages":[{"id":"wamid.%s%d"}]}' % (str(to).encode(), str(to).encode(),
                                                             self.prefix.encode(), next(_wamid)))
            return _response(200, "OK", answer, close)
        if method == "GET" and path == "/count":
            return _response(200, "OK", b'{"sends":%d}' % state.sends, close)
        if method == "GET" and path == "/arrivals":
            return _response(200, "OK", json.dumps(state.arrivals).encode(), close)
        if method == "GET" and path == "/stats":
            return _response(200, "OK", json.dumps(state.stats()).encode(), close)
        if method == "POST" and path == "/reset":
            state.reset()
            return _response(200, "OK", b"{}", close)
        return _response(404, "Not Found", _meta_error(803, "Unknown path", "OAuthException"), close)


async def serve(host: str, port: int, ready_file: Path | None, stats_file: Path | None) -> None:
    state = FakeState()
    prefix = f"HBgM{os.getpid():x}x"
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Handler(state, prefix), host, port, backlog=1024, reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    if ready_file is not None:
        # Written atomically so the benchmark never reads half a port number.
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(str(bound))
        tmp.replace(ready_file)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    if stats_file is not None:
        stats_file.write_text(json.dumps(state.stats()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (written to --ready-file)")
    p.add_argument("--ready-file", type=Path, default=None, help="write the bound port here once listening")
    p.add_argument("--stats-file", type=Path, default=None, help="write the final /stats here on SIGTERM")
    args = p.parse_args(argv)
    try:
        import uvloop  # type: ignore[import-not-found]  # faster when present; not required
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.host, args.port, args.ready_file, args.stats_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
