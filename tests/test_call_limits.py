"""Every outbound call ends at its whole-call deadline and reads at most its size cap (issue 30,
point 7): a provider call (gateway/http.py, urllib3; and an SMTP conversation) and an LLM call (the
`openai` client over httpx), each against a loopback server that trickles its answer a byte at a
time (a socket timeout never trips: each byte comes well within it) and one that answers without end
(50 MB, streamed; SMTP reply lines).

The deadlines here are small so the tests are quick; the servers would go on for far longer, so a
client that only had a per-read timeout reads the whole trickle and these tests fail. None of them
measures time: they check what the client raised and that the server was cut off before its end.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from engine.flows.ai.base import AIError
from engine.flows.ai.openai_compat import MAX_ANSWER_BYTES, OpenAICompatAI
from gateway import limits
from gateway.contract import ProviderContext
from gateway.egress import LOOPBACK
from gateway.errors import TransientError
from gateway.http import MAX_ANSWER_BYTES as PROVIDER_MAX_BYTES
from gateway.http import Client, call
from providers.email.smtp import SmtpProvider
from tests.fakes.llm import Huge, LLMFake, Trickle, completion
from tests.fakes.server import FakeServer, Reply, Streamed
from tests.flows.test_ai import context

#: The per-call deadline of these tests, and the trickle's pace: a byte every 20 ms comes well within
#: any per-read timeout, and the answers below take seconds to trickle out whole.
DEADLINE = 0.4
PACE = 0.02
FIFTY_MB = 50 * 1024 * 1024


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def _cut_off(streamed: Streamed) -> None:
    # The client hung up: the server's next writes fail and it stops (a bounded wait, not a timing).
    assert streamed.done.wait(30), "the server is still writing: the client did not hang up"
    assert not streamed.finished and streamed.sent < streamed.length


# ------------------------------------------------------------------------ provider calls


def test_a_provider_that_trickles_its_answer_is_cut_off_at_the_calls_deadline() -> None:
    body = Streamed.trickle(json.dumps({"messages": [{"id": "wamid." + "1" * 200}]}).encode(), PACE)
    with FakeServer(lambda req: Reply(200, body)) as fake:
        client = Client(LOOPBACK)
        with pytest.raises(TransientError) as raised:
            call(client, "POST", f"{fake.url}/v21.0/1/messages", timeout=DEADLINE, json={"to": "1"})
        _cut_off(body)
        # The request went out: the provider may have acted on it.
        assert (raised.value.code, raised.value.outcome_unknown) == ("timeout", True)
        client.close()


@contextmanager
def head_trickler(interval: float) -> Iterator[tuple[str, dict[str, int]]]:
    """A server that answers every request with its status line and headers a byte at a time."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Pad: " + b"a" * 400 + b"\r\n"
    listener = socket.create_server(("127.0.0.1", 0))
    stats = {"sent": 0, "total": len(head)}
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for i in range(len(head)):
                if stop.wait(interval):
                    return
                try:
                    conn.sendall(head[i:i + 1])
                except OSError:
                    return
                stats["sent"] += 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", stats
    finally:
        stop.set()
        thread.join(10)
        listener.close()


def test_a_provider_that_trickles_its_status_line_and_headers_is_cut_off_too() -> None:
    with head_trickler(PACE) as (url, stats):
        client = Client(LOOPBACK)
        with pytest.raises(TransientError) as raised:
            call(client, "GET", f"{url}/check", timeout=DEADLINE)
        assert raised.value.code == "timeout"
        assert stats["sent"] < stats["total"]  # the headers never ended
        client.close()


def test_a_provider_that_answers_50_mb_is_cut_off_at_the_cap_and_the_client_goes_on() -> None:
    huge = Streamed.huge(FIFTY_MB)
    replies = iter([Reply(200, huge), Reply(200, {"messages": [{"id": "wamid.2"}]})])
    with FakeServer(lambda req: next(replies)) as fake:
        client = Client(LOOPBACK)
        with pytest.raises(TransientError) as raised:
            call(client, "POST", f"{fake.url}/v21.0/1/messages", timeout=30, json={"to": "1"})
        assert (raised.value.code, raised.value.outcome_unknown) == ("provider_answer_too_large", True)
        _cut_off(huge)
        assert huge.sent < FIFTY_MB // 2
        # The cut connection was not handed back with 49 MB unread: the next call gets its own answer.
        ok = call(client, "POST", f"{fake.url}/v21.0/1/messages", timeout=5, json={"to": "1"})
        assert ok.body == {"messages": [{"id": "wamid.2"}]}
        client.close()


def test_an_answer_under_the_cap_is_read_whole_and_decoded() -> None:
    payload = {"data": ["x" * 1000] * 500}  # ~500 kB of JSON, sent gzip'd: read and decoded whole
    raw = gzip.compress(json.dumps(payload).encode())
    with FakeServer(lambda req: Reply(200, raw, {"Content-Encoding": "gzip"})) as fake:
        client = Client(LOOPBACK)
        assert call(client, "GET", f"{fake.url}/templates", timeout=5).body == payload
        with pytest.raises(TransientError) as raised:  # the cap counts decoded bytes: no gzip bomb
            call(client, "GET", f"{fake.url}/templates", timeout=5, max_bytes=100_000)
        assert raised.value.code == "provider_answer_too_large"
        client.close()
    assert PROVIDER_MAX_BYTES < FIFTY_MB


