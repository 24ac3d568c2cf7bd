"""The clinic's own phone (issue 34): a message the clinic's WhatsApp number sends outside Lembra
(Evolution's `messages.upsert` with `key.fromMe`) is a staff message of the conversation and
hands it to the staff; the echo of a send of ours starts nothing and is not stored, whether it
arrives after the send's answer or before it; the hand-off ends after the org's quiet time.
Through the Evolution webhook (Lembra's own fixtures) and the Evolution fake for the sends; the
same through Meta's `smb_message_echoes` (a number in coexistence with the WhatsApp Business app)."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from engine.core.errors import DomainError
from engine.flows import facts
from engine.flows.contact_events import record_contact_event
from engine.messaging import clinic_phone
from engine.messaging import conversations as convs
from engine.messaging.inbound import process_inbound, receive
from engine.store.models import contact_events, inbound_messages, messages
from engine.tenants.channels import create_channel
from gateway.contract import WebhookRequest
from gateway.errors import BadSignature
from tests.factories import World
from tests.fakes import evolution as evo
from tests.fakes.meta import FakeGraph
from tests.fixtures import fixture_json
from tests.flows.helpers import Flows
from tests.flows.test_runtime import classify_graph

SECRET = "a-long-enough-webhook-secret-for-hs256!"
MARIA = "+5516999887766"


class Clinic:
    """An org with an Evolution number (the fake answering its sends), Maria, and a flow run
    waiting for her answer."""

    def __init__(self, rt: Any, slug: str, server_url: str, fake: evo.EvolutionFake) -> None:
        self.rt = rt
        self.world = World(rt, slug, quiet_start="00:00", quiet_end="23:59", skip_sundays=False,
                           skip_holidays=False)
        with rt.db.begin() as conn:
            self.channel_id = create_channel(
                conn, rt.keyring, org_id=self.world.org_id, kind="whatsapp", provider="evolution",
                name="Número da recepção", is_default=True,
                credentials={"base_url": server_url, "api_key": fake.api_key, "instance": fake.instance,
                             "webhook_secret": SECRET})
        self.world.channels["whatsapp"] = self.channel_id
        self.contact_id = self.world.contact(name="Maria Souza", phone=MARIA)
        self.flows = Flows(self.world)

    def post(self, body: dict[str, Any]) -> list[str | None]:
        """Evolution delivers `body` to the channel's webhook; each new message is processed."""
        request = WebhookRequest(method="POST", url=f"/webhooks/evolution/{self.channel_id}",
                                 headers={"Authorization": f"Bearer {evo.mint_token(SECRET)}"},
                                 body=json.dumps(body).encode())
        received = receive(self.rt, "evolution", self.channel_id, request)
        return [process_inbound(self.rt, i) for i in received.inbound_ids]

    def holds(self) -> bool:
        with self.rt.db.connect() as conn:
            return facts.human_holds(conn, self.world.org_id, self.contact_id)

    def stored(self) -> list[Any]:
        with self.rt.db.connect() as conn:
            return conn.execute(select(inbound_messages).where(inbound_messages.c.org_id == self.world.org_id)
                                .order_by(inbound_messages.c.id)).all()

    def sends(self) -> list[Any]:
        with self.rt.db.connect() as conn:
            return conn.execute(select(messages).where(messages.c.org_id == self.world.org_id)
                                .order_by(messages.c.id)).all()


def staff(text: str | None = None, message_id: str | None = None) -> dict[str, Any]:
    """The clinic's phone writes to Maria (the fixture, with another text or id when asked)."""
    body = copy.deepcopy(fixture_json("evolution/webhook_upsert_from_me_text.json"))
    if text is not None:
        body["data"]["message"] = {"conversation": text}
    if message_id is not None:
        body["data"]["key"]["id"] = message_id
    return body


def patient(message_id: str = "3A5F1C2B9D8E7F60A1B3") -> dict[str, Any]:
    body = copy.deepcopy(fixture_json("evolution/webhook_upsert_inbound_text.json"))
    body["data"]["key"]["id"] = message_id
    return body


@pytest.fixture
def fake() -> evo.EvolutionFake:
    return evo.EvolutionFake()


@pytest.fixture
def clinic(rt, clock, serve, fake):
    with serve(fake) as server:
        yield Clinic(rt, "clinica", server.url, fake)


def waiting_run(clinic: Clinic) -> int:
    """Maria's run has asked (sent through Evolution) and waits for her answer."""
    flow = clinic.flows.flow(classify_graph())
    run = clinic.flows.enroll(flow, clinic.contact_id)
    clinic.flows.run()
    assert clinic.flows.enrollment(run).status == "waiting_reply"
    return run


