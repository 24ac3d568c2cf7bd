"""The follow-up engine with real `lembra` processes: two workers over one backlog of due
enrollments, a worker SIGKILLed in the middle of an advance, a flushed broker, a broker stopped
for longer than the backoff ladder, a 30-day wait across a restart, and a backlog after three
days of downtime.

As in tests/test_processes.py: on PostgreSQL + Redis these run `lembra scheduler` and
`lembra worker` processes; on SQLite with the in-process broker each `lembra scheduler` process
carries its own workers, so two of them compete for the same enrollments through the database
alone. The processes run on the wall clock: "time moves" here by setting `next_eval_at` into the
past with one SQL UPDATE, which is exactly what a due enrollment is to a process.

The flows are published through `engine.flows.versions`; contacts, consents and enrollments are
bulk-inserted with the same values `contacts.create_contact` and `triggers.enroll` write (those
functions cost 1–3 ms a row on PostgreSQL, which for 5,000 rows would be most of the test's
budget), except in the 30-day test, which enrolls its three contacts through `triggers.enroll`.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence
from zoneinfo import ZoneInfo

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, func, insert, select, text, update

from engine.core import clock as engine_clock
from engine.flows import versions
from engine.flows.runtime import BACKOFF
from engine.store.models import contacts as contacts_table
from engine.store.models import (
    enrollment_events,
    enrollments,
    flow_pointers,
    messages,
    preferences,
    sandbox_messages,
)
from tests.conftest import BROKER_URL, IS_POSTGRES
from tests.factories import World
from tests.fakes.llm import LLMFake
from tests.fakes.server import FakeServer, Recorded, Reply
from tests.flows.helpers import Flows, linear, node
from tests.processes import Processes, flush_broker, lembra_env, wait_until

#: Each test bounds its own waits (a deadline per phase, with the state of every enrollment when
#: it passes); the suite's 300 s default would cut a slow run short before that diagnosis.
pytestmark = pytest.mark.timeout(900)
UTC = timezone.utc
REAL_BROKER = not BROKER_URL.startswith("stub")
#: Brazilian zones one hour apart: at any instant one of them is far from local midnight, where a
#: 00:00–23:59 window has its one closed minute (as bench/throughput.py picks).
ZONES = ("America/Noronha", "America/Sao_Paulo", "America/Manaus", "America/Rio_Branco")

#: Claimed-but-unadvanced enrollments allowed at once (`LEMBRA_MAX_IN_FLIGHT`, which bounds the
#: scheduler's message claims and should bound its enrollment claims alike): a claim that waits in
#: the broker longer than its lease is swept back to the queue (free) and claimed again.
IN_FLIGHT = "500"

CHECKIN_THEN_REBOOK = linear(
    node("inicio", "trigger"),
    node("checkin", "action", mode="template", template="followup_checkin"),
    node("espera", "wait", mode="fixed", minutes=60),
    node("rebook", "action", mode="template", template="followup_rebook"),
    node("fim", "end", outcome="exhausted"),
)


# ---------------------------------------------------------------------------------------------
# Fixtures and seeding
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    flush_broker()  # no actor message of an earlier test may reach this test's (reused) ids
    processes = Processes(tmp_path)
    yield processes
    processes.stop_all()


@pytest.fixture
def world(rt, clock) -> World:
    """An org open all day with a sandbox WhatsApp channel, on the wall clock."""
    clock.set(datetime.now(UTC))
    world = World(rt, timezone=_open_zone(), quiet_start="00:00", quiet_end="23:59", skip_sundays=False,
                  skip_holidays=False)
    world.channel("whatsapp")
    return world


@pytest.fixture
def step_writers(owner_database_url) -> Iterator[Any]:
    """On PostgreSQL: which process wrote each `ok` step event, by the `test.process` setting its
    connections carry (PGOPTIONS, see `_env`), recorded by a test-only trigger. Yields a function
    that returns the counts by process name. The trigger is the owner's (the processes may run as
    the application's role, LEMBRA_TEST_APP_ROLE), and writes as its owner (SECURITY DEFINER)."""
    if not IS_POSTGRES:
        yield None
        return
    owner = create_engine(owner_database_url)
    with owner.begin() as conn:
        conn.execute(text("CREATE TABLE test_step_writers (event_id BIGINT PRIMARY KEY, app TEXT NOT NULL)"))
        conn.execute(text(
            "CREATE FUNCTION test_note_step_writer() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$ BEGIN "
            "INSERT INTO test_step_writers VALUES (NEW.id, coalesce(current_setting('test.process', true), '?')); "
            "RETURN NEW; END $$"))
        conn.execute(text(
            "CREATE TRIGGER test_note_step_writer AFTER INSERT ON enrollment_events FOR EACH ROW "
            "WHEN (NEW.event_type = 'step' AND NEW.payload->>'status' = 'ok') "
            "EXECUTE FUNCTION test_note_step_writer()"))

    def writers() -> Counter:
        with owner.connect() as conn:
            return Counter(dict(conn.execute(text("SELECT app, count(*) FROM test_step_writers GROUP BY app")).all()))

    yield writers
    with owner.begin() as conn:
        conn.execute(text("DROP TRIGGER IF EXISTS test_note_step_writer ON enrollment_events"))
        conn.execute(text("DROP FUNCTION IF EXISTS test_note_step_writer()"))
        conn.execute(text("DROP TABLE IF EXISTS test_step_writers"))
    owner.dispose()