# ----------------------------------------------------------------------------- LLM calls


def test_a_model_that_trickles_its_answer_is_a_transient_timeout_at_the_deadline() -> None:
    with LLMFake(Trickle(PACE, {"label": "confirm"})) as fake:
        ai = OpenAICompatAI(fake.base_url, "sk-test", "llama3", timeout=DEADLINE, egress=LOOPBACK)
        with pytest.raises(AIError) as raised:
            ai.classify(text="sim", classes=["confirm"], keywords={}, hint=None, context=context())
        assert (raised.value.code, raised.value.permanent) == ("timeout", False)
        [streamed] = fake.streams
        _cut_off(streamed)
        ai.close()


def test_a_model_that_answers_50_mb_is_a_transient_error_at_the_cap() -> None:
    with LLMFake(Huge(FIFTY_MB)) as fake:
        ai = OpenAICompatAI(fake.base_url, "sk-test", "llama3", timeout=30, egress=LOOPBACK)
        with pytest.raises(AIError) as raised:
            ai.write(prompt_hint="Oi", max_chars=200, context=context())
        assert (raised.value.code, raised.value.permanent) == ("answer_too_large", False)
        [streamed] = fake.streams
        _cut_off(streamed)
        assert streamed.sent < FIFTY_MB // 2
        # The next call opens a fresh connection and gets its answer.
        fake.script({"mensagem": "Olá!"})
        assert ai.write(prompt_hint="Oi", max_chars=200, context=context()).text == "Olá!"
        ai.close()
    assert MAX_ANSWER_BYTES < FIFTY_MB


def test_the_model_is_asked_for_an_uncompressed_answer_and_a_compressed_one_is_refused_unread() -> None:
    # A few kB of gzip can decode to gigabytes: the cap counts the bytes read, so none may be compressed.
    body = gzip.compress(json.dumps(completion('{"label": "confirm"}', model="llama3")).encode())
    with LLMFake(Reply(200, body, {"Content-Encoding": "gzip"})) as fake:
        ai = OpenAICompatAI(fake.base_url, None, "llama3", timeout=5, egress=LOOPBACK)
        with pytest.raises(AIError) as raised:
            ai.classify(text="sim", classes=["confirm"], keywords={}, hint=None, context=context())
        assert raised.value.code == "answer_too_large"
        assert fake.requests[0].header("Accept-Encoding") == "identity"
        ai.close()


# --------------------------------------------------------------------------------- budget


def test_a_budget_is_the_threads_and_ends_with_its_call() -> None:
    assert limits.current() is None
    with limits.budget(5, 10) as outer:
        with limits.budget(1, 10) as inner:
            assert limits.current() is inner
            inner.take(10)
            with pytest.raises(limits.AnswerTooLarge):
                inner.take(1)
        assert limits.current() is outer
        seen: list[object] = []
        thread = threading.Thread(target=lambda: seen.append(limits.current()))
        thread.start()
        thread.join()
        assert seen == [None]  # another thread's calls are not bound by this one's budget
    assert limits.current() is None
    with pytest.raises(ValueError):
        limits.Budget(0, 10)


# ---------------------------------------------------------------------------------- SMTP


@contextmanager
def smtp_relay(script: Iterator[bytes], interval: float) -> Iterator[tuple[int, dict[str, int]]]:
    """A relay that writes `script`'s pieces `interval` seconds apart, whatever the client says."""
    listener = socket.create_server(("127.0.0.1", 0))
    stats = {"sent": 0, "finished": 0}
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(0.0)
            for piece in script:
                if stop.wait(interval):
                    return
                try:
                    conn.recv(65536)  # whatever the client sent meanwhile
                except (BlockingIOError, OSError):
                    pass
                try:
                    conn.sendall(piece)
                except OSError:
                    return
                stats["sent"] += len(piece)
            stats["finished"] = 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], stats
    finally:
        stop.set()
        thread.join(10)
        listener.close()


def _smtp(port: int, timeout: float) -> SmtpProvider:
    config = {"host": "127.0.0.1", "port": str(port), "security": "none", "from_email": "agenda@clinica.example"}
    return SmtpProvider(config, ProviderContext(org_id=1, channel_id=1, timeout=timeout, egress=LOOPBACK))


def test_a_relay_that_trickles_its_greeting_is_cut_off_at_the_send_timeout() -> None:
    greeting = b"220 " + b"x" * 300 + b"\r\n"
    pieces = (greeting[i:i + 1] for i in range(len(greeting)))
    with smtp_relay(pieces, PACE) as (port, stats):
        with pytest.raises(TransientError) as raised:
            _smtp(port, DEADLINE).check()
        assert raised.value.code == "timeout"
        assert not stats["finished"]


def test_a_relay_that_sends_reply_lines_without_end_is_cut_off_at_the_cap() -> None:
    lines = (b"220-" + b"x" * 1000 + b"\r\n" for _ in range(100_000))  # ~100 MB of one endless greeting
    with smtp_relay(lines, 0.0) as (port, stats):
        with pytest.raises(TransientError) as raised:
            _smtp(port, 30).check()
        assert raised.value.code == "smtp_error"
        assert not stats["finished"] and stats["sent"] < 10_000_000
