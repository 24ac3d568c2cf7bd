"""The follow-up runtime with a controlled clock: every node type's semantics, the one clock,
stale wakes, backoff to dead, lost claims, backlogs after downtime, replies, opt-out, hand-off."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event, select, text, update

from engine.flows.contact_events import record_contact_event
from engine.queue.address_optouts import block_sender
from engine.store.db import Database
from engine.flows import runtime, triggers, versions
from engine.flows.ai.base import AIError, Classification, Plan, PlannedWait, Written
from engine.flows.ai.builtin import BuiltinAI
from engine.store.models import contact_events, enrollment_events, enrollments
from tests.conftest import IS_POSTGRES
from tests.factories import World
from tests.flows.helpers import Flows, edge, linear, node, statuses


@pytest.fixture
def world(rt, clock):
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    for kind in ("whatsapp", "sms", "email"):
        world.channel(kind)
    return world


@pytest.fixture
def flows(world):
    return Flows(world)


def classify_graph(grace: int = 60) -> dict:
    return {
        "nodes": [
            node("inicio", "trigger"),
            node("pergunta", "action", mode="template", template="followup_checkin"),
            node("resposta", "ai_classify", classes=["confirm", "reschedule"], grace_minutes=grace),
            node("confirmou", "end", outcome="converted"),
            node("remarcar", "end", outcome="custom"),
            node("calado", "end", outcome="exhausted"),
            node("outro", "end", outcome="custom"),
        ],
        "edges": [
            edge("inicio", "pergunta"), edge("pergunta", "resposta"),
            edge("resposta", "confirmou", "class_match", "confirm"),
            edge("resposta", "remarcar", "class_match", "reschedule"),
            edge("resposta", "calado", "no_reply"), edge("resposta", "outro"),
        ],
    }


def test_a_template_follow_up_goes_out_once_and_the_run_ends_with_its_outcome(world, flows, clock):
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"),
                             node("msg", "action", mode="template", template="followup_checkin"),
                             node("fim", "end", outcome="converted")))
    enrollment_id = flows.enroll(flow, contact)
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.outcome, run.messages_sent, run.steps) == ("completed", "converted", 1, 2)
    [message] = flows.followups(enrollment_id)
    assert message.idempotency_key == f"enrollment:{enrollment_id}:node:msg:attempt:1"
    assert message.status == "sent"
    [sent] = world.sandbox()
    assert "Passando para saber" in sent.body
    assert statuses(flows.steps(enrollment_id)) == [
        ("inicio", "ok", "trigger_fired"), ("msg", "ok", "message_queued")]
    flows.run()  # nothing more to do
    assert len(world.sandbox()) == 1


def test_a_fixed_wait_holds_the_clock_until_it_has_passed(world, flows, clock):
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=180),
                             node("msg", "action", mode="template", template="followup_checkin"),
                             node("fim", "end", outcome="exhausted")))
    enrollment_id = flows.enroll(flow, contact)
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert run.current_node_id == "espera" and run.next_eval_at == clock.now() + timedelta(minutes=180)
    clock.advance(timedelta(minutes=179))
    flows.run()
    assert world.sandbox() == []
    clock.advance(timedelta(minutes=1))
    flows.run()
    assert len(world.sandbox()) == 1
    assert flows.enrollment(enrollment_id).status == "completed"


def test_a_condition_routes_by_the_contacts_stage(world, flows, rt, clock):
    graph = {
        "nodes": [node("inicio", "trigger"),
                  node("lead", "condition", checks=[{"field": "contact.stage", "op": "eq", "value": "lead"}],
                       combinator="all"),
                  node("sim", "end", outcome="converted"), node("nao", "end", outcome="exhausted")],
        "edges": [edge("inicio", "lead"), edge("lead", "sim", "cond_result", True),
                  edge("lead", "nao", "cond_result", False)],
    }
    flow = flows.flow(graph)
    lead, other = world.contact(), world.contact(name="Bruno", phone="+5516999887700", email="b@example.com")
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=lead, type="stage_changed", stage="Lead")
    first, second = flows.enroll(flow, lead), flows.enroll(flow, other)
    flows.run()
    assert flows.enrollment(first).outcome == "converted"
    assert flows.enrollment(second).outcome == "exhausted"


@pytest.mark.parametrize(("text", "route"), [
    ("Posso REMARCAR para sexta?", "remarcar"),
    ("ok, confirmo!", "confirmou"),
    ("quem é?", "outro"),
])
def test_a_reply_is_classified_and_routed(world, flows, clock, text, route):
    contact = world.contact()
    enrollment_id = flows.enroll(flows.flow(classify_graph()), contact)
    flows.run()
    assert flows.enrollment(enrollment_id).status == "waiting_reply"
    flows.reply(text)
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.current_node_id, run.replies) == ("completed", route, 1)
    assert run.llm_calls == 0  # the built-in classifier


def test_the_grace_timeout_takes_no_reply(world, flows, clock):
    contact = world.contact()
    enrollment_id = flows.enroll(flows.flow(classify_graph(grace=60)), contact)
    flows.run()
    clock.advance(timedelta(minutes=59))
    flows.run()
    assert flows.enrollment(enrollment_id).status == "waiting_reply"
    clock.advance(timedelta(minutes=1))
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert (run.current_node_id, run.outcome, run.last_class) == ("calado", "exhausted", "no_reply")


def test_a_wake_overtaken_by_a_reply_is_stale_and_recorded(world, flows, rt, clock):
    contact = world.contact()
    enrollment_id = flows.enroll(flows.flow(classify_graph(grace=60)), contact)
    flows.run()
    clock.advance(timedelta(minutes=60))
    [(claimed_id, revision)] = runtime.claim_due(rt, limit=10)  # the grace timer fires…
    flows.reply("confirmo")  # …and the reply lands before the actor runs
    step = runtime.advance(rt, [(claimed_id, revision)])[claimed_id]
    assert step.status == "stale"
    assert flows.enrollment(enrollment_id).current_node_id == "resposta"
    flows.run()
    assert flows.enrollment(enrollment_id).current_node_id == "confirmou"
    assert ("resposta", "stale", "stale_wake") in statuses(flows.steps(enrollment_id))
    # The same claim delivered again (a redelivered actor message) changes nothing either.
    assert runtime.advance(rt, [(claimed_id, revision)])[claimed_id].status == "stale"


def test_an_actor_that_runs_twice_advances_once(world, flows, rt, clock):
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=10),
                             node("fim", "end", outcome="exhausted")))
    enrollment_id = flows.enroll(flow, contact)
    pairs = runtime.claim_due(rt, limit=10)
    assert runtime.advance(rt, pairs)[enrollment_id].status == "ok"
    assert runtime.advance(rt, pairs)[enrollment_id].status == "stale"
    assert flows.enrollment(enrollment_id).steps == 1


def _wait_then_end(flows) -> int:
    return flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=10),
                             node("fim", "end", outcome="exhausted")))


@pytest.mark.postgres_only
@pytest.mark.skipif(not IS_POSTGRES, reason="SQLite writes a claim's steps one UPDATE each")
def test_a_claims_steps_are_written_in_one_statement_not_one_per_enrollment(world, flows, rt, clock):
    """50 runs due at a wait → end: their moves are one UPDATE of enrollments, and the org's
    webhook endpoints are read once for the 50 `run.ended`, not once per run."""
    flow = _wait_then_end(flows)
    ids = [flows.enroll(flow, world.contact()) for _ in range(50)]
    flows.run()
    clock.advance(timedelta(minutes=10))
    pairs = runtime.claim_due(rt, limit=100)
    assert len(pairs) == 50
    seen: list[str] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        seen.append(" ".join(statement.split()).upper())

    event.listen(rt.db.engine, "before_cursor_execute", note)
    try:
        done = runtime.advance(rt, pairs)
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", note)
    assert {step.status for step in done.values()} == {"ok"} and len(done) == 50
    assert len([s for s in seen if s.startswith("UPDATE ENROLLMENTS ")]) == 1, seen
    assert len([s for s in seen if "FROM WEBHOOK_ENDPOINTS" in s]) == 1
    assert {(flows.enrollment(i).status, flows.enrollment(i).steps) for i in ids} == {("completed", 2)}


def test_a_claim_mate_whose_revision_moved_is_a_stale_wake_and_the_others_advance(world, flows, rt, clock,
                                                                                   monkeypatch):
    """The claim's moves are written together, each under its own compare-and-set: one run whose
    revision moved between the read and the write (a reply landed) is a stale wake, recorded, its
    step not taken; its claim-mates move, and their counters add to the row as it is then (LLM
    calls a stale wake added meanwhile are kept)."""
    flow = _wait_then_end(flows)
    ids = [flows.enroll(flow, world.contact()) for _ in range(3)]
    flows.run()
    clock.advance(timedelta(minutes=10))
    pairs = runtime.claim_due(rt, limit=10)
    overtaken, counted = ids[1], ids[2]
    write_moves = runtime._write_moves

    def meanwhile(conn, moves):
        conn.execute(update(enrollments).where(enrollments.c.id == overtaken)
                     .values(revision=enrollments.c.revision + 1))
        conn.execute(update(enrollments).where(enrollments.c.id == counted)
                     .values(llm_calls=enrollments.c.llm_calls + 2))
        return write_moves(conn, moves)

    monkeypatch.setattr(runtime, "_write_moves", meanwhile)
    done = runtime.advance(rt, pairs)
    assert [done[i].status for i in ids] == ["ok", "stale", "ok"]
    runs = {i: flows.enrollment(i) for i in ids}
    assert [(runs[i].status, runs[i].current_node_id) for i in ids] == [
        ("completed", "fim"), ("active", "espera"), ("completed", "fim")]
    assert (runs[counted].llm_calls, runs[counted].steps) == (2, 2)
    assert runs[overtaken].steps == 1
    assert ("espera", "stale", "stale_wake") in statuses(flows.steps(overtaken))
    assert ("espera", "ok", "wait_elapsed") in statuses(flows.steps(ids[0]))


def test_one_claim_advances_each_org_with_its_own_rows(world, flows, rt, clock):
    """A claim mixes orgs (the scheduler claims for all of them): each enrollment reads its own
    org's contact and sends to it, and each follow-up lands in its own org's outbox."""
    other = World(rt, slug="outra", quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    other.channel("whatsapp")
    other_flows = Flows(other)
    graph = linear(node("inicio", "trigger"), node("oi", "action", mode="template", template="followup_checkin"),
                   node("fim", "end", outcome="exhausted"))
    mine = [flows.enroll(flows.flow(graph), world.contact(phone="+5511988880001"))]
    theirs = [other_flows.enroll(other_flows.flow(graph), other.contact(phone="+5511988880002"))]
    taken = runtime.advance_claimed(rt, runtime.claim_due(rt, limit=10))
    assert taken == 4  # trigger and action of each, chained in one claim
    assert [m.contact_id for m in flows.followups()] == [flows.enrollment(mine[0]).contact_id]
    assert [m.contact_id for m in other_flows.followups()] == [other_flows.enrollment(theirs[0]).contact_id]
    assert {m.org_id for m in flows.followups()} == {world.org_id}
    assert {m.org_id for m in other_flows.followups()} == {other.org_id}


@pytest.fixture
def owner(owner_database_url):
    """The schema's owner, who may add and drop the trigger that refuses a row's updates."""
    database = Database(owner_database_url)
    yield database
    database.dispose()


def _fail_updates_of(db, enrollment_id: int, *, but_the_start: bool = False) -> None:
    """A real write failure for one enrollment: the database refuses every update of its row (with
    `but_the_start`, every one but the actor's mark that it started: the step's own write fails).
    A trigger is DDL, so `db` is the owner's, which LEMBRA_TEST_APP_ROLE sets apart from rt's."""
    when = f"OLD.id = {int(enrollment_id)}" + (" AND NEW.revision <> OLD.revision" if but_the_start else "")
    with db.begin() as conn:
        if db.dialect == "postgresql":
            conn.execute(text("CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                              "RAISE EXCEPTION 'refused'; END $$"))
            conn.execute(text(f"CREATE TRIGGER test_refuse BEFORE UPDATE ON enrollments FOR EACH ROW "
                              f"WHEN ({when}) EXECUTE FUNCTION test_refuse()"))
        else:
            conn.execute(text(f"CREATE TRIGGER test_refuse BEFORE UPDATE ON enrollments "
                              f"WHEN {when} BEGIN SELECT RAISE(ABORT, 'refused'); END"))


def _accept_updates_again(db) -> None:
    with db.begin() as conn:
        conn.execute(text("DROP TRIGGER test_refuse" + (" ON enrollments" if db.dialect == "postgresql" else "")))
        if db.dialect == "postgresql":
            conn.execute(text("DROP FUNCTION test_refuse()"))
    db.dispose()


def test_one_enrollment_that_cannot_be_written_does_not_stop_its_claim(world, flows, rt, clock, owner):
    """The claim's steps are written together; when that fails they are written one by one: the
    others advance, and the one that fails (a step that started) keeps its lease until the sweep
    backs it off."""
    flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=10),
                             node("fim", "end", outcome="exhausted")))
    ids = [flows.enroll(flow, world.contact()) for _ in range(3)]
    pairs = runtime.claim_due(rt, limit=10)
    assert len(pairs) == 3
    _fail_updates_of(owner, ids[1], but_the_start=True)
    runtime.advance_claimed(rt, pairs)
    runs = [flows.enrollment(i) for i in ids]
    assert [(r.current_node_id, r.steps) for r in (runs[0], runs[2])] == [("espera", 1), ("espera", 1)]
    assert (runs[1].current_node_id, runs[1].steps) == ("inicio", 0) and runs[1].lease_until is not None
    assert runs[1].claim_started_at is not None
    _accept_updates_again(owner)
    clock.advance(rt.settings.lease + timedelta(seconds=1))
    assert runtime.sweep_lost(rt) == (1, 0)
    assert (flows.enrollment(ids[1]).attempts, flows.enrollment(ids[1]).last_error) == (1, "claim_expired")


def test_an_enrollment_whose_claim_cannot_even_start_leaves_its_claim_mates_alone(world, flows, rt, clock,
                                                                                   owner):
    """The actor marks its claim started in one statement; when one row refuses even that, the
    others are marked one by one and advance, and the one that never started goes back to the
    queue free once the database takes its writes again."""
    flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=10),
                             node("fim", "end", outcome="exhausted")))
    ids = [flows.enroll(flow, world.contact()) for _ in range(3)]
    pairs = runtime.claim_due(rt, limit=10)
    _fail_updates_of(owner, ids[1])
    assert runtime.advance_claimed(rt, pairs) == 2
    runs = [flows.enrollment(i) for i in ids]
    assert [(r.current_node_id, r.steps) for r in (runs[0], runs[2])] == [("espera", 1), ("espera", 1)]
    assert (runs[1].current_node_id, runs[1].claim_started_at) == ("inicio", None)
    _accept_updates_again(owner)
    clock.advance(rt.settings.lease + timedelta(seconds=1))
    assert runtime.sweep_lost(rt) == (0, 1)
    run = flows.enrollment(ids[1])
    assert (run.attempts, run.last_error, run.lease_until) == (0, None, None)
    flows.run()
    assert flows.enrollment(ids[1]).current_node_id == "espera"


class FailingAI(BuiltinAI):
    def __init__(self) -> None:
        self.calls = 0

    def write(self, **kwargs):
        self.calls += 1
        raise AIError("server error", permanent=False, code="server_error")


def test_node_failures_back_off_then_the_run_is_dead_with_a_pendencia(world, flows, clock):
    failing = FailingAI()
    flows.ai = lambda agent: failing
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"),
                             node("ia", "action", mode="ai_message", prompt_hint="retomar contato",
                                  fallback_template="followup_checkin"),
                             node("fim", "end", outcome="exhausted")))
    enrollment_id = flows.enroll(flow, contact)
    flows.run()
    delays = []
    for expected in (30, 60, 300, 900, 3600):
        run = flows.enrollment(enrollment_id)
        assert run.status == "active" and run.last_error == "ai_unavailable"
        delays.append(int((run.next_eval_at - clock.now()).total_seconds()))
        clock.set(run.next_eval_at)
        flows.run()
    assert delays == [30, 60, 300, 900, 3600]
    run = flows.enrollment(enrollment_id)
    assert run.status == "dead" and run.next_eval_at is None
    assert run.llm_calls == 6 and failing.calls == 6
    [item] = [i for i in world.inbox() if i.kind == "enrollment_dead"]
    assert item.enrollment_id == enrollment_id
    assert world.sandbox() == []


def test_a_claim_lost_with_its_worker_counts_as_a_failed_attempt(world, flows, rt, clock):
    contact = world.contact()
    enrollment_id = flows.enroll(flows.flow(classify_graph()), contact)
    pairs = runtime.claim_due(rt, limit=10)
    assert runtime.start_claims(rt, pairs) == pairs  # the worker that took it starts, and dies mid-step
    clock.advance(rt.settings.lease + timedelta(seconds=1))
    assert runtime.sweep_lost(rt) == (1, 0)
    run = flows.enrollment(enrollment_id)
    assert (run.attempts, run.last_error, run.lease_until) == (1, "claim_expired", None)
    assert run.next_eval_at == clock.now() + timedelta(seconds=30)
    clock.advance(timedelta(seconds=30))
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert (run.attempts, run.status, run.current_node_id) == (0, "waiting_reply", "resposta")
    assert len(world.sandbox()) == 1


class _SlowWriter(BuiltinAI):
    """A model that takes 50 s to write each message (the frozen clock moves on); the
    scheduler's sweep runs beside the actor as each answer comes."""

    def __init__(self, rt, clock, swept: list) -> None:
        self.rt, self.clock, self.swept = rt, clock, swept

    def write(self, *, prompt_hint, max_chars, context):
        self.clock.advance(timedelta(seconds=50))
        self.swept.append(runtime.sweep_lost(self.rt))
        return Written(text="Oi! Podemos marcar seu retorno?", llm_calls=1, reason="ok")