def _open_zone() -> str:
    now = datetime.now(UTC)
    return next((z for z in ZONES if now.astimezone(ZoneInfo(z)).hour not in (22, 23, 0)), ZONES[1])


def _publish(world: World, graph: dict[str, Any], **agent_llm: Any) -> int:
    """Create and publish the flow through `engine.flows.versions`; an agent only for an LLM."""
    flows = Flows(world)
    pointer_id = flows.flow(graph, agent=False)
    if agent_llm:
        flows.enable(pointer_id, **agent_llm)
    return pointer_id


def _bulk_contacts(world: World, count: int) -> list[int]:
    """`count` contacts with WhatsApp consent: the rows `create_contact(consent=("whatsapp",))` writes."""
    now = engine_clock.now()
    rt = world.rt
    with rt.db.begin() as conn:
        ids = list(conn.execute(insert(contacts_table).returning(contacts_table.c.id, sort_by_parameter_order=True), [
            {"org_id": world.org_id, "name": f"Paciente {i}", "phone": f"+551199{i:07d}", "email": None,
             "created_at": now, "updated_at": now} for i in range(count)]).scalars())
        conn.execute(insert(preferences), [
            {"org_id": world.org_id, "contact_id": cid, "kind": "whatsapp", "opted_in": True, "opted_in_at": now,
             "source": "clinic", "updated_at": now} for cid in ids])
    return ids


def _bulk_enroll(world: World, pointer_id: int, contact_ids: Sequence[int], *, node_id: str | None = None,
                 steps: int = 0, due: datetime | None = None, entered: datetime | None = None) -> list[int]:
    """Manual enrollments, due now at the trigger: the row and `enrolled` event `triggers.enroll`
    writes. With `node_id`, the enrollment sits at that node instead (with `steps` taken)."""
    rt = world.rt
    now = engine_clock.now()
    with rt.db.begin() as conn:
        pointer = conn.execute(select(flow_pointers).where(flow_pointers.c.id == pointer_id)).one()
        graph = versions.graph_of(conn, world.org_id, pointer.active_version_id)
        at = node_id or graph.trigger_id
        agent_id = _agent_for(conn, world.org_id, pointer_id)
        ids = list(conn.execute(insert(enrollments).returning(enrollments.c.id, sort_by_parameter_order=True), [
            {"org_id": world.org_id, "pointer_id": pointer_id, "version_id": pointer.active_version_id,
             "contact_id": cid, "current_node_id": at, "status": "active", "next_eval_at": due or now,
             "node_entered_at": entered or now, "steps": steps, "agent_id": agent_id, "trigger_kind": "manual",
             "trigger_key": f"manual:{i}", "created_at": now, "updated_at": now}
            for i, cid in enumerate(contact_ids)]).scalars())
        conn.execute(insert(enrollment_events), [
            {"org_id": world.org_id, "enrollment_id": eid, "node_id": graph.trigger_id, "event_type": "enrolled",
             "payload": {"trigger": "manual", "manual": True}, "idempotency_key": "enrolled", "created_at": now}
            for eid in ids])
    return ids