def test_the_clinic_phone_takes_the_conversation_and_the_bot_steps_back(rt, clinic, serve, fake):
    run = waiting_run(clinic)
    other = Clinic(rt, "outra", "http://127.0.0.1:9", fake)  # the same patient number at another clinic
    other_run = other.flows.enroll(other.flows.flow(classify_graph()), other.contact_id)

    assert clinic.post(staff()) == ["staff_message"]
    assert clinic.post(staff()) == []  # Evolution delivers it again: nothing new
    assert clinic.holds() and clinic.flows.enrollment(run).status == "paused_handoff"
    with rt.db.connect() as conn:
        starts = conn.execute(select(contact_events.c.payload).where(
            contact_events.c.org_id == clinic.world.org_id, contact_events.c.type == "handoff_started")).scalars().all()
    assert [p["source"] for p in starts] == ["clinic_phone"]

    # Maria answers: the paused run does not read it, nothing is sent back; it waits in Conversas.
    sent_before = len(clinic.sends())
    assert clinic.post(patient()) == ["free_text"]
    clinic.flows.run()
    assert len(clinic.sends()) == sent_before and clinic.flows.enrollment(run).status == "paused_handoff"
    reply = clinic.stored()[-1]
    with rt.db.connect() as conn:
        item = convs.find_item(conn, clinic.world.org_id, reply.id)
        assert item is not None and item.state == "open"
        entries = convs.thread(conn, clinic.world.org_id, item)
        staff_ids = [r.id for r in clinic.stored() if r.from_me]
        assert convs.find_item(conn, clinic.world.org_id, staff_ids[0]) is None  # not a reply to answer
    ours = [e for e in entries if e.outgoing and e.purpose == convs.CLINIC_PHONE_PURPOSE]
    assert [e.text for e in ours] == ["Oi Maria, aqui é a Júlia da recepção. Posso te ligar agora?"]

    # The other clinic's contact with the same number is untouched.
    assert not other.holds() and other.flows.enrollment(other_run).status != "paused_handoff"
    assert other.stored() == []


def test_the_echo_of_our_own_send_after_its_answer_starts_nothing(clinic, fake):
    run = waiting_run(clinic)
    [sent] = [m for m in clinic.sends() if m.status == "sent"]
    assert sent.provider_message_id == fake.sent[-1]
    assert clinic.post(staff(sent.body, sent.provider_message_id)) == []
    assert clinic.stored() == [] and not clinic.holds()
    assert clinic.flows.enrollment(run).status == "waiting_reply"


@pytest.mark.parametrize("same_text", [True, False], ids=["same-text", "provider-worded"])
def test_the_echo_of_our_own_send_before_its_answer_starts_nothing(rt, clock, serve, same_text):
    """Evolution posts the echo while our sendText call is still open (the row is `sending`, its
    id unknown). Its text matches the send's: recognised at once. It does not (a provider
    rewording): left unprocessed, and recognised by its id once the answer is stored."""
    fake = evo.EvolutionFake()
    echoed: dict[str, Any] = {}

    def handler(req):
        reply = fake(req)
        if "/message/sendText/" in req.path and reply.status == 201:
            data = reply.body if isinstance(reply.body, dict) else json.loads(reply.body)
            text = data["message"]["conversation"] if same_text else "Mensagem do modelo"
            echoed["id"] = data["key"]["id"]
            echoed["outcomes"] = holder["clinic"].post(staff(text, data["key"]["id"]))
            echoed["stored"] = holder["clinic"].stored()
        return reply

    holder: dict[str, Clinic] = {}
    with serve(handler) as server:
        holder["clinic"] = clinic = Clinic(rt, "clinica", server.url, fake)
        run = waiting_run(clinic)
    assert echoed["outcomes"] == [None]  # an echo (deleted) or not known yet (waits)
    assert len(echoed["stored"]) == (0 if same_text else 1)
    [sent] = clinic.sends()
    assert sent.provider_message_id == echoed["id"]
    if not same_text:
        # The scheduler's repoke hands it over again: now its id is the send's.
        [row] = clinic.stored()
        assert row.processed_at is None and process_inbound(rt, row.id) is None
    assert clinic.stored() == [] and not clinic.holds()
    assert clinic.flows.enrollment(run).status == "waiting_reply"