def test_a_claim_that_outlasts_its_lease_keeps_it_while_its_worker_works(world, flows, rt, clock):
    """Three runs whose model takes 50 s each: 150 s of work on a 120 s lease. The actor renews
    the claim's leases as it goes (every third of a lease), so the sweep beside it finds no lost
    step and every run is written once; without the renewal the sweep took all three as lost
    and the actor's writes found stale wakes, claim after claim."""
    assert rt.settings.lease == timedelta(seconds=120)
    flow = flows.flow(linear(node("inicio", "trigger"),
                             node("escrever", "action", mode="ai_message", prompt_hint="Pergunte.",
                                  fallback_template="followup_checkin"),
                             node("fim", "end", outcome="converted")))
    ids = [flows.enroll(flow, world.contact()) for _ in range(3)]
    swept: list = []
    pairs = runtime.claim_due(rt, limit=10)
    assert runtime.advance_claimed(rt, pairs, ai=lambda agent: _SlowWriter(rt, clock, swept)) == 6
    assert swept == [(0, 0)] * 3
    assert [flows.enrollment(i).status for i in ids] == ["completed"] * 3
    assert [flows.enrollment(i).attempts for i in ids] == [0] * 3
    flows.run()
    assert len(world.sandbox()) == 3


def _requeued(rt, enrollment_id: int) -> list[tuple[str, str | None, str]]:
    """The run's `requeued` events: (node, reason, key)."""
    with rt.db.connect() as conn:
        rows = conn.execute(select(enrollment_events).where(enrollment_events.c.enrollment_id == enrollment_id,
                                                            enrollment_events.c.event_type == "requeued")
                            .order_by(enrollment_events.c.id)).all()
    return [(row.node_id, (row.payload or {}).get("reason"), row.idempotency_key) for row in rows]


