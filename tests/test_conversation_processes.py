"""A conversation that moves an appointment, with real `lembra` processes: a worker SIGKILLed in
the middle of the move, two replies racing on one offer, the same reply delivered twice, and 200
runs picking the same few free times of one professional with two worker processes.

As in tests/test_flow_processes.py, `lembra scheduler` and `lembra worker` processes run on the
wall clock over the test's database and broker; the patient's replies come in through a `lembra
web` process (the sandbox channel's webhook), which hands them to the workers through the broker.
The flow: `oferta` offers the professional's first free times, the reply picks one, `remarca`
moves the appointment there (its `appointment.moved` webhook delivery written in the same
transaction), `confirma` sends the confirmation.

These need PostgreSQL and a real broker: the kill and the race are made deterministic with row
locks the test holds on PostgreSQL (a worker waiting on one is visibly in the middle of its step,
in `pg_stat_activity`), and two worker processes compete through the broker. Nothing here sleeps
to decide an outcome: each phase waits for the database to say it is done, under a deadline.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import create_engine, func, select, text, update
from sqlalchemy.engine import Engine

from engine.flows import triggers
from engine.people.agenda import create_professional
from engine.store.models import (
    appointments,
    enrollment_events,
    enrollments,
    inbound_messages,
    messages,
    orgs,
    sandbox_messages,
    webhook_deliveries,
)
from engine.tenants.webhooks.endpoints import create_endpoint
from tests.conftest import BROKER_URL, IS_POSTGRES
from tests.factories import World, sandbox_headers
from tests.fakes.server import FakeServer, Reply
from tests.flows.helpers import Flows, edge, node
from tests.processes import Processes, flush_broker, lembra_env, wait_until

REAL_BROKER = not BROKER_URL.startswith("stub")
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(not (IS_POSTGRES and REAL_BROKER),
                       reason="needs PostgreSQL (row locks the test holds) and a real broker (Redis or RabbitMQ)"),
]
UTC = timezone.utc
#: Brazilian zones one hour apart: one of them is far from local midnight (as test_flow_processes).
ZONES = ("America/Noronha", "America/Sao_Paulo", "America/Manaus", "America/Rio_Branco")
PROFESSIONAL = "Dra. Beatriz Costa"
CONFIRMATION = "session_confirmation"
#: A short lease, so the sweep finds a killed claim soon; no shorter than a webhook POST's 10-second
#: timeout, or the worker leaves every delivery claim to the sweep (delivery.deliver_one).
ENV = {"LEMBRA_LEASE_SECONDS": "15", "LEMBRA_SEND_TIMEOUT": "5"}

#: offer the first free times → the reply picks one → move there → confirm it.
GRAPH = {
    "nodes": [node("inicio", "trigger"),
              node("oferta", "do", action="offer_slots", limit=3),
              node("remarca", "do", action="move"),
              node("confirma", "action", mode="template", template=CONFIRMATION),
              node("feito", "end", outcome="converted"),
              node("sem_vaga", "end", outcome="custom"),
              node("falhou", "end", outcome="exhausted")],
    "edges": [edge("inicio", "oferta"),
              edge("oferta", "remarca", "ok"), edge("oferta", "sem_vaga", "unavailable"),
              edge("oferta", "falhou", "failed"), edge("oferta", "falhou", "no_reply"),
              edge("remarca", "confirma", "ok"), edge("remarca", "sem_vaga", "unavailable"),
              edge("remarca", "falhou", "failed"),
              edge("confirma", "feito")],
}


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    flush_broker()  # no actor message of an earlier test may reach this test's (reused) ids
    processes = Processes(tmp_path)
    yield processes
    processes.stop_all()
    flush_broker()


@pytest.fixture
def owner(owner_database_url: str) -> Iterator[Engine]:
    """The database as its owner: the row locks the test holds, and `pg_stat_activity` (which
    shows another role's queries only to a superuser or the same role)."""
    engine = create_engine(owner_database_url)
    yield engine
    engine.dispose()


class Clinic:
    """An org open all day, with a sandbox WhatsApp channel, one professional who works every day
    around the clock (so free times exist whenever the test runs), an endpoint that hears
    `appointment.moved`, and the conversation flow."""

    def __init__(self, rt: Any, hooks_url: str) -> None:
        now = datetime.now(UTC)
        zone = next((z for z in ZONES if now.astimezone(ZoneInfo(z)).hour not in (22, 23, 0)), ZONES[1])
        self.rt = rt
        self.opened = now  # every reply's timestamp: a redelivery is the same bytes
        self.world = World(rt, timezone=zone, quiet_start="00:00", quiet_end="23:59", skip_sundays=False,
                           skip_holidays=False)
        self.org_id = self.world.org_id
        self.channel_id = self.world.channel("whatsapp")
        self.secret = sandbox_headers(rt, self.channel_id)
        with rt.db.begin() as conn:
            # A two-second turn: the test's replies are read soon after they arrive.
            conn.execute(update(orgs).where(orgs.c.id == self.org_id).values(reply_debounce_seconds=2))
            self.professional_id = create_professional(
                conn, self.org_id, name=PROFESSIONAL, slot_minutes=30,
                hours=[{"weekday": d, "starts": "00:00", "ends": "24:00"} for d in range(7)]).id
            create_endpoint(conn, rt.keyring, self.org_id, url=hooks_url, event_types=["appointment.moved"],
                            egress=rt.settings.egress)
        self.flows = Flows(self.world)
        self.pointer = self.flows.flow(GRAPH, agent=False)

    def patients(self, count: int) -> list[tuple[int, int, int, str]]:
        """`count` patients, each with an appointment of the professional ten days ahead (far from
        the free times offered now) and a run of the flow: (contact, appointment, run, phone)."""
        base = (datetime.now(UTC) + timedelta(days=10)).replace(minute=0, second=0, microsecond=0)
        out = []
        for i in range(count):
            phone = f"+551198{i:07d}"
            contact = self.world.contact(name=f"Paciente {i}", phone=phone, email=None, consent=("whatsapp",))
            appointment = self.world.appointment(contact, base + timedelta(minutes=30 * i), refresh=False,
                                                 professional=PROFESSIONAL, professional_id=self.professional_id)
            with self.rt.db.begin() as conn:
                run = triggers.enroll(conn, self.org_id, self.pointer, contact, trigger_kind="manual",
                                      trigger_key=f"manual:{appointment}", appointment_id=appointment,
                                      automatic=False).enrollment_id
            assert run is not None
            out.append((contact, appointment, run, phone))
        return out


@pytest.fixture
def hooks() -> Iterator[FakeServer]:
    """The clinic's system: answers every webhook 200 and records it."""
    with FakeServer(lambda request: Reply(200)) as server:
        yield server


@pytest.fixture
def clinic(rt, clock, hooks) -> Clinic:
    clock.set(datetime.now(UTC))
    return Clinic(rt, f"{hooks.url}/hooks")


# ---------------------------------------------------------------------------------------------
# Processes and the patient's replies
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(database_url: str, name: str, **extra: str) -> dict[str, str]:
    return lembra_env(database_url, PGOPTIONS=f"-c test.process={name}", **{**ENV, **extra})


def _worker(procs: Processes, database_url: str, name: str) -> Any:
    proc = procs.start(name, ["worker", "--processes", "1", "--threads", "4"],
                       _env(database_url, name, LEMBRA_LOG_LEVEL="INFO"))
    procs.wait_ready(proc)
    return proc


def _web(procs: Processes, database_url: str) -> int:
    """`lembra web` on a free port, answering; returns the port."""
    port = _free_port()
    procs.start("web", ["web", "--bind", f"127.0.0.1:{port}", "--workers", "2"], _env(database_url, "web"))
    wait_until(lambda: _status(f"http://127.0.0.1:{port}/healthz") == 200, timeout=90, what="lembra web",
               on_fail=procs.logs)
    return port


def _fleet(procs: Processes, database_url: str, workers: int = 1) -> tuple[list[Any], Any, int]:
    """Worker processes (ready), the scheduler and `lembra web`: (workers, scheduler, web port)."""
    started = [_worker(procs, database_url, f"worker{i}") for i in range(workers)]
    scheduler = procs.start("scheduler", ["scheduler"], _env(database_url, "scheduler"))
    return started, scheduler, _web(procs, database_url)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code
    except OSError:
        return 0


def _reply(clinic: Clinic, port: int, phone: str, said: str, message_id: str) -> int:
    """The patient writes on WhatsApp: the sandbox provider's webhook delivery to `lembra web`.
    The same `message_id` with the same text is the provider delivering the same message again."""
    body = json.dumps({"type": "message", "id": message_id, "from": phone, "text": said,
                       "timestamp": clinic.opened.timestamp()}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/webhooks/sandbox/{clinic.channel_id}", data=body,
                                     method="POST", headers={"Content-Type": "application/json", **clinic.secret})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code


def _together(*calls: Any) -> list[Any]:
    """Run the calls at the same moment, each on its own thread (a barrier releases them)."""
    barrier = threading.Barrier(len(calls))

    def go(call: Any) -> Any:
        barrier.wait(timeout=30)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(go, calls))


