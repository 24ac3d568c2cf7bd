"""Meta WhatsApp Cloud API end to end: reminder → the Graph fake → signed status webhooks
(delivered, then read) → the patient taps Confirmar → the appointment is confirmed; "sair"
cancels every pending message of theirs. Plus the 24-hour window and throughput back-off.

Webhook bodies follow the fixtures' structure (tests/fixtures/providers/meta_whatsapp:
webhook_status_*.json, webhook_inbound_text.json, webhook_inbound_template_quick_reply_button.json)
with this test's ids and numbers.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import json
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select

from admin.app import create_app
from engine.messaging import dispatch
from engine.tenants.channels import create_channel
from engine.store.models import appointments, messages, templates
from engine.queue.outbox import enqueue
from tests.conftest import BROKER_URL, IS_POSTGRES
from tests.factories import World
from tests.fakes.meta import notes_error, sample_json, templates_answer
from tests.fakes.server import FakeServer, Recorded, Reply
from tests.processes import Processes, lembra_env, wait_until

APP_SECRET = "meta-app-secret"
WABA = "102290129340398"
PHONE = "+5516999887766"
WA_ID = "5516999887766"


class Graph(FakeServer):
    """The Graph API fake: each accepted send gets its own wamid, in the documented 200 shape
    (send_response_official_sdk.json); the WABA's templates in the fixtures' two pages; scripted
    errors first when given."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self._ids = itertools.count(1)
        self.template_pages = [sample_json("message_templates_page1.json"), sample_json("message_templates_page2.json")]
        super().__init__(self._answer)

    def _answer(self, request: Recorded) -> Reply:
        if self.script:
            return self.script.pop(0)
        if request.method == "GET" and request.path.endswith("/message_templates"):
            return templates_answer(request, self.template_pages)
        body = request.json()
        return Reply(200, {"messaging_product": "whatsapp",
                           "contacts": [{"input": body.get("to"), "wa_id": body.get("to")}],
                           "messages": [{"id": f"wamid.LEMBRA{next(self._ids):04d}"}]})

    def sends(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests if r.method == "POST" and r.path.endswith("/messages")]


