""""Conectar WhatsApp": linking the clinic's phone to an Evolution channel from the console, against the
Evolution fake on loopback (real HTTP). The engine functions are tested directly too.

The fake's state is driven by the tests (no sleeping): `close` until a session is started, `connecting`
while it waits for the scan, `open` once "the phone scanned".
"""

from __future__ import annotations

import re
import socket
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from engine.tenants.channels import create_channel
from engine.messaging.connect import ChannelNotFound, channel_health, connect_channel, connection_snapshot, qr_image
from engine.store.models import audit_log, channels, inbox_items
from gateway.errors import PermanentError, TransientError
from tests.admin.conftest import SECRET, csrf
from tests.fakes import evolution as evo
from tests.fakes.server import Reply

API_KEY = "global-api-key"  # the fake's global key: must never reach a page


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def evolution_channel(rt: Any, org_id: int, base_url: str, *, name: str = "WhatsApp da clínica") -> int:
    with rt.db.begin() as conn:
        return create_channel(conn, rt.keyring, org_id=org_id, kind="whatsapp", provider="evolution", name=name,
                              credentials={"base_url": base_url, "api_key": API_KEY, "instance": "clinica",
                                           "webhook_secret": SECRET}, is_default=False)


def channel_row(rt: Any, channel_id: int) -> Any:
    with rt.db.connect() as conn:
        return conn.execute(select(channels).where(channels.c.id == channel_id)).one()


def img_srcs(html: str) -> list[str]:
    return re.findall(r'<img id="lembra-qr" src="([^"]*)"', html)


def assert_no_secret(html: str) -> None:
    assert API_KEY not in html and SECRET not in html


# ------------------------------------------------------------------------------------------ console


def test_the_details_page_offers_connect_for_evolution_channels_only(owner, tenants, rt, serve):
    a, _ = tenants
    with serve(evo.EvolutionFake(state="close")) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        details = owner.get(f"/admin/channels/details/?id={cid}").text
        assert f"/admin/channels/connect/{cid}/" in details and "Conectar WhatsApp" in details
        assert server.requests == []  # the details page does not call Evolution

        # The tenant's sandbox channel has no phone to link: no button, and the page says why.
        sandbox = owner.get(f"/admin/channels/details/?id={a.channel_id}").text
        assert "/admin/channels/connect/" not in sandbox
        page = owner.get(f"/admin/channels/connect/{a.channel_id}/", follow_redirects=True)
        assert page.status_code == 200 and "não se conecta por QR code" in page.text
        assert owner.get(f"/admin/channels/connect/{a.channel_id}/state").status_code == 404


def test_a_waiting_session_shows_its_qr_code_without_starting_anything(owner, tenants, rt, serve):
    a, _ = tenants
    fake = evo.EvolutionFake(state="connecting")
    with serve(fake) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        page = owner.get(f"/admin/channels/connect/{cid}/")
    assert page.status_code == 200
    assert page.headers["Cache-Control"] == "no-store"
    assert img_srcs(page.text) == [evo.QR_BASE64]
    assert "Aguardando leitura do QR" in page.text
    for step in ("Abra o WhatsApp no celular da clínica", "Aparelhos conectados", "Conectar um aparelho",
                 "Aponte a câmera do celular para o código"):
        assert step in page.text
    assert f"/admin/channels/connect/{cid}/state" in page.text  # the polling script's endpoint
    assert [(r.method, r.path) for r in server.requests] == [
        ("GET", "/instance/connectionState/clinica"), ("GET", "/instance/connect/clinica")]
    assert fake.pairing_number is None
    assert_no_secret(page.text)


