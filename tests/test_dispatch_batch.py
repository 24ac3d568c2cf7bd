"""The batch send path: a worker task's messages (up to LEMBRA_SEND_BATCH) are checked, marked
`sending` and settled together. What a batch adds to guard: one message's failure (permanent,
transient, ambiguous) leaves the others correct, a worker dying mid-batch sends nothing twice, a
call whose lease ran out is not made, a batch of many costs the statements of a batch of few,
and two orgs in one batch never see each other's rows."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import create_engine, event, select, text
from sqlalchemy.pool import NullPool

from engine import dispatch
from engine.channels import create_channel
from engine.config import Settings
from engine.models import message_events
from engine.runtime import Runtime, install
from providers.sandbox.provider import SandboxProvider
from tests.conftest import IS_POSTGRES
from tests.factories import World, local, provider_as
from tests.fakes.meta import notes_error
from tests.fakes.server import FakeServer, Recorded, Reply

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


def meta_world(rt: Runtime, graph: Graph) -> World:
    world = World(rt)
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
    rt = serial_rt  # calls in order: 0, 1, then 2 dies
    world, batch = claimed_on_sandbox(rt, clock, 5)
    dying_provider.dies_at = phone(2)
    with pytest.raises(SystemExit):
        dispatch.send_batch(rt, batch)
    rows = {m.id: m for m in world.messages()}
    assert [rows[mid].status for mid in batch] == ["sending"] * 5
    assert len(world.sandbox()) == 2  # patients 0 and 1 were sent before the worker died

    # Another worker's batch is not held up by it.
    dying_provider.dies_at = ""
    others = booked(world, 3, first=10)
    assert set(dispatch.claim_due(rt, limit=100)) == set(others) and not set(batch) & set(others)
    assert set(dispatch.send_batch(rt, others).values()) == {"sent"}

    # The lease runs out: the dead worker's rows become `unknown`, never sent blindly again.
    clock.advance(rt.settings.lease + timedelta(seconds=1))
    assert dispatch.sweep_leases(rt) == (0, 5)
    assert [world.message(mid).status for mid in batch] == ["unknown"] * 5
    assert dispatch.claim_due(rt, limit=100) == []
    assert set(dispatch.send_batch(rt, batch).values()) == {"not_claimed"}
    assert len(world.sandbox()) == 2 + 3
    assert world.events(batch[0]) == ["queued", "claimed", "sending", "unknown"]


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
    (timedelta(seconds=-0.4), False),  # the lease has 0.4 s left, the send timeout is 0.5 s
    (timedelta(seconds=1), False),
    (timedelta(seconds=1), True),
], ids=["less-than-the-send-timeout-left", "lease-ran-out-before-the-sweep", "lease-ran-out-after-the-sweep"])
def test_a_call_whose_lease_ran_out_while_it_waited_is_not_made(serial_rt, clock, waited, sweep_runs):
    rt = serial_rt  # calls in order: patient 1's takes the lease (or all but `waited` of it)
    with provider_as("sandbox", _SlowSandbox) as slow:
        world, ids = claimed_on_sandbox(rt, clock, 4)

        def slow_call() -> None:
            clock.advance(rt.settings.lease + waited)
            if sweep_runs:  # meanwhile the scheduler's sweep takes the whole batch, still `sending`
                assert dispatch.sweep_leases(rt) == (0, 4)
            elif waited < timedelta(0):  # the lease still holds: the sweep has nothing to take
                assert dispatch.sweep_leases(rt) == (0, 0)

        slow.slow_to, slow.during_slow_call = phone(1), staticmethod(slow_call)
        outcomes = dispatch.send_batch(rt, ids)
        slow.slow_to = ""

        assert len(world.sandbox()) == 2  # patients 2 and 3 were never called
        rows = {m.id: m for m in world.messages()}
        assert [rows[mid].status for mid in ids[:2]] == ["sent", "sent"]  # calls that were made
        if sweep_runs:  # the sweep's `unknown` stands: an operator may already have acted on it
            assert [outcomes[mid] for mid in ids[2:]] == ["not_claimed", "not_claimed"]
            assert [rows[mid].status for mid in ids[2:]] == ["unknown", "unknown"]
            return
        assert [outcomes[mid] for mid in ids] == ["sent", "sent", "reclaimed", "reclaimed"]
        for mid in ids[2:]:
            row = rows[mid]
            assert (row.status, row.attempts, row.lease_until, row.error_code) == (
                "pending", 0, None, "lease_expired_before_call")
            assert world.events(mid) == ["queued", "claimed", "sending", "reclaimed"]
        assert dispatch.sweep_leases(rt) == (0, 0)

        # They go out on the next pass, once each, as their first attempt.
        assert sorted(dispatch.claim_due(rt, limit=100)) == sorted(ids[2:])
        assert set(dispatch.send_batch(rt, ids[2:]).values()) == {"sent"}
        assert sorted(m.to_address for m in world.sandbox()) == sorted(phone(i) for i in range(4))
        assert [world.message(mid).attempts for mid in ids] == [1, 1, 1, 1]


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


def test_a_batch_of_twenty_five_costs_the_statements_of_a_batch_of_five(rt, clock):
    with Graph({}) as graph:
        world = meta_world(rt, graph)
        small = booked(world, 5)
        large = booked(world, 25, first=20)
        clock.set(DUE)
        dispatch.claim_due(rt, limit=100)
        statements = _counting(rt)

        assert set(dispatch.send_batch(rt, small).values()) == {"sent"}
        for_small = list(statements)
        statements.clear()
        assert set(dispatch.send_batch(rt, large).values()) == {"sent"}

        assert len(statements) == len(for_small), "\n".join(statements)
        # Fewer than one per message: 14 on PostgreSQL, plus a BEGIN IMMEDIATE per transaction on SQLite.
        assert len(statements) <= 16, "\n".join(statements)
        assert len(graph.requests) == 30
        with rt.db.connect() as conn:
            sent = conn.execute(select(message_events.c.message_id).where(
                message_events.c.message_id.in_(large), message_events.c.event == "sent")).scalars().all()
        assert sorted(sent) == sorted(large)


def _values(parameters: Any) -> list[Any]:
    """A statement's bound values, whichever paramstyle the driver takes."""
    if isinstance(parameters, dict):
        return list(parameters.values())
    return [v for row in parameters for v in (row if isinstance(row, (list, tuple)) else [row])]