def test_a_claim_no_worker_started_goes_back_to_the_queue_free_however_often(world, flows, rt, clock):
    """A claim that never reached a worker (the broker was down, lost it, or held it past its
    lease) is put back in the queue at no cost, as a message is: more times than the backoff
    ladder has steps, over longer than the whole ladder, and the run is neither dead nor backed
    off. The step then runs once."""
    enrollment_id = flows.enroll(flows.flow(classify_graph()), world.contact())
    due = flows.enrollment(enrollment_id).next_eval_at
    claims = []
    for _ in range(len(runtime.BACKOFF) + 3):
        pairs = runtime.claim_due(rt, limit=10)
        assert [p[0] for p in pairs] == [enrollment_id]
        claims += pairs
        clock.advance(timedelta(minutes=20))  # 8 × 20 min: well past the ladder's 81 minutes
        assert runtime.sweep_lost(rt) == (0, 1)
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.attempts, run.last_error, run.lease_until, run.next_eval_at) == \
        ("active", 0, None, None, due)
    assert _requeued(rt, enrollment_id) == [("inicio", "claim_not_started", f"requeued:{revision}")
                                            for _, revision in claims]
    assert flows.steps(enrollment_id) == [] and world.inbox() == []

    assert runtime.advance_claimed(rt, [claims[0]]) == 1  # a message of an old claim turns up: stale
    assert [s["status"] for s in flows.steps(enrollment_id)] == ["stale"]
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.current_node_id, run.attempts, run.messages_sent) == ("waiting_reply", "resposta", 0, 1)
    assert len(world.sandbox()) == 1