# ---------------------------------------------------------------------------------------------
# Row locks the test holds, and the backends waiting on them
# ---------------------------------------------------------------------------------------------


@contextmanager
def _row_locked(owner: Engine, table: str, org_id: int, row_id: int) -> Iterator[None]:
    """Hold a lock on one row (FOR NO KEY UPDATE: a write of the row waits; a foreign key that
    only points at it does not) until the block ends."""
    with owner.connect() as conn:
        with conn.begin():
            locked = conn.execute(text(f"SELECT id FROM {table} WHERE org_id = :org AND id = :id FOR NO KEY UPDATE"),
                                  {"org": org_id, "id": row_id}).first()
            assert locked is not None
            yield


def _waiting(owner: Engine, statement: str) -> int:
    """How many backends of this database wait on a lock in a statement that starts so."""
    with owner.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND ltrim(query) ILIKE :statement"),
            {"statement": f"{statement}%"}).scalar_one()


# ---------------------------------------------------------------------------------------------
# What the database says
# ---------------------------------------------------------------------------------------------


def _run(rt, run_id: int) -> Any:
    with rt.db.connect() as conn:
        return conn.execute(select(enrollments).where(enrollments.c.id == run_id)).one()


def _runs(rt, ids: Sequence[int]) -> list[Any]:
    with rt.db.connect() as conn:
        return list(conn.execute(select(enrollments).where(enrollments.c.id.in_(list(ids))).order_by(enrollments.c.id)))


