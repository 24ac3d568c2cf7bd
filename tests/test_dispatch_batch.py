"""The batch send path: a worker task's messages (up to LEMBRA_SEND_BATCH) are checked, marked
`sending` and settled together. What a batch adds to guard: one message's failure (permanent,
transient, ambiguous) leaves the others correct, a worker dying mid-batch sends nothing twice, a
call whose lease ran out is not made, a batch of many costs the statements of a batch of few,
and two orgs in one batch never see each other's rows."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import create_engine, event, select, text
from sqlalchemy.pool import NullPool

from engine.people import appointments as appts
from engine.messaging import dispatch
from engine.tenants.channels import create_channel
from engine.core.config import Settings
from engine.store.models import message_events
from engine.store.runtime import Runtime, install
from providers.sandbox.provider import SandboxProvider
from tests.conftest import IS_POSTGRES
from tests.factories import World, local, provider_as
from tests.fakes.meta import notes_error
from tests.fakes.server import FakeServer, Recorded, Reply
from tests.processes import wait_until

APPOINTMENT = local(2026, 12, 3, 14, 0)
DUE = local(2026, 12, 2, 14, 0)


def phone(i: int) -> str:
    return f"+55169990000{i:02d}"


def booked(world: World, count: int, *, first: int = 0) -> list[int]:
    """`count` patients with an appointment each; returns their reminders' ids."""
    for i in range(first, first + count):
        world.appointment(world.contact(name=f"Paciente {i}", phone=phone(i)), APPOINTMENT)
    return [m.id for m in world.messages()][-count:]


def _installed(settings: Settings, **changes: Any) -> Iterator[Runtime]:
    runtime = Runtime.build(dataclasses.replace(settings, **changes))
    previous = install(runtime)
    yield runtime
    install(previous)
    runtime.close()


@pytest.fixture
def quick_rt(settings, clock) -> Iterator[Runtime]:
    """A runtime whose provider calls give up after half a second (the ambiguous case)."""
    yield from _installed(settings, send_timeout=0.5)


@pytest.fixture
def serial_rt(settings, clock) -> Iterator[Runtime]:
    """A runtime whose provider calls are made one after the other, in the batch's order."""
    yield from _installed(settings, send_concurrency=1)


def claimed_on_sandbox(rt: Runtime, clock: Any, count: int) -> tuple[World, list[int]]:
    """`count` reminders on a sandbox WhatsApp channel, due and claimed; returns their ids."""
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    ids = booked(world, count)
    clock.set(DUE)
    assert sorted(dispatch.claim_due(rt, limit=100)) == sorted(ids)
    return world, ids


class Graph(FakeServer):
    """Meta's Graph API, answering by recipient: the test says which number fails and how."""

    def __init__(self, answers: dict[str, Reply]) -> None:
        self.answers = answers
        super().__init__(self._answer)
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]

    def _answer(self, request: Recorded) -> Reply:
        to = request.json().get("to", "")
        if to in self.answers:
            return self.answers[to]
        return Reply(200, {"messaging_product": "whatsapp", "contacts": [{"input": to, "wa_id": to}],
                           "messages": [{"id": f"wamid.{to}"}]})

    def sends_to(self, to: str) -> int:
        return sum(1 for r in self.requests if r.method == "POST" and r.json().get("to") == to)


def meta_world(rt: Runtime, graph: Graph, slug: str = "clinica", **org_kwargs: Any) -> World:
    """An org whose WhatsApp is the Meta Cloud API at `graph`, with a reminder a day ahead."""
    world = World(rt, slug, **org_kwargs)
    with rt.db.begin() as conn:
        world.channels["whatsapp"] = create_channel(
            conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="meta", name="WhatsApp oficial",
            credentials={"phone_number_id": "1122334455667", "access_token": "EAAG-token",
                         "app_secret": "segredo", "verify_token": "verifique", "base_url": graph.url})
    world.rule(1440, kinds=("whatsapp",))
    return world


def wa(i: int) -> str:
    return phone(i).lstrip("+")


