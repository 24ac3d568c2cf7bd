"""The builder's rehearsal (engine/messaging/rehearsal.py): the flow's own engine plays the conversation,
shows what the patient would read and what each reply was understood as and which exit it took,
and leaves nothing behind — no row, no broker message, no clock moved."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import func, select

from engine.core import clock as engine_clock
from engine.flows import versions
from engine.messaging import rehearsal
from engine.flows.ai.factory import ai_for
from engine.messaging.rehearsal import RehearsalRefused, rehearse
from engine.flows.versions import FlowNotFound, FlowRejected
from engine.people.agenda import create_professional
from engine.store import models
from engine.tenants.webhooks.endpoints import create_endpoint
from tests.factories import World
from tests.fakes.llm import LLMFake
from tests.flows.helpers import Flows, conversation_fields, edge, node

QUESTION = "Qual dia fica melhor para você?"
TABLES = ("messages", "enrollments", "enrollment_events", "appointments", "contacts", "inbound_messages",
          "inbox_items", "webhook_deliveries", "flow_versions", "preferences", "flow_claims")


@pytest.fixture
def world(rt, clock):
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    world.channel("whatsapp")
    conversation_fields(rt, world.org_id, {"slug": "data", "label": "Data", "type": "date", "question": QUESTION},
                        {"slug": "periodo", "label": "Período", "type": "period", "question": "De manhã ou à tarde?"})
    with rt.db.begin() as conn:
        create_professional(conn, world.org_id, name="Dra. Beatriz Costa", slot_minutes=30,
                            hours=[{"weekday": d, "starts": s, "ends": e} for d in range(5)
                                   for s, e in (("08:00", "12:00"), ("14:00", "18:00"))])
    return world


def move_graph() -> dict:
    return {"nodes": [node("inicio", "trigger"), node("quando", "ask", fields=["data", "periodo"]),
                      node("oferta", "do", action="offer_slots", date_field="data", period_field="periodo"),
                      node("remarca", "do", action="move"), node("aviso", "do", action="notify_clinic", signal="moved"),
                      node("equipe", "do", action="notify_staff", note="Remarcou pelo fluxo"),
                      node("feito", "end", outcome="converted"), node("sem_vaga", "end", outcome="custom"),
                      node("falhou", "end", outcome="exhausted")],
            "edges": [edge("inicio", "quando"), edge("quando", "oferta", "complete"),
                      edge("quando", "falhou", "gave_up"), edge("quando", "falhou", "no_reply"),
                      edge("oferta", "remarca", "ok"), edge("oferta", "sem_vaga", "unavailable"),
                      edge("oferta", "falhou", "failed"), edge("oferta", "falhou", "no_reply"),
                      edge("remarca", "aviso", "ok"), edge("remarca", "sem_vaga", "unavailable"),
                      edge("remarca", "falhou", "failed"), edge("aviso", "equipe", "ok"),
                      edge("equipe", "feito", "ok")]}


def counts(rt) -> dict[str, int]:
    with rt.db.connect() as conn:
        return {name: conn.execute(select(func.count()).select_from(getattr(models, name))).scalar_one()
                for name in TABLES}


def patient(transcript) -> list:
    return [turn for turn in transcript.turns if turn.role == "patient"]


def bot(transcript) -> list[str | None]:
    return [turn.text for turn in transcript.turns if turn.role == "bot"]


def test_a_published_flow_is_replayed_through_the_engine_and_leaves_nothing(world, rt, clock):
    with rt.db.begin() as conn:  # the clinic's system listens: the move and the signal would be deliveries
        create_endpoint(conn, rt.keyring, world.org_id, url="http://127.0.0.1:9/hooks",
                        event_types=["appointment.moved", "run.notified", "run.ended"], egress=rt.settings.egress)
    flows = Flows(world)
    pointer = flows.flow(move_graph())
    before = counts(rt)
    started = clock.now()

    first = rehearse(rt, world.org_id, pointer, version="published", replies=[])
    assert bot(first) == [QUESTION] and first.waiting and first.node == "quando"

    done = rehearse(rt, world.org_id, pointer, version="published", replies=["quinta de manhã", "2"])
    asked, picked = patient(done)
    assert asked.fields == {"data": "2026-12-03", "periodo": "morning"}
    assert asked.intent is not None and asked.exit == {"type": "complete"} and asked.next_node == "oferta"
    offer = bot(done)[1]
    assert offer.startswith("Tenho estes horários livres:\n1. quinta-feira, 03/12 às 08:00 (Dra. Beatriz Costa)")
    assert "10:00" not in offer, "the synthetic appointment's own time is taken"
    assert picked.node == "oferta" and picked.reason == "do_slot_picked" and picked.exit == {"type": "ok"}
    assert "slot" in picked.fields
    assert (done.status, done.node, done.outcome, done.waiting) == ("completed", "feito", "converted", False)
    assert [(step["node"], step["reason"]) for step in picked.path] == [
        ("oferta", "do_slot_picked"), ("remarca", "do_moved"), ("aviso", "do_clinic_notified"),
        ("equipe", "do_staff_notified")]
    # Nothing stays: no run, outbox row, moved appointment, webhook delivery; the clock did not move.
    assert counts(rt) == before
    assert clock.now() == started


def test_the_draft_is_rehearsed_without_being_published(world, rt):
    flows = Flows(world)
    pointer = flows.flow(move_graph(), publish=False)
    done = rehearse(rt, world.org_id, pointer, version="draft", replies=["quinta à tarde", "1"])
    assert done.outcome == "converted"
    with rt.db.connect() as conn:
        assert versions.list_versions(conn, world.org_id, pointer) == []
        assert versions.get_flow(conn, world.org_id, pointer).active_version_id is None
    with pytest.raises(RehearsalRefused) as refused:
        rehearse(rt, world.org_id, pointer, version="published", replies=[])
    assert refused.value.code == "rehearsal_not_published"


def test_silence_takes_the_no_reply_exit(world, rt):
    pointer = Flows(world).flow(move_graph())
    done = rehearse(rt, world.org_id, pointer, version="published", replies=[None])
    [silent] = patient(done)
    assert silent.text is None and silent.exit == {"type": "no_reply"} and silent.next_node == "falhou"
    assert done.outcome == "exhausted"


def test_giving_up_shows_the_exit_the_engine_recorded(world, rt):
    # gave_up and no_reply both lead to `falhou`: the target alone cannot say which was taken.
    graph = move_graph()
    graph["nodes"][1]["config"]["max_asks"] = 1
    done = rehearse(rt, world.org_id, Flows(world).flow(graph), version="published", replies=["não sei"])
    [unsure] = patient(done)
    assert unsure.reason == "ask_gave_up" and unsure.exit == {"type": "gave_up"} and unsure.next_node == "falhou"


def test_a_draft_that_breaks_a_publish_rule_is_refused_with_its_issues(world, rt):
    graph = move_graph()
    graph["edges"] = [e for e in graph["edges"] if e["source"] != "quando"]
    pointer = Flows(world).flow(graph, publish=False)
    with pytest.raises(FlowRejected) as rejected:
        rehearse(rt, world.org_id, pointer, version="draft", replies=[])
    assert rejected.value.issues


def test_no_broker_message_is_sent(world, rt, monkeypatch):
    """Whatever broker the process has (the stub, or Redis on the PG run), a rehearsal hands it nothing."""
    import dramatiq

    from engine.fleet.broker import make_broker

    pointer = Flows(world).flow(move_graph())
    broker = make_broker(rt.settings)
    previous = dramatiq.get_broker()
    dramatiq.set_broker(broker)
    sent = []
    monkeypatch.setattr(broker, "enqueue", lambda message, **kw: sent.append(message))
    try:
        rehearse(rt, world.org_id, pointer, version="published", replies=["quinta de manhã", "1"])
    finally:
        dramatiq.set_broker(previous)
    assert sent == []


def test_another_orgs_flow_is_not_found(world, rt):
    pointer = Flows(world).flow(move_graph())
    other = World(rt, slug="outra")
    other.channel("whatsapp")
    with pytest.raises(FlowNotFound):
        rehearse(rt, other.org_id, pointer, version="published", replies=[])


@pytest.mark.parametrize("replies, code", [
    (["oi"] * (rehearsal.MAX_REPLIES + 1), "rehearsal_too_many_replies"),
    (["x" * (rehearsal.MAX_REPLY_CHARS + 1)], "rehearsal_reply_too_long"),
    ([""], "rehearsal_bad_replies"),
    ([3], "rehearsal_bad_replies"),
    ("oi", "rehearsal_bad_replies"),
])
def test_bad_replies_are_refused_before_anything_runs(world, rt, replies, code):
    pointer = Flows(world).flow(move_graph())
    before = counts(rt)
    with pytest.raises(RehearsalRefused) as refused:
        rehearse(rt, world.org_id, pointer, version="published", replies=replies)
    assert refused.value.code == code and str(refused.value.text)
    assert counts(rt) == before


def test_a_classifier_with_the_agents_model(world, rt, clock):
    graph = {"nodes": [node("inicio", "trigger"),
                       node("pergunta", "action", mode="ai_message", prompt_hint="Pergunte se confirma.",
                            fallback_template=None, max_chars=300),
                       node("resposta", "ai_classify", classes=["confirmar", "remarcar"], grace_minutes=60),
                       node("ok", "end", outcome="converted"), node("outro", "end", outcome="custom")],
             "edges": [edge("inicio", "pergunta"), edge("pergunta", "resposta"),
                       edge("resposta", "ok", "class_match", "confirmar"),
                       edge("resposta", "outro", "class_match", "remarcar"),
                       edge("resposta", "outro", "no_reply"), edge("resposta", "outro")]}
    from engine.flows.agents import create_agent

    with LLMFake() as llm:
        flows = Flows(world)
        pointer = flows.flow(graph, agent=False)
        with rt.db.begin() as conn:
            create_agent(conn, rt.keyring, world.org_id, name="Assistente", llm_base_url=llm.base_url,
                         llm_model="llama3", llm_api_key="sk-test", followup_enabled=True, flow_ids=[pointer])
        llm.script({"mensagem": "Olá! Podemos confirmar sua consulta?"}, {"label": "remarcar"})
        before = counts(rt)
        done = rehearse(rt, world.org_id, pointer, version="published", replies=["prefiro outro dia"],
                        ai=lambda agent: ai_for(agent, rt.keyring, timeout=2, egress=rt.settings.egress))
    assert bot(done)[0] == "Olá! Podemos confirmar sua consulta?"
    [reply] = patient(done)
    assert reply.label == "remarcar" and reply.exit == {"type": "class_match", "value": "remarcar"}
    assert (done.node, done.outcome) == ("outro", "custom")
    assert len(llm.calls) == 2
    assert counts(rt) == before


def test_the_local_clock_leaves_the_process_clock_alone(clock):
    own = engine_clock.FrozenClock(datetime(2030, 1, 1, tzinfo=engine_clock.UTC))
    with engine_clock.local(own):
        assert engine_clock.now() == own.now()
    assert engine_clock.now() == clock.now()


def test_an_intent_flow_reads_the_message_that_starts_it(world, rt):
    pointer = Flows(world).flow(move_graph(), trigger={"kind": "intent", "intent": "reschedule"})
    done = rehearse(rt, world.org_id, pointer, version="published", replies=["posso remarcar pra quinta de manhã?"])
    [first] = patient(done)
    assert turns_roles(done) == ["patient", "bot"], "no question: the message already said the day and the period"
    assert first.fields == {"data": "2026-12-03", "periodo": "morning"} and first.exit == {"type": "complete"}
    assert bot(done)[0].startswith("Tenho estes horários livres:") and done.waiting


def turns_roles(transcript) -> list[str]:
    return [turn.role for turn in transcript.turns]
