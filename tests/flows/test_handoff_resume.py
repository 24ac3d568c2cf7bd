"""A hand-off's end resumes a paused run at the later of its node's own deadline and the flow's
grace after the end (issue 30, point 2): a patient keeps the time they had left to answer, a
fixed or smart wait is not stretched, a node that was due resumes after the grace, and the
run's timeline says which. Every node kind, across a hand-off much shorter than its deadline
and one longer; a stale wake and the sweep cannot act on a paused run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable

import pytest
from sqlalchemy import select, update

from engine.flows.contact_events import record_contact_event
from engine.flows import queries, runtime
from engine.flows.ai.base import Plan, PlannedWait
from engine.flows.ai.builtin import BuiltinAI
from engine.store.models import enrollment_events, enrollments
from tests.factories import World
from tests.flows.helpers import Flows, edge, linear, node
from tests.flows.test_runtime import FailingAI, classify_graph

GRACE = 30  # the flows' resume grace, in minutes
SHORT = timedelta(seconds=6)
LONG = timedelta(days=3)  # longer than every node's deadline here


@pytest.fixture
def world(rt, clock):
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    for kind in ("whatsapp", "sms", "email"):
        world.channel(kind)
    return world


@pytest.fixture
def flows(world):
    return Flows(world)


def handoff(rt, world: World, contact: int, kind: str) -> None:
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type=kind)


def resumed(flows: Flows, enrollment_id: int) -> dict[str, Any]:
    """The payload of the run's latest `resumed` event."""
    with flows.rt.db.connect() as conn:
        payloads = conn.execute(select(enrollment_events.c.payload).where(
            enrollment_events.c.org_id == flows.org_id, enrollment_events.c.enrollment_id == enrollment_id,
            enrollment_events.c.event_type == "resumed").order_by(enrollment_events.c.id)).scalars().all()
    return payloads[-1]


def timeline_reason(flows: Flows, enrollment_id: int, event: str) -> str:
    """The sentence the console and the API show for the run's latest event of that type."""
    with flows.rt.db.connect() as conn:
        steps = [s for s in queries.run_steps(conn, flows.org_id, enrollment_id) if s.event == event]
    return str(steps[-1].reason_text)


class Planner(BuiltinAI):
    """Plans the smart wait at 700 minutes (inside its 60–1440 bounds)."""

    def plan(self, *, waits, context):
        return Plan({w.node_id: PlannedWait(w.node_id, 700, "bom horário") for w in waits}, llm_calls=1,
                    reason="ai_ok")


@dataclass
class Scenario:
    """A run brought to one node kind: `node` is where it pauses; `after` says, once the run has
    taken its step there at the resume instant, that it did that node's thing."""

    node: str
    prepare: Callable[[World, Flows, Any, Any], int]
    after: Callable[[World, Flows, int], None]


def _wait_fixed(world, flows, rt, clock) -> int:
    flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=1440),
                             node("msg", "action", mode="template", template="followup_checkin"),
                             node("fim", "end", outcome="exhausted")), resume_grace_minutes=GRACE)
    enrollment_id = flows.enroll(flow, world.contact())
    flows.run()
    return enrollment_id


def _wait_smart(world, flows, rt, clock) -> int:
    flows.ai = lambda agent: Planner()
    flow = flows.flow(linear(node("inicio", "trigger"),
                             node("espera", "wait", mode="smart", min_minutes=60, max_minutes=1440),
                             node("msg", "action", mode="template", template="followup_checkin"),
                             node("fim", "end", outcome="exhausted")), resume_grace_minutes=GRACE)
    enrollment_id = flows.enroll(flow, world.contact())
    flows.run()
    assert flows.enrollment(enrollment_id).next_eval_at == clock.now() + timedelta(minutes=700)
    return enrollment_id


def _sent_one(world, flows, enrollment_id) -> None:
    assert flows.enrollment(enrollment_id).status == "completed"
    assert [m.status for m in flows.followups(enrollment_id)] == ["sent"]


def _classify(world, flows, rt, clock) -> int:
    enrollment_id = flows.enroll(flows.flow(classify_graph(grace=1440), resume_grace_minutes=GRACE),
                                 world.contact())
    flows.run()
    assert flows.enrollment(enrollment_id).status == "waiting_reply"
    return enrollment_id


def _classify_no_reply(world, flows, enrollment_id) -> None:
    run = flows.enrollment(enrollment_id)
    assert (run.current_node_id, run.last_class) == ("calado", "no_reply")


def _classify_holding_a_reply(world, flows, rt, clock) -> int:
    """A reply the classify took but has not read yet when the hand-off starts."""
    enrollment_id = _classify(world, flows, rt, clock)
    clock.advance(timedelta(minutes=5))
    flows.reply("Posso REMARCAR para sexta?")
    assert flows.enrollment(enrollment_id).pending_inbound_id is not None
    return enrollment_id


