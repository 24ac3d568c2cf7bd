"""A reply a follow-up flow took, as Conversas sees it (issue 30, point 5): the flow's from the
transaction that stores it (never "Para responder" while a run holds it unread), handled by the
flow once it understood it (with what it understood and where the run went), a person's when
the flow left it (the fallback edge, a run ended or paused before reading it, a run stuck past
FLOW_CHANCE) or never took it; filed under the run's appointment, never a guess; one clinic's
replies never in another's lists."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from engine.messaging import conversations as convs
from engine.flows.contact_events import record_contact_event
from engine.flows import triggers, versions
from engine.flows.ai.base import AIError
from engine.flows.ai.builtin import BuiltinAI
from engine.store.models import appointments, inbound_messages
from tests.factories import World
from tests.flows.helpers import Flows, edge, linear, node
from tests.flows.test_runtime import classify_graph

QUESTION = "Posso REMARCAR para sexta?"


@pytest.fixture
def world(rt, clock):
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    for kind in ("whatsapp", "sms", "email"):
        world.channel(kind)
    return world


@pytest.fixture
def flows(world):
    return Flows(world)


def latest_reply(world: World) -> int:
    with world.rt.db.connect() as conn:
        return int(conn.execute(select(func.max(inbound_messages.c.id))
                                .where(inbound_messages.c.org_id == world.org_id)).scalar_one())


def item(world: World, inbound_id: int) -> convs.Item:
    with world.rt.db.connect() as conn:
        found = convs.find_item(conn, world.org_id, inbound_id)
    assert found is not None
    return found


def listed(world: World, state: str) -> list[int]:
    with world.rt.db.connect() as conn:
        items, total = convs.list_items(conn, world.org_id, state=state)
    assert total == len(items)
    return [i.id for i in items]


def waiting(world: World) -> int:
    with world.rt.db.connect() as conn:
        return convs.unhandled_count(conn, world.org_id)


def waiting_classify(flows: Flows, contact: int, **settings) -> int:
    enrollment_id = flows.enroll(flows.flow(classify_graph(grace=1440), **settings), contact)
    flows.run()
    assert flows.enrollment(enrollment_id).status == "waiting_reply"
    return enrollment_id


def test_a_reply_the_classify_takes_is_the_flows_from_the_moment_it_is_stored(world, flows, clock):
    enrollment_id = waiting_classify(flows, world.contact())
    assert flows.reply(QUESTION) == ["free_text"]  # stored and processed; the run has not read it yet
    reply = latest_reply(world)
    assert waiting(world) == 0 and listed(world, "open") == [], "staff were told to answer a reply the flow holds"
    assert listed(world, "all") == [reply]
    held = item(world, reply)
    assert (held.state, held.flow.state, held.flow.enrollment_id) == ("flow", "reading", enrollment_id)

    flows.run()  # the worker's step reads it: understood as reschedule, on to the step it leads to
    done = item(world, reply)
    assert (done.state, done.handled_at, done.flow_handled_at) == ("flow_handled", None, clock.now())
    assert (done.flow.state, done.flow.reason, done.flow.label, done.flow.node, done.flow.next) == (
        "understood", "classified", "reschedule", "resposta", "remarcar")
    assert waiting(world) == 0 and listed(world, "open") == [] and listed(world, "handled") == [reply]
    with world.rt.db.connect() as conn:
        [entry] = [e for e in convs.thread(conn, world.org_id, done) if not e.outgoing]
    assert entry.handled and entry.flow == done.flow


def test_a_wait_that_takes_a_reply_handles_it(world, flows, clock):
    graph = {"nodes": [node("inicio", "trigger"),
                       node("espera", "wait", mode="fixed", minutes=1440),
                       node("obrigado", "action", mode="template", template="followup_checkin"),
                       node("fim", "end", outcome="converted"), node("calado", "end", outcome="exhausted")],
             "edges": [edge("inicio", "espera"), edge("espera", "obrigado", "replied"), edge("espera", "calado"),
                       edge("obrigado", "fim")]}
    enrollment_id = flows.enroll(flows.flow(graph), world.contact())
    flows.run()
    flows.reply("Tudo certo por aqui, obrigada")
    reply = latest_reply(world)
    assert waiting(world) == 0
    flows.run()
    done = item(world, reply)
    assert (done.state, done.flow.reason, done.flow.next) == ("flow_handled", "wait_replied", "obrigado")
    assert flows.enrollment(enrollment_id).outcome == "converted"
    assert len(flows.followups(enrollment_id)) == 1  # what the flow did: its message went out


def test_a_reply_the_flow_does_not_understand_waits_for_a_person(world, flows, clock):
    waiting_classify(flows, world.contact())
    flows.reply("quem é?")
    reply = latest_reply(world)
    assert waiting(world) == 0  # the flow has its chance first
    flows.run()
    left = item(world, reply)
    assert (left.state, left.flow.state, left.flow.reason, left.flow.next) == (
        "open", "not_understood", "not_classified", "outro")
    assert waiting(world) == 1 and listed(world, "open") == [reply]


def test_a_reply_no_flow_waits_for_is_for_a_person_at_once(world, flows, clock):
    contact = world.contact()
    flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                             node("fim", "end", outcome="exhausted")))
    flows.enroll(flow, contact)
    flows.run()  # the run waits, with no `replied` edge: it only counts a reply
    flows.reply(QUESTION)
    reply = latest_reply(world)
    free = item(world, reply)
    assert (free.state, free.flow, free.outcome) == ("open", None, "free_text")
    assert waiting(world) == 1


@pytest.mark.parametrize("how", ["flow_disabled", "handoff_paused"])
def test_a_reply_whose_run_stops_before_reading_it_goes_to_a_person(world, flows, rt, clock, how):
    contact = world.contact()
    enrollment_id = waiting_classify(flows, contact)
    flows.reply(QUESTION)
    reply = latest_reply(world)
    assert waiting(world) == 0
    with rt.db.begin() as conn:
        if how == "flow_disabled":
            versions.disable(conn, world.org_id, flows.enrollment(enrollment_id).pointer_id, live="cancel")
        else:
            record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="handoff_started")
    left = item(world, reply)
    assert (left.state, left.flow.state) == ("open", "dropped")
    assert waiting(world) == 1


class FailingClassifier(BuiltinAI):
    def classify(self, **kwargs):
        raise AIError("server error", permanent=False, code="server_error")


def test_a_reply_a_stuck_run_holds_goes_to_a_person_after_the_flows_chance(world, flows, clock):
    waiting_classify(flows, world.contact())
    flows.ai = lambda agent: FailingClassifier()
    flows.reply(QUESTION)
    reply = latest_reply(world)
    flows.run()  # the model fails: the run backs off, holding the reply
    assert item(world, reply).state == "flow"
    clock.advance(convs.FLOW_CHANCE - timedelta(seconds=1))
    assert item(world, reply).state == "flow"
    clock.advance(timedelta(seconds=1))
    late = item(world, reply)
    assert (late.state, late.flow.state) == ("open", "late") and waiting(world) == 1
    flows.ai = None  # the model is back: the run reads and understands it after all
    flows.run()
    assert item(world, reply).state == "flow_handled" and waiting(world) == 0


def test_a_reply_is_filed_under_its_runs_appointment_never_a_guess(world, flows, rt, clock):
    now = clock.now()
    booked = world.contact()
    soon = world.appointment(booked, now + timedelta(days=1))  # unrelated: the next booking
    later = world.appointment(booked, now + timedelta(days=9))  # the one the run is about
    pointer = flows.flow(classify_graph(grace=1440))
    with rt.db.begin() as conn:
        enrolled = triggers.enroll(conn, world.org_id, pointer, booked, trigger_kind="manual", trigger_key="m:1",
                                   appointment_id=later, automatic=False)
    flows.run()
    flows.reply(QUESTION)
    reply = latest_reply(world)
    assert item(world, reply).appointment.id == later
    flows.run()
    assert item(world, reply).appointment.id == later and item(world, reply).flow.enrollment_id == \
        enrolled.enrollment_id
    assert soon != later

    # A run with no appointment: its reply is about none, not the contact's next booking.
    other = world.contact(name="Bruno", phone="+5516999000111", email="bruno@example.com")
    world.appointment(other, now + timedelta(days=1))
    waiting_classify(flows, other)
    flows.reply(QUESTION, sender="+5516999000111")
    assert item(world, latest_reply(world)).appointment is None

    # No flow: never a cancelled booking (the next live one, else the latest past one not cancelled).
    carla = world.contact(name="Carla", phone="+5516999000222", email="carla@example.com")
    gone = world.appointment(carla, now - timedelta(days=2))
    with rt.db.begin() as conn:
        conn.execute(appointments.update().where(appointments.c.id == gone).values(status="cancelled"))
    flows.reply(QUESTION, sender="+5516999000222")
    assert item(world, latest_reply(world)).appointment is None
    kept = world.appointment(carla, now - timedelta(days=5))
    assert item(world, latest_reply(world)).appointment.id == kept


def test_another_clinics_lists_show_nothing_of_this_ones_flow_replies(world, flows, rt, clock):
    waiting_classify(flows, world.contact())
    flows.reply(QUESTION)
    reply = latest_reply(world)
    other = World(rt, "outra", quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    other.channel("whatsapp")
    other_flows = Flows(other)
    waiting_classify(other_flows, other.contact())  # same phone, another clinic
    other_flows.reply("quem é?")
    theirs = latest_reply(other)
    flows.run()
    other_flows.run()
    assert listed(world, "all") == [reply] and listed(other, "all") == [theirs]
    assert waiting(world) == 0 and waiting(other) == 1  # their own unread reply, not ours
    with rt.db.connect() as conn:
        assert convs.find_item(conn, other.org_id, reply) is None
        assert convs.find_item(conn, world.org_id, theirs) is None
    assert item(world, reply).flow.state == "understood" and item(other, theirs).flow.state == "not_understood"