def test_one_permanent_one_transient_one_ambiguous_failure_leave_the_rest_of_the_batch_sent(quick_rt, clock):
    rt = quick_rt
    answers = {
        wa(1): notes_error(131026, "Message undeliverable"),
        wa(2): Reply(503, {"error": {"message": "Service temporarily unavailable", "code": 2}}),
        wa(3): Reply(200, {"messaging_product": "whatsapp"}, delay=2.0),  # answers after the client gave up
    }
    with Graph(answers) as graph:
        world = meta_world(rt, graph)
        ids = booked(world, 6)
        clock.set(DUE)
        assert sorted(dispatch.claim_due(rt, limit=100)) == sorted(ids)

        outcomes = dispatch.send_batch(rt, ids)

        assert [outcomes[mid] for mid in ids] == ["sent", "failed", "retried", "unknown", "sent", "sent"]
        rows = {m.id: m for m in world.messages()}
        for i, mid in enumerate(ids):
            assert graph.sends_to(wa(i)) == 1, f"patient {i} got {graph.sends_to(wa(i))} sends"
        for i in (0, 4, 5):
            row = rows[ids[i]]
            assert (row.status, row.provider_message_id, row.lease_until) == ("sent", f"wamid.{wa(i)}", None)
            assert world.events(ids[i]) == ["queued", "claimed", "sending", "sent"]
        assert (rows[ids[1]].status, rows[ids[1]].error_code) == ("failed", "undeliverable")
        assert (rows[ids[2]].status, rows[ids[2]].attempts) == ("pending", 1)
        assert rows[ids[2]].next_attempt_at == clock.now() + timedelta(minutes=5)
        assert (rows[ids[3]].status, rows[ids[3]].error_code) == ("unknown", "timeout")
        assert {(item.kind, item.message_id) for item in world.inbox()} == {
            ("message_failed", ids[1]), ("message_unknown", ids[3])}

        # Nothing of the batch goes out again: only the transient one comes back, on its schedule.
        clock.advance(timedelta(minutes=5))
        assert dispatch.claim_due(rt, limit=100) == [ids[2]]


class _DyingSandbox(SandboxProvider):
    """The sandbox, in a worker that is killed during the call to one number."""

    dies_at: str = ""

    def send(self, message):  # type: ignore[no-untyped-def]
        if message.to == self.dies_at:
            raise SystemExit("killed")  # not an Exception: nothing in the engine may catch it
        return super().send(message)


@pytest.fixture
def dying_provider() -> Iterator[type[_DyingSandbox]]:
    with provider_as("sandbox", _DyingSandbox) as provider:
        yield provider


def test_a_worker_killed_in_the_middle_of_a_batch_sends_nothing_twice(serial_rt, clock, dying_provider):
    rt = serial_rt  # one call in flight: calls in order, 0, 1, then 2 dies
    world, batch = claimed_on_sandbox(rt, clock, 5)
    dying_provider.dies_at = phone(2)
    with pytest.raises(SystemExit):
        dispatch.send_batch(rt, batch)
    rows = {m.id: m for m in world.messages()}
    # Only the call in flight is `sending`; the calls not begun are still `claimed`.
    assert [rows[mid].status for mid in batch] == ["sent", "sent", "sending", "claimed", "claimed"]
    assert [rows[mid].attempts for mid in batch] == [1, 1, 1, 0, 0]
    assert len(world.sandbox()) == 2  # patients 0 and 1 were sent before the worker died

    # Another worker's batch is not held up by it.
    dying_provider.dies_at = ""
    others = booked(world, 3, first=10)
    assert set(dispatch.claim_due(rt, limit=100)) == set(others) and not set(batch) & set(others)
    assert set(dispatch.send_batch(rt, others).values()) == {"sent"}

    # The leases run out: the row caught mid-call becomes `unknown`, never sent blindly again;
    # the two whose calls never began go back to the queue at no cost and go out once.
    clock.advance(rt.settings.lease + timedelta(seconds=1))
    assert dispatch.sweep_leases(rt) == (2, 1)
    assert [world.message(mid).status for mid in batch] == ["sent", "sent", "unknown", "pending", "pending"]
    assert sorted(dispatch.claim_due(rt, limit=100)) == sorted(batch[3:])
    assert dispatch.send_batch(rt, batch) == {batch[0]: "not_claimed", batch[1]: "not_claimed",
                                              batch[2]: "not_claimed", batch[3]: "sent", batch[4]: "sent"}
    assert sorted(m.to_address for m in world.sandbox()) == sorted(
        [phone(i) for i in (0, 1, 3, 4)] + [phone(i) for i in range(10, 13)])
    assert world.events(batch[2]) == ["queued", "claimed", "sending", "unknown"]
    assert world.events(batch[3]) == ["queued", "claimed", "reclaimed", "claimed", "sending", "sent"]
    assert [world.message(mid).attempts for mid in batch] == [1, 1, 1, 1, 1]