def test_a_claim_the_scheduler_could_not_hand_over_is_released_at_once_unless_it_started(world, flows, rt, clock):
    ids = [flows.enroll(flows.flow(classify_graph()), world.contact()) for _ in range(2)]
    first, second = runtime.claim_due(rt, limit=10)
    assert runtime.start_claims(rt, [second]) == [second]  # its message reached a worker after all
    assert runtime.release_unhanded(rt, [first, second]) == 1
    runs = {i: flows.enrollment(i) for i in ids}
    assert (runs[first[0]].lease_until, runs[first[0]].revision, runs[first[0]].attempts) == (None, first[1] + 1, 0)
    assert runs[second[0]].lease_until is not None and runs[second[0]].revision == second[1]
    assert _requeued(rt, first[0]) == []  # undone before it left the scheduler: nothing to tell
    assert [p[0] for p in runtime.claim_due(rt, limit=10)] == [first[0]]  # due again at once


def test_claims_in_flight_are_capped_and_lost_ones_are_swept_in_batches(world, flows, rt, clock):
    """A claim waits in the broker while its lease runs: the scheduler leases no more than
    `max_in_flight` at once, and the sweep takes lost claims `limit` at a time, oldest first."""
    pointer = flows.flow(classify_graph())
    ids = [flows.enroll(pointer, world.contact()) for _ in range(5)]
    first = runtime.claim_due(rt, limit=10, max_in_flight=3)
    assert len(first) == 3
    assert runtime.claim_due(rt, limit=10, max_in_flight=3) == []  # three already in flight
    second = runtime.claim_due(rt, limit=10, max_in_flight=4)
    assert len(second) == 1

    runtime.start_claims(rt, first + second)
    clock.advance(rt.settings.lease + timedelta(seconds=1))  # every worker holding them died
    assert runtime.sweep_lost(rt, limit=3) == (3, 0)
    assert runtime.sweep_lost(rt, limit=3) == (1, 0)
    assert runtime.sweep_lost(rt, limit=3) == (0, 0)
    runs = {i: flows.enrollment(i) for i in ids}
    lost = {i for i, run in runs.items() if run.last_error == "claim_expired"}
    assert len(lost) == 4 and all(runs[i].attempts == 1 and runs[i].lease_until is None for i in lost)
    assert [r.attempts for i, r in runs.items() if i not in lost] == [0]


