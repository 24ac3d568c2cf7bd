"""A loopback fake of Zenvia's v2 API answering with the published responses.

Sources (shared/conformance/zenvia.md and samples/INDEX.md):
- send answer: `samples/zenvia/send_response_courier_mock.json` (nyaruka/courier mock `{"id": "55555"}`;
  no real capture was published);
- error answers: `samples/zenvia/error_validation_courier_mock.json` (courier mock in Zenvia's error
  shape) and, for the codes of the spec's error table (notes §2) without a published body, the
  documented shape `{code, message, details}` with the table's code and message.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from tests.conformance import sample_bytes
from tests.fakes.server import FakeServer, Recorded, Reply

SAMPLES = "samples/zenvia/"


def sample_json(name: str) -> Any:
    return json.loads(sample_bytes(SAMPLES + name))


def sent() -> Reply:
    """The (mock) 200 answer to POST /v2/channels/sms/messages."""
    return Reply(200, sample_bytes(SAMPLES + "send_response_courier_mock.json"))


def validation_error(status: int = 400) -> Reply:
    """The published error body (courier mock), at the given status (courier also tests it on a 200)."""
    return Reply(status, sample_bytes(SAMPLES + "error_validation_courier_mock.json"))


def table_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    """An error of the spec's table (§2) in the documented shape."""
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