class HeldGraph(Graph):
    """The Graph fake, holding every call open until the test lets it answer (a provider slow to
    answer); it knows which calls reached it."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        super().__init__({})

    def _answer(self, request: Recorded) -> Reply:
        self.gate.wait(timeout=60)  # a bound only, so a broken run cannot hang the suite
        return super()._answer(request)

    def reached(self) -> list[str]:
        with self._lock:
            return [r.json()["to"] for r in self.requests]


@pytest.fixture
def three_in_flight(settings, clock) -> Iterator[Runtime]:
    """A runtime whose worker process makes three provider calls at once."""
    yield from _installed(settings, send_concurrency=3)


def _statuses(world: World, ids: list[int]) -> dict[int, str]:
    return {m.id: m.status for m in world.messages() if m.id in ids}


def test_a_batch_larger_than_the_calls_in_flight_marks_only_those_sending(three_in_flight, clock):
    """`sending` means "this call may have started": with the provider holding the calls open,
    the rows `sending` are the three calls that reached it, the other seven are still `claimed`."""
    rt = three_in_flight
    with HeldGraph() as graph:
        world = meta_world(rt, graph)
        ids = booked(world, 10)
        clock.set(DUE)
        assert sorted(dispatch.claim_due(rt, limit=100)) == sorted(ids)
        with ThreadPoolExecutor(1) as worker:
            batch = worker.submit(dispatch.send_batch, rt, ids)
            try:
                wait_until(lambda: len(graph.reached()) == 3, timeout=60, what="three calls on the wire")
                statuses = _statuses(world, ids)
                reached = set(graph.reached())
            finally:
                graph.gate.set()
            outcomes = batch.result(timeout=120)

        assert sorted(statuses.values()) == ["claimed"] * 7 + ["sending"] * 3, statuses
        assert {wa(i) for i, mid in enumerate(ids) if statuses[mid] == "sending"} == reached
        assert outcomes == {mid: "sent" for mid in ids}
        assert sorted(graph.reached()) == sorted(wa(i) for i in range(10))  # each once


def test_two_batches_at_once_share_the_calls_in_flight_of_their_process(three_in_flight, clock):
    """Two send tasks of one process (two actor threads) take their places from the same three
    calls in flight: while the first holds them, the second marks nothing `sending`."""
    rt = three_in_flight
    with HeldGraph() as graph:
        world = meta_world(rt, graph)
        ids = booked(world, 10)
        first, second = ids[:5], ids[5:]
        clock.set(DUE)
        assert sorted(dispatch.claim_due(rt, limit=100)) == sorted(ids)
        with rt.db.begin() as conn:  # the second batch's checks settle this one: they are done when it is
            assert appts.cancel(conn, world.org_id, world.message(second[0]).appointment_id, source="clinic")
        with ThreadPoolExecutor(2) as workers:
            a = workers.submit(dispatch.send_batch, rt, first)
            try:
                wait_until(lambda: len(graph.reached()) == 3, timeout=60, what="three calls on the wire")
                b = workers.submit(dispatch.send_batch, rt, second)
                wait_until(lambda: world.message(second[0]).status == "cancelled", timeout=60,
                           what="the second batch's checks")
                statuses = _statuses(world, ids)
                reached = set(graph.reached())
            finally:
                graph.gate.set()
            outcomes = {**a.result(timeout=120), **b.result(timeout=120)}

        assert sorted(statuses.values()) == ["cancelled"] + ["claimed"] * 6 + ["sending"] * 3, statuses
        assert {wa(i) for i, mid in enumerate(ids) if statuses[mid] == "sending"} == reached
        assert outcomes == {**{mid: "sent" for mid in ids}, second[0]: "cancelled"}
        assert sorted(graph.reached()) == sorted(wa(i) for i in range(10) if i != 5)  # each once


class _SlowSandbox(SandboxProvider):
    """The sandbox, whose call to one number lasts longer than a lease (the test's clock moves)."""

    slow_to: str = ""
    during_slow_call: Callable[[], None] = staticmethod(lambda: None)

    def send(self, message):  # type: ignore[no-untyped-def]
        result = super().send(message)
        if message.to == self.slow_to:
            type(self).during_slow_call()
        return result


@pytest.mark.parametrize("waited, sweep_runs", [
    (timedelta(seconds=-0.4), False),  # the claim's lease has 0.4 s left when their wave comes
    (timedelta(seconds=1), False),
    (timedelta(seconds=1), True),
], ids=["claim-still-held", "claim-ran-out-before-the-sweep", "claim-ran-out-after-the-sweep"])
def test_a_message_whose_claim_ran_out_while_it_waited_for_its_wave_is_not_marked(serial_rt, clock, waited,
                                                                                   sweep_runs):
    rt = serial_rt  # one call in flight: patient 1's takes the lease (or all but `waited` of it)
    with provider_as("sandbox", _SlowSandbox) as slow:
        world, ids = claimed_on_sandbox(rt, clock, 4)

        def slow_call() -> None:
            clock.advance(rt.settings.lease + waited)
            if sweep_runs:  # meanwhile the scheduler's sweep: patient 1 mid-call, 2 and 3 still claimed
                assert dispatch.sweep_leases(rt) == (2, 1)
            elif waited < timedelta(0):  # the leases still hold: the sweep has nothing to take
                assert dispatch.sweep_leases(rt) == (0, 0)

        slow.slow_to, slow.during_slow_call = phone(1), staticmethod(slow_call)
        outcomes = dispatch.send_batch(rt, ids)
        slow.slow_to = ""

        rows = {m.id: m for m in world.messages()}
        # The calls that were made are `sent`, also the one the sweep took for `unknown` meanwhile.
        assert [rows[mid].status for mid in ids[:2]] == ["sent", "sent"]
        if waited < timedelta(0):  # a claim still held when its wave comes is marked with a fresh lease
            assert [outcomes[mid] for mid in ids] == ["sent"] * 4
            assert len(world.sandbox()) == 4
            return
        assert len(world.sandbox()) == 2  # patients 2 and 3 were never called
        assert [outcomes[mid] for mid in ids[2:]] == ["not_claimed", "not_claimed"]
        expected = "pending" if sweep_runs else "claimed"  # the sweep hands them out again, at no cost
        for mid in ids[2:]:
            row = rows[mid]
            assert (row.status, row.attempts) == (expected, 0)
        assert dispatch.sweep_leases(rt) == ((0, 0) if sweep_runs else (2, 0))
        for mid in ids[2:]:
            assert world.events(mid) == ["queued", "claimed", "reclaimed"]

        # They go out on the next pass, once each, as their first attempt.
        assert sorted(dispatch.claim_due(rt, limit=100)) == sorted(ids[2:])
        assert set(dispatch.send_batch(rt, ids[2:]).values()) == {"sent"}
        assert sorted(m.to_address for m in world.sandbox()) == sorted(phone(i) for i in range(4))
        assert [world.message(mid).attempts for mid in ids] == [1, 1, 1, 1]


class _StallingSandbox(SandboxProvider):
    """The sandbox, in a worker that stalls (for a lease) in its call to one number."""

    stalls_at: str = ""
    stall: Callable[[], None] = staticmethod(lambda: None)

    def send(self, message):  # type: ignore[no-untyped-def]
        if message.to == self.stalls_at:
            type(self).stall()
        return super().send(message)


@pytest.fixture
def two_in_flight(settings, clock) -> Iterator[Runtime]:
    """A runtime whose worker process makes two provider calls at once."""
    yield from _installed(settings, send_concurrency=2)


def test_a_paced_call_whose_lease_ran_out_while_it_waited_for_its_slot_is_not_made(two_in_flight, clock):
    """Two paced messages in one wave: the second waits for its slot (2 to 3 s on from the first)
    while the first call stalls for a whole lease; when its slot comes, too little of its lease is
    left for the call, so it is not made and the message goes back to the queue at no cost."""
    with provider_as("sandbox", _StallingSandbox) as stalling:
        rt = two_in_flight
        world = World(rt)
        with rt.db.begin() as conn:
            world.channels["whatsapp"] = create_channel(
                conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="sandbox",
                name="Número da recepção", min_interval_ms=2000)
        world.rule(1440)
        ids = booked(world, 2)
        clock.set(DUE)
        assert sorted(dispatch.claim_due(rt, limit=100)) == sorted(ids)
        stalling.stalls_at = phone(0)
        stalling.stall = staticmethod(lambda: clock.advance(rt.settings.lease + timedelta(seconds=5)))

        outcomes = dispatch.send_batch(rt, ids)

        assert [outcomes[mid] for mid in ids] == ["sent", "reclaimed"]
        assert [m.to_address for m in world.sandbox()] == [phone(0)]
        row = world.message(ids[1])
        assert (row.status, row.attempts, row.error_code) == ("pending", 0, "lease_expired_before_call")
        assert world.events(ids[1]) == ["queued", "claimed", "sending", "reclaimed"]


def test_a_call_begun_with_the_send_timeout_left_is_made(serial_rt, clock):
    rt = serial_rt
    with provider_as("sandbox", _SlowSandbox) as slow:
        world, ids = claimed_on_sandbox(rt, clock, 4)
        left = timedelta(seconds=rt.settings.send_timeout)
        slow.slow_to = phone(1)
        slow.during_slow_call = staticmethod(lambda: clock.advance(rt.settings.lease - left))
        outcomes = dispatch.send_batch(rt, ids)
        slow.slow_to = ""
    assert [outcomes[mid] for mid in ids] == ["sent"] * 4
    assert len(world.sandbox()) == 4


def _counting(rt: Runtime) -> list[str]:
    statements: list[str] = []

    @event.listens_for(rt.db.engine, "before_cursor_execute")
    def _count(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        statements.extend([statement] * (len(parameters) if executemany else 1))

    return statements


def _counting_commits(rt: Runtime) -> list[None]:
    commits: list[None] = []

    @event.listens_for(rt.db.engine, "commit")
    def _count(conn: Any) -> None:
        commits.append(None)

    return commits


def test_a_batch_costs_its_checks_once_and_one_transaction_per_wave(rt, clock):
    """Checks read each table once per batch, whatever its size; each wave of calls in flight (8)
    costs one transaction: the last wave's `sent`, the next one's `sending`, their events, in one
    statement on PostgreSQL and three on SQLite."""
    assert rt.settings.send_concurrency == 8
    with Graph({}) as graph:
        world = meta_world(rt, graph)
        small = booked(world, 5)
        large = booked(world, 25, first=20)
        clock.set(DUE)
        dispatch.claim_due(rt, limit=100)
        statements, commits = _counting(rt), _counting_commits(rt)

        def by_verb() -> dict[str, int]:
            verbs: dict[str, int] = {}
            for statement in statements:
                verb = statement.split(None, 1)[0].upper()
                if verb != "BEGIN":  # SQLite's BEGIN IMMEDIATE, one per transaction
                    verbs[verb] = verbs.get(verb, 0) + 1
            return verbs

        assert set(dispatch.send_batch(rt, small).values()) == {"sent"}
        for_small, small_commits = by_verb(), len(commits)
        statements.clear()
        commits.clear()
        assert set(dispatch.send_batch(rt, large).values()) == {"sent"}
        for_large = by_verb()

        reads = for_small.pop("SELECT")
        assert for_large.pop("SELECT") == reads, "the checks cost the same for 5 and for 25"
        assert reads <= 11  # + the Meta templates' categories (how each send is billed), one read
        # 5 messages, one wave: checks, `sending`, `sent` (3 transactions). 25: waves of 8, 8, 8
        # and 1, each marked as the previous one is recorded (6). PostgreSQL writes each move in one
        # statement (`WITH … UPDATE … INSERT`), SQLite in an UPDATE per status and an INSERT. The
        # checks of a Meta batch write once more: every recipient's slot in one upsert (on the
        # frozen clock no wave is late, so none moves its recipients' slots again).
        writes = (1 + 2, 1 + 1 + 3 + 1) if IS_POSTGRES else (1 + 2 + 2, 1 + 2 + 3 * 3 + 2)
        assert (sum(for_small.values()), small_commits) == (writes[0], 3), for_small
        assert (sum(for_large.values()), len(commits)) == (writes[1], 6), "\n".join(statements)
        assert len(graph.requests) == 30
        with rt.db.connect() as conn:
            sent = conn.execute(select(message_events.c.message_id).where(
                message_events.c.message_id.in_(large), message_events.c.event == "sent")).scalars().all()
        assert sorted(sent) == sorted(large)


def test_a_task_larger_than_the_backends_cap_is_sent_in_slices_each_message_once(rt, clock, monkeypatch):
    from engine.messaging.dispatch import send

    monkeypatch.setattr(send, "MAX_BATCH", 10)
    monkeypatch.setattr(send, "SQLITE_MAX_BATCH", 10)
    with Graph({}) as graph:
        world = meta_world(rt, graph)
        ids = booked(world, 25)
        clock.set(DUE)
        dispatch.claim_due(rt, limit=100)
        outcomes = dispatch.send_batch(rt, ids)

        assert outcomes == {mid: "sent" for mid in ids}
        assert sorted(r.json()["to"] for r in graph.requests) == sorted(wa(i) for i in range(25))
        with rt.db.connect() as conn:
            events = conn.execute(select(message_events.c.message_id, message_events.c.event).where(
                message_events.c.message_id.in_(ids), message_events.c.event.in_(("sending", "sent")))
                .order_by(message_events.c.id)).all()
        assert sorted(mid for mid, e in events if e == "sent") == sorted(ids)
        # Three slices (10, 10, 5), each marked `sending` a wave of 8 calls in flight at a time,
        # each wave's events written as the previous wave's `sent` ones.
        waves = [len(list(run)) for event, run in itertools.groupby(e for _, e in events) if event == "sending"]
        assert waves == [8, 2, 8, 2, 5], [e for _, e in events]


def test_two_orgs_in_one_batch_each_get_their_own_channel_template_and_name(rt, clock):
    a, b = World(rt, "clinica-a"), World(rt, "clinica-b")
    for world in (a, b):
        world.channel("whatsapp")
        world.rule(1440)
    ids = booked(a, 2) + booked(b, 2, first=5)
    clock.set(DUE)
    assert sorted(dispatch.claim_due(rt, limit=100)) == sorted(ids)
    assert set(dispatch.send_batch(rt, ids).values()) == {"sent"}
    for world, own, other in ((a, "Clínica Clinica-A", "Clinica-B"), (b, "Clínica Clinica-B", "Clinica-A")):
        rows = world.messages()
        assert {m.channel_id for m in rows} == {world.channels["whatsapp"]}
        assert all(own in m.body and other not in m.body for m in rows)
        assert len(world.sandbox()) == 2


def test_a_message_that_breaks_the_batch_costs_only_itself(rt, clock, monkeypatch):
    world, ids = claimed_on_sandbox(rt, clock, 4)

    from engine.messaging.dispatch import checks

    real = checks.render_message

    def render(conn, **kwargs):  # type: ignore[no-untyped-def]  # an engine bug on one message
        if kwargs["message"].id == ids[1]:
            raise RuntimeError("bug")
        return real(conn, **kwargs)

    monkeypatch.setattr(checks, "render_message", render)
    outcomes = dispatch.send_batch(rt, ids)
    assert [outcomes[mid] for mid in ids] == ["sent", "crashed", "sent", "sent"]
    assert world.message(ids[1]).status == "claimed"  # its lease expires and the sweep hands it out again
    assert len(world.sandbox()) == 3


@pytest.mark.skipif(not IS_POSTGRES, reason="a server that drops a connection: PostgreSQL")
def test_a_connection_the_server_dropped_costs_one_failed_statement_not_the_batch(rt, clock, caplog):
    """Busy connections are not pinged before use (engine.store.db._ping_when_idle): one the server
    dropped fails its statement once, the pool is discarded, and the batch still goes out."""
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    ids = booked(world, 3)
    clock.set(DUE)
    dispatch.claim_due(rt, limit=100)
    with rt.db.connect() as conn:  # the pooled connection the batch will check out next
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
    killer = create_engine(rt.settings.database_url, poolclass=NullPool)
    with killer.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
    killer.dispose()

    outcomes = dispatch.send_batch(rt, ids)

    assert [outcomes[mid] for mid in ids] == ["sent"] * 3
    assert len(world.sandbox()) == 3
    assert "preparing a batch failed" in caplog.text  # the dropped connection was really used