def test_the_hand_off_ends_after_the_staff_is_quiet(rt, clinic, clock):
    run = waiting_run(clinic)
    assert clinic.post(staff(message_id="3EB0000000000000AA01")) == ["staff_message"]
    clock.advance(timedelta(minutes=29))
    assert clinic_phone.end_quiet(rt, limit=10) == 0
    assert clinic.post(staff("Já te ligo.", "3EB0000000000000AA02")) == ["staff_message"]  # the quiet starts again
    clock.advance(timedelta(minutes=29))
    assert clinic_phone.end_quiet(rt, limit=10) == 0 and clinic.holds()
    clock.advance(timedelta(minutes=2))
    assert clinic_phone.end_quiet(rt, limit=10) == 1
    assert clinic_phone.end_quiet(rt, limit=10) == 0  # once
    assert not clinic.holds() and clinic.flows.enrollment(run).status != "paused_handoff"

    # A hand-off a person started on the console is not the phone's to end.
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=clinic.world.org_id, contact_id=clinic.contact_id, type="handoff_started")
    assert clinic.post(staff("Oi de novo", "3EB0000000000000AA03")) == ["staff_message"]
    clock.advance(timedelta(minutes=31))
    assert clinic_phone.end_quiet(rt, limit=10) == 0 and clinic.holds()

    # The org's quiet time: 0 leaves it to a person; out of range is refused.
    with rt.db.begin() as conn:
        for bad in (-1, 24 * 60 + 1):
            with pytest.raises(DomainError):
                clinic_phone.set_quiet_minutes(conn, clinic.world.org_id, bad)
        assert clinic_phone.set_quiet_minutes(conn, clinic.world.org_id, 0) == 0
        record_contact_event(conn, org_id=clinic.world.org_id, contact_id=clinic.contact_id, type="handoff_ended")
    assert clinic.post(staff("Mais uma", "3EB0000000000000AA04")) == ["staff_message"]
    clock.advance(timedelta(days=1))
    assert clinic_phone.end_quiet(rt, limit=10) == 0 and clinic.holds()


def test_a_message_to_a_number_with_no_contact_is_stored_and_starts_nothing(clinic):
    body = staff()
    body["data"]["key"]["remoteJid"] = "5516988887777@s.whatsapp.net"
    assert clinic.post(body) == ["staff_message"]
    [row] = clinic.stored()
    assert row.from_me and row.contact_id is None and row.quiet_until is None


# ------------------------------------------------------------------ Meta coexistence echoes

APP_SECRET = "meta-app-secret-of-the-clinic"


class MetaClinic(Clinic):
    """The same clinic on Meta's Cloud API, its number in coexistence with the WhatsApp Business
    app: what the receptionist sends from the app arrives as an `smb_message_echoes` webhook."""

    def __init__(self, rt: Any, graph_url: str) -> None:
        self.rt = rt
        self.world = World(rt, "clinica", quiet_start="00:00", quiet_end="23:59", skip_sundays=False,
                           skip_holidays=False)
        with rt.db.begin() as conn:
            self.channel_id = create_channel(
                conn, rt.keyring, org_id=self.world.org_id, kind="whatsapp", provider="meta",
                name="Número da recepção", is_default=True,
                credentials={"phone_number_id": "106540352242922", "access_token": "EAAG-token",
                             "app_secret": APP_SECRET, "verify_token": "v", "base_url": graph_url})
        self.world.channels["whatsapp"] = self.channel_id
        self.contact_id = self.world.contact(name="Maria Souza", phone=MARIA)
        self.flows = Flows(self.world)

    def post(self, body: dict[str, Any], secret: str = APP_SECRET) -> list[str | None]:
        raw = json.dumps(body).encode()
        signature = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
        request = WebhookRequest(method="POST", url=f"/webhooks/meta/{self.channel_id}",
                                 headers={"X-Hub-Signature-256": signature}, body=raw)
        received = receive(self.rt, "meta", self.channel_id, request)
        return [process_inbound(self.rt, i) for i in received.inbound_ids]


def meta_echo(message_id: str | None = None) -> dict[str, Any]:
    """The receptionist writes to Maria from the WhatsApp Business app (Lembra's own fixture)."""
    body = copy.deepcopy(fixture_json("meta_whatsapp/webhook_smb_message_echoes_text.json"))
    if message_id is not None:
        body["entry"][0]["changes"][0]["value"]["message_echoes"][0]["id"] = message_id
    return body


def test_a_meta_coexistence_echo_takes_the_conversation_and_an_echo_of_ours_starts_nothing(rt, clock):
    with FakeGraph() as graph:
        clinic = MetaClinic(rt, graph.url)
        # Maria wrote first (the 24-hour window is open), then the flow asks her in a session text.
        assert clinic.post(fixture_json("meta_whatsapp/webhook_inbound_text.json")) != []
        run = waiting_run(clinic)
    [sent] = [m for m in clinic.sends() if m.status == "sent"]
    stored_before = len(clinic.stored())

    # The app echoes Lembra's own send (its id is the outbox row's): nothing stored, nothing started.
    assert clinic.post(meta_echo(sent.provider_message_id)) == []
    # A forged delivery is refused before anything is read.
    with pytest.raises(BadSignature):
        clinic.post(meta_echo(), secret="not-the-app-secret")
    assert len(clinic.stored()) == stored_before and not clinic.holds()
    assert clinic.flows.enrollment(run).status == "waiting_reply"

    # The receptionist writes from the app: a staff message of the conversation, and the bot steps back.
    assert clinic.post(meta_echo()) == ["staff_message"]
    row = clinic.stored()[-1]
    assert row.from_me and row.contact_id == clinic.contact_id and row.provider_message_id == "wamid.lembra-echo-01"
    assert row.text == "Oi Maria, aqui é a Júlia da recepção. Posso te ligar agora?"
    assert clinic.holds() and clinic.flows.enrollment(run).status == "paused_handoff"