def _classify_read_the_reply(world, flows, enrollment_id) -> None:
    run = flows.enrollment(enrollment_id)
    assert (run.current_node_id, run.last_class) == ("remarcar", "reschedule")


def _trigger(world, flows, rt, clock) -> int:
    flow = flows.flow(linear(node("inicio", "trigger"),
                             node("msg", "action", mode="template", template="followup_checkin"),
                             node("fim", "end", outcome="exhausted")), resume_grace_minutes=GRACE)
    return flows.enroll(flow, world.contact())  # due now, not run yet


def _action_backing_off(world, flows, rt, clock) -> int:
    """An AI message whose model failed once: the run waits 30 s at the action before trying again."""
    flows.ai = lambda agent: FailingAI()
    flow = flows.flow(linear(node("inicio", "trigger"),
                             node("ia", "action", mode="ai_message", prompt_hint="retomar contato",
                                  fallback_template="followup_checkin"),
                             node("fim", "end", outcome="exhausted")), resume_grace_minutes=GRACE)
    enrollment_id = flows.enroll(flow, world.contact())
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert (run.current_node_id, run.attempts, run.next_eval_at) == ("ia", 1, clock.now() + timedelta(seconds=30))
    flows.ai = None  # the model is back (the built-in writer: the fallback template goes)
    return enrollment_id


def _condition(world, flows, rt, clock) -> int:
    """A run whose worker took the trigger's step and holds the condition, due at once."""
    graph = {
        "nodes": [node("inicio", "trigger"),
                  node("lead", "condition", checks=[{"field": "contact.stage", "op": "eq", "value": "lead"}],
                       combinator="all"),
                  node("sim", "end", outcome="converted"), node("nao", "end", outcome="exhausted")],
        "edges": [edge("inicio", "lead"), edge("lead", "sim", "cond_result", True),
                  edge("lead", "nao", "cond_result", False)],
    }
    enrollment_id = flows.enroll(flows.flow(graph, resume_grace_minutes=GRACE), world.contact())
    steps = runtime.advance(rt, runtime.claim_due(rt, limit=10))  # one step, not chained
    assert steps[enrollment_id].continue_with is not None
    assert flows.enrollment(enrollment_id).current_node_id == "lead"
    return enrollment_id


def _condition_evaluated(world, flows, enrollment_id) -> None:
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.current_node_id) == ("completed", "nao")


SCENARIOS = {
    "wait_fixed": Scenario("espera", _wait_fixed, _sent_one),
    "wait_smart": Scenario("espera", _wait_smart, _sent_one),
    "ai_classify": Scenario("resposta", _classify, _classify_no_reply),
    "ai_classify_holding_a_reply": Scenario("resposta", _classify_holding_a_reply, _classify_read_the_reply),
    "trigger": Scenario("inicio", _trigger, _sent_one),
    "action_backing_off": Scenario("ia", _action_backing_off, _sent_one),
    "condition": Scenario("lead", _condition, _condition_evaluated),
}


@pytest.mark.parametrize("length", [SHORT, LONG], ids=["short_hand_off", "long_hand_off"])
@pytest.mark.parametrize("kind", sorted(SCENARIOS))
def test_every_node_kind_resumes_at_the_later_of_its_deadline_and_the_grace(world, flows, rt, clock, kind, length):
    scenario = SCENARIOS[kind]
    enrollment_id = scenario.prepare(world, flows, rt, clock)
    before = flows.enrollment(enrollment_id)
    own_deadline: datetime = before.next_eval_at
    contact = before.contact_id
    assert before.current_node_id == scenario.node

    handoff(rt, world, contact, "handoff_started")
    paused = flows.enrollment(enrollment_id)
    assert (paused.status, paused.next_eval_at, paused.lease_until) == ("paused_handoff", None, None)
    assert paused.paused_next_eval_at == own_deadline  # the pause keeps the clock it stopped
    clock.advance(length)
    flows.run()  # nothing claims a paused run
    assert flows.enrollment(enrollment_id).steps == paused.steps

    handoff(rt, world, contact, "handoff_ended")
    grace_until = clock.now() + timedelta(minutes=GRACE)
    expected = max(own_deadline, grace_until)
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.next_eval_at, run.paused_status, run.paused_next_eval_at) == (
        before.status, expected, None, None)
    payload = resumed(flows, enrollment_id)
    at_own_deadline = own_deadline > grace_until
    assert payload == {"at": expected.isoformat(), "deadline": own_deadline.isoformat(),
                       "reason": "resumed_node_deadline" if at_own_deadline else "resumed_after_grace",
                       "params": {"minutes": GRACE}}
    sentence = timeline_reason(flows, enrollment_id, "resumed")
    if at_own_deadline:
        assert "retoma no prazo que esta etapa já tinha antes da pausa" in sentence
    else:
        assert "depois do tempo de retomada do fluxo (30 min)" in sentence

    clock.set(expected - timedelta(seconds=1))
    flows.run()
    assert (flows.enrollment(enrollment_id).current_node_id, flows.enrollment(enrollment_id).steps) == (
        scenario.node, paused.steps), "the node acted before its resume instant"
    clock.set(expected)
    flows.run()
    scenario.after(world, flows, enrollment_id)