def _positions(rt) -> Counter:
    with rt.db.connect() as conn:
        return Counter({(n, s): c for n, s, c in conn.execute(
            select(enrollments.c.current_node_id, enrollments.c.status, func.count())
            .group_by(enrollments.c.current_node_id, enrollments.c.status)).all()})


def _steps(rt, run_id: int) -> list[tuple[str, str, str]]:
    """The run's `step` events in order: (node, status, reason)."""
    with rt.db.connect() as conn:
        rows = conn.execute(select(enrollment_events.c.node_id, enrollment_events.c.payload).where(
            enrollment_events.c.enrollment_id == run_id, enrollment_events.c.event_type == "step")
            .order_by(enrollment_events.c.id)).all()
    return [(row.node_id, (row.payload or {}).get("status"), (row.payload or {}).get("reason")) for row in rows]


def _appointment(rt, appointment_id: int) -> Any:
    with rt.db.connect() as conn:
        return conn.execute(select(appointments).where(appointments.c.id == appointment_id)).one()


def _sent(rt, contact_id: int | None = None) -> list[tuple[str | None, str | None, str]]:
    """What the sandbox provider sent (to one contact): (template, text, idempotency key), in order."""
    query = select(sandbox_messages.c.idempotency_key, messages.c.template_key, messages.c.payload).join(
        messages, (messages.c.org_id == sandbox_messages.c.org_id)
        & (messages.c.idempotency_key == sandbox_messages.c.idempotency_key))
    if contact_id is not None:
        query = query.where(messages.c.contact_id == contact_id)
    with rt.db.connect() as conn:
        rows = conn.execute(query.order_by(sandbox_messages.c.id)).all()
    return [(row.template_key, (row.payload or {}).get("text"), row.idempotency_key) for row in rows]


