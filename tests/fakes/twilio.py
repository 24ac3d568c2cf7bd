"""A loopback fake of Twilio's Messages API, answering in the documented wire format, plus an
independent X-Twilio-Signature signer for webhook tests.

Fixtures: tests/fixtures/providers/twilio/ (how each was written and its sources:
tests/fixtures/providers/README.md):
- 201 create answer: `message_create_response_201.json` (the documented Message resource);
- error answers: Twilio's REST error shape `{code, message, more_info, status}` with the codes and
  wording of Twilio's error pages (no verbatim error body is published);
- status-callback and incoming-SMS parameters: built below from the parameter lists of Twilio's
  "Track the Message Status of Outbound Messages" and "webhook request" pages.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any, Callable, Iterable
from urllib.parse import urlencode

from tests.fakes.server import FakeServer, Recorded, Reply
from tests.fixtures import fixture_bytes, fixture_json

SAMPLES = "twilio/"
CREATE_201 = SAMPLES + "message_create_response_201.json"
FETCH_30007 = SAMPLES + "message_fetch_response_error_30007.json"
VECTORS = SAMPLES + "signature_vectors.json"  # published by twilio-python, kept byte for byte

ACCOUNT_SID = "ACaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"  # the account of the 201 fixture
AUTH_TOKEN = "twilio-test-auth-token"


def sample_json(relative: str) -> Any:
    """A fixture of tests/fixtures/providers/ (e.g. CREATE_201), parsed (a fresh copy each call)."""
    return fixture_json(relative)


def created() -> Reply:
    """Twilio's documented 201 answer to POST /2010-04-01/Accounts/{sid}/Messages.json."""
    return Reply(201, fixture_bytes(CREATE_201))


def rest_error(status: int, code: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    """A REST error in the documented shape."""
    return Reply(status, {"code": code, "message": message,
                          "more_info": f"https://www.twilio.com/docs/errors/{code}", "status": status},
                 headers=dict(headers or {}))


class FakeTwilio(FakeServer):
    """Answers scripted replies in order, then `default` (the documented 201)."""

    def __init__(self, *replies: Reply | Callable[[Recorded], Reply], default: Reply | None = None) -> None:
        self.script = list(replies)
        self.default = default or created()
        super().__init__(self._answer)

    def _answer(self, request: Recorded) -> Reply:
        if self.script:
            reply = self.script.pop(0)
            return reply(request) if callable(reply) else reply
        return self.default


# --- signing webhooks the way Twilio does (its RequestValidator), written independently of the provider ---


def sign(auth_token: str, url: str, pairs: Iterable[tuple[str, str]]) -> str:
    """X-Twilio-Signature for a form POST of `pairs` to `url`."""
    grouped: dict[str, set[str]] = {}
    for name, value in pairs:
        grouped.setdefault(name, set()).add(value)
    data = url + "".join(name + value for name in sorted(grouped) for value in sorted(grouped[name]))
    return base64.b64encode(hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()).decode()


def form(pairs: Iterable[tuple[str, str]]) -> bytes:
    return urlencode(list(pairs)).encode()


def status_callback(message_sid: str, status: str, error_code: str | None = None) -> list[tuple[str, str]]:
    """A status callback's parameters (Twilio's status-callback page: AccountSid, From, MessageSid,
    MessageStatus, SmsSid, SmsStatus, To, ApiVersion; ErrorCode on failed/undelivered;
    RawDlrDoneDate on DLR statuses)."""
    pairs = [
        ("AccountSid", ACCOUNT_SID),
        ("ApiVersion", "2010-04-01"),
        ("From", "+14155552345"),
        ("MessageSid", message_sid),
        ("MessageStatus", status),
        ("SmsSid", message_sid),
        ("SmsStatus", status),
        ("To", "+5516999887766"),
    ]
    if status in ("delivered", "undelivered"):
        pairs.append(("RawDlrDoneDate", "2612011205"))
    if error_code is not None:
        pairs.append(("ErrorCode", error_code))
    return pairs


def inbound_sms(message_sid: str, sender: str, body: str, opt_out_type: str | None = None) -> list[tuple[str, str]]:
    """An incoming SMS's parameters (the list of Twilio's "webhook request" page)."""
    pairs = [
        ("ToCountry", "BR"), ("ToState", "SP"), ("SmsMessageSid", message_sid), ("NumMedia", "0"),
        ("ToCity", ""), ("FromZip", ""), ("SmsSid", message_sid), ("FromState", "SP"),
        ("SmsStatus", "received"), ("FromCity", ""), ("Body", body), ("FromCountry", "BR"),
        ("To", "+14155552345"), ("MessagingServiceSid", "MGaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"), ("ToZip", ""),
        ("NumSegments", "1"), ("MessageSid", message_sid), ("AccountSid", ACCOUNT_SID), ("From", sender),
        ("ApiVersion", "2010-04-01"),
    ]
    if opt_out_type is not None:
        pairs.append(("OptOutType", opt_out_type))
    return pairs
