"""Outbound webhooks (issue 32): the clinic's system hears about what happened, signed as Standard
Webhooks says, delivered at least once from a durable table with retries and backoff, behind the
egress guard. The receiver is a real HTTP server on loopback that verifies every signature with
the `standardwebhooks` package itself."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any, Iterator

import pytest
from sqlalchemy import select, update
from standardwebhooks import Webhook, WebhookVerificationError

from engine.fleet.scheduler import Scheduler
from engine.people import appointments as appts
from engine.store.models import webhook_deliveries, webhook_endpoints
from engine.tenants.webhooks import delivery, endpoints, events
from engine.words.catalogue import describe
from tests.factories import World
from tests.fakes.server import FakeServer, Recorded, Reply
from tests.test_inbound import APPOINTMENT, clinic, reminded, reply

ALL = list(events.EVENT_TYPES)


class Receiver:
    """The clinic's system: verifies each request's signature, then answers as scripted."""

    def __init__(self) -> None:
        self.secret: str | None = None
        self.answers: list[int | Reply] = []
        self.verified: list[dict[str, Any]] = []
        self.refused = 0

    def __call__(self, request: Recorded) -> Reply:
        try:
            assert self.secret is not None
            body = Webhook(self.secret).verify(request.body, request.headers)
        except WebhookVerificationError:
            self.refused += 1
            return Reply(401)
        self.verified.append({"id": request.header("webhook-id"), "body": body})
        answer = self.answers.pop(0) if self.answers else 200
        return answer if isinstance(answer, Reply) else Reply(answer)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, FakeServer]]:
    hooks = Receiver()
    with FakeServer(hooks) as server:
        yield hooks, server


def _endpoint(rt, world: World, url: str, event_types: list[str] | None = None, *, hooks: Receiver | None = None,
              egress: Any = "default") -> int:
    with rt.db.begin() as conn:
        made = endpoints.create_endpoint(conn, rt.keyring, world.org_id, url=url, event_types=event_types or ALL,
                                         egress=rt.settings.egress if egress == "default" else egress)
    if hooks is not None:
        hooks.secret = made.secret
    return made.endpoint_id


def _deliveries(rt, **filters: Any) -> list[Any]:
    query = select(webhook_deliveries).order_by(webhook_deliveries.c.id)
    for name, value in filters.items():
        query = query.where(webhook_deliveries.c[name] == value)
    with rt.db.connect() as conn:
        return list(conn.execute(query))


def _run(rt) -> dict[int, str]:
    """One scheduler pass's worth of webhooks: sweep, claim what is due, deliver it."""
    delivery.sweep_expired(rt)
    return delivery.deliver_claimed(rt, delivery.claim_due(rt, limit=100))


# --- what happens emits, once, in the change's transaction ----------------------------------------


def test_a_patients_cancelar_delivers_one_signed_appointment_cancelled(rt, clock, receiver):
    hooks, server = receiver
    world = clinic(rt)
    _endpoint(rt, world, server.url + "/lembra", ["appointment.cancelled", "appointment.confirmed"], hooks=hooks)
    contact, appointment, _ = reminded(rt, clock, world)
    with rt.db.begin() as conn:
        conn.execute(update(webhook_endpoints).values(description="agenda"))

    assert reply(rt, world.channels["whatsapp"], text="CANCELAR") == ["cancelled"]
    [row] = _deliveries(rt)
    assert (row.event_type, row.status, row.attempts) == ("appointment.cancelled", "pending", 0)
    assert _run(rt) == {row.id: "delivered"}

    [got] = hooks.verified
    assert hooks.refused == 0 and got["id"] == row.webhook_id
    assert got["body"] == {
        "type": "appointment.cancelled", "timestamp": clock.now().isoformat(),
        "data": {"appointment_id": appointment, "appointment_external_id": None, "contact_id": contact,
                 "contact_external_id": None, "starts_at": APPOINTMENT.isoformat(), "status": "cancelled",
                 "cancel_source": "patient"}}
    assert got["body"]["data"]["starts_at"].endswith("-03:00")
    raw = server.requests[0].body.decode()
    assert "99887766" not in raw and "Ana" not in raw and "CANCELAR" not in raw  # ids, never PII or texts
    done = _deliveries(rt)[0]
    assert (done.status, done.attempts, done.last_status_code, done.last_error) == ("delivered", 1, 200, None)
    assert done.delivered_at == clock.now()
    assert _run(rt) == {} and len(server.requests) == 1  # exactly once