def test_after_downtime_each_run_fires_once_and_re_anchors(world, flows, clock):
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"), node("d1", "wait", mode="fixed", minutes=1440),
                             node("m1", "action", mode="template", template="followup_checkin"),
                             node("d2", "wait", mode="fixed", minutes=1440),
                             node("m2", "action", mode="template", template="followup_rebook"),
                             node("fim", "end", outcome="exhausted")))
    enrollment_id = flows.enroll(flow, contact)
    flows.run()
    clock.advance(timedelta(days=3))  # the scheduler was down for three days
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert run.current_node_id == "d2"
    assert run.next_eval_at == clock.now() + timedelta(days=1)  # anchored on now, not on the missed instant
    assert len(world.sandbox()) == 1


def test_smart_waits_are_planned_once_and_clamped_when_stored_and_read(world, flows, clock):
    class Planner(BuiltinAI):
        calls = 0

        def plan(self, *, waits, context):
            Planner.calls += 1
            return Plan({"a": PlannedWait("a", 5, "cedo demais"), "b": PlannedWait("b", 200, "bom horário")},
                        llm_calls=1, reason="ai_ok")

    flows.ai = lambda agent: Planner()
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"),
                             node("a", "wait", mode="smart", min_minutes=60, max_minutes=600),
                             node("b", "wait", mode="smart", min_minutes=60, max_minutes=600),
                             node("c", "wait", mode="smart", min_minutes=60, max_minutes=600),
                             node("fim", "end", outcome="exhausted")))
    enrollment_id = flows.enroll(flow, contact)
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert run.timing_plan["a"] == {"proposed_minutes": 5, "minutes": 60, "reason": "cedo demais"}
    assert run.next_eval_at == clock.now() + timedelta(minutes=60)
    clock.advance(timedelta(minutes=60))
    flows.run()
    assert flows.enrollment(enrollment_id).next_eval_at == clock.now() + timedelta(minutes=200)
    clock.advance(timedelta(minutes=200))
    flows.run()
    assert flows.enrollment(enrollment_id).next_eval_at == clock.now() + timedelta(minutes=600)  # no plan: max
    assert Planner.calls == 1 and flows.enrollment(enrollment_id).llm_calls == 1


