"""The `ask` node with an agent's model (the loopback Chat Completions fake): the model reads each
turn and, when the node says so, phrases the question; at most two calls a turn, counted on the
run; the patient's text goes only in the user message; a model that answers off-schema leaves the
built-in reading in charge; nothing is asked of the model while a person holds the conversation."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from engine.flows import triggers
from engine.flows.agents import create_agent
from engine.flows.ai.factory import ai_for
from engine.flows.conversation.fields import create_field
from tests.factories import World
from tests.fakes.llm import LLMFake
from tests.flows.helpers import Flows, edge, node

ANY_HOUR = {"quiet_start": "00:00", "quiet_end": "23:59", "skip_sundays": False, "skip_holidays": False}
FRIDAY = {"intent": "reschedule", "confidence": 0.9, "date": "2026-12-11", "time": None, "period": None}
MORNING = {"intent": "other", "confidence": 0.9, "date": None, "time": None, "period": "morning"}


def graph(phrasing: str) -> dict:
    return {"nodes": [node("inicio", "trigger"),
                      node("pergunta", "ask", fields=["data", "periodo"], phrasing=phrasing, grace_minutes=60),
                      node("pronto", "end", outcome="converted"), node("desistiu", "end", outcome="exhausted"),
                      node("calado", "end", outcome="custom")],
            "edges": [edge("inicio", "pergunta"), edge("pergunta", "pronto", "complete"),
                      edge("pergunta", "desistiu", "gave_up"), edge("pergunta", "calado", "no_reply")]}


@pytest.fixture
def llm():
    with LLMFake() as fake:
        yield fake


@pytest.fixture
def setup(rt, clock, llm):
    world = World(rt, **ANY_HOUR)
    world.channel("whatsapp")
    with rt.db.begin() as conn:
        create_field(conn, world.org_id, {"slug": "data", "label": "Data", "type": "date",
                                          "question": "Qual dia fica melhor para você?"})
        create_field(conn, world.org_id, {"slug": "periodo", "label": "Período", "type": "period",
                                          "question": "De manhã, à tarde ou à noite?"})
    flows = Flows(world, ai=lambda agent: ai_for(agent, rt.keyring, timeout=2, egress=rt.settings.egress))
    return world, flows


def start(rt, world, flows, llm, phrasing: str) -> int:
    flow = flows.flow(graph(phrasing), agent=False)
    with rt.db.begin() as conn:
        agent = create_agent(conn, rt.keyring, world.org_id, name="Assistente", llm_base_url=llm.base_url,
                             llm_model="llama3", llm_api_key="sk-test", followup_enabled=True, flow_ids=[flow])
    flows.agent_id = agent
    contact = world.contact()
    with rt.db.begin() as conn:
        result = triggers.enroll(conn, world.org_id, flow, contact, trigger_kind="event", trigger_key="t1")
    assert result.created, result.reason
    return result.enrollment_id


def turn(flows, clock, text: str) -> None:
    flows.reply(text)
    clock.advance(timedelta(seconds=9))
    flows.run()


def test_the_model_reads_each_turn_and_phrases_each_question(rt, setup, llm, clock):
    world, flows = setup
    llm.script({"mensagem": "Oi! Que dia seria bom para você?"})
    run = start(rt, world, flows, llm, "ai")
    flows.run()
    assert [m.body for m in world.sandbox()] == ["Oi! Que dia seria bom para você?"]
    assert flows.enrollment(run).llm_calls == 1
    llm.script(FRIDAY, {"mensagem": "E qual período prefere?"})
    turn(flows, clock, "dá pra ser sexta?")
    assert world.sandbox()[-1].body == "E qual período prefere?"
    assert flows.enrollment(run).llm_calls == 3, "two calls for the turn: read, phrase"
    llm.script(MORNING)
    turn(flows, clock, "cedinho")  # the built-in reader would find no period here: the model's reading counts
    done = flows.enrollment(run)
    assert (done.current_node_id, done.data) == ("pronto", {"data": "2026-12-11", "periodo": "morning"})
    assert done.llm_calls == 4 and len(llm.calls) == 4
    for call in llm.calls:
        system = " ".join(m["content"] for m in call.body["messages"] if m["role"] == "system")
        assert "sexta" not in system and "cedinho" not in system, "the patient's text is data, never instructions"
    reading = [c for c in llm.calls if c.kind is None]
    assert any("cedinho" in m["content"] for m in reading[-1].body["messages"] if m["role"] == "user")


def test_an_answer_off_the_schema_leaves_the_built_in_reading(rt, setup, llm, clock):
    world, flows = setup
    run = start(rt, world, flows, llm, "question")
    flows.run()
    assert flows.enrollment(run).llm_calls == 0, "a plain question asks nothing of the model"
    llm.script({"intent": "confirm", "confidence": 2, "date": "amanhã"})
    turn(flows, clock, "pode ser sexta de manhã?")
    done = flows.enrollment(run)
    assert (done.current_node_id, done.data["periodo"]) == ("pronto", "morning")
    assert date.fromisoformat(done.data["data"]).weekday() == 4, "the built-in reading's Friday"
    assert done.llm_calls == 1
