"""Real processes over one database: several workers, a worker killed mid-batch, a flushed broker.

On PostgreSQL with a real broker (Redis or RabbitMQ: LEMBRA_TEST_BROKER_URL) these run `lembra
scheduler` and `lembra worker` processes; on SQLite with the in-process broker each `lembra
scheduler` process carries its own workers, so two of them compete for the same rows through the
database alone.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import func, select, update

from engine.tenants.channels import create_channel
from engine.store.models import channels, contacts, inbox_items, messages, sandbox_messages
from engine.queue.outbox import enqueue
from tests.conftest import BROKER_URL, IS_POSTGRES
from tests.factories import World
from tests.fakes.server import FakeServer, Recorded, Reply
from tests.processes import Processes, flush_broker, lembra_env, wait_until

REAL_BROKER = not BROKER_URL.startswith("stub")
OPEN = ("new", "pending", "claimed", "sending")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    flush_broker()  # no actor message of an earlier test may reach this test's (reused) ids
    processes = Processes(tmp_path)
    yield processes
    processes.stop_all()
    flush_broker()


@pytest.fixture
def backlog(rt, clock):
    """An org with a sandbox channel and a function that queues N messages due now (real time)."""
    clock.set(datetime.now(timezone.utc))
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    channel_id = world.channel("whatsapp")

    contacts: list[int] = []

    def make(count: int, key: str = "bench") -> list[int]:
        ids = []
        contacts.extend(world.contact(name=f"Paciente {i}", phone=f"+551199{i:07d}", consent=("whatsapp",))
                        for i in range(len(contacts), min(count, 20)))
        with rt.db.begin() as conn:
            for i in range(count):
                ids.append(enqueue(
                    conn, org_id=world.org_id, contact_id=contacts[i % min(count, 20)], channel_kind="whatsapp",
                    purpose="notice", idempotency_key=f"{key}:{i}", payload={"text": f"Mensagem {i}"},
                    due_at=clock.now() - timedelta(seconds=1), respect_window=False,
                ))
        return ids

    make.world = world  # type: ignore[attr-defined]
    make.channel_id = channel_id  # type: ignore[attr-defined]
    return make


def _set_sandbox(rt, channel_id: int, **settings) -> None:
    with rt.db.begin() as conn:
        conn.execute(update(channels).where(channels.c.id == channel_id)
                     .values(settings=settings, updated_at=datetime.now(timezone.utc)))


def _status_counts(rt) -> Counter:
    with rt.db.connect() as conn:
        return Counter(dict(conn.execute(select(messages.c.status, func.count()).group_by(messages.c.status)).all()))


def _sandbox_counts(rt) -> Counter:
    with rt.db.connect() as conn:
        return Counter(dict(conn.execute(
            select(sandbox_messages.c.idempotency_key, func.count()).group_by(sandbox_messages.c.idempotency_key)
        ).all()))


def _start_workers(procs: Processes, database_url: str, count: int, **env: str) -> list:
    """`count` independent consumers: worker processes (real broker) or embedded schedulers."""
    started = []
    if REAL_BROKER:
        for i in range(count):
            started.append(procs.start(f"worker{i}", ["worker", "--processes", "1", "--threads", "4"],
                                       lembra_env(database_url, **env)))
    else:
        for i in range(count):
            started.append(procs.start(f"embedded{i}", ["scheduler"], lembra_env(database_url, **env)))
    return started


def _start_scheduler(procs: Processes, database_url: str, **env: str):
    if REAL_BROKER:
        return procs.start("scheduler", ["scheduler"], lembra_env(database_url, **env))
    return None


def test_two_workers_send_every_message_exactly_once(rt, backlog, procs, database_url):
    # Each send takes a little while outside any transaction, so neither process can keep the
    # (SQLite) write lock to itself.
    _set_sandbox(rt, backlog.channel_id, delay_ms=40)
    # Small claims and small tasks, so the backlog is shared instead of taken in one pass. Up to
    # 100 in flight is 20 tasks: more than one worker prefetches (twice its 4 threads), so tasks
    # wait in the broker for the other one. With 20 (4 tasks) one worker could hold them all, and
    # as the one that polled last it kept winning the next claim (CI saw one sender of 400).
    small = {"LEMBRA_CLAIM_BATCH": "20", "LEMBRA_SEND_BATCH": "5", "LEMBRA_MAX_IN_FLIGHT": "100",
             "LEMBRA_LOG_LEVEL": "INFO"}
    for proc in _start_workers(procs, database_url, 2, **small):
        procs.wait_ready(proc)
    _start_scheduler(procs, database_url, **small)
    ids = backlog(400)

    wait_until(lambda: _status_counts(rt).get("sent", 0) == len(ids), timeout=120,
               what="all messages sent", on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")
    counts = _sandbox_counts(rt)
    assert len(counts) == len(ids)
    assert set(counts.values()) == {1}, "a message reached the sandbox twice"
    with rt.db.connect() as conn:
        senders = conn.execute(select(messages.c.claimed_by).distinct()).scalars().all()
    assert len(senders) == 2, f"expected both worker processes to send, got {senders}"


def test_worker_killed_mid_batch_loses_nothing_and_sends_nothing_twice(rt, backlog, procs, database_url):
    ids = backlog(300)
    _set_sandbox(rt, backlog.channel_id, delay_ms=150)
    short_lease = {"LEMBRA_LEASE_SECONDS": "3", "LEMBRA_SEND_TIMEOUT": "1"}
    # Small claims and tasks: at most 20 rows are claimed at once, so most of the backlog is still
    # unclaimed when the provider starts hanging, and later tasks surely load the hanging settings
    # (a batch carries the channel settings it loaded; a whole small backlog could be in flight
    # with the fast ones).
    small = {"LEMBRA_CLAIM_BATCH": "20", "LEMBRA_SEND_BATCH": "5", "LEMBRA_MAX_IN_FLIGHT": "20"}
    [victim] = _start_workers(procs, database_url, 1, **short_lease, **small)
    scheduler = _start_scheduler(procs, database_url, **short_lease, **small)

    # After a few went out, make the provider hang, so that the kill surely finds sends in flight
    # (a kill timed against 150 ms sends can land between two of them on a loaded machine).
    wait_until(lambda: _status_counts(rt).get("sent", 0) >= 10, timeout=120, what="the first sends",
               on_fail=procs.logs)
    _set_sandbox(rt, backlog.channel_id, delay_ms=600_000)
    wait_until(lambda: _status_counts(rt).get("sending", 0) >= 1, timeout=120, what="a send in flight",
               on_fail=procs.logs)
    procs.kill(victim, signal.SIGKILL)
    if scheduler is not None:
        procs.kill(scheduler, signal.SIGKILL)
    in_flight = _status_counts(rt)
    assert in_flight.get("sending", 0) >= 1, f"the kill caught nothing mid-send: {in_flight}"

    _set_sandbox(rt, backlog.channel_id, delay_ms=150)
    # The small tasks again: a task's calls must fit in its 3 s lease (one of 100 takes longer on
    # a loaded machine, and its late calls would be the sweep's `unknown` too).
    _start_workers(procs, database_url, 1, **short_lease, **small)
    _start_scheduler(procs, database_url, **short_lease, **small)
    wait_until(lambda: not any(_status_counts(rt).get(s, 0) for s in OPEN), timeout=180,
               what="the backlog to settle", on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")

    final = _status_counts(rt)
    assert final["sent"] + final["unknown"] == len(ids), final
    assert final["unknown"] == in_flight["sending"], "every row caught mid-send is unknown, no other"
    counts = _sandbox_counts(rt)
    assert all(n == 1 for n in counts.values()), "a message reached the sandbox twice"
    with rt.db.connect() as conn:
        sent_keys = conn.execute(select(messages.c.idempotency_key).where(messages.c.status == "sent")).scalars().all()
        unknown_ids = conn.execute(select(messages.c.id).where(messages.c.status == "unknown")).scalars().all()
        inbox = conn.execute(select(inbox_items.c.message_id).where(inbox_items.c.kind == "message_unknown")).scalars().all()
    assert all(counts[key] == 1 for key in sent_keys), "a sent message is missing from the sandbox"
    assert sorted(inbox) == sorted(unknown_ids), "every unknown outcome is in front of the operator"


@pytest.mark.skipif(not (IS_POSTGRES and REAL_BROKER), reason="needs PostgreSQL and Redis or RabbitMQ")
def test_flushing_the_broker_mid_run_loses_nothing(rt, backlog, procs, database_url):
    """Redis: FLUSHDB. RabbitMQ: a purge of every Lembra queue (the messages already delivered to a
    worker stay with it, as they would across a restart of the broker)."""
    ids = backlog(300)
    _set_sandbox(rt, backlog.channel_id, delay_ms=10)
    short_lease = {"LEMBRA_LEASE_SECONDS": "3", "LEMBRA_SEND_TIMEOUT": "1"}
    _start_workers(procs, database_url, 1, **short_lease)
    _start_scheduler(procs, database_url, **short_lease)
    wait_until(lambda: _status_counts(rt).get("sent", 0) >= 30, timeout=120, what="the first sends",
               on_fail=procs.logs)
    flush_broker()
    wait_until(lambda: _status_counts(rt).get("sent", 0) == len(ids), timeout=180,
               what="every message sent after the flush", on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")
    counts = _sandbox_counts(rt)
    assert len(counts) == len(ids) and set(counts.values()) == {1}


@pytest.mark.skipif(not REAL_BROKER, reason="`lembra worker` needs a real broker (Redis or RabbitMQ)")
def test_a_killed_worker_process_is_replaced_and_the_fleet_keeps_sending(rt, backlog, procs, database_url):
    """`lembra worker --processes 2`: SIGKILL one worker process (as the OOM killer would) and the
    supervisor starts another while the sibling goes on; kill the sibling too, and the messages
    queued afterwards are sent, each once, by the two replacements. SIGTERM then stops it cleanly."""
    from tests.processes import child_pids

    _set_sandbox(rt, backlog.channel_id, delay_ms=20)
    env = {"LEMBRA_LOG_LEVEL": "INFO", "LEMBRA_LEASE_SECONDS": "5", "LEMBRA_SEND_TIMEOUT": "2"}
    fleet = procs.start("worker", ["worker", "--processes", "2", "--threads", "2"], lembra_env(database_url, **env))
    log = procs.logdir / "worker.log"

    def ready_count() -> int:
        return log.read_text(errors="replace").count("ready for action")

    def children() -> list[int]:
        return child_pids(fleet.pid)

    wait_until(lambda: ready_count() == 2 and len(children()) == 2, timeout=60, what="two worker processes",
               on_fail=procs.logs)
    first, second = children()
    _start_scheduler(procs, database_url, **env)
    before = backlog(20)
    wait_until(lambda: _status_counts(rt).get("sent", 0) == len(before), timeout=120, what="the first sends",
               on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")

    for victim, ready_after in ((first, 3), (second, 4)):
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda victim=victim, ready_after=ready_after: ready_count() == ready_after
                   and len(children()) == 2 and victim not in children(),
                   timeout=60, what=f"a replacement for worker process {victim}",
                   on_fail=lambda: f"children {children()}\n{procs.logs()}")
        assert fleet.poll() is None, "lembra worker exited when one of its processes died"
        if victim == first:
            assert second in children(), "the sibling of the killed process was restarted too"
    replacements = children()
    assert not set(replacements) & {first, second}

    after = backlog(60, key="after-the-kills")
    wait_until(lambda: _status_counts(rt).get("sent", 0) == len(before) + len(after), timeout=120,
               what="every message queued after the kills sent",
               on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")
    counts = _sandbox_counts(rt)
    assert set(counts.values()) == {1}, "a message reached the sandbox twice"
    with rt.db.connect() as conn:
        senders = set(conn.execute(select(messages.c.claimed_by).where(messages.c.id.in_(after))).scalars())
    assert {int(s.rsplit(":", 1)[1]) for s in senders} <= set(replacements), senders
    assert "worker process died; starting a new one" in log.read_text(errors="replace")

    fleet.send_signal(signal.SIGTERM)  # the supervisor alone, as systemd (KillMode=mixed) or docker stop do
    assert fleet.wait(timeout=60) == 0
    wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in replacements),
               timeout=30, what="the worker processes to stop with their supervisor", on_fail=procs.logs)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not REAL_BROKER, reason="`lembra worker` needs a real broker (Redis or RabbitMQ)")
def test_worker_processes_stop_when_their_supervisor_is_killed(procs, database_url):
    """No orphans that go on consuming beside the fleet a restarted `lembra worker` starts: the
    kernel sends each worker process a SIGTERM when its supervisor dies."""
    from tests.processes import child_pids

    fleet = procs.start("worker", ["worker", "--processes", "2", "--threads", "1"],
                        lembra_env(database_url, LEMBRA_LOG_LEVEL="INFO"))
    log = procs.logdir / "worker.log"
    wait_until(lambda: log.read_text(errors="replace").count("ready for action") == 2, timeout=60,
               what="two worker processes", on_fail=procs.logs)
    children = child_pids(fleet.pid)
    assert len(children) == 2
    os.kill(fleet.pid, signal.SIGKILL)  # the supervisor alone, not its process group
    fleet.wait(timeout=30)
    wait_until(lambda: not any(_alive(pid) for pid in children), timeout=60,
               what="the orphaned worker processes to stop", on_fail=procs.logs)
    assert log.read_text(errors="replace").count("worker process stopping") == 2, "a graceful stop, not a kill"


class _HeldGraph(FakeServer):
    """Meta's Graph API on loopback, holding every send open until the test lets it answer; it
    counts the sends that reached it, by recipient (each message here has its own patient)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        super().__init__(self._answer)
        # The killed worker's held calls are answered on closed sockets: expected, not worth a traceback.
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]

    def _answer(self, request: Recorded) -> Reply:
        self.gate.wait(timeout=120)  # a bound only, so a broken run cannot hang the suite
        to = request.json().get("to", "")
        return Reply(200, {"messaging_product": "whatsapp", "contacts": [{"input": to, "wa_id": to}],
                           "messages": [{"id": f"wamid.{to}.{len(self.requests)}"}]})

    def reached(self) -> Counter:
        with self._lock:
            return Counter(r.json().get("to") for r in self.requests if r.method == "POST")