def test_a_task_larger_than_the_backends_cap_is_sent_in_slices_each_message_once(rt, clock, monkeypatch):
    from engine.dispatch import send

    monkeypatch.setattr(send, "MAX_BATCH", 10)
    monkeypatch.setattr(send, "SQLITE_MAX_BATCH", 10)
    with Graph({}) as graph:
        world = meta_world(rt, graph)
        ids = booked(world, 25)
        clock.set(DUE)
        dispatch.claim_due(rt, limit=100)
        marked: list[str] = []

        @event.listens_for(rt.db.engine, "before_cursor_execute")
        def _marking(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
            values = _values(parameters)  # to `sending`, not from it to `sent`
            if statement.startswith("UPDATE messages") and "sending" in values and "sent" not in values:
                marked.append(statement)

        outcomes = dispatch.send_batch(rt, ids)

        assert outcomes == {mid: "sent" for mid in ids}
        assert sorted(r.json()["to"] for r in graph.requests) == sorted(wa(i) for i in range(25))
        # Three slices (10, 10, 5), each marked `sending` in one statement before its calls.
        assert len(marked) == 3, marked
        with rt.db.connect() as conn:
            sent = conn.execute(select(message_events.c.message_id).where(
                message_events.c.message_id.in_(ids), message_events.c.event == "sent")).scalars().all()
        assert sorted(sent) == sorted(ids)


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

    from engine.dispatch import checks

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
    """Busy connections are not pinged before use (engine.db._ping_when_idle): one the server
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