def test_a_closed_instance_gets_a_qr_code_only_by_post(owner, tenants, rt, serve):
    a, _ = tenants
    fake = evo.EvolutionFake(state="close")
    with serve(fake) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        page = owner.get(f"/admin/channels/connect/{cid}/")
        # GET only asked the state: starting a session is a side effect on Evolution.
        assert [r.path for r in server.requests] == ["/instance/connectionState/clinica"]
        assert fake.state == "close" and img_srcs(page.text) == [""]
        assert "Desconectado" in page.text and "Gerar QR code" in page.text
        # Recorded like a connection.update webhook, minus the inbox item: the operator is looking at it.
        assert (channel_row(rt, cid).status, channel_row(rt, cid).status_detail) == ("broken", "close")
        with rt.db.connect() as conn:
            assert conn.execute(select(inbox_items).where(inbox_items.c.channel_id == cid)).all() == []

        posted = owner.post(f"/admin/channels/connect/{cid}/", data={"csrf_token": csrf(page.text)})
    assert posted.status_code == 200
    assert img_srcs(posted.text) == [evo.QR_BASE64]
    assert fake.state == "connecting"  # Evolution started the session
    assert_no_secret(posted.text)
    with rt.db.connect() as conn:
        audit = conn.execute(select(audit_log).where(audit_log.c.entity == "channels", audit_log.c.entity_id == cid,
                                                     audit_log.c.action == "connect")).one()
    assert audit.changes == {"pairing_code": False, "result": "connecting"}


def test_a_pairing_code_for_the_clinics_number(owner, tenants, rt, serve):
    a, _ = tenants
    fake = evo.EvolutionFake(state="close")
    with serve(fake) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        token = csrf(owner.get(f"/admin/channels/connect/{cid}/").text)
        server.requests.clear()

        bad = owner.post(f"/admin/channels/connect/{cid}/", data={"csrf_token": token, "pairing": "1",
                                                                   "number": "123"})
        assert bad.status_code == 200 and "Número de telefone inválido" in bad.text
        # a code the console has a sentence for is said in words only
        assert "invalid_number" not in bad.text and server.requests == []  # refused before any request

        page = owner.post(f"/admin/channels/connect/{cid}/", data={"csrf_token": token, "pairing": "1",
                                                                    "number": "(16) 3333-4444"})
    assert page.status_code == 200
    assert 'id="lembra-pairing-code">WZYE-H1YY<' in page.text
    [req] = server.requests
    assert req.path == "/instance/connect/clinica" and req.query == {"number": ["551633334444"]}
    assert img_srcs(page.text) == [evo.QR_BASE64]


def test_a_pairing_code_cannot_be_had_once_the_qr_session_started(owner, tenants, rt, serve):
    a, _ = tenants
    with serve(evo.EvolutionFake(state="connecting")) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        token = csrf(owner.get(f"/admin/channels/connect/{cid}/").text)
        page = owner.post(f"/admin/channels/connect/{cid}/", data={"csrf_token": token, "pairing": "1",
                                                                    "number": "+55 16 3333-4444"})
        empty = owner.post(f"/admin/channels/connect/{cid}/", data={"csrf_token": token, "pairing": "1",
                                                                     "number": " "})
    assert "não devolveu um código de pareamento" in page.text and "lembra-pairing-code" not in page.text
    assert "Informe o número do WhatsApp da clínica para receber o código" in empty.text


def test_the_state_endpoint_follows_the_phone_until_it_is_connected(owner, tenants, rt, serve):
    a, _ = tenants
    fake = evo.EvolutionFake(state="connecting")
    with serve(fake) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        url = f"/admin/channels/connect/{cid}/state"
        waiting = owner.get(url)
        assert waiting.status_code == 200 and waiting.headers["Cache-Control"] == "no-store"
        assert waiting.json == {"state": "connecting", "label": "Aguardando leitura do QR", "color": "warning",
                                "connected": False, "qr": evo.QR_BASE64, "error": None}
        assert channel_row(rt, cid).status_detail == "connecting"

        fake.state = "open"  # the phone scanned the code
        server.requests.clear()
        connected = owner.get(url)
        assert connected.json == {"state": "open", "label": "Conectado", "color": "success", "connected": True,
                                  "qr": None, "error": None}
        assert [r.path for r in server.requests] == ["/instance/connectionState/clinica"]
        assert channel_row(rt, cid).status_detail == "open"

        page = owner.get(f"/admin/channels/connect/{cid}/")
    assert 'id="lembra-connected" class="alert alert-success" >' in page.text  # shown, not hidden
    assert img_srcs(page.text) == [""]
    # The channels list and the details page show the recorded connection.
    listing = owner.get("/admin/channels/").text
    assert "Conexão do WhatsApp" in listing and "Conectado" in listing
    assert "Conectado" in owner.get(f"/admin/channels/details/?id={cid}").text