def test_a_worker_killed_mid_batch_leaves_unknown_only_the_calls_in_flight(rt, clock, procs, database_url):
    """A task of 10 reminders, three provider calls in flight, a provider that holds them open:
    SIGKILL the worker. Only the three calls that reached the provider become `unknown` once their
    lease runs out; every other reminder goes back to the queue at no cost and is sent afterwards,
    exactly once."""
    clock.set(datetime.now(timezone.utc))
    with _HeldGraph() as graph:
        world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
        with rt.db.begin() as conn:
            create_channel(conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="meta",
                           name="WhatsApp oficial",
                           credentials={"phone_number_id": "1122334455667", "access_token": "EAAG-token",
                                        "app_secret": "segredo", "verify_token": "verifique", "base_url": graph.url})
        world.rule(1440, kinds=("whatsapp",))
        to_of: dict[int, str] = {}
        for i in range(30):  # each its own patient, so the fake tells the sends apart
            phone = f"+55119{i:08d}"
            world.appointment(world.contact(name=f"Paciente {i}", phone=phone, consent=("whatsapp",)),
                              clock.now() + timedelta(hours=24, seconds=1))
        for message in world.messages():
            with rt.db.connect() as conn:
                to_of[message.id] = conn.execute(select(contacts.c.phone).where(
                    contacts.c.id == message.contact_id)).scalar_one().lstrip("+")
        assert len(to_of) == 30

        # Three calls in flight per worker process, tasks of 10 taken by four send threads at once.
        env = {"LEMBRA_SEND_CONCURRENCY": "3", "LEMBRA_SEND_BATCH": "10", "LEMBRA_CLAIM_BATCH": "30",
               "LEMBRA_MAX_IN_FLIGHT": "30", "LEMBRA_LEASE_SECONDS": "10", "LEMBRA_SEND_TIMEOUT": "8"}
        [victim] = _start_workers(procs, database_url, 1, **env)
        scheduler = _start_scheduler(procs, database_url, **env)
        wait_until(lambda: sum(graph.reached().values()) >= 3, timeout=120, what="three calls at the provider",
                   on_fail=procs.logs)
        procs.kill(victim, signal.SIGKILL)
        if scheduler is not None:
            procs.kill(scheduler, signal.SIGKILL)
        at_the_kill = _status_counts(rt)
        with rt.db.connect() as conn:
            caught = set(conn.execute(select(messages.c.id).where(messages.c.status == "sending")).scalars())
        reached_before = set(graph.reached())
        assert len(reached_before) == 3 and set(graph.reached().values()) == {1}, graph.reached()
        # `sending` is "this call may have started": no more rows than the calls in flight, each of
        # them one the provider received; the rest of the batch is still `claimed`.
        assert len(caught) <= 3, f"{len(caught)} rows `sending` with 3 calls in flight: {at_the_kill}"
        assert {to_of[mid] for mid in caught} <= reached_before, at_the_kill

        graph.gate.set()  # the provider answers from now on (the held calls, to a dead worker)
        # The leases run out (10 s): the sweep of a new scheduler settles the killed worker's rows.
        _start_workers(procs, database_url, 1, **env)
        _start_scheduler(procs, database_url, **env)
        wait_until(lambda: not any(_status_counts(rt).get(s, 0) for s in OPEN), timeout=180,
                   what="the backlog to settle", on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")

        with rt.db.connect() as conn:
            final = dict(conn.execute(select(messages.c.id, messages.c.status)).all())
            inbox = conn.execute(select(inbox_items.c.message_id)
                                 .where(inbox_items.c.kind == "message_unknown")).scalars().all()
        reached = graph.reached()
    unknown = {mid for mid, status in final.items() if status == "unknown"}
    assert unknown == caught, "the rows caught mid-call, and no other, are unknown"
    assert {status for mid, status in final.items() if mid not in unknown} == {"sent"}, final
    assert set(reached.values()) == {1}, f"a patient got the reminder twice: {reached}"
    assert set(reached) == set(to_of.values()), "every reminder reached the provider"
    assert sorted(inbox) == sorted(unknown), "every unknown outcome is in front of the operator"