def _open_messages(rt) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(messages).where(
            messages.c.status.in_(("new", "pending", "claimed", "sending")))).scalar_one()


def _deliveries(rt) -> list[Any]:
    with rt.db.connect() as conn:
        return list(conn.execute(select(webhook_deliveries).order_by(webhook_deliveries.c.id)))


def _heard(hooks: FakeServer) -> Counter:
    """The clinic's system: webhook ids it received, by (event type, webhook id)."""
    return Counter((r.json()["type"], r.header("webhook-id")) for r in list(hooks.requests) if r.path == "/hooks")


def _offered(row: Any) -> list[dict[str, Any]]:
    return list((row.ask_state or {}).get("offered") or [])


def _instant(stored: str) -> datetime:
    return datetime.fromisoformat(stored).astimezone(UTC)


def _assert_no_key_twice(rt) -> None:
    with rt.db.connect() as conn:
        sandbox_twice = conn.execute(select(sandbox_messages.c.idempotency_key)
                                     .group_by(sandbox_messages.c.idempotency_key).having(func.count() > 1)).all()
        outbox_twice = conn.execute(select(messages.c.idempotency_key).group_by(messages.c.org_id,
                                                                                  messages.c.idempotency_key)
                                    .having(func.count() > 1)).all()
        events_twice = conn.execute(select(enrollment_events.c.enrollment_id, enrollment_events.c.idempotency_key)
                                    .group_by(enrollment_events.c.enrollment_id, enrollment_events.c.idempotency_key)
                                    .having(func.count() > 1)).all()
    assert sandbox_twice == [] and outbox_twice == [], "a message went out twice"
    assert events_twice == [], f"run event keys written twice: {events_twice[:5]}"


def _state(rt, procs: Processes, hooks: FakeServer | None = None) -> str:
    with rt.db.connect() as conn:
        moved = conn.execute(select(appointments.c.id, appointments.c.starts_at, appointments.c.status)
                             .order_by(appointments.c.id).limit(10)).all()
    heard = dict(_heard(hooks)) if hooks is not None else {}
    return (f"positions {dict(_positions(rt))}; sent {Counter(t for t, _, _ in _sent(rt))}; "
            f"deliveries {[(d.event_type, d.status) for d in _deliveries(rt)]}; heard {heard}; "
            f"appointments {moved}\n{procs.logs()}")


