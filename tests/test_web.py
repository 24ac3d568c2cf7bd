"""The web side of the foundation: webhooks refuse what they must with nothing stored, the
console signs in with CSRF, the sandbox inbox shows what was sent and takes the patient's reply
through the same inbound path as a provider webhook, scoped to the user's org."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from admin.app import create_app
from engine.messaging import dispatch
from engine.store.models import appointments, channels, inbound_messages, messages, sandbox_messages
from engine.tenants.orgs import create_user
from tests.factories import World, sandbox_headers


@pytest.fixture
def app(rt):
    app = create_app(rt)
    app.config["TESTING"] = True
    return app


@pytest.fixture
def client(app):
    return app.test_client()


def _secret_channel(rt, world: World, secret: str) -> int:
    from engine.tenants.channels import create_channel

    with rt.db.begin() as conn:
        return create_channel(conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="sandbox",
                              name="sbx", credentials={"webhook_secret": secret})


def _inbound_count(rt) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(inbound_messages)).scalar_one()


def _message(text: str, sender: str = "+5516999887766", mid: str = "in-1") -> bytes:
    return json.dumps({"type": "message", "id": mid, "from": sender, "text": text}).encode()


def test_webhook_refusals_store_nothing(rt, client):
    world = World(rt)
    channel_id = _secret_channel(rt, world, "s3cret")
    world.contact()
    url = f"/webhooks/sandbox/{channel_id}"
    headers = {"X-Sandbox-Secret": "s3cret", "Content-Type": "application/json"}

    assert client.post("/webhooks/sandbox/999999", data=_message("oi"), headers=headers).status_code == 404
    assert client.post(f"/webhooks/meta/{channel_id}", data=_message("oi"), headers=headers).status_code == 404
    wrong = client.post(url, data=_message("SAIR"), headers={**headers, "X-Sandbox-Secret": "nope"})
    assert wrong.status_code == 401
    assert client.post(url, data=b'{"type": "message", "id": ', headers=headers).status_code == 400
    assert client.post(url, data=b"[1, 2, 3]", headers=headers).status_code == 400
    huge = client.post(url, data=b"{" + b" " * (5 * 1024 * 1024) + b"}", headers=headers)
    assert huge.status_code == 413
    assert _inbound_count(rt) == 0

    ok = client.post(url, data=_message("vou sair mais cedo"), headers=headers)
    assert ok.status_code == 200 and ok.get_json()["inbound"] == 1
    again = client.post(url, data=_message("vou sair mais cedo"), headers=headers)
    assert again.status_code == 200 and again.get_json()["inbound"] == 0
    assert _inbound_count(rt) == 1


def test_the_sandbox_webhook_takes_no_reply_without_the_channels_secret(rt, clock, client):
    """Ids are sequential: without its secret, nobody may post SAIR or CANCELAR to a clinic's sandbox."""
    clinic_a, clinic_b = World(rt, slug="clinica-a"), World(rt, slug="clinica-b")
    channel_a, channel_b = clinic_a.channel("whatsapp"), clinic_b.channel("whatsapp")
    contact = clinic_a.contact()
    appointment_id = clinic_a.appointment(contact, clock.now() + timedelta(hours=3))
    url = f"/webhooks/sandbox/{channel_a}"
    for n, headers in enumerate(({}, {"X-Sandbox-Secret": ""}, sandbox_headers(rt, channel_b))):
        for text in ("SAIR", "CANCELAR"):
            refused = client.post(url, data=_message(text, mid=f"x-{n}-{text}"),
                                  headers={**headers, "Content-Type": "application/json"})
            assert refused.status_code == 401, (headers, text)
    assert _inbound_count(rt) == 0
    with rt.db.connect() as conn:
        assert conn.execute(select(appointments.c.status).where(appointments.c.id == appointment_id)).scalar_one() \
            == "scheduled"
    ok = client.post(url, data=_message("CANCELAR"), headers={**sandbox_headers(rt, channel_a),
                                                                "Content-Type": "application/json"})
    assert ok.status_code == 200 and ok.get_json()["inbound"] == 1
    with rt.db.connect() as conn:
        assert conn.execute(select(appointments.c.status).where(appointments.c.id == appointment_id)).scalar_one() \
            == "cancelled"