def test_sair_during_a_wait_cancels_the_run_and_nothing_more_goes_out(world, flows, clock):
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                             node("msg", "action", mode="template", template="followup_checkin"),
                             node("fim", "end", outcome="exhausted")))
    enrollment_id = flows.enroll(flow, contact)
    flows.run()
    flows.reply("SAIR")
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.outcome) == ("cancelled", "opted_out")
    clock.advance(timedelta(hours=2))
    flows.run()
    assert [m.body for m in world.sandbox() if "Passando" in (m.body or "")] == []


def test_cancel_on_reply_ends_the_run_replied(world, flows, clock):
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                             node("fim", "end", outcome="exhausted")), cancel_on_reply=True)
    enrollment_id = flows.enroll(flow, contact)
    flows.run()
    flows.reply("oi, tudo bem?")
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.outcome, run.cancel_reason) == ("cancelled", "replied", "replied")


def test_a_hand_off_pauses_the_run_and_its_end_resumes_it_after_the_grace(world, flows, rt, clock):
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                             node("msg", "action", mode="template", template="followup_checkin"),
                             node("fim", "end", outcome="exhausted")), resume_grace_minutes=30)
    enrollment_id = flows.enroll(flow, contact)
    flows.run()
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="handoff_started")
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.next_eval_at, run.paused_status) == ("paused_handoff", None, "active")
    clock.advance(timedelta(hours=5))
    flows.run()
    assert world.sandbox() == []
    flows.reply("quero falar com alguém")  # the person is talking: the run only counts it
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="handoff_ended")
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.next_eval_at) == ("active", clock.now() + timedelta(minutes=30))
    clock.advance(timedelta(minutes=30))
    flows.run()
    assert flows.enrollment(enrollment_id).status == "completed"
    assert len(world.sandbox()) == 1


def test_a_hand_off_with_the_cancel_policy_ends_the_run(world, flows, rt):
    contact = world.contact()
    enrollment_id = flows.enroll(flows.flow(classify_graph(), handoff_policy="cancel"), contact)
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="handoff_started")
    assert flows.enrollment(enrollment_id).outcome == "handoff"


def test_no_llm_call_while_a_person_holds_the_conversation(world, flows, rt, clock):
    class Counting(BuiltinAI):
        calls = 0

        def classify(self, **kwargs):
            Counting.calls += 1
            return Classification("confirm", 1, "ai_ok")

    flows.ai = lambda agent: Counting()
    contact = world.contact()
    enrollment_id = flows.enroll(flows.flow(classify_graph(), handoff_policy="allow"), contact)
    flows.run()
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="handoff_started")
    flows.reply("posso remarcar?")
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert (run.current_node_id, run.llm_calls, Counting.calls) == ("remarcar", 0, 0)


def test_max_steps_ends_a_looping_run_exhausted(world, flows, clock):
    graph = {"nodes": [node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=5),
                       node("de_novo", "wait", mode="fixed", minutes=5)],
             "edges": [edge("inicio", "espera"), edge("espera", "de_novo"), edge("de_novo", "espera")]}
    # A graph without an end cannot be published; this one gets its end through a condition.
    graph["nodes"].append(node("fim", "end", outcome="exhausted"))
    graph["nodes"].append(node("nunca", "condition", checks=[{"field": "enrollment.steps", "op": "gt", "value": 999}],
                               combinator="all"))
    graph["edges"] = [edge("inicio", "espera"), edge("espera", "nunca"),
                      edge("nunca", "fim", "cond_result", True), edge("nunca", "de_novo", "cond_result", False),
                      edge("de_novo", "espera")]
    contact = world.contact()
    enrollment_id = flows.enroll(flows.flow(graph, max_steps=6), contact)
    for _ in range(10):
        flows.run()
        clock.advance(timedelta(minutes=5))
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.outcome, run.cancel_reason) == ("completed", "exhausted", None)
    assert statuses(flows.steps(enrollment_id))[-1][1:] == ("skipped", "max_steps")


def test_a_run_keeps_the_version_it_entered(world, flows, rt, clock):
    contact = world.contact()
    first = linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                   node("v1", "action", mode="template", template="followup_checkin"), node("fim", "end", outcome="exhausted"))
    flow = flows.flow(first)
    enrollment_id = flows.enroll(flow, contact)
    flows.run()
    second = linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                    node("v2", "action", mode="template", template="followup_rebook"), node("fim", "end", outcome="exhausted"))
    with rt.db.begin() as conn:
        versions.update_flow(conn, world.org_id, flow, draft_graph=second)
        assert versions.publish(conn, world.org_id, flow).version == 2
    clock.advance(timedelta(minutes=60))
    flows.run()
    assert "Passando para saber" in world.sandbox()[0].body  # v1's template
    assert flows.enrollment(enrollment_id).current_node_id == "fim"
    with rt.db.begin() as conn:
        versions.rollback(conn, world.org_id, flow, 1)
        assert versions.get_flow(conn, world.org_id, flow).active_version_id == flows.enrollment(enrollment_id).version_id


