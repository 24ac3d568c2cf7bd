"""The sandbox provider's webhook parser takes anything and answers only with typed errors."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.contract import ProviderContext, WebhookRequest, WebhookResult
from gateway.errors import WebhookError
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