def _offer_waiting(rt, clinic: Clinic, patients: Sequence[tuple[int, int, int, str]], procs: Processes,
                   hooks: FakeServer) -> list[dict[str, Any]]:
    """Wait until every run waits for its pick with the list sent; the times offered (the same
    for every run: nobody has picked yet)."""
    n = len(patients)
    wait_until(lambda: _positions(rt) == Counter({("oferta", "waiting_reply"): n}) and len(_sent(rt)) == n
               and _open_messages(rt) == 0, timeout=180, what="every run waiting on its offer, the list sent",
               on_fail=lambda: _state(rt, procs, hooks))
    lists = {json.dumps(_offered(row), sort_keys=True) for row in _runs(rt, [p[2] for p in patients])}
    assert len(lists) == 1, f"the runs were offered different times: {lists}"
    offered = _offered(_runs(rt, [patients[0][2]])[0])
    assert len(offered) == 3 and all(s["professional_id"] == clinic.professional_id for s in offered), offered
    return offered


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def test_a_worker_killed_in_the_middle_of_the_move_moves_the_appointment_once(rt, clinic, procs, database_url,
                                                                              owner, hooks):
    """The patient picks the second time offered. The worker's move step holds the run for its
    claim (`_hold`), checked the time still free and is writing the appointment, waiting on a row
    lock the test holds, when it is SIGKILLed: its transaction never commits. The sweep counts the
    lost claim a failed attempt; a new worker moves the appointment, once: one `appointment.moved`
    delivery, one confirmation, the run completed."""
    [(contact, appointment, run, phone)] = clinic.patients(1)
    before = _appointment(rt, appointment).starts_at
    [worker], _scheduler, port = _fleet(procs, database_url)
    [first, second, third] = _offer_waiting(rt, clinic, [(contact, appointment, run, phone)], procs, hooks)

    with _row_locked(owner, "appointments", clinic.org_id, appointment):
        assert _reply(clinic, port, phone, "2", "wamid-pick") == 200
        wait_until(lambda: _waiting(owner, "UPDATE appointments") == 1, timeout=60,
                   what="the move step writing the appointment, waiting on the test's lock",
                   on_fail=lambda: _state(rt, procs, hooks))
        held = _run(rt, run)
        assert (held.current_node_id, held.status, held.data["slot"]["starts_at"]) == \
            ("remarca", "active", second["starts_at"]), "the pick committed; the move is in flight"
        assert held.claim_started_at is not None and held.lease_until is not None
        procs.kill(worker, signal.SIGKILL)
    # The lock is gone: the killed worker's backend finds its client gone and rolls back.
    wait_until(lambda: _waiting(owner, "UPDATE appointments") == 0, timeout=60, what="the killed step's backend")
    assert _appointment(rt, appointment).starts_at == before, "the killed step moved nothing"
    assert _deliveries(rt) == []

    # The sweep: the claim the worker started and never finished is a failed attempt, backed off.
    wait_until(lambda: (lambda r: r.lease_until is None and r.attempts == 1)(_run(rt, run)), timeout=90,
               what="the killed claim swept", on_fail=lambda: _state(rt, procs, hooks))
    swept = _run(rt, run)
    assert (swept.status, swept.current_node_id, swept.last_error) == ("active", "remarca", "claim_expired")
    assert _steps(rt, run)[-1] == ("remarca", "deferred", "claim_expired")
    with rt.db.begin() as conn:  # its 30-second backoff "passes" (what a due run is to a process)
        assert conn.execute(update(enrollments).where(enrollments.c.id == run, enrollments.c.lease_until.is_(None),
                                                      enrollments.c.attempts == 1)
                            .values(next_eval_at=datetime.now(UTC) - timedelta(seconds=1))).rowcount == 1
    _worker(procs, database_url, "worker_b")

    wait_until(lambda: _run(rt, run).status == "completed" and _open_messages(rt) == 0
               and sum(_heard(hooks).values()) >= 1, timeout=120,
               what="the run completed, its confirmation sent, the clinic told",
               on_fail=lambda: _state(rt, procs, hooks))
    done = _run(rt, run)
    assert (done.current_node_id, done.outcome, done.attempts) == ("feito", "converted", 0)
    moved = _appointment(rt, appointment)
    assert (moved.starts_at, moved.status) == (_instant(second["starts_at"]), "scheduled")
    assert [s for s in _steps(rt, run) if s[0] == "remarca"] == [
        ("remarca", "deferred", "claim_expired"), ("remarca", "ok", "do_moved")]
    [delivery] = _deliveries(rt)
    assert (delivery.event_type, delivery.status) == ("appointment.moved", "delivered")
    assert delivery.payload["data"]["appointment_id"] == appointment
    assert _instant(delivery.payload["data"]["starts_at"]) == _instant(second["starts_at"])
    assert _heard(hooks) == Counter({("appointment.moved", delivery.webhook_id): 1})
    templates = [template for template, _, _ in _sent(rt, contact)]
    assert templates == [None, CONFIRMATION], "the list, then one confirmation"
    _assert_no_key_twice(rt)
    assert {_instant(s["starts_at"]) for s in (first, third)} & {moved.starts_at} == set()