def test_console_replies_go_in_process_even_for_a_channel_from_before_secrets(rt, clock, app, client):
    """The sandbox chat's reply never goes through the public URL (its view is broken here), and an
    old channel with no secret gets one on the way: its public webhook needs it from then on."""
    world = World(rt)
    channel_id = world.channel("whatsapp")
    world.rule(120)
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email="recepcao@clinica.com.br", role="agent", password="senha-forte-1")
        conn.execute(update(channels).where(channels.c.id == channel_id).values(credentials=None, key_version=None))
    appointment_id = world.appointment(world.contact(), clock.now() + timedelta(hours=3))
    clock.advance(timedelta(hours=1))
    for mid in dispatch.claim_due(rt, limit=10):
        assert dispatch.send_one(rt, mid) == "sent"

    def public_url_used(**kwargs):
        raise AssertionError("the console's reply went through the public webhook URL")

    app.view_functions["webhooks.webhook"] = public_url_used
    assert _login(client, "recepcao@clinica.com.br", "senha-forte-1").status_code == 302
    inbox = client.get("/admin/sandbox/")
    with rt.db.connect() as conn:
        sandbox_id = conn.execute(select(sandbox_messages.c.id)).scalar_one()
    reply = client.post("/admin/sandbox/reply/", data={"sandbox_message_id": sandbox_id, "text": "CONFIRMAR",
                                                       "csrf_token": _csrf(inbox.text)}, follow_redirects=True)
    assert "Resposta enviada como o paciente." in reply.text
    with rt.db.connect() as conn:
        assert conn.execute(select(appointments.c.status).where(appointments.c.id == appointment_id)).scalar_one() \
            == "confirmed"
    secret = sandbox_headers(rt, channel_id)["X-Sandbox-Secret"]  # the old channel has one now
    assert len(secret) >= 40


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', html) or \
        re.search(r'id="csrf_token" name="csrf_token" type="hidden" value="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def _login(client, email: str, password: str):
    page = client.get("/login")
    return client.post("/login", data={"email": email, "password": password, "csrf_token": _csrf(page.text)})


def test_console_login_sandbox_reply_confirms_the_appointment(rt, clock, client):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(120)
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email="recepcao@clinica.com.br", role="agent", password="senha-forte-1")
    contact = world.contact()
    appointment_id = world.appointment(contact, clock.now() + timedelta(hours=3))
    clock.advance(timedelta(hours=1))
    for mid in dispatch.claim_due(rt, limit=10):
        assert dispatch.send_one(rt, mid) == "sent"

    assert client.get("/admin/sandbox/").status_code == 302  # login required
    no_csrf = client.post("/login", data={"email": "recepcao@clinica.com.br", "password": "senha-forte-1"})
    assert no_csrf.status_code == 400  # CSRF token missing
    wrong = _login(client, "recepcao@clinica.com.br", "errada")
    assert "incorretos" in wrong.text
    assert _login(client, "recepcao@clinica.com.br", "senha-forte-1").status_code == 302

    inbox = client.get("/admin/sandbox/")
    assert inbox.status_code == 200
    assert "Lembrete: sua sessão com Dra. Beatriz Costa" in inbox.text
    with rt.db.connect() as conn:
        sandbox_id = conn.execute(select(sandbox_messages.c.id)).scalar_one()
    token = _csrf(inbox.text)
    refused = client.post("/admin/sandbox/reply/", data={"sandbox_message_id": sandbox_id, "text": "OK"})
    assert refused.status_code == 400  # no CSRF token
    reply = client.post("/admin/sandbox/reply/", data={"sandbox_message_id": sandbox_id, "text": "Confirmar!",
                                                       "csrf_token": token})
    assert reply.status_code == 302
    with rt.db.connect() as conn:
        status = conn.execute(select(appointments.c.status).where(appointments.c.id == appointment_id)).scalar_one()
        ack = conn.execute(select(messages.c.status).where(messages.c.purpose == "confirm_ack")).scalar_one()
    assert status == "confirmed"
    assert ack == "pending"

    queue = client.get("/admin/queue/")
    assert queue.status_code == 200 and "Enviada" in queue.text


def test_console_never_shows_or_touches_another_orgs_rows(rt, clock, client):
    clinic_a, clinic_b = World(rt, slug="clinica-a"), World(rt, slug="clinica-b")
    for world in (clinic_a, clinic_b):
        world.channel("whatsapp")
        world.rule(120)
    with rt.db.begin() as conn:
        create_user(conn, org_id=clinic_a.org_id, email="a@clinica.com.br", role="owner", password="senha-forte-a")
    clinic_b.appointment(clinic_b.contact(name="Paciente Só Da B"), clock.now() + timedelta(hours=3))
    clock.advance(timedelta(hours=1))
    for mid in dispatch.claim_due(rt, limit=10):
        dispatch.send_one(rt, mid)
    with rt.db.connect() as conn:
        b_sandbox_id = conn.execute(select(sandbox_messages.c.id)).scalar_one()

    _login(client, "a@clinica.com.br", "senha-forte-a")
    inbox = client.get("/admin/sandbox/")
    assert "Paciente Só Da B" not in inbox.text and "Lembrete" not in inbox.text
    assert "Nenhuma mensagem ainda" in inbox.text
    assert "Paciente Só Da B" not in client.get("/admin/queue/").text
    poke = client.post("/admin/sandbox/reply/", data={"sandbox_message_id": b_sandbox_id, "text": "CANCELAR",
                                                      "csrf_token": _csrf(inbox.text)})
    assert poke.status_code == 404
    assert _inbound_count(rt) == 0


def test_health_ready_and_metrics(rt, client):
    World(rt).channel("whatsapp")
    assert client.get("/healthz").get_json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    metrics = client.get("/metrics").text
    assert 'lembra_messages{status="pending"} 0.0' in metrics


def test_readyz_reports_an_unreachable_broker(rt):
    from dataclasses import replace

    from engine.store.runtime import Runtime

    broken = Runtime(settings=replace(rt.settings, broker_url="redis://127.0.0.1:1/0"), db=rt.db,
                     keyring=rt.keyring, providers=rt.providers)
    response = create_app(broken).test_client().get("/readyz")
    assert response.status_code == 503
    assert "cannot connect to redis" in response.get_json()["reason"]