def test_evolution_answering_500_is_a_message_not_a_500(owner, tenants, rt, serve):
    a, _ = tenants
    # An error body that echoes a key (some proxies do): it must not reach the page.
    leaky = Reply(500, {"status": 500, "error": "Internal Server Error",
                        "response": {"message": f"boom apikey={API_KEY}"}})
    fake = evo.EvolutionFake(state="close", script=[leaky, leaky, leaky])
    with serve(fake) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        page = owner.get(f"/admin/channels/connect/{cid}/")
        state = owner.get(f"/admin/channels/connect/{cid}/state")
        posted = owner.post(f"/admin/channels/connect/{cid}/", data={"csrf_token": csrf(page.text)})
    for response in (page, posted):
        assert response.status_code == 200
        assert "O servidor Evolution está com problemas" in response.text and "http_500" not in response.text
        assert "boom" not in response.text
        assert_no_secret(response.text)
    assert state.status_code == 200 and state.json["state"] == "error" and "http_500" not in state.json["error"]
    assert API_KEY not in state.text
    assert channel_row(rt, cid).status_detail is None  # failing to ask is not a state of the phone


def test_evolution_unreachable_is_a_message_not_a_500(owner, tenants, rt):
    a, _ = tenants
    cid = evolution_channel(rt, a.world.org_id, closed_port_url())
    page = owner.get(f"/admin/channels/connect/{cid}/")
    assert page.status_code == 200
    assert "O servidor Evolution não respondeu" in page.text and "connection_error" not in page.text
    assert "Sem resposta do servidor" in page.text
    posted = owner.post(f"/admin/channels/connect/{cid}/", data={"csrf_token": csrf(page.text)})
    assert posted.status_code == 200 and "connection_error" not in posted.text
    for response in (page, posted):
        assert_no_secret(response.text)
        assert "127.0.0.1:" not in response.text  # not even the server's address


def test_another_orgs_channel_answers_404_and_evolution_is_not_called(owner, tenants, rt, serve):
    _, b = tenants
    with serve(evo.EvolutionFake(state="close")) as server:
        other = evolution_channel(rt, b.world.org_id, server.url, name="Evolution da B")
        token = csrf(owner.get("/admin/channels/").text)
        assert owner.get(f"/admin/channels/connect/{other}/").status_code == 404
        assert owner.get(f"/admin/channels/connect/{other}/state").status_code == 404
        assert owner.post(f"/admin/channels/connect/{other}/", data={"csrf_token": token}).status_code == 404
        assert owner.get("/admin/channels/connect/999999/").status_code == 404
        assert server.requests == []
    assert channel_row(rt, other).status_detail is None


def test_agents_cannot_link_a_phone(agent, tenants, rt, serve):
    a, _ = tenants
    with serve(evo.EvolutionFake(state="close")) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        assert "/admin/channels/connect/" not in agent.get(f"/admin/channels/details/?id={cid}").text
        token = csrf(agent.get("/admin/channels/").text)
        assert agent.get(f"/admin/channels/connect/{cid}/").status_code == 403
        assert agent.get(f"/admin/channels/connect/{cid}/state").status_code == 403
        assert agent.post(f"/admin/channels/connect/{cid}/", data={"csrf_token": token}).status_code == 403
        assert server.requests == []


def test_a_post_without_the_csrf_token_is_refused(owner, tenants, rt, serve):
    a, _ = tenants
    fake = evo.EvolutionFake(state="close")
    with serve(fake) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        refused = owner.post(f"/admin/channels/connect/{cid}/", data={"pairing": "1", "number": "+5516333344444"})
        assert refused.status_code == 400
        assert server.requests == [] and fake.state == "close"