def test_two_replies_racing_on_one_offer_move_the_appointment_once(rt, clinic, procs, database_url, owner, hooks):
    """The patient answers the list with "1" and, while the worker is writing that pick, with "2".
    The race is held open with row locks: the pick step has taken the run (its compare-and-set
    UPDATE holds the run's row) and waits to mark "1" read, when "2" arrives and its processing
    waits for the run's row in turn. Then both go: the appointment moves once, to the first time
    offered; "2" is read without a second move, without cancelling what the patient just chose,
    and without a second message.

    (This found two faults, both mended: `on_reply` lost a reply whose run's revision moved on
    under it — it now locks the contact's runs and sees the step as committed — and the inbound
    path then read "2" as the reminders' cancel keyword although the patient's last message was the
    flow's list.)"""
    [(contact, appointment, run, phone)] = clinic.patients(1)
    _workers, _scheduler, port = _fleet(procs, database_url)
    [first, second, _third] = _offer_waiting(rt, clinic, [(contact, appointment, run, phone)], procs, hooks)

    assert _reply(clinic, port, phone, "1", "wamid-one") == 200
    wait_until(lambda: _processed(rt, clinic.org_id) == 1, timeout=60, what='"1" handed to the run',
               on_fail=lambda: _state(rt, procs, hooks))
    with rt.db.connect() as conn:
        one = conn.execute(select(inbound_messages.c.id).where(inbound_messages.c.org_id == clinic.org_id)).scalar_one()
    assert _run(rt, run).pending_inbound_id == one
    with _row_locked(owner, "inbound_messages", clinic.org_id, one):
        wait_until(lambda: _waiting(owner, "UPDATE inbound_messages") == 1, timeout=60,
                   what='the pick step holding the run, marking "1" read',
                   on_fail=lambda: _state(rt, procs, hooks))
        assert _reply(clinic, port, phone, "2", "wamid-two") == 200
        wait_until(lambda: _waiting(owner, "UPDATE enrollments") == 1, timeout=60,
                   what='"2" waiting for the run the pick step holds', on_fail=lambda: _state(rt, procs, hooks))

    wait_until(lambda: _run(rt, run).status in ("completed", "dead", "cancelled") and _open_messages(rt) == 0
               and _processed(rt, clinic.org_id) == 2
               and sum(_heard(hooks).values()) >= len(_deliveries(rt)), timeout=120,
               what="the run ended, both replies processed, the clinic told",
               on_fail=lambda: _state(rt, procs, hooks))
    _assert_one_move(rt, clinic, hooks, contact, appointment, run, first)
    # A provider that delivers both again changes nothing.
    assert _reply(clinic, port, phone, "1", "wamid-one") == 200
    assert _reply(clinic, port, phone, "2", "wamid-two") == 200
    assert _processed(rt, clinic.org_id) == 2
    _assert_one_move(rt, clinic, hooks, contact, appointment, run, first)


def test_the_same_reply_delivered_twice_at_once_moves_the_appointment_once(rt, clinic, procs, database_url, hooks):
    """The provider delivers the patient's "2" twice at the same moment (and once more later):
    one inbound message, one move to the second time offered, one confirmation."""
    [(contact, appointment, run, phone)] = clinic.patients(1)
    _workers, _scheduler, port = _fleet(procs, database_url)
    [_first, second, _third] = _offer_waiting(rt, clinic, [(contact, appointment, run, phone)], procs, hooks)

    statuses = _together(lambda: _reply(clinic, port, phone, "2", "wamid-twice"),
                         lambda: _reply(clinic, port, phone, "2", "wamid-twice"))
    assert statuses == [200, 200]
    wait_until(lambda: _run(rt, run).status in ("completed", "dead", "cancelled") and _open_messages(rt) == 0
               and _processed(rt, clinic.org_id) == 1 and sum(_heard(hooks).values()) >= len(_deliveries(rt)),
               timeout=120,
               what="the run ended and the clinic told", on_fail=lambda: _state(rt, procs, hooks))
    assert _reply(clinic, port, phone, "2", "wamid-twice") == 200
    assert _processed(rt, clinic.org_id) == 1
    _assert_one_move(rt, clinic, hooks, contact, appointment, run, second)


def _processed(rt, org_id: int) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(inbound_messages).where(
            inbound_messages.c.org_id == org_id, inbound_messages.c.processed_at.is_not(None))).scalar_one()