def test_confirm_opt_out_and_a_clinic_cancel_each_emit_their_event(rt, clock, receiver):
    hooks, server = receiver
    world = clinic(rt)
    _endpoint(rt, world, server.url, hooks=hooks)
    contact, appointment, _ = reminded(rt, clock, world)
    assert reply(rt, world.channels["whatsapp"], text="OK") == ["confirmed"]
    assert reply(rt, world.channels["whatsapp"], text="SAIR") == ["opted_out"]
    assert reply(rt, world.channels["whatsapp"], text="SAIR") == ["already_opted_out"]  # no second event
    with rt.db.begin() as conn:
        appts.set_status(conn, world.org_id, appointment, "confirmed", "cancelled")
    assert [(d.event_type, d.payload["data"].get("cancel_source") or d.payload["data"].get("source"))
            for d in _deliveries(rt)] == [
        ("appointment.confirmed", None), ("contact.opted_out", "reply:whatsapp"), ("appointment.cancelled", "clinic")]
    assert _deliveries(rt)[1].payload["data"] == {"contact_id": contact, "contact_external_id": None,
                                                  "channel_kinds": ["email", "sms", "whatsapp"],
                                                  "source": "reply:whatsapp"}
    _run(rt)
    assert [v["body"]["type"] for v in hooks.verified] == ["appointment.confirmed", "contact.opted_out",
                                                           "appointment.cancelled"]


def test_only_subscribed_active_endpoints_of_the_org_get_the_event(rt, clock):
    world, other = clinic(rt), World(rt, "outra")
    wanted = _endpoint(rt, world, "https://hooks.example.com/a", ["appointment.confirmed"], egress=None)
    _endpoint(rt, world, "https://hooks.example.com/b", ["appointment.cancelled"], egress=None)
    off = _endpoint(rt, world, "https://hooks.example.com/c", ["appointment.confirmed"], egress=None)
    _endpoint(rt, other, "https://hooks.example.com/d", ALL, egress=None)
    with rt.db.begin() as conn:
        endpoints.update_endpoint(conn, world.org_id, off, active=False)
    appointment = world.appointment(world.contact(), APPOINTMENT)
    with rt.db.begin() as conn:
        assert appts.confirm(conn, world.org_id, appointment)
    assert [(d.endpoint_id, d.org_id) for d in _deliveries(rt)] == [(wanted, world.org_id)]


def test_an_event_exists_only_if_its_change_commits(rt, clock):
    world = clinic(rt)
    _endpoint(rt, world, "https://hooks.example.com/x", egress=None)
    appointment = world.appointment(world.contact(), APPOINTMENT)
    with pytest.raises(RuntimeError):
        with rt.db.begin() as conn:
            assert appts.confirm(conn, world.org_id, appointment)
            assert len(events.subscribed(conn, world.org_id, "appointment.confirmed")) == 1
            raise RuntimeError("the change fails after the event was written")
    assert _deliveries(rt) == []
    with rt.db.begin() as conn:
        assert appts.confirm(conn, world.org_id, appointment)
    assert [d.event_type for d in _deliveries(rt)] == ["appointment.confirmed"]


def test_a_run_that_ends_tells_why(rt, clock):
    from tests.flows.helpers import Flows, linear, node

    world = clinic(rt)
    _endpoint(rt, world, "https://hooks.example.com/runs", ["run.ended"], egress=None)
    flows = Flows(world)
    pointer = flows.flow(linear(node("inicio", "trigger"), node("fim", "end", outcome="exhausted")))
    run = flows.enroll(pointer, world.contact(), key="k")
    flows.run()
    [row] = _deliveries(rt)
    assert row.payload["data"] == {"run_id": run, "flow_id": pointer, "contact_id": flows.enrollment(run).contact_id,
                                   "contact_external_id": None, "appointment_id": None, "status": "completed",
                                   "outcome": "exhausted", "reason": "ended"}


def test_booked_and_moved_helpers_carry_the_old_time_with_its_offset(rt, clock):
    world = clinic(rt)
    _endpoint(rt, world, "https://hooks.example.com/x", egress=None)
    appointment = world.appointment(world.contact(), APPOINTMENT, external_id="ag-7")
    with rt.db.begin() as conn:
        events.appointment_booked(conn, world.org_id, appointment, reason="no_show_rebooked")
        events.appointment_moved(conn, world.org_id, appointment, old_starts_at=APPOINTMENT - timedelta(days=1),
                                 reason="patient asked")  # not a code: left out
    booked, moved = (d.payload["data"] for d in _deliveries(rt))
    assert booked["appointment_external_id"] == "ag-7" and booked["reason"] == "no_show_rebooked"
    assert moved["old_starts_at"] == "2026-12-02T14:00:00-03:00" and moved["reason"] is None


