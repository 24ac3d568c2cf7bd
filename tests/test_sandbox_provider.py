"""The sandbox provider's webhook parser takes anything and answers only with typed errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.contract import ProviderContext, WebhookRequest, WebhookResult
from gateway.errors import BadSignature, WebhookError
from providers.sandbox.provider import SandboxProvider

PROVIDER = SandboxProvider({"webhook_secret": "s"}, ProviderContext(org_id=1, channel_id=1))
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)


def _parse(body: bytes) -> None:
    request = WebhookRequest(method="POST", url="http://x", headers={"X-Sandbox-Secret": "s"}, body=body)
    try:
        assert isinstance(PROVIDER.parse_webhook(request), WebhookResult)
    except WebhookError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes(body):
    _parse(body)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_arbitrary_json(value):
    _parse(json.dumps(value).encode())


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"type": st.sampled_from(["message", "status", "x"])},
                             optional={"id": JSON, "from": JSON, "text": JSON, "button": JSON, "status": JSON,
                                       "timestamp": JSON, "in_reply_to": JSON, "error_code": JSON}))
def test_arbitrary_shapes(value):
    _parse(json.dumps(value).encode())


# --- the secret (issue 9, point 4) ---------------------------------------------------------------------
BODY = json.dumps({"type": "message", "id": "m1", "from": "+5516999887766", "text": "SAIR"}).encode()


def _request(headers: dict[str, str]) -> WebhookRequest:
    return WebhookRequest(method="POST", url="http://x", headers=headers, body=BODY)


def test_a_channel_without_a_secret_takes_nothing():
    """A sandbox channel from before every one had a secret: its webhook refuses every delivery."""
    bare = SandboxProvider({}, ProviderContext(org_id=1, channel_id=1))
    for headers in ({}, {"X-Sandbox-Secret": ""}, {"X-Sandbox-Secret": "None"}):
        with pytest.raises(BadSignature):
            bare.parse_webhook(_request(headers))


def test_the_right_secret_is_needed_exactly():
    for headers in ({}, {"X-Sandbox-Secret": ""}, {"X-Sandbox-Secret": "S"}, {"X-Sandbox-Secret": "s "}):
        with pytest.raises(BadSignature):
            PROVIDER.parse_webhook(_request(headers))
    assert PROVIDER.parse_webhook(_request({"x-sandbox-secret": "s"})).events


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_header_value_is_refused_with_a_typed_error(value):
    """Non-ASCII header values too (hmac.compare_digest refuses to compare such str: they go as bytes)."""
    if value == "s":
        return
    with pytest.raises(BadSignature):
        PROVIDER.parse_webhook(_request({"X-Sandbox-Secret": value}))