def _agent_for(conn, org_id: int, pointer_id: int) -> int | None:
    from engine.flows.triggers import enabled_by_agent

    return enabled_by_agent(conn, org_id, pointer_id)


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def _consumers(procs: Processes, database_url: str, count: int, *, tag: str = "", **env: str) -> list:
    """`count` independent consumers: worker processes (real broker) or embedded schedulers
    (stub broker: each carries its own workers and scheduler)."""
    started = []
    for i in range(count):
        name = f"worker{tag}{i}" if REAL_BROKER else f"embedded{tag}{i}"
        args = ["worker", "--processes", "1", "--threads", "4"] if REAL_BROKER else ["scheduler"]
        started.append(procs.start(name, args, _env(database_url, name, **env)))
    return started


def _scheduler(procs: Processes, database_url: str, *, tag: str = "", **env: str):
    if not REAL_BROKER:
        return None
    return procs.start(f"scheduler{tag}", ["scheduler"], _env(database_url, f"scheduler{tag}", **env))


def _env(database_url: str, name: str, **env: str) -> dict[str, str]:
    # libpq sends PGOPTIONS to the server on every connection: the process's name as a setting.
    return lembra_env(database_url, PGOPTIONS=f"-c test.process={name}", **{"LEMBRA_MAX_IN_FLIGHT": IN_FLIGHT, **env})


def _run(procs: Processes, database_url: str, consumers: int = 1, *, tag: str = "", ready: bool = False,
         **env: str) -> list:
    """Start the consumers (waiting until they are ready, with `ready`) and the scheduler."""
    if ready:
        env = {**env, "LEMBRA_LOG_LEVEL": "INFO"}
    started = _consumers(procs, database_url, consumers, tag=tag, **env)
    if ready:
        for proc in started:
            procs.wait_ready(proc)
    scheduler = _scheduler(procs, database_url, tag=tag, **env)
    return started + ([scheduler] if scheduler is not None else [])


# ---------------------------------------------------------------------------------------------
# What the database says
# ---------------------------------------------------------------------------------------------


def _every(seconds: float, condition: Callable[[], bool]) -> Callable[[], bool]:
    """`condition`, evaluated at most once per `seconds` (False in between): `wait_until` polls every
    0.1 s, and a count over thousands of rows that often takes CPU from the processes under test."""
    last = [float("-inf")]

    def throttled() -> bool:
        if time.monotonic() - last[0] < seconds:
            return False
        last[0] = time.monotonic()
        return condition()

    return throttled


def _positions(rt) -> Counter:
    """(node, status) → how many enrollments."""
    with rt.db.connect() as conn:
        return Counter({(n, s): c for n, s, c in conn.execute(
            select(enrollments.c.current_node_id, enrollments.c.status, func.count())
            .group_by(enrollments.c.current_node_id, enrollments.c.status)).all()})


def _sent(rt, template: str) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(messages).where(
            messages.c.template_key == template, messages.c.status == "sent")).scalar_one()


def _message_counts(rt) -> Counter:
    with rt.db.connect() as conn:
        return Counter({(t, s): c for t, s, c in conn.execute(
            select(messages.c.template_key, messages.c.status, func.count())
            .group_by(messages.c.template_key, messages.c.status)).all()})


def _state(rt) -> str:
    """Where the enrollments and their messages are, and what their steps did (for a failure)."""
    outcomes = Counter((s[0], s[1], s[2]) for steps in _steps(rt).values() for s in steps)
    return (f"positions {dict(_positions(rt))}; messages {dict(_message_counts(rt))}; "
            f"steps (node, status, reason) {dict(outcomes)}")


def _steps(rt) -> dict[int, list[tuple[str, str, str, str]]]:
    """enrollment id → its `step` events in order: (node, status, reason, idempotency key)."""
    out: dict[int, list[tuple[str, str, str, str]]] = defaultdict(list)
    with rt.db.connect() as conn:
        for row in conn.execute(select(enrollment_events.c.enrollment_id, enrollment_events.c.node_id,
                                       enrollment_events.c.payload, enrollment_events.c.idempotency_key)
                                .where(enrollment_events.c.event_type == "step").order_by(enrollment_events.c.id)):
            payload = row.payload or {}
            out[row.enrollment_id].append((row.node_id, payload.get("status"), payload.get("reason"),
                                           row.idempotency_key))
    return out