# --- retries, backoff, dead --------------------------------------------------------------------


def _confirmed(rt, world: World) -> None:
    appointment = world.appointment(world.contact(), APPOINTMENT)
    with rt.db.begin() as conn:
        appts.confirm(conn, world.org_id, appointment)


def test_a_500_is_retried_after_its_backoff_with_the_same_webhook_id(rt, clock, receiver):
    hooks, server = receiver
    hooks.answers = [500]
    world = clinic(rt)
    _endpoint(rt, world, server.url, hooks=hooks)
    _confirmed(rt, world)
    [row] = _deliveries(rt)
    assert _run(rt) == {row.id: "retry"}
    failed = _deliveries(rt)[0]
    assert (failed.status, failed.attempts, failed.last_status_code, failed.last_error) == \
        ("pending", 1, 500, "webhook_server_error")
    assert failed.next_attempt_at == clock.now() + timedelta(seconds=30)
    clock.advance(timedelta(seconds=29))
    assert _run(rt) == {}  # not before its time
    clock.advance(timedelta(seconds=1))
    assert _run(rt) == {row.id: "delivered"}
    assert [v["id"] for v in hooks.verified] == [row.webhook_id, row.webhook_id]
    assert _deliveries(rt)[0].attempts == 2


def test_transient_failures_back_off_30s_2min_10min_1h_6h_then_dead(rt, clock, receiver):
    hooks, server = receiver
    hooks.answers = [503, 429, 408, 502, 500, 504]
    world = clinic(rt)
    _endpoint(rt, world, server.url, hooks=hooks)
    _confirmed(rt, world)
    waits = []
    for _ in range(6):
        before = clock.now()
        _run(rt)
        row = _deliveries(rt)[0]
        if row.next_attempt_at is None:
            break
        waits.append(row.next_attempt_at - before)
        clock.set(row.next_attempt_at)
    assert waits == [timedelta(seconds=30), timedelta(minutes=2), timedelta(minutes=10), timedelta(hours=1),
                     timedelta(hours=6)]
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == ("dead", 6, 504, "webhook_server_error")
    assert len({v["id"] for v in hooks.verified}) == 1 and len(hooks.verified) == 6


def test_a_400_is_dead_at_once_with_the_catalogues_reason(rt, clock, receiver):
    hooks, server = receiver
    hooks.answers = [400]
    world = clinic(rt)
    _endpoint(rt, world, server.url, hooks=hooks)
    _confirmed(rt, world)
    [row] = _deliveries(rt)
    assert _run(rt) == {row.id: "dead"}
    dead = _deliveries(rt)[0]
    assert (dead.status, dead.attempts, dead.last_status_code, dead.last_error, dead.next_attempt_at) == \
        ("dead", 1, 400, "webhook_refused", None)
    assert "recusou o aviso" in str(describe(dead.last_error))
    clock.advance(timedelta(days=1))
    assert _run(rt) == {}


def test_the_receivers_answer_to_the_last_attempt_is_kept_as_text_and_never_logged(rt, clock, receiver, caplog):
    caplog.set_level(logging.DEBUG)
    hooks, server = receiver
    long_body = "Falhou \x1b[31mvermelho\x1b[0m\u202e\x00 " + "x" * 5000
    hooks.answers = [Reply(500, long_body, {"Content-Type": "text/plain; charset=utf-8"}),
                     Reply(200, {"recebido": True}, delay=0.5),  # after the 0.1 s this attempt may take
                     Reply(200, "ok\r\nobrigado", {"Content-Type": "text/plain"})]
    world = clinic(rt)
    _endpoint(rt, world, server.url, hooks=hooks)
    _confirmed(rt, world)
    [row] = _deliveries(rt)

    assert _run(rt) == {row.id: "retry"}
    failed = _deliveries(rt)[0]
    assert (failed.last_status_code, failed.last_error, failed.last_response_reason) == \
        (500, "webhook_server_error", "Internal Server Error")
    assert failed.last_response_body == ("Falhou [31mvermelho[0m " + "x" * 5000)[:delivery.ANSWER_CHARS] + "…"
    assert isinstance(failed.last_duration_ms, int) and failed.last_duration_ms >= 0

    clock.set(failed.next_attempt_at)  # no answer in time: the last answer is this attempt's, none
    delivery.sweep_expired(rt)
    assert delivery.deliver_claimed(rt, delivery.claim_due(rt, limit=10), timeout=0.1) == {row.id: "retry"}
    timed_out = _deliveries(rt)[0]
    assert (timed_out.last_status_code, timed_out.last_error, timed_out.last_response_reason,
            timed_out.last_response_body) == (None, "webhook_timeout", None, None)
    assert timed_out.last_duration_ms is not None

    clock.set(timed_out.next_attempt_at)
    assert _run(rt) == {row.id: "delivered"}
    done = _deliveries(rt)[0]
    assert (done.attempts, done.last_status_code, done.last_response_reason, done.last_response_body) == \
        (3, 200, "OK", "ok\nobrigado")
    assert "vermelho" not in caplog.text and "obrigado" not in caplog.text  # the receiver's words: never logged


