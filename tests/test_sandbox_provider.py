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


# --- receipts: delivered and read a few seconds after the send (issue 33, point 3) ---------------------
from datetime import timedelta  # noqa: E402

from sqlalchemy import func, select  # noqa: E402

from engine.fleet.scheduler import Scheduler  # noqa: E402
from engine.messaging import dispatch, statuses  # noqa: E402
from engine.store.models import early_statuses  # noqa: E402
from gateway.contract import StatusEvent  # noqa: E402
from providers.sandbox.provider import receipts_seconds  # noqa: E402
from tests.factories import World, local  # noqa: E402

DUE = local(2026, 12, 2, 14, 0)


def _sent(rt, clock, **settings):
    """One reminder sent through a sandbox channel with `settings`; the world and its message id."""
    world = World(rt)
    world.channel("whatsapp", **settings)
    world.rule(1440, kinds=("whatsapp",))
    world.appointment(world.contact(), local(2026, 12, 3, 14, 0))
    clock.set(DUE)
    [mid] = dispatch.claim_due(rt, limit=10)
    assert dispatch.send_batch(rt, [mid]) == {mid: "sent"}
    return world, mid


def _tick(rt):
    return Scheduler(rt, enqueue=lambda batch: None).tick()


def test_receipts_arrive_when_due_through_the_status_path(rt, clock):
    world, mid = _sent(rt, clock, receipts_seconds=3)
    assert _tick(rt).settled == 0 and world.message(mid).status == "sent", "nothing before it is due"
    clock.advance(timedelta(seconds=3))
    assert _tick(rt).settled == 1
    row = world.message(mid)
    assert (row.status, row.delivered_at, row.read_at) == ("delivered", DUE + timedelta(seconds=3), None)
    clock.advance(timedelta(seconds=3))
    assert _tick(rt).settled == 1
    row = world.message(mid)
    assert (row.status, row.read_at) == ("read", DUE + timedelta(seconds=6))
    assert world.events(mid)[-3:] == ["sent", "delivered", "read"]
    assert _tick(rt).settled == 0


def test_receipts_due_together_never_regress_and_a_duplicate_changes_nothing(rt, clock):
    world, mid = _sent(rt, clock, receipts_seconds="2")
    clock.advance(timedelta(minutes=5))
    assert _tick(rt).settled == 2
    row = world.message(mid)
    assert row.status == "read"
    with rt.db.begin() as conn:  # a late or replayed `delivered` (a webhook retry) does not move it back
        assert not statuses.apply_status(conn, world.org_id, row.channel_id, StatusEvent(
            provider_message_id=row.provider_message_id, status="delivered", timestamp=clock.now()))
    assert world.message(mid).status == "read"
    assert world.events(mid).count("delivered") == 1


def test_no_receipts_unless_the_channel_asks(rt, clock):
    world, mid = _sent(rt, clock)
    clock.advance(timedelta(hours=1))
    _tick(rt)
    assert world.message(mid).status == "sent"
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(early_statuses)).scalar_one() == 0


@pytest.mark.parametrize("value", [None, 0, -3, "x", "nan", "inf", True, [], {}])
def test_a_bad_receipts_setting_means_none(value):
    assert receipts_seconds(value) == 0.0


def test_a_huge_receipts_setting_is_capped():
    assert receipts_seconds(10 ** 9) == 3600.0 and receipts_seconds("2.5") == 2.5
