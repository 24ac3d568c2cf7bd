"""Webhooks and bad input (issue 9, points 8 and 10).

- An id no channel can have (beyond bigint, zero, negative) on any provider's route: 404.
- A signed body with NUL characters in strings, lone surrogates, or NaN / Infinity as JSON numbers
  (Python's json accepts them; PostgreSQL's text and jsonb do not): stored cleaned, answered 2xx,
  so the provider does not retry it forever. One test per provider whose parser accepts such a body.
- The same delivery replayed (byte for byte) does not add a `webhook_events` row.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from typing import Any

import pytest
from sqlalchemy import func, select

from admin.app import create_app
from engine.tenants.channels import create_channel
from engine.store.models import inbound_messages, webhook_events
from gateway.webhook_body import clean_json, clean_text, json_value
from tests.factories import World

NUL = "\u0000"
LONE = "\ud800"  # a surrogate with no pair: neither UTF-8 nor PostgreSQL text can hold it
PHONE = "+5516999887766"
WA_ID = "5516999887766"
#: The numbers Python's json reads but JSON does not have (PostgreSQL's jsonb refuses them).
NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "minus_inf": float("-inf")}


@pytest.fixture
def app(rt):
    app = create_app(rt)
    app.config["TESTING"] = True
    return app


@pytest.fixture
def client(app):
    return app.test_client()


def _channel(rt, world: World, provider: str, kind: str, credentials: dict[str, str]) -> int:
    with rt.db.begin() as conn:
        return create_channel(conn, rt.keyring, org_id=world.org_id, kind=kind, provider=provider,
                              name=provider, credentials=credentials)


def _events(rt) -> list[Any]:
    with rt.db.connect() as conn:
        return conn.execute(select(webhook_events).order_by(webhook_events.c.id)).all()


def _inbound(rt) -> list[Any]:
    with rt.db.connect() as conn:
        return conn.execute(select(inbound_messages).order_by(inbound_messages.c.id)).all()


def _walk(value: Any):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)
    else:
        yield value


def _assert_clean(value: Any) -> None:
    for leaf in _walk(value):
        if isinstance(leaf, str):
            assert NUL not in leaf and LONE not in leaf, leaf
        if isinstance(leaf, float):
            assert math.isfinite(leaf), leaf


def _assert_stored_clean(rt, *, inbound: int) -> None:
    [event] = _events(rt)
    body = event.body if not isinstance(event.body, str) else json.loads(event.body)
    assert body is not None
    _assert_clean(body)
    assert body.get("lembra_nan") is None and body.get("lembra_inf") is None
    rows = _inbound(rt)
    assert len(rows) == inbound
    for row in rows:
        for column in ("provider_message_id", "from_address", "text", "button_payload", "in_reply_to"):
            value = getattr(row, column)
            assert value is None or (NUL not in value and LONE not in value), (column, value)


def _hostile(data: dict[str, Any]) -> bytes:
    """`data` with non-finite numbers beside it, as a provider (or someone with the secret) could send."""
    return json.dumps({**data, "lembra_nan": NON_FINITE["nan"], "lembra_inf": NON_FINITE["inf"],
                       "lembra_list": [NON_FINITE["minus_inf"], 1.5, f"a{NUL}b"], f"key{NUL}": 1}).encode()


# --- the helpers -------------------------------------------------------------------------------


def test_clean_json_strips_nul_and_lone_surrogates_and_nulls_non_finite_numbers():
    raw = _hostile({"text": f"oi{NUL}{LONE} tudo", "n": [1, 2.5, True, None], "deep": {"x": {"y": NON_FINITE["nan"]}}})
    data = json_value(raw)
    _assert_clean(data)
    assert data["text"] == "oi\ufffd tudo"
    assert data["n"] == [1, 2.5, True, None]
    assert data["deep"] == {"x": {"y": None}}
    assert data["lembra_list"] == [None, 1.5, "ab"]
    assert "key" in data
    assert clean_text(f"a{NUL}{NUL}b{LONE}") == "ab\ufffd"
    assert clean_json(float("1e999")) is None


# --- ids no channel can have ----------------------------------------------------------------------


def test_webhook_ids_no_channel_can_have_answer_404(rt, client):
    world = World(rt)
    world.channel("whatsapp")
    for provider in ("meta", "sandbox", "evolution", "twilio", "zenvia", "resend", "smtp", "nope"):
        for bad in ("9223372036854775808", "99999999999999999999", "0", "-1"):
            url = f"/webhooks/{provider}/{bad}"
            assert client.get(url).status_code == 404, url
            response = client.post(url, data=b'{"type": "message"}', headers={"Content-Type": "application/json"})
            assert response.status_code == 404, url
    for url in ("/webhooks/me%00ta/1", "/webhooks/sand%00box/1", "/webhooks/%ED%A0%80/1"):
        assert client.get(url).status_code == 404, url
        assert client.post(url, data=b"{}").status_code == 404, url


# --- NUL, surrogates and NaN, per provider -------------------------------------------------------------


def test_sandbox_body_with_nul_and_nan_is_stored_cleaned(rt, client):
    world = World(rt)
    world.contact()
    channel_id = world.channel("whatsapp", webhook_secret="s3cret")
    body = _hostile({"type": "message", "id": f"sbx-in-1{NUL}", "from": f"{PHONE}{NUL}",
                     "text": f"vou{NUL} chegar {LONE}atrasada"})
    response = client.post(f"/webhooks/sandbox/{channel_id}", data=body,
                           headers={"X-Sandbox-Secret": "s3cret", "Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    _assert_stored_clean(rt, inbound=1)
    [row] = _inbound(rt)
    assert row.text == "vou chegar \ufffdatrasada"
    assert row.from_address == PHONE and row.provider_message_id == "sbx-in-1"
    assert row.contact_id is not None  # the cleaned number found the patient


def _meta_post(client, channel_id: int, raw: bytes, secret: str = "meta-app-secret"):
    signature = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    return client.post(f"/webhooks/meta/{channel_id}", data=raw,
                       headers={"Content-Type": "application/json", "X-Hub-Signature-256": signature})


def _meta_notification(text: str, mid: str = "wamid.LEMBRA-IN-1") -> dict[str, Any]:
    """A `whatsapp_business_account` text notification (Meta's documented shape)."""
    return {"object": "whatsapp_business_account", "entry": [{"id": "102290129340398", "changes": [{
        "field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550783881", "phone_number_id": "106540352242922",
                         "lembra_nan": NON_FINITE["nan"]},
            "contacts": [{"profile": {"name": f"Ana{NUL}"}, "wa_id": WA_ID}],
            "messages": [{"from": WA_ID, "id": mid, "timestamp": str(int(time.time())), "type": "text",
                          "text": {"body": text}}],
        }}]}]}