def test_one_live_enrollment_per_flow_and_contact_and_the_repeat_policy(world, flows, rt, clock):
    contact = world.contact()
    graph = linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                   node("fim", "end", outcome="exhausted"))
    once = flows.flow(graph, trigger={"kind": "event", "event": "stage_changed", "repeat": "once"})
    cooldown = flows.flow(graph, trigger={"kind": "event", "event": "stage_changed", "repeat": "cooldown",
                                          "cooldown_minutes": 1440})

    def stage(value):
        with rt.db.begin() as conn:
            record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="stage_changed", stage=value)

    def live(flow):
        with rt.db.connect() as conn:
            return conn.execute(select(enrollments.c.id).where(enrollments.c.pointer_id == flow)).scalars().all()

    stage("lead")
    stage("lead")  # the first run is live: no second one
    assert len(live(once)) == 1 and len(live(cooldown)) == 1
    flows.run()
    clock.advance(timedelta(hours=2))
    flows.run()  # both runs end
    stage("orcamento")
    assert len(live(once)) == 1  # once per contact, for good
    assert len(live(cooldown)) == 1  # within the cooldown
    clock.advance(timedelta(days=1))
    stage("orcamento")
    assert len(live(once)) == 1 and len(live(cooldown)) == 2


def test_automatic_triggers_need_an_enabled_agent_manual_ones_do_not(world, flows, rt):
    contact = world.contact()
    graph = linear(node("inicio", "trigger"), node("fim", "end", outcome="exhausted"))
    flow = flows.flow(graph, trigger={"kind": "event", "event": "stage_changed"}, agent=False)
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="stage_changed", stage="x")
        result = triggers.enroll(conn, world.org_id, flow, contact, trigger_kind="event", trigger_key="e:1")
    assert result.reason == "no_agent_enables_flow"
    assert flows.enroll(flow, contact, key="abc") == flows.enroll(flow, contact, key="abc")


def test_appointment_events_start_their_flows(world, flows, rt, clock):
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"), node("msg", "action", mode="template", template="followup_rebook"),
                             node("fim", "end", outcome="exhausted")),
                      trigger={"kind": "appointment", "appointment_event": "no_show"})
    appointment = world.appointment(contact, clock.now() + timedelta(hours=1))
    from engine.people.appointments import set_status

    with rt.db.begin() as conn:
        set_status(conn, world.org_id, appointment, "scheduled", "no_show")
    flows.run()
    [message] = flows.followups()
    assert message.appointment_id == appointment and message.status == "sent"
    assert flows.enrollment(message.enrollment_id).pointer_id == flow


def test_silence_starts_a_run_and_a_broken_premise_skips_it(world, flows, rt, clock):
    from engine.queue.outbox import enqueue

    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"), node("msg", "action", mode="template", template="followup_checkin"),
                             node("fim", "end", outcome="exhausted")),
                      trigger={"kind": "silence", "minutes": 120})
    clock.advance(timedelta(minutes=1))  # messages from before the flow was published do not count
    with rt.db.begin() as conn:
        enqueue(conn, org_id=world.org_id, contact_id=contact, channel_kind="whatsapp", purpose="adhoc",
                idempotency_key="adhoc:1", payload={"text": "Olá!"}, respect_window=False)
    flows.send()
    clock.advance(timedelta(minutes=119))
    with rt.db.begin() as conn:
        assert triggers.scan(conn) == 0
    clock.advance(timedelta(minutes=1))
    with rt.db.begin() as conn:
        assert triggers.scan(conn) == 1
        assert triggers.scan(conn) == 0  # the same silence starts one run
    flows.reply("oi")  # the patient writes before the run fires: the premise is broken
    flows.run()
    [run_id] = [e.id for e in _runs(rt, flow)]
    run = flows.enrollment(run_id)
    assert (run.status, run.cancel_reason) == ("cancelled", "silence_broken")
    assert statuses(flows.steps(run_id)) == [("inicio", "skipped", "silence_broken")]
    assert flows.followups() == []


def _runs(rt, flow):
    with rt.db.connect() as conn:
        return conn.execute(select(enrollments).where(enrollments.c.pointer_id == flow)).all()


def test_disable_finishes_or_cancels_live_runs(world, flows, rt, clock):
    graph = linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                   node("fim", "end", outcome="exhausted"))
    finishing, cancelling = flows.flow(graph), flows.flow(graph)
    contact = world.contact()
    a, b = flows.enroll(finishing, contact), flows.enroll(cancelling, contact)
    flows.run()
    with rt.db.begin() as conn:
        assert versions.disable(conn, world.org_id, finishing, live="finish") == 0
        assert versions.disable(conn, world.org_id, cancelling, live="cancel") == 1
        assert triggers.enroll(conn, world.org_id, finishing, contact, trigger_kind="manual", trigger_key="k",
                               automatic=False).reason == "flow_not_active"
    clock.advance(timedelta(minutes=60))
    flows.run()
    assert flows.enrollment(a).status == "completed"
    assert (flows.enrollment(b).status, flows.enrollment(b).cancel_reason) == ("cancelled", "flow_disabled")


