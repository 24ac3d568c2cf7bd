"""A reply answered by the worker that read it (engine/messaging/turn.py): the run it made due is
claimed and advanced, and what is due to the patient is claimed and sent, in the same actor run,
with no scheduler pass; a reply an `ask` must wait the debounce for is left to the scheduler; a
claim the scheduler took first is not taken twice; a worker killed between the claim and the step
leaves a claim the sweep puts back free; another tenant's reply claims nothing of this one."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Iterator

import pytest
from sqlalchemy import select

from admin.embedded import Embedded
from engine.flows import runtime
from engine.flows.conversation.fields import create_field
from engine.flows.replies import set_reply_debounce
from engine.messaging import dispatch, turn
from engine.messaging.inbound import process_inbound, receive
from engine.store.models import enrollment_events, message_events
from gateway.contract import WebhookRequest
from tests.factories import World, sandbox_headers
from tests.flows.helpers import Flows, edge, node

PHONE = "+5516999887766"
FIRST, SECOND = "De manhã, à tarde ou à noite?", "Qual dia fica melhor para você?"


def _world(rt: Any, slug: str) -> World:
    world = World(rt, slug=slug, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    world.channel("whatsapp")
    with rt.db.begin() as conn:
        create_field(conn, world.org_id, {"slug": "periodo", "label": "Período", "type": "period", "question": FIRST})
        create_field(conn, world.org_id, {"slug": "data", "label": "Data", "type": "date", "question": SECOND})
    return world


def _asking(world: World, *, debounce: int = 0) -> tuple[Flows, int]:
    """A run at an `ask` for the period, then the day, its first question sent."""
    flows = Flows(world)
    with world.rt.db.begin() as conn:
        set_reply_debounce(conn, world.org_id, debounce)
    graph = {"nodes": [node("inicio", "trigger"), node("pergunta", "ask", fields=["periodo", "data"], max_asks=3),
                       node("pronto", "end", outcome="converted"), node("desistiu", "end", outcome="exhausted"),
                       node("calado", "end", outcome="custom")],
             "edges": [edge("inicio", "pergunta"), edge("pergunta", "pronto", "complete"),
                       edge("pergunta", "desistiu", "gave_up"), edge("pergunta", "calado", "no_reply")]}
    run = flows.enroll(flows.flow(graph), world.contact(phone=PHONE))
    flows.run()
    assert _texts(flows, run) == [(FIRST, "sent")]
    return flows, run


def _store(world: World, text: str, wamid: str) -> list[int]:
    """The patient writes on the sandbox channel: the webhook stores it (not yet processed)."""
    channel_id = world.channels["whatsapp"]
    body = {"type": "message", "id": wamid, "from": PHONE, "text": text, "timestamp": 1_800_000_000}
    request = WebhookRequest(method="POST", url="/webhooks/sandbox", headers=sandbox_headers(world.rt, channel_id),
                             body=json.dumps(body).encode())
    return list(receive(world.rt, "sandbox", channel_id, request).inbound_ids)


def _texts(flows: Flows, run: int) -> list[tuple[str, str]]:
    return [((row.payload or {}).get("text"), row.status) for row in flows.followups(run)]


def _claimed_events(rt: Any, message_id: int) -> int:
    with rt.db.connect() as conn:
        return len(conn.execute(select(message_events.c.id).where(
            message_events.c.message_id == message_id, message_events.c.event == "claimed")).all())


@pytest.fixture(autouse=True)
def quiet_process(monkeypatch) -> None:
    """This process has read no reply lately (other tests in it may have)."""
    monkeypatch.setattr(turn, "recent", turn.RecentReplies())


@pytest.fixture
def world(rt, clock) -> World:
    return _world(rt, "clinica")


@pytest.fixture
def embedded(rt) -> Iterator[Embedded]:
    """The embedded default's in-process worker, its scheduler never run: what happens, the
    actors did."""
    embedded = Embedded(rt, worker_threads=1)
    embedded.start_workers()
    try:
        yield embedded
    finally:
        embedded.stop_workers()


def test_the_worker_that_reads_a_reply_asks_the_next_question_without_a_scheduler_pass(world, embedded):
    flows, run = _asking(world)
    embedded.enqueue_inbound(_store(world, "pode ser de manhã", "in-1"))
    embedded.drain()
    assert _texts(flows, run) == [(FIRST, "sent"), (SECOND, "sent")]
    assert [(s["node"], s["reason"]) for s in flows.steps(run)][-1] == ("pergunta", "ask_question")
    [_, second] = flows.followups(run)
    assert _claimed_events(world.rt, second.id) == 1
    done = flows.enrollment(run)
    assert (done.status, done.lease_until, done.attempts, done.data) == ("waiting_reply", None, 0,
                                                                          {"periodo": "morning"})
    # A scheduler pass after it finds nothing left to do.
    assert flows.tick() == 0 and dispatch.claim_due(world.rt, limit=100) == []


def test_a_turn_the_ask_must_wait_the_debounce_for_is_the_schedulers(world, embedded, clock):
    flows, run = _asking(world, debounce=8)
    embedded.enqueue_inbound(_store(world, "pode ser de manhã", "in-1"))
    embedded.drain()
    assert _texts(flows, run) == [(FIRST, "sent")], "read before the patient's other fragments could come"
    assert flows.enrollment(run).lease_until is None
    clock.advance(timedelta(seconds=9))
    flows.run()
    assert _texts(flows, run) == [(FIRST, "sent"), (SECOND, "sent")]


def test_a_reply_that_waited_in_the_queue_or_comes_to_a_busy_process_is_left_to_the_schedulers_batches(
        world, clock, monkeypatch):
    flows, run = _asking(world)
    [late] = _store(world, "pode ser de manhã", "in-1")
    process_inbound(world.rt, late)
    clock.advance(turn.ANSWER_NOW_WITHIN + timedelta(milliseconds=1))  # the workers were behind
    turn.answer_now(world.rt, late)
    assert _texts(flows, run) == [(FIRST, "sent")] and flows.enrollment(run).lease_until is None
    flows.run()
    assert _texts(flows, run) == [(FIRST, "sent"), (SECOND, "sent")]

    instants = iter([0.0, 0.1, 0.2, 0.3, 0.4, 1.35])
    recent = turn.RecentReplies(lambda: next(instants))
    assert [recent.quiet() for _ in range(5)] == [True] * turn.BUSY_REPLIES + [False] * (5 - turn.BUSY_REPLIES)
    assert recent.quiet(), "a second on, only the reply read at 0.4 s still counts"
    monkeypatch.setattr(turn, "recent", turn.RecentReplies(lambda: 5.0))
    for _ in range(turn.BUSY_REPLIES):
        turn.recent.quiet()
    [busy] = _store(world, "amanhã", "in-2")
    process_inbound(world.rt, busy)
    turn.answer_now(world.rt, busy)
    assert flows.enrollment(run).lease_until is None and len(flows.steps(run)) == 3, "no step of its own"


def test_a_claim_the_scheduler_took_first_is_not_taken_again(world, clock):
    flows, run = _asking(world)
    [inbound_id] = _store(world, "pode ser de manhã", "in-1")
    assert process_inbound(world.rt, inbound_id) == "free_text"
    claims = runtime.claim_due(world.rt, limit=10)  # a scheduler pass, between the commit and the answer
    assert [enrollment_id for enrollment_id, _ in claims] == [run]
    turn.answer_now(world.rt, inbound_id)
    assert flows.steps(run)[-1]["reason"] == "ask_question" and len(flows.steps(run)) == 2, "no step of its own"
    assert _texts(flows, run) == [(FIRST, "sent")]
    runtime.advance_claimed(world.rt, claims)
    ids = dispatch.claim_due(world.rt, limit=10)
    assert len(ids) == 1
    turn.answer_now(world.rt, inbound_id)  # again: the question is the scheduler's claim now
    assert _claimed_events(world.rt, ids[0]) == 1
    dispatch.send_batch(world.rt, ids)
    assert _texts(flows, run) == [(FIRST, "sent"), (SECOND, "sent")]
    assert [s["reason"] for s in flows.steps(run)].count("ask_question") == 2


def test_a_worker_killed_between_its_claim_and_the_step_leaves_the_run_to_the_sweep_free(world, clock):
    flows, run = _asking(world)
    [inbound_id] = _store(world, "pode ser de manhã", "in-1")
    process_inbound(world.rt, inbound_id)
    # answer_now's claim, and then nothing: the worker died before `advance_claimed` started it.
    assert [enrollment_id for enrollment_id, _ in runtime.claim_replied(world.rt, world.org_id, inbound_id)] == [run]
    assert runtime.claim_due(world.rt, limit=10) == [], "leased: no scheduler pass takes it meanwhile"
    clock.advance(world.rt.settings.lease + timedelta(seconds=1))
    assert runtime.sweep_lost(world.rt) == runtime.Swept(lost=0, requeued=1)
    flows.run()
    assert _texts(flows, run) == [(FIRST, "sent"), (SECOND, "sent")]
    done = flows.enrollment(run)
    assert done.attempts == 0 and [s["reason"] for s in flows.steps(run)].count("ask_question") == 2
    with world.rt.db.connect() as conn:
        requeued = conn.execute(select(enrollment_events.c.event_type).where(
            enrollment_events.c.enrollment_id == run, enrollment_events.c.event_type == "requeued")).all()
    assert len(requeued) == 1


def test_another_tenants_reply_claims_nothing_of_this_one(rt, world, clock):
    flows, run = _asking(world)
    other = _world(rt, "outra")
    other_flows, other_run = _asking(other)
    [inbound_id] = _store(world, "pode ser de manhã", "in-1")
    process_inbound(rt, inbound_id)
    # The same reply id with the other org's: not its run.
    assert runtime.claim_replied(rt, other.org_id, inbound_id) == []
    runtime.advance_claimed(rt, runtime.claim_replied(rt, world.org_id, inbound_id))
    [question] = [row for row in flows.followups(run) if row.status == "pending"]  # due now
    # The same patient with the other org's: not their question.
    assert dispatch.claim_for_contact(rt, other.org_id, question.contact_id) == []
    turn.answer_now(rt, inbound_id)  # the run already stepped: it claims and sends the question
    assert _texts(flows, run) == [(FIRST, "sent"), (SECOND, "sent")]
    assert _texts(other_flows, other_run) == [(FIRST, "sent")] and other_flows.enrollment(other_run).lease_until is None