def _assert_one_move(rt, clinic: Clinic, hooks: FakeServer, contact: int, appointment: int, run: int,
                     to: dict[str, Any]) -> None:
    """The run completed having moved the appointment once, to `to`; the appointment is live
    there; one `appointment.moved` delivery, heard once; the list and one confirmation sent."""
    done = _run(rt, run)
    assert (done.status, done.current_node_id, done.outcome) == ("completed", "feito", "converted"), \
        _steps(rt, run)
    moved = _appointment(rt, appointment)
    assert (moved.starts_at, moved.status) == (_instant(to["starts_at"]), "scheduled"), \
        f"the appointment is {moved.status} at {moved.starts_at}"
    assert [s for s in _steps(rt, run) if s[0] in ("oferta", "remarca")] == [
        ("oferta", "ok", "do_slots_offered"), ("oferta", "ok", "do_slot_picked"), ("remarca", "ok", "do_moved")]
    [delivery] = _deliveries(rt)
    assert (delivery.event_type, delivery.payload["data"]["appointment_id"]) == ("appointment.moved", appointment)
    assert _heard(hooks) == Counter({("appointment.moved", delivery.webhook_id): 1})
    assert [template for template, _, _ in _sent(rt, contact)] == [None, CONFIRMATION], _sent(rt, contact)
    _assert_no_key_twice(rt)


def test_200_runs_picking_the_same_few_times_book_each_time_once(rt, clinic, procs, database_url, hooks):
    """200 patients of one professional, each with a run waiting on an offer of the same three
    free times, answer at once (a third of them each time), and two worker processes read the
    picks. Each time ends up with one appointment; each run ends by its `ok` exit (its
    appointment moved, a confirmation sent) or by `unavailable` (its appointment untouched);
    every `appointment.moved` delivery is a move that happened."""
    n = 200
    patients = clinic.patients(n)
    originally = {appointment: _appointment(rt, appointment).starts_at for _, appointment, _, _ in patients}
    _workers, _scheduler, port = _fleet(procs, database_url, workers=2)
    offered = _offer_waiting(rt, clinic, patients, procs, hooks)
    times = [_instant(s["starts_at"]) for s in offered]

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda p: _reply(clinic, port, p[1][3], str(p[0] % 3 + 1), f"wamid-{p[0]}"),
                                 enumerate(patients)))
    assert statuses == [200] * n
    wait_until(lambda: sum(c for (_, s), c in _positions(rt).items() if s in ("completed", "dead", "cancelled")) == n
               and _open_messages(rt) == 0 and _processed(rt, clinic.org_id) == n
               and sum(_heard(hooks).values()) >= len(_deliveries(rt)), timeout=300,
               what="every run ended, its messages sent, the clinic told", on_fail=lambda: _state(rt, procs, hooks))

    with rt.db.connect() as conn:
        live = Counter(conn.execute(select(appointments.c.starts_at).where(
            appointments.c.org_id == clinic.org_id, appointments.c.professional_id == clinic.professional_id,
            appointments.c.status.in_(("scheduled", "confirmed")), appointments.c.starts_at.in_(times))).scalars())
    assert live == Counter({t: 1 for t in times}), f"each time offered holds one appointment: {live}"
    assert _positions(rt) == Counter({("feito", "completed"): 3, ("sem_vaga", "completed"): n - 3}), _positions(rt)

    deliveries = _deliveries(rt)
    assert [d.event_type for d in deliveries] == ["appointment.moved"] * 3
    heard = _heard(hooks)
    assert heard == Counter({("appointment.moved", d.webhook_id): 1 for d in deliveries})
    runs = {r.appointment_id: r for r in _runs(rt, [p[2] for p in patients])}
    delivered = {d.payload["data"]["appointment_id"]: _instant(d.payload["data"]["starts_at"]) for d in deliveries}
    for contact, appointment, run, _phone in patients:
        row, now_at = runs[appointment], _appointment(rt, appointment)
        reasons = [s for s in _steps(rt, run) if s[0] == "remarca"]
        templates = [template for template, _, _ in _sent(rt, contact)]
        picked = _instant(row.data["slot"]["starts_at"])
        if row.current_node_id == "feito":
            assert reasons == [("remarca", "ok", "do_moved")]
            assert (now_at.starts_at, now_at.status) == (picked, "scheduled")
            assert delivered.get(appointment) == picked, "a move without its delivery"
            assert templates == [None, CONFIRMATION]
        else:
            assert reasons == [("remarca", "skipped", "do_slot_taken")], reasons
            assert (now_at.starts_at, now_at.status) == (originally[appointment], "scheduled"), "moved anyway"
            assert appointment not in delivered, "a delivery without its move"
            assert templates == [None]
    _assert_no_key_twice(rt)