def test_a_six_second_hand_off_leaves_the_patient_their_whole_day_to_answer(world, flows, rt, clock):
    """The issue's case: a classify waiting a day, a 6 s hand-off half an hour in. Before the fix
    it took the no-reply branch 30 min after the hand-off; now the patient still has 23.5 h."""
    enrollment_id = _classify(world, flows, rt, clock)
    deadline = flows.enrollment(enrollment_id).next_eval_at
    contact = flows.enrollment(enrollment_id).contact_id
    clock.advance(timedelta(minutes=30))
    handoff(rt, world, contact, "handoff_started")
    clock.advance(SHORT)
    handoff(rt, world, contact, "handoff_ended")
    assert flows.enrollment(enrollment_id).next_eval_at == deadline
    clock.advance(timedelta(minutes=GRACE, seconds=1))
    flows.run()
    assert flows.enrollment(enrollment_id).status == "waiting_reply", "the no-reply branch was taken early"
    clock.set(deadline - timedelta(minutes=10))
    flows.reply("ok, confirmo!")
    flows.run()
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.current_node_id, run.last_class) == ("completed", "confirmou", "confirm")


def test_a_completed_run_is_left_alone_by_a_hand_off(world, flows, rt, clock):
    enrollment_id = flows.enroll(flows.flow(linear(node("inicio", "trigger"), node("fim", "end", outcome="converted"))),
                                 world.contact())
    flows.run()
    contact = flows.enrollment(enrollment_id).contact_id
    handoff(rt, world, contact, "handoff_started")
    handoff(rt, world, contact, "handoff_ended")
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.outcome, run.paused_next_eval_at) == ("completed", "converted", None)
    assert flows.events(enrollment_id) == ["enrolled", "step"]


def test_a_stale_wake_and_the_sweep_cannot_act_on_a_paused_run(world, flows, rt, clock):
    enrollment_id = _classify(world, flows, rt, clock)
    contact = flows.enrollment(enrollment_id).contact_id
    clock.advance(timedelta(days=1))  # the classify's grace is over: it is claimed …
    [claim] = runtime.claim_due(rt, limit=10)
    handoff(rt, world, contact, "handoff_started")  # … and the hand-off starts before its worker runs
    assert runtime.advance(rt, [claim])[enrollment_id].status == "stale"
    clock.advance(rt.settings.lease + timedelta(minutes=1))
    assert runtime.sweep_lost(rt) == (0, 0)
    assert runtime.claim_due(rt, limit=10) == []
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.current_node_id, run.attempts, run.last_error) == (
        "paused_handoff", "resposta", 0, None)
    handoff(rt, world, contact, "handoff_ended")
    assert runtime.advance(rt, [claim])[enrollment_id].status == "stale"  # still stale after the resume
    assert flows.enrollment(enrollment_id).next_eval_at == clock.now() + timedelta(minutes=30)
    clock.advance(timedelta(minutes=30))
    flows.run()
    assert flows.enrollment(enrollment_id).current_node_id == "calado"
    assert len(world.sandbox()) == 1  # the question, once


def test_a_run_paused_before_the_clock_was_kept_resumes_on_its_nodes_deadline(world, flows, rt, clock):
    """A run paused by an older release has no kept clock: its node's own deadline is worked out
    from when it entered the node (a classify: its grace after)."""
    enrollment_id = _classify(world, flows, rt, clock)
    deadline = flows.enrollment(enrollment_id).next_eval_at
    contact = flows.enrollment(enrollment_id).contact_id
    handoff(rt, world, contact, "handoff_started")
    with rt.db.begin() as conn:
        conn.execute(update(enrollments).where(enrollments.c.id == enrollment_id).values(paused_next_eval_at=None))
    clock.advance(timedelta(hours=2))
    handoff(rt, world, contact, "handoff_ended")
    assert flows.enrollment(enrollment_id).next_eval_at == deadline
    assert resumed(flows, enrollment_id)["reason"] == "resumed_node_deadline"


def test_another_clinics_hand_off_does_not_touch_this_clinics_runs(world, flows, rt, clock):
    enrollment_id = _classify(world, flows, rt, clock)
    deadline = flows.enrollment(enrollment_id).next_eval_at
    other = World(rt, "outra", quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    other.channel("whatsapp")
    other_flows = Flows(other)
    theirs = _classify(other, other_flows, rt, clock)
    handoff(rt, other, other_flows.enrollment(theirs).contact_id, "handoff_started")
    assert other_flows.enrollment(theirs).status == "paused_handoff"
    run = flows.enrollment(enrollment_id)
    assert (run.status, run.next_eval_at, run.paused_next_eval_at) == ("waiting_reply", deadline, None)