def test_a_resend_is_the_same_delivery_with_the_same_webhook_id_and_a_fresh_round_of_retries(rt, clock, receiver):
    hooks, server = receiver
    hooks.answers = [400, 500, 200]
    world = clinic(rt)
    endpoint_id = _endpoint(rt, world, server.url, hooks=hooks)
    _confirmed(rt, world)
    [row] = _deliveries(rt)
    assert _run(rt) == {row.id: "dead"}
    with rt.db.begin() as conn:  # as if every retry of its round had been spent
        conn.execute(update(webhook_deliveries).values(attempts=6))
    with rt.db.begin() as conn:
        assert delivery.resend(conn, world.org_id, endpoint_id, row.id).status == "dead"
    with rt.db.begin() as conn, pytest.raises(delivery.ResendRefused) as twice:
        delivery.resend(conn, world.org_id, endpoint_id, row.id)  # already queued: not twice
    assert twice.value.code == "webhook_resend_pending"
    queued = _deliveries(rt)[0]
    assert (queued.status, queued.resend_base, queued.resent_at, queued.next_attempt_at) == \
        ("pending", 6, clock.now(), clock.now())
    assert _run(rt) == {row.id: "retry"}  # the 7th attempt starts a new round: retried, not dead
    assert _deliveries(rt)[0].next_attempt_at == clock.now() + timedelta(seconds=30)
    clock.advance(timedelta(seconds=30))
    assert _run(rt) == {row.id: "delivered"}
    assert [v["id"] for v in hooks.verified] == [row.webhook_id] * 3
    assert [(r.id, r.attempts, r.status) for r in _deliveries(rt)] == [(row.id, 8, "delivered")]
    with rt.db.begin() as conn, pytest.raises(delivery.DeliveryNotFound):
        delivery.resend(conn, world.org_id + 1000, endpoint_id, row.id)  # not that org's
    with rt.db.begin() as conn:
        endpoints.update_endpoint(conn, world.org_id, endpoint_id, active=False)
    with rt.db.begin() as conn, pytest.raises(delivery.ResendRefused) as inactive:
        delivery.resend(conn, world.org_id, endpoint_id, row.id)
    assert inactive.value.code == "webhook_resend_inactive"


def test_a_receiver_that_is_down_is_a_connection_error_to_retry(rt, clock):
    with FakeServer(lambda request: Reply(200)) as server:
        url = server.url
    world = clinic(rt)
    _endpoint(rt, world, url)  # nothing listens there any more
    _confirmed(rt, world)
    _run(rt)
    row = _deliveries(rt)[0]
    assert (row.status, row.last_error, row.last_status_code) == ("pending", "webhook_connection_error", None)


# --- the egress guard, at save and at send --------------------------------------------------------


@pytest.mark.parametrize("url, code", [
    ("http://10.1.2.3/hook", "egress_refused"),
    ("http://169.254.169.254/latest/meta-data", "egress_refused"),
    ("https://user:pw@hooks.example.com/", "url_credentials"),
    ("ftp://hooks.example.com/", "url_invalid"),
    ("http://0177.0.0.1/", "url_ip_spelling"),
])
def test_an_internal_or_unusable_url_is_refused_at_save(rt, clock, url, code):
    world = clinic(rt)
    with pytest.raises(endpoints.EndpointRefused) as refused, rt.db.begin() as conn:
        endpoints.create_endpoint(conn, rt.keyring, world.org_id, url=url, event_types=ALL, egress=rt.settings.egress)
    assert (refused.value.field, refused.value.code) == ("url", code)