def test_a_qr_code_that_is_not_a_data_image_is_not_rendered(owner, tenants, rt, serve):
    a, _ = tenants
    hostile = Reply(200, {"pairingCode": None, "code": "x", "base64": 'javascript:alert(1)//"><script>', "count": 1})
    with serve(evo.EvolutionFake(state="close", script=[hostile])) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        token = csrf(owner.get("/admin/channels/").text)
        page = owner.post(f"/admin/channels/connect/{cid}/", data={"csrf_token": token})
    assert page.status_code == 200
    assert "alert(1)" not in page.text and img_srcs(page.text) == [""]


# ------------------------------------------------------------------------------------------- engine


def test_engine_connect_and_health_record_the_state_on_the_channel(rt, tenants, clock, serve):
    a, b = tenants
    org = a.world.org_id
    fake = evo.EvolutionFake(state="close")
    with serve(fake) as server:
        cid = evolution_channel(rt, org, server.url)

        health = channel_health(rt, org, cid)
        assert (health.ok, health.state) == (False, "close")
        row = channel_row(rt, cid)
        assert (row.status, row.status_detail) == ("broken", "close")  # apply_connection's mapping
        with rt.db.connect() as conn:
            assert conn.execute(select(inbox_items.c.kind).where(inbox_items.c.channel_id == cid)).scalars().all() \
                == ["channel_broken"]

        info = connect_channel(rt, org, cid)
        assert (info.state, info.qr_code_base64, info.pairing_code) == ("connecting", evo.QR_BASE64, None)
        assert (channel_row(rt, cid).status, channel_row(rt, cid).status_detail) == ("broken", "connecting")

        snapshot = connection_snapshot(rt, org, cid)
        assert snapshot.health.state == "connecting" and snapshot.info is not None
        assert snapshot.info.qr_code_base64 == evo.QR_BASE64

        fake.state = "open"
        assert channel_health(rt, org, cid).ok is True
        row = channel_row(rt, cid)
        assert (row.status, row.status_detail) == ("active", "open")

        # Polling an unchanged state writes nothing (updated_at is what ProviderPool rebuilds on).
        clock.advance(timedelta(minutes=1))
        assert connection_snapshot(rt, org, cid).info is None
        assert channel_row(rt, cid).updated_at == row.updated_at

        with pytest.raises(ChannelNotFound):
            channel_health(rt, b.world.org_id, cid)  # another org's id
        with pytest.raises(ChannelNotFound):
            connect_channel(rt, b.world.org_id, cid)
        assert [r.path for r in server.requests].count("/instance/connect/clinica") == 2


def test_engine_pairing_code_and_unsupported_provider(rt, tenants, serve):
    a, _ = tenants
    with serve(evo.EvolutionFake(state="close")) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url)
        info = connect_channel(rt, a.world.org_id, cid, number="+55 16 3333-4444")
    assert info.pairing_code == "WZYEH1YY"
    with pytest.raises(PermanentError) as unsupported:
        connect_channel(rt, a.world.org_id, a.channel_id)  # the tenant's sandbox channel
    assert unsupported.value.code == "unsupported"


def test_engine_evolution_down_is_typed_and_records_nothing(rt, tenants):
    a, _ = tenants
    cid = evolution_channel(rt, a.world.org_id, closed_port_url())
    health = channel_health(rt, a.world.org_id, cid)
    assert (health.ok, health.state, health.detail) == (False, "error", "connection_error")
    with pytest.raises(TransientError) as down:
        connect_channel(rt, a.world.org_id, cid)
    assert down.value.code == "connection_error"
    assert API_KEY not in repr(down.value) and API_KEY not in str(down.value)
    row = channel_row(rt, cid)
    assert (row.status, row.status_detail) == ("active", None)


@pytest.mark.parametrize("value,ok", [
    (evo.QR_BASE64, True),
    ("data:image/jpeg;base64,/9j/4AAQ", True),
    ("data:image/svg+xml;base64,PHN2Zz4=", False),
    ("data:text/html;base64,PGh0bWw+", False),
    ('data:image/png;base64,AAA" onerror="x', False),
    ("javascript:alert(1)", False),
    (None, False),
])
def test_qr_image_accepts_raster_data_uris_only(value, ok):
    assert (qr_image(value) is not None) is ok