def _assert_advanced_once(rt, ids: Sequence[int], nodes: Sequence[str]) -> dict[int, list]:
    """Each enrollment took exactly one `ok` step per node passed, in order, and no step key twice."""
    steps = _steps(rt)
    wrong = {eid: steps.get(eid) for eid in ids if [s[0] for s in steps.get(eid, []) if s[1] == "ok"] != list(nodes)}
    assert not wrong, f"{len(wrong)} enrollments did not take exactly one ok step per node {list(nodes)}, e.g. " \
                      f"{dict(list(wrong.items())[:3])}"
    with rt.db.connect() as conn:
        duplicated = conn.execute(
            select(enrollment_events.c.enrollment_id, enrollment_events.c.idempotency_key)
            .group_by(enrollment_events.c.enrollment_id, enrollment_events.c.idempotency_key)
            .having(func.count() > 1)).all()
    assert duplicated == [], f"event keys written twice: {duplicated[:5]}"
    return steps


def _assert_sent_once(rt, expected: dict[str, int]) -> None:
    """The sandbox recorded each follow-up key once, and as many per template as expected; the
    outbox holds each key once too."""
    with rt.db.connect() as conn:
        repeated = conn.execute(select(sandbox_messages.c.idempotency_key, func.count())
                                .group_by(sandbox_messages.c.idempotency_key).having(func.count() > 1)).all()
        outbox_repeated = conn.execute(select(messages.c.org_id, messages.c.idempotency_key, func.count())
                                       .group_by(messages.c.org_id, messages.c.idempotency_key)
                                       .having(func.count() > 1)).all()
        by_node = Counter(dict(conn.execute(
            select(messages.c.template_key, func.count()).where(messages.c.purpose == "followup")
            .group_by(messages.c.template_key)).all()))
        recorded = conn.execute(select(func.count()).select_from(sandbox_messages)).scalar_one()
    assert repeated == [], f"the sandbox recorded a follow-up twice: {repeated[:5]}"
    assert outbox_repeated == [], f"an outbox key twice: {outbox_repeated[:5]}"
    assert by_node == Counter(expected), by_node
    assert recorded == sum(expected.values())


def _enrollment_rows(rt, ids: Sequence[int] | None = None) -> list[Any]:
    query = select(enrollments).order_by(enrollments.c.id)
    if ids is not None:
        query = query.where(enrollments.c.id.in_(list(ids)))
    with rt.db.connect() as conn:
        return list(conn.execute(query))