def test_an_internal_url_is_refused_again_at_send_and_nothing_connects(rt, clock, connects):
    world = clinic(rt)
    # Saved before the guard could say no (or the name resolved elsewhere then): the send refuses.
    _endpoint(rt, world, "http://10.1.2.3/hook", egress=None)
    _confirmed(rt, world)
    [row] = _deliveries(rt)
    assert _run(rt) == {row.id: "dead"}
    dead = _deliveries(rt)[0]
    assert (dead.status, dead.attempts, dead.last_error) == ("dead", 1, "egress_refused")
    assert [c for c in connects if c[0] == "10.1.2.3"] == []


# --- a worker killed mid-delivery ------------------------------------------------------------------


def test_a_delivery_whose_worker_died_mid_post_is_retried_after_its_lease(rt, clock, receiver):
    hooks, server = receiver
    world = clinic(rt)
    _endpoint(rt, world, server.url, hooks=hooks)
    _confirmed(rt, world)
    [claim] = delivery.claim_due(rt, limit=10)
    with rt.db.begin() as conn:  # what the actor stamps just before its POST, and then the process dies
        conn.execute(update(webhook_deliveries).values(claim_started_at=clock.now()))
    assert delivery.claim_due(rt, limit=10) == []  # leased: nobody else takes it meanwhile
    clock.advance(rt.settings.lease - timedelta(seconds=1))
    assert delivery.sweep_expired(rt) == (0, 0)
    clock.advance(timedelta(seconds=2))
    assert delivery.sweep_expired(rt) == (1, 0)
    row = _deliveries(rt)[0]
    assert (row.status, row.attempts, row.last_error, row.lease_until) == ("pending", 1, "webhook_interrupted", None)
    assert row.next_attempt_at == clock.now() + timedelta(seconds=30)
    clock.advance(timedelta(seconds=30))
    [again] = delivery.claim_due(rt, limit=10)
    # The dead worker's claim, were it to wake now, is stale: it cannot overwrite the new one.
    client = delivery.http.Client(rt.settings.egress)
    try:
        assert delivery.deliver_one(rt, client, claim.id, claim.revision) == "stale"
    finally:
        client.close()
    assert delivery.deliver_claimed(rt, [again]) == {again.id: "delivered"}
    assert [v["id"] for v in hooks.verified] == [row.webhook_id]
    assert _deliveries(rt)[0].attempts == 2


def test_a_claim_no_worker_started_goes_back_free(rt, clock):
    world = clinic(rt)
    _endpoint(rt, world, "https://hooks.example.com/x", egress=None)
    _confirmed(rt, world)
    delivery.claim_due(rt, limit=10)  # the broker lost the task
    clock.advance(rt.settings.lease + timedelta(seconds=1))
    assert delivery.sweep_expired(rt) == (0, 1)
    row = _deliveries(rt)[0]
    assert (row.status, row.attempts, row.lease_until, row.last_error) == ("pending", 0, None, None)
    assert len(delivery.claim_due(rt, limit=10)) == 1


# --- the scheduler and the workers ---------------------------------------------------------------


def test_the_scheduler_hands_due_deliveries_to_the_workers_in_tasks(rt, clock):
    world = clinic(rt)
    _endpoint(rt, world, "https://hooks.example.com/x", egress=None)
    for _ in range(12):
        _confirmed(rt, world)
    tasks: list[list[list[int]]] = []
    tick = Scheduler(rt, lambda ids: None, enqueue_webhooks=lambda claims: tasks.append([list(c) for c in claims])
                     ).tick()
    assert tick.webhooks == 12 and [len(t) for t in tasks] == [delivery.TASK, 12 - delivery.TASK]
    assert Scheduler(rt, lambda ids: None).tick().webhooks == 0  # a scheduler without the actor claims none


def test_the_embedded_default_delivers_through_its_in_process_worker(rt, clock, receiver):
    from admin.embedded import Embedded

    hooks, server = receiver
    world = clinic(rt)
    _endpoint(rt, world, server.url, hooks=hooks)
    _confirmed(rt, world)
    embedded = Embedded(rt, worker_threads=1)
    embedded.start_workers()
    try:
        assert embedded.scheduler.tick().webhooks == 1
        embedded.drain()
    finally:
        embedded.stop_workers()
    assert _deliveries(rt)[0].status == "delivered" and len(hooks.verified) == 1


# --- the secret ------------------------------------------------------------------------------------


