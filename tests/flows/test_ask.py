"""The `ask` node: a flow asks for the fields it needs until it knows them (in any order, with
corrections), gives up after `max_asks`, reads a turn sent in fragments as one, hands the patient
to a person who asks for one, and never asks for what it already knows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event, select

from engine.flows import versions
from engine.flows.contact_events import record_contact_event
from engine.flows.conversation.fields import create_field
from engine.flows.versions import FlowRejected
from engine.store.models import inbox_items, message_events, messages, preferences
from tests.factories import World
from tests.flows.helpers import DEBOUNCE, Flows, edge, linear, node, turn



@pytest.fixture
def world(rt, clock):
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    world.channel("whatsapp")
    with rt.db.begin() as conn:
        create_field(conn, world.org_id, {"slug": "data", "label": "Data", "type": "date",
                                          "question": "Qual dia fica melhor para você?"})
        create_field(conn, world.org_id, {"slug": "periodo", "label": "Período", "type": "period",
                                          "question": "De manhã, à tarde ou à noite?"})
        create_field(conn, world.org_id, {"slug": "ok", "label": "Pode", "type": "boolean",
                                          "question": "Posso marcar assim?"})
    return world


@pytest.fixture
def flows(world):
    return Flows(world)


def ask_graph(fields: list[str], *, max_asks: int = 3, grace: int = 60) -> dict:
    return {"nodes": [node("inicio", "trigger"),
                      node("pergunta", "ask", fields=fields, max_asks=max_asks, grace_minutes=grace),
                      node("pronto", "end", outcome="converted"), node("desistiu", "end", outcome="exhausted"),
                      node("calado", "end", outcome="custom")],
            "edges": [edge("inicio", "pergunta"), edge("pergunta", "pronto", "complete"),
                      edge("pergunta", "desistiu", "gave_up"), edge("pergunta", "calado", "no_reply")]}


def sent(flows: Flows, enrollment_id: int) -> list[str]:
    return [(row.payload or {}).get("text") for row in flows.followups(enrollment_id)]


def exits(flows: Flows, enrollment_id: int) -> list[dict | None]:
    """The exit each step of the `ask` recorded (None: it stayed and asked)."""
    return [step.get("exit") for step in flows.steps(enrollment_id) if step["node"] == "pergunta"]


def reasons(flows: Flows, enrollment_id: int) -> list[str]:
    return [step["reason"] for step in flows.steps(enrollment_id) if step["node"] == "pergunta"]



def test_fields_come_in_any_order_a_correction_wins_and_the_run_completes(world, flows, clock):
    run = flows.enroll(flows.flow(ask_graph(["data", "periodo"])), world.contact())
    flows.run()
    assert sent(flows, run) == ["Qual dia fica melhor para você?"]
    assert flows.enrollment(run).status == "waiting_reply"
    turn(flows, clock, "pode ser de manhã")  # the period first: the day is asked again
    assert sent(flows, run)[-1] == "Qual dia fica melhor para você?"
    assert flows.enrollment(run).data == {"periodo": "morning"}
    turn(flows, clock, "sexta não, quinta à tarde")  # a correction of the period, and the day
    done = flows.enrollment(run)
    assert (done.status, done.outcome, done.current_node_id) == ("completed", "converted", "pronto")
    assert done.data["periodo"] == "afternoon" and done.data["data"] is not None
    assert reasons(flows, run) == ["ask_question", "ask_question", "ask_complete"]
    assert done.llm_calls == 0 and done.ask_state is None
    assert exits(flows, run) == [None, None, {"type": "complete"}], "the step records the exit it took"


def test_a_field_asked_max_asks_times_gives_up(world, flows, clock):
    run = flows.enroll(flows.flow(ask_graph(["data"], max_asks=2)), world.contact())
    flows.run()
    turn(flows, clock, "não sei ainda")
    turn(flows, clock, "vou ver")
    done = flows.enrollment(run)
    assert (done.status, done.current_node_id) == ("completed", "desistiu")
    assert len(sent(flows, run)) == 2
    assert reasons(flows, run) == ["ask_question", "ask_question", "ask_gave_up"]
    assert exits(flows, run)[-1] == {"type": "gave_up"}
    assert flows.steps(run)[-2]["params"]["field"] == "data"


def test_no_reply_within_the_grace_takes_the_no_reply_exit(world, flows, clock):
    run = flows.enroll(flows.flow(ask_graph(["data"], grace=30)), world.contact())
    flows.run()
    clock.advance(timedelta(minutes=31))
    flows.run()
    assert flows.enrollment(run).current_node_id == "calado"
    assert exits(flows, run)[-1] == {"type": "no_reply"}


def test_fragments_within_the_debounce_are_one_turn(world, flows, clock):
    run = flows.enroll(flows.flow(ask_graph(["data", "periodo"])), world.contact())
    flows.run()
    flows.reply("oi")
    clock.advance(timedelta(seconds=3))
    flows.run()  # still inside the debounce: nothing read yet
    assert len(sent(flows, run)) == 1
    turn(flows, clock, "então", "dá pra ser sexta de manhã?")
    done = flows.enrollment(run)
    assert (done.current_node_id, done.data) == ("pronto", {"data": done.data["data"], "periodo": "morning"})
    assert reasons(flows, run) == ["ask_question", "ask_complete"], "three messages, one turn"
    assert len(sent(flows, run)) == 1


def test_a_value_the_type_refuses_is_explained_and_asked_again(world, flows, clock):
    run = flows.enroll(flows.flow(ask_graph(["data"])), world.contact())
    flows.run()
    turn(flows, clock, "dia 20/12/2025")
    assert sent(flows, run)[-1] == "Essa data já passou. Pode dizer um dia a partir de hoje?"
    assert reasons(flows, run)[-1] == "ask_value_refused"
    assert flows.steps(run)[-1]["params"]["refused"] == "field_value_past"


def test_known_fields_are_not_asked_and_a_boolean_is_read_only_when_asked(world, flows, clock):
    run = flows.enroll(flows.flow(ask_graph(["periodo", "ok"])), world.contact())
    flows.run()
    turn(flows, clock, "sim, de tarde")  # "sim" answers the period question, not the boolean
    assert flows.enrollment(run).data == {"periodo": "afternoon"}
    assert sent(flows, run)[-1] == "Posso marcar assim?"
    turn(flows, clock, "sim")
    assert flows.enrollment(run).data == {"periodo": "afternoon", "ok": True}
    assert flows.enrollment(run).current_node_id == "pronto"


def test_asking_for_a_person_hands_the_conversation_to_staff(world, flows, clock, rt):
    run = flows.enroll(flows.flow(ask_graph(["data"])), world.contact())
    flows.run()
    turn(flows, clock, "quero falar com uma atendente")
    paused = flows.enrollment(run)
    assert paused.status == "paused_handoff" and len(sent(flows, run)) == 1
    with rt.db.connect() as conn:
        kinds = conn.execute(select(inbox_items.c.kind).where(inbox_items.c.org_id == world.org_id)).scalars().all()
    assert "handoff_requested" in kinds


def test_a_question_whose_time_ran_out_during_a_hand_off_is_asked_again_after_it(world, flows, clock, rt):
    run = flows.enroll(flows.flow(ask_graph(["data", "periodo"], grace=30), resume_grace_minutes=10),
                       world.contact())
    flows.run()
    turn(flows, clock, "quero falar com uma atendente")
    assert flows.enrollment(run).status == "paused_handoff"
    clock.advance(timedelta(hours=2))  # the person talks with the patient past the question's 30 min
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=flows.enrollment(run).contact_id,
                             type="handoff_ended")
    flows.run()
    assert flows.enrollment(run).status == "active" and len(sent(flows, run)) == 1, "the grace first"
    clock.advance(timedelta(minutes=11))
    flows.run()
    resumed = flows.enrollment(run)
    assert (resumed.status, resumed.current_node_id) == ("waiting_reply", "pergunta")
    assert sent(flows, run) == ["Qual dia fica melhor para você?"] * 2
    assert "resumed" in flows.events(run)


def test_an_opt_out_in_words_ends_the_run_and_opts_the_contact_out_as_sair_would(world, flows, clock, rt):
    contact = world.contact()
    run = flows.enroll(flows.flow(ask_graph(["data"])), contact)
    flows.run()
    waiting = flows.enroll(flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed",
                                                                            minutes=60),
                                              node("fim", "end", outcome="custom"))), contact)
    flows.run()
    turn(flows, clock, "não quero mais receber mensagens de vocês")
    done = flows.enrollment(run)
    assert (done.status, done.outcome) == ("cancelled", "opted_out")
    assert (flows.enrollment(waiting).status, flows.enrollment(waiting).outcome) == ("cancelled", "opted_out")
    with rt.db.connect() as conn:
        refused = conn.execute(select(preferences.c.kind, preferences.c.source).where(
            preferences.c.org_id == world.org_id, preferences.c.contact_id == contact,
            preferences.c.opted_out_at.is_not(None))).all()
        goodbye = conn.execute(select(messages.c.template_key).where(
            messages.c.org_id == world.org_id, messages.c.purpose == "optout_confirmation")).scalars().all()
    assert sorted(refused) == [("email", "flow_reply"), ("sms", "flow_reply"), ("whatsapp", "flow_reply")]
    assert goodbye == ["optout_confirmation"]


def test_a_flow_that_asks_for_an_unknown_field_is_not_published(world, flows, rt):
    with rt.db.begin() as conn:
        pointer = versions.create_flow(conn, world.org_id, name="Pergunta", draft_graph=ask_graph(["cor"]),
                                       trigger_config={"kind": "manual"})
    with pytest.raises(FlowRejected) as refused, rt.db.begin() as conn:
        versions.publish(conn, world.org_id, pointer)
    assert [(i.node_id, i.code) for i in refused.value.issues] == [("pergunta", "unknown_field")]


def test_another_orgs_fields_do_not_exist_for_a_flow(world, rt):
    other = World(rt, slug="outra")
    with rt.db.begin() as conn:
        pointer = versions.create_flow(conn, other.org_id, name="Pergunta", draft_graph=ask_graph(["data"]),
                                       trigger_config={"kind": "manual"})
    with pytest.raises(FlowRejected), rt.db.begin() as conn:
        versions.publish(conn, other.org_id, pointer)


def test_the_floor_one_run_asks_at_a_time_the_answer_is_its_alone_and_the_next_asks_after(world, flows, clock):
    contact = world.contact()
    first = flows.enroll(flows.flow(ask_graph(["data"])), contact)
    flows.run()
    second = flows.enroll(flows.flow(ask_graph(["periodo"])), contact)
    other = flows.enroll(flows.flow({"nodes": [node("inicio", "trigger"),
                                               node("msg", "action", mode="template", template="followup_checkin"),
                                               node("fim", "end", outcome="custom")],
                                     "edges": [edge("inicio", "msg"), edge("msg", "fim")]}), contact)
    flows.run()
    assert sent(flows, second) == [] and flows.enrollment(second).status == "active"
    assert [s["reason"] for s in flows.steps(second) if s["node"] == "pergunta"] == ["floor_busy"]
    assert flows.enrollment(other).status == "completed", "a run that asks nothing goes on beside it"
    clock.advance(timedelta(minutes=3))
    flows.run()
    assert sent(flows, second) == [], "still waiting"
    assert [s["reason"] for s in flows.steps(second) if s["node"] == "pergunta"] == ["floor_busy"], "said once"
    turn(flows, clock, "quinta de manhã")  # answers the run that asked; "de manhã" is not taken by the other
    assert flows.enrollment(first).current_node_id == "pronto"
    assert flows.enrollment(second).data == {} and flows.enrollment(second).pending_inbound_id is None
    clock.advance(timedelta(minutes=1, seconds=1))
    flows.run()
    assert sent(flows, second) == ["De manhã, à tarde ou à noite?"]
    assert flows.enrollment(second).status == "waiting_reply"


def test_a_turn_reads_the_org_once_a_stage_and_looks_for_no_voice_note_in_a_text(world, flows, clock, rt):
    """A turn — a text reply read by the `ask`, its next question queued and sent — reads the
    org's row once where the reply is acted on (with the channel's kind, in the same statement),
    once for the step (which also places the question in the sending window with it) and once for
    the send; a text reply is read once, with its lock, not looked at first for a voice note; the
    question gets one `queued` event, from the planner that placed it."""
    run = flows.enroll(flows.flow(ask_graph(["data", "periodo"])), world.contact())
    flows.run()
    seen: list[str] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        seen.append(" ".join(statement.split()).upper())

    event.listen(rt.db.engine, "before_cursor_execute", note)
    try:
        assert flows.reply("pode ser de manhã") == ["free_text"]
        replying, seen[:] = list(seen), []
        clock.advance(DEBOUNCE)
        flows.run()
        stepping = list(seen)
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", note)
    assert sent(flows, run)[-1] == "Qual dia fica melhor para você?"
    assert not [s for s in replying if "VOICE_STATE =" in s], replying
    assert len([s for s in replying if "FROM INBOUND_MESSAGES" in s]) == 1, replying
    assert len([s for s in replying if " FROM ORGS " in s]) == 1, replying
    assert not [s for s in replying if " FROM CHANNELS " in s and "SELECT CHANNELS.ID" not in s], replying
    assert len([s for s in stepping if " FROM ORGS " in s]) == 2, stepping  # the step's, the send's
    question = flows.followups(run)[-1].id
    with rt.db.connect() as conn:
        events = conn.execute(select(message_events.c.event).where(
            message_events.c.org_id == world.org_id, message_events.c.message_id == question)).scalars().all()
    assert events.count("queued") == 1, events