def _move_clock(rt, ids: Sequence[int] | None = None, *, back: timedelta | None = None) -> int:
    """What "the clock moved" means for a process: due enrollments. Without `back`, one UPDATE
    makes everything that waits due a second ago; with `back`, each waiting enrollment's clock and
    entry instant move that far into the past (as if that long had passed)."""
    waiting = (enrollments.c.status.in_(("active", "waiting_reply")), enrollments.c.lease_until.is_(None))
    if ids is not None:
        waiting += (enrollments.c.id.in_(list(ids)),)
    with rt.db.begin() as conn:
        if back is None:
            return conn.execute(update(enrollments).where(*waiting)
                                .values(next_eval_at=datetime.now(UTC) - timedelta(seconds=1))).rowcount
        rows = conn.execute(select(enrollments.c.id, enrollments.c.next_eval_at, enrollments.c.node_entered_at)
                            .where(*waiting)).all()
        for row in rows:  # datetime arithmetic in Python: SQLite stores instants as text
            conn.execute(update(enrollments).where(enrollments.c.id == row.id)
                         .values(next_eval_at=row.next_eval_at - back, node_entered_at=row.node_entered_at - back))
        return len(rows)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def test_two_workers_advance_5000_due_enrollments_once_each(rt, world, procs, database_url, step_writers):
    n = 5000
    pointer = _publish(world, CHECKIN_THEN_REBOOK)
    ids = _bulk_enroll(world, pointer, _bulk_contacts(world, n))
    _run(procs, database_url, 2, ready=True)

    wait_until(_every(1, lambda: _positions(rt) == Counter({("espera", "active"): n})
                      and _sent(rt, "followup_checkin") == n),
               timeout=400, what="every enrollment at the wait and every check-in sent",
               on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
    steps = _assert_advanced_once(rt, ids, ["inicio", "checkin"])
    assert _deferred_lost(steps, ids) == set(), "a claim expired although no process died"
    _assert_sent_once(rt, {"followup_checkin": n})
    rows = _enrollment_rows(rt)
    assert Counter((r.steps, r.messages_sent, r.attempts, r.lease_until) for r in rows) == Counter({(2, 1, 0, None): n})
    assert all(r.next_eval_at - r.node_entered_at == timedelta(minutes=60) for r in rows)
    if REAL_BROKER and step_writers is not None:
        writers = step_writers()
        assert set(writers) == {"worker0", "worker1"} and sum(writers.values()) == 2 * n, \
            f"expected both worker processes to advance enrollments, got {writers}"

    assert _move_clock(rt) == n  # an hour "passes"
    wait_until(_every(1, lambda: _positions(rt) == Counter({("fim", "completed"): n})
                      and _sent(rt, "followup_rebook") == n),
               timeout=400, what="every enrollment completed and every rebook sent",
               on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
    steps = _assert_advanced_once(rt, ids, ["inicio", "checkin", "espera", "rebook"])
    assert _deferred_lost(steps, ids) == set(), "a claim expired although no process died"
    _assert_sent_once(rt, {"followup_checkin": n, "followup_rebook": n})
    rows = _enrollment_rows(rt)
    assert Counter((r.steps, r.messages_sent, r.attempts, r.outcome) for r in rows) == \
        Counter({(4, 2, 0, "exhausted"): n})


class GatedLLM:
    """An OpenAI-compatible LLM on loopback that answers at once until `hold()`, then keeps every
    request waiting until `release()` (bounded, so nothing waits forever)."""

    def __init__(self) -> None:
        self.fake = LLMFake()
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self.waiting = 0
        self.answered = 0

    def __call__(self, request: Recorded) -> Reply:
        if not self._open.is_set():
            with self._lock:
                self.waiting += 1
            self._open.wait(timeout=120)
            with self._lock:
                self.waiting -= 1
        reply = self.fake(request)
        with self._lock:
            self.answered += 1
        return reply

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()


def _deferred_lost(steps: dict[int, list], ids: Sequence[int]) -> set[int]:
    """Enrollments with a step deferred because their claim expired (a lost worker)."""
    return {eid for eid in ids if any(s[1] == "deferred" and s[2] == "claim_expired" for s in steps.get(eid, []))}


def _requeued(rt) -> dict[int, set[str]]:
    """enrollment id → the keys of its `requeued` events (claims no worker started, put back free)."""
    out: dict[int, set[str]] = defaultdict(set)
    with rt.db.connect() as conn:
        for eid, key in conn.execute(select(enrollment_events.c.enrollment_id, enrollment_events.c.idempotency_key)
                                     .where(enrollment_events.c.event_type == "requeued")):
            out[eid].add(key)
    return out


def test_a_worker_killed_mid_advance_loses_nothing_and_sends_nothing_twice(rt, world, procs, database_url):
    """The advance calls a (slow) LLM between its read and its write; the worker is SIGKILLed
    while advances wait on it. Those claims expire, the sweep counts a failed attempt
    (`claim_expired`) and backs them off (claims the killed worker had not started go back to
    the queue free); a new worker finishes everything, once."""
    n = 2000
    # A short lease, so the sweep finds the killed claims soon; few claims in flight, in small
    # tasks, so the ones waiting in the queue do not outlive it.
    env = {"LEMBRA_LEASE_SECONDS": "15", "LEMBRA_SEND_TIMEOUT": "5", "LEMBRA_MAX_IN_FLIGHT": "40",
           "LEMBRA_SEND_BATCH": "5"}
    llm = GatedLLM()
    with FakeServer(llm) as server:
        graph = linear(node("inicio", "trigger"),
                       node("ia", "action", mode="ai_message", prompt_hint="retomar o contato",
                            fallback_template="followup_checkin", max_chars=600),
                       node("fim", "end", outcome="exhausted"))
        pointer = _publish(world, graph, llm_base_url=f"{server.url}/v1", llm_model="llama3")
        ids = _bulk_enroll(world, pointer, _bulk_contacts(world, n))
        started = _run(procs, database_url, 1, **env)

        wait_until(lambda: _positions(rt)[("fim", "completed")] >= 100, timeout=120, what="the first advances",
                   on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
        llm.hold()
        wait_until(lambda: llm.waiting >= 1, timeout=60, what="an advance waiting on the LLM", on_fail=procs.logs)
        for proc in started:  # the worker (and the scheduler, so the state after the kill stays put)
            procs.kill(proc, signal.SIGKILL)
        caught = llm.waiting
        assert caught >= 1
        with rt.db.connect() as conn:
            held = {r.id: (r.revision, r.steps) for r in conn.execute(
                select(enrollments.c.id, enrollments.c.revision, enrollments.c.steps)
                .where(enrollments.c.lease_until.is_not(None)))}
        leased = set(held)
        assert len(leased) >= caught, "the advances caught mid-call hold their claims"
        llm.release()

        _run(procs, database_url, 1, tag="b", **env)
        # Once no claim of the killed fleet is left, each of them either advanced (its task was
        # still in the broker and a new worker ran it), or was swept: backed off if it had
        # started, put back in the queue free if it had not.
        wait_until(_every(0.5, lambda: all(r.revision != held[r.id][0] for r in _enrollment_rows(rt, leased))),
                   timeout=120,
                   what="the killed claims to be released", on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
        requeued = _requeued(rt)
        neither = [(r.id, r.status, r.current_node_id, r.attempts, r.last_error) for r in _enrollment_rows(rt, leased)
                   if not (r.steps > held[r.id][1] or (r.attempts >= 1 and r.last_error == "claim_expired")
                           or f"requeued:{held[r.id][0]}" in requeued.get(r.id, set()))]
        assert neither == [], f"claims of the killed worker neither advanced nor were swept: {neither[:5]}"
        wait_until(_every(1, lambda: _positions(rt) == Counter({("fim", "completed"): n})
                          and _open_followups(rt) == 0),
               timeout=400, what="every enrollment completed and its message settled",
                   on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")

    steps = _assert_advanced_once(rt, ids, ["inicio", "ia"])
    lost = _deferred_lost(steps, ids)
    assert len(lost) >= caught, f"{caught} advances were killed mid-call, only {len(lost)} claims counted lost"
    assert lost <= leased, "only claims held at the kill expired"
    _assert_unique_sends(rt)
    counts = _message_counts(rt)
    # A send caught by the kill is `unknown` (the sandbox does not dedupe, so it is not retried).
    assert counts[("followup_checkin", "sent")] + counts[("followup_checkin", "unknown")] == n, counts
    rows = _enrollment_rows(rt)
    assert [r.id for r in rows if r.lease_until is not None] == [], "an enrollment kept its lease"
    assert Counter((r.steps, r.messages_sent, r.attempts, r.llm_calls) for r in rows) == Counter({(2, 1, 0, 1): n})


def _open_followups(rt) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(messages).where(
            messages.c.status.in_(("new", "pending", "claimed", "sending")))).scalar_one()


def _assert_unique_sends(rt) -> None:
    with rt.db.connect() as conn:
        repeated = conn.execute(select(sandbox_messages.c.idempotency_key).group_by(sandbox_messages.c.idempotency_key)
                                .having(func.count() > 1)).all()
        outbox_repeated = conn.execute(select(messages.c.idempotency_key).group_by(messages.c.org_id,
                                                                                   messages.c.idempotency_key)
                                       .having(func.count() > 1)).all()
    assert repeated == [] and outbox_repeated == [], "a follow-up went out twice"


@pytest.mark.skipif(not (IS_POSTGRES and REAL_BROKER), reason="needs PostgreSQL and Redis or RabbitMQ")
def test_flushing_the_broker_mid_run_still_completes_every_enrollment_once(rt, world, procs, database_url):
    n = 1000
    env = {"LEMBRA_LEASE_SECONDS": "10", "LEMBRA_SEND_TIMEOUT": "5", "LEMBRA_MAX_IN_FLIGHT": "100",
           "LEMBRA_SEND_BATCH": "5"}
    pointer = _publish(world, linear(node("inicio", "trigger"),
                                     node("checkin", "action", mode="template", template="followup_checkin"),
                                     node("fim", "end", outcome="exhausted")))
    ids = _bulk_enroll(world, pointer, _bulk_contacts(world, n))
    _run(procs, database_url, 1, **env)
    wait_until(lambda: _positions(rt)[("fim", "completed")] >= 100, timeout=120, what="the first advances",
               on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
    flush_broker()  # Redis: FLUSHDB; RabbitMQ: a purge of Lembra's queues
    flushed_at = _positions(rt)
    wait_until(_every(1, lambda: _positions(rt) == Counter({("fim", "completed"): n})
                      and _sent(rt, "followup_checkin") == n),
               timeout=400, what="every enrollment completed after the flush",
               on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
    steps = _assert_advanced_once(rt, ids, ["inicio", "checkin"])
    _assert_sent_once(rt, {"followup_checkin": n})
    # The claims lost with the broker never reached a worker: back in the queue, at no cost.
    assert _deferred_lost(steps, ids) == set(), "a claim lost with the broker cost an attempt"
    assert Counter(r.attempts for r in _enrollment_rows(rt)) == Counter({0: n})
    if flushed_at[("fim", "completed")] < n:
        assert _requeued(rt), "claims lost with the broker were never put back in the queue"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OwnRedis:
    """A redis-server of the test's own on a free loopback port, without persistence, that the
    test stops and starts again (never the machine's Redis, which other tests use)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.folder / "redis.log", "ab") as log:  # the server writes to its own copy
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.folder)], stdout=log, stderr=subprocess.STDOUT)
        wait_until(self.answers, timeout=30, what="the test's redis-server to answer")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    def answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=1).ping())
        except redis.RedisError:
            return False


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def _scheduler_passes(port: int) -> float:
    """Passes the scheduler has run, ok or failed (its /metrics)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            exposition = response.read().decode()
    except OSError:
        return 0.0
    return sum(sample.value for family in text_string_to_metric_families(exposition) for sample in family.samples
               if sample.name == "lembra_scheduler_passes_total")


@pytest.mark.skipif(not (IS_POSTGRES and REAL_BROKER and shutil.which("redis-server")),
                    reason="needs PostgreSQL, a real broker run and the redis-server binary")
def test_a_broker_stopped_for_longer_than_the_backoff_ladder_kills_no_follow_up(rt, world, own_redis, procs,
                                                                              database_url):
    """Redis (the test's own) stops while enrollments fall due, for longer than the whole backoff
    ladder in the runtime's terms: with a 3-second lease, the scheduler passes again and again, and
    every enrollment's clock is moved past its backoff as many times as the ladder has steps, and
    more. A claim that never reached a worker costs nothing, so when Redis is back every run takes
    each step once: none dead, none backed off, each follow-up in the outbox and sent once. The
    scheduler says the outage once and its end once, without a traceback; the worker starts
    without Dramatiq's "middleware of the same type twice" warning."""
    n_before, n_during = 20, 180
    metrics_port = _free_port()
    env = {"BROKER_URL": own_redis.url, "LEMBRA_LEASE_SECONDS": "3", "LEMBRA_SEND_TIMEOUT": "1",
           "LEMBRA_SCHEDULER_METRICS_PORT": str(metrics_port), "LEMBRA_WORKER_METRICS_PORT": "0"}
    pointer = _publish(world, linear(node("inicio", "trigger"),
                                     node("checkin", "action", mode="template", template="followup_checkin"),
                                     node("fim", "end", outcome="exhausted")))
    contacts = _bulk_contacts(world, n_before + n_during)
    first = _bulk_enroll(world, pointer, contacts[:n_before])
    later = _bulk_enroll(world, pointer, contacts[n_before:], due=datetime.now(UTC) + timedelta(days=1))
    ids = first + later
    _run(procs, database_url, 1, ready=True, **env)
    wait_until(lambda: _positions(rt)[("fim", "completed")] == n_before, timeout=120,
               what="the first runs to complete while the broker is up",
               on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")

    own_redis.stop()
    assert _move_clock(rt, later) == n_during  # they fall due while the broker is down
    for _ in range(len(BACKOFF) + 2):
        # A few passes of the scheduler, and no claim left waiting on its lease...
        passes = _scheduler_passes(metrics_port)
        wait_until(lambda: _scheduler_passes(metrics_port) >= passes + 3
                   and not any(r.lease_until for r in _enrollment_rows(rt, later)),
                   timeout=60, what="scheduler passes with no claim held",
                   on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
        # ...then the backoff a lost claim would have earned has passed.
        _move_clock(rt, later)
    during = _enrollment_rows(rt, later)
    assert Counter((r.status, r.attempts) for r in during) == Counter({("active", 0): n_during}), \
        f"the outage cost attempts: {_state(rt)}"

    own_redis.start()  # empty: whatever it held went with it
    wait_until(_every(1, lambda: _positions(rt) == Counter({("fim", "completed"): n_before + n_during})
                      and _sent(rt, "followup_checkin") == n_before + n_during),
               timeout=300, what="every run completed once the broker is back",
               on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
    steps = _assert_advanced_once(rt, ids, ["inicio", "checkin"])
    assert _deferred_lost(steps, ids) == set(), "a claim no worker started cost an attempt"
    _assert_sent_once(rt, {"followup_checkin": n_before + n_during})
    assert Counter((r.status, r.steps, r.messages_sent, r.attempts) for r in _enrollment_rows(rt)) == \
        Counter({("completed", 2, 1, 0): n_before + n_during})
    assert world.inbox() == [], "no Pendência for a run"

    scheduler_log = (procs.logdir / "scheduler.log").read_text(errors="replace")
    assert scheduler_log.count("broker unreachable: due work waits in the database") == 1, scheduler_log[-3000:]
    assert scheduler_log.count("broker reachable again") == 1, scheduler_log[-3000:]
    assert "Traceback" not in scheduler_log and "scheduler pass crashed" not in scheduler_log, scheduler_log[-3000:]
    worker_log = (procs.logdir / "worker0.log").read_text(errors="replace")
    assert "ready for action" in worker_log
    assert "same type twice" not in worker_log, worker_log[-3000:]


def test_a_30_day_wait_survives_a_restart(rt, world, procs, database_url):
    flows = Flows(world)
    pointer = _publish(world, linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=43200),
                                     node("msg", "action", mode="template", template="followup_checkin"),
                                     node("fim", "end", outcome="exhausted")))
    ids = [flows.enroll(pointer, contact) for contact in _bulk_contacts(world, 3)]
    first = _run(procs, database_url, 1)
    wait_until(lambda: _positions(rt) == Counter({("espera", "active"): 3}), timeout=120, what="the runs at the wait",
               on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
    for proc in first:
        procs.kill(proc, signal.SIGTERM)
    assert all(proc.poll() is not None for proc in first)
    rows = _enrollment_rows(rt, ids)
    assert all(r.next_eval_at - r.node_entered_at == timedelta(days=30) for r in rows)
    assert world.sandbox() == []

    assert _move_clock(rt, ids, back=timedelta(days=30)) == 3  # thirty days pass while nothing runs
    _run(procs, database_url, 1, tag="b")
    wait_until(lambda: _positions(rt) == Counter({("fim", "completed"): 3}) and _sent(rt, "followup_checkin") == 3,
               timeout=120, what="each run firing after the restart", on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
    _assert_advanced_once(rt, ids, ["inicio", "espera", "msg"])
    _assert_sent_once(rt, {"followup_checkin": 3})


def test_a_backlog_after_three_days_down_fires_each_run_once_and_re_anchors(rt, world, procs, database_url):
    """10,000 enrollments on PostgreSQL; 2,000 on SQLite, whose single writer makes the larger
    backlog take several minutes on two cores. Each sits at a one-day wait that fell due three
    days ago (entered four days ago): the outage."""
    n = 10_000 if IS_POSTGRES else 2000
    pointer = _publish(world, linear(
        node("inicio", "trigger"), node("d1", "wait", mode="fixed", minutes=1440),
        node("m1", "action", mode="template", template="followup_checkin"),
        node("d2", "wait", mode="fixed", minutes=1440),
        node("m2", "action", mode="template", template="followup_rebook"),
        node("fim", "end", outcome="exhausted")))
    now = datetime.now(UTC)
    ids = _bulk_enroll(world, pointer, _bulk_contacts(world, n), node_id="d1", steps=1,
                       due=now - timedelta(days=3), entered=now - timedelta(days=4))
    started = datetime.now(UTC)
    _run(procs, database_url, 2)
    wait_until(_every(1, lambda: _positions(rt) == Counter({("d2", "active"): n})
                      and _sent(rt, "followup_checkin") == n),
               timeout=400, what="every run at the second wait and its one message sent",
               on_fail=lambda: f"{_state(rt)}\n{procs.logs()}")
    ended = datetime.now(UTC)
    steps = _assert_advanced_once(rt, ids, ["d1", "m1"])
    assert _deferred_lost(steps, ids) == set(), "a claim expired although no process died"
    _assert_sent_once(rt, {"followup_checkin": n})  # one message each, not a burst of both
    rows = _enrollment_rows(rt)
    assert [r for r in rows if r.next_eval_at - r.node_entered_at != timedelta(days=1)] == []
    assert [r for r in rows if not started <= r.node_entered_at <= ended] == [], \
        "re-anchored on the step, not on the outage"
    assert Counter((r.steps, r.messages_sent, r.attempts) for r in rows) == Counter({(3, 1, 0): n})