def test_every_live_status_has_a_way_out(world, flows, rt, clock):
    """active → advance; waiting_reply → a reply or the grace; paused_handoff → the hand-off's
    end (or opt-out); and from each, opt-out ends the run."""
    contact = world.contact()
    enrollment_id = flows.enroll(flows.flow(classify_graph(), handoff_policy="pause"), contact)
    seen = {flows.enrollment(enrollment_id).status}
    flows.run()
    seen.add(flows.enrollment(enrollment_id).status)
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="handoff_started")
    seen.add(flows.enrollment(enrollment_id).status)
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="handoff_ended")
    assert flows.enrollment(enrollment_id).status == "waiting_reply"
    clock.advance(timedelta(minutes=60))
    flows.run()  # resumed at the classify, on its own deadline (its 60 min grace), which has now passed
    seen.add(flows.enrollment(enrollment_id).status)
    assert seen == {"active", "waiting_reply", "paused_handoff", "completed"}
    for status in ("active", "waiting_reply", "paused_handoff"):
        other = flows.enroll(flows.flow(classify_graph()), contact)
        with rt.db.begin() as conn:
            conn.execute(update(enrollments).where(enrollments.c.id == other).values(status=status))
        flows.reply("SAIR")
        assert flows.enrollment(other).outcome == "opted_out"
        with rt.db.begin() as conn:
            conn.execute(contact_events.delete())
        from engine.people.contacts import set_consent

        with rt.db.begin() as conn:
            for kind in ("whatsapp", "sms", "email"):
                set_consent(conn, world.org_id, contact, kind, source="test")


def test_a_reminder_without_a_reply_starts_its_flow_once(world, flows, rt, clock):
    contact = world.contact()
    flows.flow(linear(node("inicio", "trigger"), node("msg", "action", mode="template", template="followup_checkin"),
                             node("fim", "end", outcome="exhausted")),
                      trigger={"kind": "reminder_no_reply", "minutes": 180})
    world.rule(1440)
    appointment = world.appointment(contact, clock.now() + timedelta(hours=26))
    clock.advance(timedelta(hours=2))
    flows.send()  # the 24 h reminder goes out
    clock.advance(timedelta(minutes=179))
    with rt.db.begin() as conn:
        assert triggers.scan(conn) == 0
    clock.advance(timedelta(minutes=1))
    with rt.db.begin() as conn:
        assert triggers.scan(conn) == 1
    flows.run()
    [message] = flows.followups()
    assert (message.appointment_id, message.status) == (appointment, "sent")
    clock.advance(timedelta(hours=1))
    with rt.db.begin() as conn:
        assert triggers.scan(conn) == 0  # once per contact (repeat: once)


def test_a_claims_follow_ups_are_queued_together_and_its_contacts_reach_read_once(world, flows, rt, clock):
    """20 runs due at a template action: their follow-ups are one INSERT of messages and one of
    their `queued` events, and how each contact can be reached (consent, refused addresses, the
    org's channels) is read once for the claim, not once per run; each run still gets its own
    message, and a contact whose address was refused gets none."""
    flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=10),
                             node("msg", "action", mode="template", template="followup_checkin",
                                  channel_kinds=["whatsapp"]),
                             node("fim", "end", outcome="converted")))
    ids = [flows.enroll(flow, world.contact(phone=f"+55119888800{n:02d}")) for n in range(20)]
    flows.run()
    with rt.db.begin() as conn:  # the address refused, the contact's own consent untouched
        block_sender(conn, world.org_id, "+5511988880007", source="import", evidence=None)
    clock.advance(timedelta(minutes=10))
    seen: list[str] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        seen.append(" ".join(statement.split()).upper())

    event.listen(rt.db.engine, "before_cursor_execute", note)
    try:
        runtime.advance_claimed(rt, runtime.claim_due(rt, limit=100))
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", note)
    assert len([s for s in seen if s.startswith("INSERT INTO MESSAGES ")]) == 1, seen
    # Their `queued` events, written by the planner as it places the 19 in the sending window.
    assert len([s for s in seen if s.startswith("INSERT INTO MESSAGE_EVENTS ")]) == 1, seen
    for table, reads in (("PREFERENCES", 1), ("CHANNELS", 1), ("ADDRESS_OPTOUTS", 2)):  # phones, then e-mails
        assert len([s for s in seen if f"FROM {table} " in s]) == reads, (table, seen)
    refused = ids[7]
    assert ("msg", "skipped", "no_usable_channel") in statuses(flows.steps(refused))
    assert flows.followups(refused) == []
    for enrollment_id in ids[:7] + ids[8:]:
        [message] = flows.followups(enrollment_id)
        assert message.idempotency_key == f"enrollment:{enrollment_id}:node:msg:attempt:2"