def _envelope(sample: str, key: str, item: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(sample_json(sample))
    value = data["entry"][0]["changes"][0]["value"]
    value["contacts"][0]["wa_id"] = WA_ID
    value[key] = [item]
    return data


def status_body(wamid: str, status: str, ts: int) -> dict[str, Any]:
    item = copy.deepcopy(sample_json("webhook_status_delivered.json")["entry"][0]["changes"][0]["value"]["statuses"][0])
    item.update(id=wamid, status=status, timestamp=str(ts), recipient_id=WA_ID)
    return _envelope("webhook_status_delivered.json", "statuses", item)


def text_body(mid: str, text: str, ts: int) -> dict[str, Any]:
    item = {"from": WA_ID, "id": mid, "timestamp": str(ts), "type": "text", "text": {"body": text}}
    return _envelope("webhook_inbound_text.json", "messages", item)


def button_body(mid: str, payload: str, context_id: str, ts: int) -> dict[str, Any]:
    item = copy.deepcopy(sample_json("webhook_inbound_template_quick_reply_button.json")
                         ["entry"][0]["changes"][0]["value"]["messages"][0])
    item.update(id=mid, timestamp=str(ts), button={"payload": payload, "text": "Confirmar"})
    item["from"] = WA_ID
    item["context"]["id"] = context_id
    return _envelope("webhook_inbound_template_quick_reply_button.json", "messages", item)


def post(client, channel_id: int, body: dict[str, Any], secret: str = APP_SECRET):
    raw = json.dumps(body).encode()
    signature = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    return client.post(f"/webhooks/meta/{channel_id}", data=raw,
                       headers={"Content-Type": "application/json", "X-Hub-Signature-256": signature})


#: For tests on the wall clock (real worker processes): a window open at any hour of any day, so the
#: reminder is due now whatever the time in São Paulo when the suite runs.
ANY_HOUR = {"quiet_start": "00:00", "quiet_end": "23:59", "skip_sundays": False, "skip_holidays": False}


def meta_world(rt, graph: Graph, **org_kwargs) -> tuple[World, int]:
    world = World(rt, **org_kwargs)
    with rt.db.begin() as conn:
        channel_id = create_channel(conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="meta",
                                    name="WhatsApp oficial",
                                    credentials={"phone_number_id": "1122334455667", "access_token": "EAAG-token",
                                                 "app_secret": APP_SECRET, "verify_token": "verifique",
                                                 "base_url": graph.url, "waba_id": WABA})
    world.channels["whatsapp"] = channel_id
    world.rule(1440, kinds=("whatsapp",))
    return world, channel_id


def _send_due(rt) -> list[str]:
    return [dispatch.send_one(rt, mid) for mid in dispatch.claim_due(rt, limit=50)]


def _status_of(rt, message_id: int) -> str:
    with rt.db.connect() as conn:
        return conn.execute(select(messages.c.status).where(messages.c.id == message_id)).scalar_one()


def test_reminder_status_confirm_and_sair_through_meta(rt, clock):
    with Graph() as graph:
        world, channel_id = meta_world(rt, graph)
        client = create_app(rt).test_client()
        contact = world.contact(phone=PHONE)
        appointment_id = world.appointment(contact, clock.now() + timedelta(hours=30))
        world.appointment(contact, clock.now() + timedelta(days=4))
        clock.advance(timedelta(hours=6))
        assert _send_due(rt) == ["sent"]

        [sent] = graph.sends()
        assert sent["type"] == "template", "outside the 24 h window a reminder goes as the approved template"
        assert sent["to"] == WA_ID and sent["template"]["name"] == "session_reminder_v1"
        params = [p["text"] for p in sent["template"]["components"][0]["parameters"]]
        assert params[0] == "Ana" and params[1] == "Dra. Beatriz Costa"
        payloads = [c["parameters"][0]["payload"] for c in sent["template"]["components"] if c["type"] == "button"]
        assert payloads == [f"confirm:{appointment_id}", f"cancel:{appointment_id}"]
        [reminder] = world.messages(status="sent")
        now_ts = int(clock.now().timestamp())

        assert post(client, channel_id, status_body(reminder.provider_message_id, "delivered", now_ts)).status_code == 200
        assert _status_of(rt, reminder.id) == "delivered"
        assert post(client, channel_id, status_body(reminder.provider_message_id, "read", now_ts + 5)).status_code == 200
        post(client, channel_id, status_body(reminder.provider_message_id, "delivered", now_ts + 1))  # late
        assert _status_of(rt, reminder.id) == "read"

        tapped = post(client, channel_id, button_body("wamid.IN1", f"confirm:{appointment_id}",
                                                      reminder.provider_message_id, now_ts + 60))
        assert tapped.status_code == 200
        with rt.db.connect() as conn:
            status = conn.execute(select(appointments.c.status).where(appointments.c.id == appointment_id)).scalar_one()
        assert status == "confirmed"
        clock.advance(timedelta(seconds=6))  # Meta: one message every 6 s to one person
        assert _send_due(rt) == ["sent"]
        ack = graph.sends()[-1]
        assert ack["type"] == "text", "inside the window (the patient just wrote) free text goes"
        assert "confirmada" in ack["text"]["body"]

        world.populate()
        pending = [m.id for m in world.messages(status="pending")]
        assert pending, "the other appointment's reminder is waiting"
        assert post(client, channel_id, text_body("wamid.IN2", "sair", now_ts + 120)).status_code == 200
        assert all(_status_of(rt, mid) == "cancelled" for mid in pending)
        clock.advance(timedelta(seconds=6))
        assert _send_due(rt) == ["sent"]
        assert "não receberá mais" in graph.sends()[-1]["text"]["body"]


def test_outside_the_window_without_template_fails_explicitly(rt, clock):
    with Graph() as graph:
        world, _ = meta_world(rt, graph)
        contact = world.contact(phone=PHONE)
        with rt.db.begin() as conn:
            mid = enqueue(conn, org_id=world.org_id, contact_id=contact, channel_kind="whatsapp", purpose="notice",
                          idempotency_key="notice:1", payload={"text": "Aviso da clínica"}, respect_window=False)
        assert _send_due(rt) == ["failed"]
        row = world.message(mid)
        assert (row.status, row.error_code) == ("failed", "template_required")
        assert graph.sends() == [], "nothing is sent silently outside the window"


def _customise(rt, world: World, channel_id: int, meta: Any) -> int:
    """The clinic's own WhatsApp reminder, saved the way the API and the CLI save it: the WABA read
    from the Graph fake first, then the save checked against it."""
    from engine.messaging import meta_templates
    from engine.messaging.template_edits import Changes, customize

    with rt.db.connect() as conn:
        channel = meta_templates.meta_channel(conn, world.org_id)
    assert channel is not None and channel.id == channel_id
    waba = meta_templates.read_waba(rt.providers, channel)
    with rt.db.begin() as conn:
        saved = customize(conn, world.org_id, key="session_reminder", kind="whatsapp", locale="pt_BR",
                          changes=Changes(body="Oi, {{ nome }}! Sua sessão é {{ data }} às {{ hora }}.", meta=meta),
                          waba=waba)
    assert saved.warnings == ()
    return saved.id


def _reminder_outside_the_window(rt, clock, world: World, graph: Graph) -> tuple[dict[str, Any], int]:
    contact = world.contact(phone=PHONE)
    appointment_id = world.appointment(contact, clock.now() + timedelta(hours=30),
                                       professional="Dr. Caio Prado", mode="online")
    clock.advance(timedelta(hours=6))
    assert _send_due(rt) == ["sent"]
    [sent] = [s for s in graph.sends() if s["type"] == "template"]
    return sent["template"], appointment_id


def test_a_customised_reminder_keeps_the_default_s_approved_template_outside_the_window(rt, clock):
    # "Personalizar" changes the text: outside the 24 h window Meta still gets the default's
    # approved template (before issue 30 the override had no Meta name: `template_required`).
    with Graph() as graph:
        world, _ = meta_world(rt, graph)
        with rt.db.begin() as conn:  # the override as "Personalizar" wrote it: no Meta columns of its own
            conn.execute(insert(templates).values(
                org_id=world.org_id, key="session_reminder", channel_kind="whatsapp", locale="pt_BR",
                body="Oi, {{ nome }}! Sua sessão é {{ data }} às {{ hora }}.", updated_at=clock.now()))
        template, appointment_id = _reminder_outside_the_window(rt, clock, world, graph)
        assert (template["name"], template["language"]["code"]) == ("session_reminder_v1", "pt_BR")
        params = [p["text"] for p in template["components"][0]["parameters"]]
        assert params == ["Ana", "Dr. Caio Prado", "02/12", "15:00", "Online"]
        payloads = [c["parameters"][0]["payload"] for c in template["components"] if c["type"] == "button"]
        assert payloads == [f"confirm:{appointment_id}", f"cancel:{appointment_id}"]


def test_a_customised_reminder_sends_its_own_mapped_template_with_the_parameters_in_order(rt, clock):
    from engine.messaging.meta_templates import MetaMapping

    with Graph() as graph:
        world, channel_id = meta_world(rt, graph)
        mapping = MetaMapping("lembrete_sorriso", "pt_BR", ("nome", "profissional", "data", "hora"),
                              ("confirm", "cancel"))
        _customise(rt, world, channel_id, meta=mapping)
        template, appointment_id = _reminder_outside_the_window(rt, clock, world, graph)
        assert template == {
            "name": "lembrete_sorriso", "language": {"policy": "deterministic", "code": "pt_BR"},
            "components": [
                {"type": "body", "parameters": [{"type": "text", "text": t}
                                                for t in ("Ana", "Dr. Caio Prado", "02/12", "15:00")]},
                {"type": "button", "sub_type": "quick_reply", "index": "0",
                 "parameters": [{"type": "payload", "payload": f"confirm:{appointment_id}"}]},
                {"type": "button", "sub_type": "quick_reply", "index": "1",
                 "parameters": [{"type": "payload", "payload": f"cancel:{appointment_id}"}]}]}


def test_an_unmapped_or_unusable_reminder_is_refused_at_save_not_at_send(rt, clock):
    from engine.messaging.meta_templates import MetaMapping
    from engine.messaging.template_edits import Changes, TemplateRefused, customize

    with Graph() as graph:
        world, channel_id = meta_world(rt, graph)
        for meta, code in ((MetaMapping("volte_a_sorrir", "pt_BR", ("nome",)), "waba_template_not_approved"),
                           (MetaMapping("lembrete_sorriso", "pt_BR", ("nome",), ("confirm", "cancel")),
                            "waba_template_parameter_count")):
            with pytest.raises(TemplateRefused) as refused:
                _customise(rt, world, channel_id, meta=meta)
            assert [f.code for f in refused.value.findings] == [code]
        with pytest.raises(TemplateRefused) as unmapped, rt.db.begin() as conn:
            customize(conn, world.org_id, key="session_reminder", kind="whatsapp", locale="es",
                      changes=Changes(body="Hola {{ nome }}"), waba=None)
        assert [f.code for f in unmapped.value.findings] == ["waba_template_unmapped"]
        with rt.db.connect() as conn:
            assert conn.execute(select(templates).where(templates.c.org_id == world.org_id)).all() == []


def test_throughput_errors_back_off_instead_of_failing(rt, clock):
    with Graph() as graph:
        world, _ = meta_world(rt, graph)
        graph.script = [notes_error(130429, "Rate limit hit", status=400)]
        contact = world.contact(phone=PHONE)
        world.appointment(contact, clock.now() + timedelta(hours=30))
        clock.advance(timedelta(hours=6))
        assert _send_due(rt) == ["retried"]
        [row] = world.messages()
        assert row.status == "pending" and row.error_code == "throughput"
        # The number's throughput, not the message: the wait Meta implies (5 s without a
        # Retry-After), not the backoff schedule's 5 minutes (tests/test_meta_limits.py).
        assert row.next_attempt_at == clock.now() + timedelta(seconds=5)
        clock.advance(timedelta(seconds=6))  # and the refused attempt held the patient's 6 s slot
        assert _send_due(rt) == ["sent"]


def test_meta_webhook_verification_and_bad_signature(rt, clock):
    with Graph() as graph:
        world, channel_id = meta_world(rt, graph)
        client = create_app(rt).test_client()
        ok = client.get(f"/webhooks/meta/{channel_id}?hub.mode=subscribe&hub.verify_token=verifique&hub.challenge=1158201444")
        assert ok.status_code == 200 and ok.text == "1158201444"
        assert client.get(f"/webhooks/meta/{channel_id}?hub.mode=subscribe&hub.verify_token=nope&hub.challenge=1").status_code == 401
        body = text_body("wamid.IN9", "sair", 1_800_000_000)
        assert post(client, channel_id, body, secret="wrong").status_code == 401
        world.contact(phone=PHONE)
        with rt.db.connect() as conn:
            assert conn.execute(select(messages)).all() == []


@pytest.mark.skipif(not (IS_POSTGRES and BROKER_URL.startswith("redis")), reason="needs PostgreSQL and Redis")
def test_end_to_end_on_postgres_and_redis_with_worker_processes(rt, clock, tmp_path, database_url):
    """The same story with real `lembra worker` and `lembra scheduler` processes."""
    from datetime import datetime, timezone

    from engine.fleet.broker import setup_broker

    clock.set(datetime.now(timezone.utc))
    procs = Processes(tmp_path)
    with Graph() as graph:
        world, channel_id = meta_world(rt, graph, **ANY_HOUR)
        contact = world.contact(phone=PHONE)
        appointment_id = world.appointment(contact, clock.now() + timedelta(hours=24, seconds=2))
        world.appointment(contact, clock.now() + timedelta(days=3))
        setup_broker(rt.settings)
        import engine.fleet.actors as actors

        client = create_app(rt, enqueue_inbound=lambda ids: actors.process_inbound.send(list(ids))).test_client()
        env = lembra_env(database_url, LEMBRA_POPULATE_INTERVAL="1")
        try:
            procs.start("worker", ["worker", "--processes", "1", "--threads", "4"], env)
            procs.start("scheduler", ["scheduler"], env)
            wait_until(lambda: len(graph.sends()) >= 1, timeout=60, what="the reminder at the Graph fake",
                       on_fail=procs.logs)
            # The row is marked sent after the call returns (its batch's calls, then one commit):
            # the fake can hold the request a moment before the database says so.
            wait_until(lambda: bool(world.messages(status="sent")), timeout=30, what="the reminder marked sent",
                       on_fail=procs.logs)
            [reminder] = world.messages(status="sent")
            now_ts = int(time.time())
            post(client, channel_id, status_body(reminder.provider_message_id, "delivered", now_ts))
            post(client, channel_id, status_body(reminder.provider_message_id, "read", now_ts + 1))
            assert _status_of(rt, reminder.id) == "read"
            post(client, channel_id, button_body("wamid.PG1", f"confirm:{appointment_id}",
                                                 reminder.provider_message_id, now_ts + 2))

            def confirmed() -> bool:
                with rt.db.connect() as conn:
                    return conn.execute(select(appointments.c.status)
                                        .where(appointments.c.id == appointment_id)).scalar_one() == "confirmed"

            wait_until(confirmed, timeout=30, what="the appointment confirmed by the worker", on_fail=procs.logs)
            # The acknowledgement is due at once and the scheduler may claim it before SAIR is read:
            # a claimed message goes out. Only the later appointment's reminder is the SAIR's to stop.
            wait_until(lambda: len(graph.sends()) >= 2, timeout=30, what="the confirmation's acknowledgement",
                       on_fail=procs.logs)
            pending = [m.id for m in world.messages(status="pending")]
            assert pending
            started = time.monotonic()
            post(client, channel_id, text_body("wamid.PG2", "Sair", now_ts + 3))
            wait_until(lambda: all(_status_of(rt, mid) == "cancelled" for mid in pending), timeout=30,
                       what="every pending message cancelled", on_fail=procs.logs)
            print(f"sair → every pending message cancelled in {time.monotonic() - started:.3f} s")
        finally:
            procs.stop_all()
