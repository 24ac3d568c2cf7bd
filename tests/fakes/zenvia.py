"""A loopback fake of Zenvia's v2 API answering in the documented wire format.

Fixtures: tests/fixtures/providers/zenvia/ (how each was written and its sources:
tests/fixtures/providers/README.md):
- send answer: `send_response.json`, the Message object the spec documents as the 200 answer (no
  real capture is published);
- error answers: `error_validation.json` (the spec's error object with `details`) and, for the
  codes of the spec's error table, the documented shape `{code, message, details}` built here.
"""

from __future__ import annotations

from typing import Any, Callable

from tests.fakes.server import FakeServer, Recorded, Reply
from tests.fixtures import fixture_bytes, fixture_json

SAMPLES = "zenvia/"


def sample_json(name: str) -> Any:
    """A fixture of tests/fixtures/providers/zenvia/, parsed (a fresh copy each call)."""
    return fixture_json(SAMPLES + name)


def sent() -> Reply:
    """The documented 200 answer to POST /v2/channels/sms/messages (the created Message)."""
    return Reply(200, fixture_bytes(SAMPLES + "send_response.json"))


def validation_error(status: int = 400) -> Reply:
    """The error fixture at the given status (a 200 carrying an error body must fail too)."""
    return Reply(status, fixture_bytes(SAMPLES + "error_validation.json"))


def table_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    """An error of the spec's error table in the documented shape."""
    return Reply(status, {"code": code, "message": message, "details": []}, headers=dict(headers or {}))


class FakeZenvia(FakeServer):
    """Answers scripted replies in order, then `default` (the documented send answer)."""

    def __init__(self, *replies: Reply | Callable[[Recorded], Reply], default: Reply | None = None) -> None:
        self.script = list(replies)
        self.default = default or sent()
        super().__init__(self._answer)

    def _answer(self, request: Recorded) -> Reply:
        if self.script:
            reply = self.script.pop(0)
            return reply(request) if callable(reply) else reply
        return self.default