def _meta_channel(rt, world: World) -> int:
    return _channel(rt, world, "meta", "whatsapp", {
        "phone_number_id": "106540352242922", "access_token": "EAAG-token", "app_secret": "meta-app-secret",
        "verify_token": "verifique", "base_url": "http://127.0.0.1:9"})


def test_meta_signed_body_with_nul_and_nan_is_stored_cleaned(rt, client):
    world = World(rt)
    world.contact()
    channel_id = _meta_channel(rt, world)
    raw = _hostile(_meta_notification(f"oi{NUL}, tudo bem?{LONE}", mid=f"wamid.LEMBRA{NUL}1"))
    response = _meta_post(client, channel_id, raw)
    assert response.status_code == 200, response.text
    _assert_stored_clean(rt, inbound=1)
    [row] = _inbound(rt)
    assert row.text == "oi, tudo bem?\ufffd" and row.provider_message_id == "wamid.LEMBRA1"
    assert row.from_address == PHONE


#: At least 32 bytes, as an HS256 key should be (RFC 7518 3.2); Lembra's own secrets are 43 characters.
EVO_SECRET = "evo-webhook-secret-0123456789abcdef"


def test_evolution_signed_body_with_nul_and_nan_is_stored_cleaned(rt, client):
    from tests.fakes.evolution import envelope, mint_token, upsert

    world = World(rt)
    world.contact()
    channel_id = _channel(rt, world, "evolution", "whatsapp", {
        "base_url": "http://127.0.0.1:9", "api_key": "evo-key", "instance": "clinica",
        "webhook_secret": EVO_SECRET})
    data = upsert({"conversation": f"oi{NUL} tudo{LONE}"}, message_id=f"3A5F1C{NUL}2B")
    data["lembra_nan"] = NON_FINITE["nan"]
    raw = _hostile(envelope("messages.upsert", data))
    response = client.post(f"/webhooks/evolution/{channel_id}", data=raw, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {mint_token(EVO_SECRET)}"})
    assert response.status_code == 200, response.text
    _assert_stored_clean(rt, inbound=1)
    [row] = _inbound(rt)
    assert row.text == "oi tudo\ufffd" and row.provider_message_id == "3A5F1C2B"


def test_zenvia_body_with_nul_and_nan_is_stored_cleaned(rt, client):
    world = World(rt)
    world.contact()
    channel_id = _channel(rt, world, "zenvia", "sms", {"api_token": "zen-token", "from": "lembra",
                                                      "webhook_secret": "zen-secret"})
    raw = _hostile({"id": "evt-1", "type": "MESSAGE", "direction": "IN", "timestamp": "2026-12-01T12:00:00Z",
                    "message": {"id": f"zen-in-1{NUL}", "from": f"{WA_ID}{NUL}", "to": "lembra", "direction": "IN",
                                "channel": "sms", "contents": [{"type": "text", "text": f"oi{NUL}{LONE}"}],
                                "lembra_nan": NON_FINITE["nan"]}})
    response = client.post(f"/webhooks/zenvia/{channel_id}", data=raw, headers={
        "Content-Type": "application/json", "X-Lembra-Webhook-Secret": "zen-secret"})
    assert response.status_code == 200, response.text
    _assert_stored_clean(rt, inbound=1)
    [row] = _inbound(rt)
    assert row.text == "oi\ufffd" and row.provider_message_id == "zen-in-1"


def test_twilio_form_body_with_nul_is_stored_cleaned(rt, client):
    from tests.fakes.twilio import form, inbound_sms, sign

    world = World(rt)
    world.contact()
    channel_id = _channel(rt, world, "twilio", "sms", {"account_sid": "AC" + "a" * 32, "auth_token": "tw-token",
                                                      "from": "+14155552345"})
    pairs = inbound_sms(f"SM{'b' * 32}", PHONE, f"oi{NUL} tudo")
    url = f"{rt.settings.public_url.rstrip('/')}/webhooks/twilio/{channel_id}"
    response = client.post(f"/webhooks/twilio/{channel_id}", data=form(pairs), headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": sign("tw-token", url, pairs)})
    assert response.status_code == 200, response.text
    _assert_stored_clean(rt, inbound=1)
    assert _inbound(rt)[0].text == "oi tudo"


def test_resend_signed_body_with_nul_and_nan_is_stored_cleaned(rt, client):
    import base64

    from tests.fakes.resend import svix_headers

    world = World(rt)
    secret = "whsec_" + base64.b64encode(b"resend-webhook-secret-0123456789").decode()
    channel_id = _channel(rt, world, "resend", "email", {"api_key": "re_key", "from_email": "clinica@example.com",
                                                        "webhook_secret": secret})
    raw = _hostile({"type": "email.delivered", "created_at": "2026-12-01T12:00:00.000Z",
                    "data": {"email_id": f"4ef9a417-02e9-4d39-ad75-9611e0fcc33c{NUL}", "to": [f"ana{NUL}@example.com"],
                             "subject": f"Lembrete{LONE}", "lembra_nan": NON_FINITE["nan"]}})
    response = client.post(f"/webhooks/resend/{channel_id}", data=raw,
                           headers=svix_headers(secret, raw, timestamp=int(time.time())))
    assert response.status_code == 200, response.text
    _assert_stored_clean(rt, inbound=0)


# --- replays (point 10) -----------------------------------------------------------------------------------


def test_a_replayed_delivery_adds_no_webhook_event(rt, client):
    world = World(rt)
    world.contact()
    channel_id = _meta_channel(rt, world)
    raw = json.dumps(_meta_notification("vou chegar atrasada")).encode()
    for _ in range(3):
        assert _meta_post(client, channel_id, raw).status_code == 200
    assert len(_events(rt)) == 1 and len(_inbound(rt)) == 1
    # Another delivery (another message) is another row; the same bytes on another channel too.
    other = json.dumps(_meta_notification("outra", mid="wamid.LEMBRA-IN-2")).encode()
    assert _meta_post(client, channel_id, other).status_code == 200
    second = _meta_channel(rt, world)
    assert _meta_post(client, second, raw).status_code == 200
    assert len(_events(rt)) == 3
    assert len({e.body_sha256 for e in _events(rt)}) == 2


def test_a_replayed_sandbox_delivery_adds_no_webhook_event(rt, client):
    world = World(rt)
    world.contact()
    channel_id = world.channel("whatsapp", webhook_secret="s3cret")
    headers = {"X-Sandbox-Secret": "s3cret", "Content-Type": "application/json"}
    raw = json.dumps({"type": "message", "id": "sbx-in-9", "from": PHONE, "text": "OK"}).encode()
    for _ in range(2):
        assert client.post(f"/webhooks/sandbox/{channel_id}", data=raw, headers=headers).status_code == 200
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(webhook_events)).scalar_one() == 1
