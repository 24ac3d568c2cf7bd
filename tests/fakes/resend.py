"""A loopback stand-in for Resend's API (`POST /emails`) and a Svix signer for its webhooks.

Answers follow Resend's documented wire format, never our provider's code (fixtures in
tests/fixtures/providers/resend/; how each was written and its sources: tests/fixtures/providers/README.md):
- success: `send_response.json` (`{"id": <uuid>}`);
- 400 validation_error: `error_400_validation.json`;
- the other errors use Resend's documented error schema `{"statusCode", "message", "name"}` with the
  names/statuses of https://resend.com/docs/api-reference/errors and resend-python `exceptions.py`,
  and the 429 headers of https://resend.com/docs/api-reference/rate-limit
  (`ratelimit-limit`, `ratelimit-remaining`, `ratelimit-reset`, `retry-after`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections import deque
from typing import Any

from tests.fakes.server import FakeServer, Recorded, Reply
from tests.fixtures import fixture_bytes

#: Documented errors: (name, HTTP status, message as documented). `validation_error` appears with
#: three statuses in the docs (400 field error, 422, 403 unverified domain / testing-only sender).
#: monthly_quota_exceeded's message is not in the stored docs (name from resend-python ERRORS list).
DOCUMENTED_ERRORS: list[tuple[str, int, str]] = [
    ("invalid_idempotency_key", 400, "The key must be between 1-256 chars."),
    ("validation_error", 400, "We found an error with one or more fields in the request."),
    ("validation_error", 422, "We found an error with one or more fields in the request."),
    ("missing_required_field", 422, "The request body is missing one or more required fields."),
    ("invalid_attachment", 422, "Attachment must have either a content or path."),
    ("missing_api_key", 401, "Missing API key in the authorization header."),
    ("restricted_api_key", 401, "This API key is restricted to only send emails."),
    ("invalid_api_key", 403, "API key is invalid."),
    ("validation_error", 403, "The domain.com domain is not verified. Please, add and verify your domain."),
    ("invalid_from_address", 403, "The from address is not valid."),
    ("not_found", 404, "The requested endpoint does not exist."),
    ("method_not_allowed", 405, "Method is not allowed for the requested path."),
    ("invalid_idempotent_request", 409, "Same idempotency key used with a different request payload."),
    ("concurrent_idempotent_requests", 409, "Same idempotency key used while original request is still in progress."),
    ("rate_limit_exceeded", 429, "Too many requests. Please limit the number of requests per second. "
                                 "Or contact support to increase rate limit."),
    ("daily_quota_exceeded", 429, "You have reached your daily email sending quota."),
    ("monthly_quota_exceeded", 429, "You have reached your monthly email sending quota."),
    ("application_error", 500, "Something went wrong."),
    ("internal_server_error", 500, "An unexpected error occurred."),
]


def send_ok() -> Reply:
    """Resend's documented 200 to POST /emails."""
    return Reply(200, fixture_bytes("resend/send_response.json"))


def validation_error_sample() -> Reply:
    """The 400 validation_error fixture."""
    return Reply(400, fixture_bytes("resend/error_400_validation.json"))


def error(name: str, status: int | None = None, *, retry_after: str | None = "1") -> Reply:
    """A documented error, in the documented body schema."""
    status, message = next((s, m) for n, s, m in DOCUMENTED_ERRORS if n == name and status in (None, s))
    headers: dict[str, str] = {}
    if status == 429:
        headers = {"ratelimit-limit": "2", "ratelimit-remaining": "0", "ratelimit-reset": "1"}
        if retry_after is not None:
            headers["retry-after"] = retry_after
    return Reply(status, {"statusCode": status, "message": message, "name": name}, headers=headers)


class ResendFake:
    """`with ResendFake() as fake:` — a FakeServer answering queued replies (default: the 200 sample)."""

    def __init__(self, *replies: Reply) -> None:
        self.replies: deque[Reply] = deque(replies)
        self.server = FakeServer(self._handle)

    def _handle(self, request: Recorded) -> Reply:
        if request.method != "POST" or request.path != "/emails":
            return error("not_found", 404)
        if self.replies:
            return self.replies.popleft()
        return send_ok()

    def reset(self, *replies: Reply) -> "ResendFake":
        """Forget recorded requests and queue new replies (one fake serves many tests)."""
        self.server.requests.clear()
        self.replies = deque(replies)
        return self

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def requests(self) -> list[Recorded]:
        return self.server.requests

    def __enter__(self) -> "ResendFake":
        self.server.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.__exit__(*exc)


def svix_signature(secret: str, msg_id: str, timestamp: int | str, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256>` as Svix signs (checked in the tests against Svix's published vector)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def svix_headers(secret: str, body: bytes, *, msg_id: str = "msg_lembra_test_1", timestamp: int) -> dict[str, str]:
    return {
        "svix-id": msg_id,
        "svix-timestamp": str(timestamp),
        "svix-signature": svix_signature(secret, msg_id, timestamp, body),
        "content-type": "application/json",
    }


def json_body(data: Any) -> bytes:
    return json.dumps(data).encode()