def test_the_secret_is_sealed_shown_once_rotated_and_never_logged(rt, clock, receiver, caplog):
    caplog.set_level(logging.DEBUG)
    hooks, server = receiver
    world = clinic(rt)
    with rt.db.begin() as conn:
        made = endpoints.create_endpoint(conn, rt.keyring, world.org_id, url=server.url, event_types=ALL,
                                         egress=rt.settings.egress)
    assert made.secret.startswith("whsec_")
    with rt.db.connect() as conn:
        stored = conn.execute(select(webhook_endpoints)).one()
    assert made.secret.encode() not in bytes(stored.secret) and made.secret not in repr(stored)
    with rt.db.begin() as conn:
        rotated = endpoints.rotate_secret(conn, rt.keyring, world.org_id, made.endpoint_id)
    assert rotated.secret != made.secret
    hooks.secret = made.secret
    _confirmed(rt, world)
    _run(rt)
    assert hooks.refused == 1  # the old secret no longer signs (the receiver's 401: given up)
    assert _deliveries(rt)[0].last_error == "webhook_refused"
    hooks.secret = rotated.secret
    _confirmed(rt, world)
    _run(rt)
    assert len(hooks.verified) == 1
    for secret in (made.secret, rotated.secret):
        assert secret not in caplog.text and secret.removeprefix("whsec_") not in caplog.text
    assert json.dumps(_deliveries(rt)[0].payload).find("whsec_") == -1


def test_retention_deletes_finished_deliveries_after_the_queue_days_and_keeps_pending_ones(rt, clock, receiver):
    from engine.privacy.retention import run_org

    hooks, server = receiver
    hooks.answers = [200, 500]
    world = clinic(rt)
    _endpoint(rt, world, server.url, hooks=hooks)
    _confirmed(rt, world)
    _confirmed(rt, world)
    _run(rt)
    assert [d.status for d in _deliveries(rt)] == ["delivered", "pending"]
    clock.advance(timedelta(days=91))
    assert run_org(rt.db, world.org_id).counts["webhook_deliveries_deleted"] == 1
    assert [d.status for d in _deliveries(rt)] == ["pending"]


def test_key_rotation_reseals_endpoint_secrets_under_the_new_key(rt, settings, clock):
    from engine.core.config import Settings
    from engine.store.key_rotation import rotate
    from engine.store.runtime import Runtime
    from gateway.crypto import Keyring
    from tests.test_credentials import NEW_KEY

    world = clinic(rt)
    with rt.db.begin() as conn:
        made = endpoints.create_endpoint(conn, rt.keyring, world.org_id, url="https://hooks.example.com/x",
                                         event_types=ALL)
    both = Runtime.build(Settings(**{**settings.__dict__, "secret_keys": f"{NEW_KEY},{settings.secret_keys}"}))
    try:
        assert rotate(both.db, both.keyring).rotated["webhook_endpoints"] == 1
    finally:
        both.close()
    with rt.db.connect() as conn:
        row = endpoints.get_endpoint(conn, world.org_id, made.endpoint_id)
    assert row.key_version == 2 and endpoints.endpoint_secret(Keyring.parse(NEW_KEY), row) == made.secret


def test_no_more_than_max_in_flight_deliveries_are_leased_at_once(rt, clock):
    world = clinic(rt)
    _endpoint(rt, world, "https://hooks.example.com/x", egress=None)
    for _ in range(5):
        _confirmed(rt, world)
    assert len(delivery.claim_due(rt, limit=100, max_in_flight=3)) == 3
    assert delivery.claim_due(rt, limit=100, max_in_flight=3) == []
    assert len(delivery.claim_due(rt, limit=100, max_in_flight=5)) == 2


def test_a_lease_shorter_than_a_webhooks_time_limit_still_delivers(rt, settings, clock, receiver):
    """A lease of a few seconds (LEMBRA_LEASE_SECONDS=3) left every delivery `stale` for good:
    none had 10 s of lease left to begin. The POST's limit shrinks to the send timeout instead."""
    from engine.core.config import Settings
    from engine.store.runtime import Runtime

    hooks, server = receiver
    world = clinic(rt)
    _endpoint(rt, world, server.url, hooks=hooks)
    reminded(rt, clock, world)
    assert reply(rt, world.channels["whatsapp"], text="CANCELAR") == ["cancelled"]
    short = Runtime.build(Settings(**{**settings.__dict__, "lease": timedelta(seconds=3), "send_timeout": 1.0}))
    try:
        [row] = _deliveries(short)
        assert delivery.deliver_claimed(short, delivery.claim_due(short, limit=10)) == {row.id: "delivered"}
    finally:
        short.close()
    assert len(hooks.verified) == 1
