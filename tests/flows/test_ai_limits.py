"""A slow or hostile model cannot hold the fleet (issue 30, point 7): a step whose model trickles its
answer, or answers 50 MB, ends at the call's deadline or size cap and backs off like any transient
failure; and while a model takes its time, `advance` holds no database connection, so no
transaction sits idle in it (on PostgreSQL: none of the test database's sessions is `idle in
transaction` while a loopback model holds its answer)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from engine.flows.agents import create_agent
from engine.flows.ai.factory import ai_for
from tests.conftest import IS_POSTGRES
from tests.factories import World
from tests.fakes.llm import CHAT_PATHS, Huge, LLMFake, Trickle
from tests.fakes.server import FakeServer, Recorded, Reply
from tests.flows.helpers import Flows
from tests.flows.test_ai_flows import ANY_HOUR, ROUTES, ai_graph

#: The worker's deadline in these tests (its default is 20 s), and a trickle that would take seconds.
DEADLINE = 0.5
PACE = 0.02


class Held:
    """A handler in front of the LLM fake that holds each chat call until the test lets it go."""

    def __init__(self, fake: LLMFake) -> None:
        self.fake = fake
        self.arrived = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: Recorded) -> Reply:
        if request.path in CHAT_PATHS:
            self.arrived.set()
            self.release.wait(60)
        return self.fake(request)


def _setup(rt: Any, base_url: str) -> tuple[World, Flows, int, int]:
    world = World(rt, **ANY_HOUR)
    world.channel("whatsapp")
    flows = Flows(world, ai=lambda agent: ai_for(agent, rt.keyring, timeout=DEADLINE, egress=rt.settings.egress))
    flow = flows.flow(ai_graph(), agent=False)
    with rt.db.begin() as conn:
        create_agent(conn, rt.keyring, world.org_id, name="Assistente", llm_base_url=base_url, llm_model="llama3",
                     llm_api_key="sk-test", followup_enabled=True, flow_ids=[flow])
    contact = world.contact()
    return world, flows, flow, flows.enroll(flow, contact)


@pytest.mark.parametrize(("answer", "code"), [
    (Trickle(PACE, {"label": "confirm"}), "timeout"),
    (Huge(50 * 1024 * 1024), "answer_too_large"),
], ids=["trickle", "50_mb"])
def test_a_model_that_trickles_or_floods_its_answer_defers_the_step_as_a_failure(rt, clock, answer, code):
    with LLMFake(classify=ROUTES, write=lambda call: "Oi! Quer agendar?") as llm:
        world, flows, flow, enrollment_id = _setup(rt, llm.base_url)
        flows.run()  # the model writes the follow-up; the run waits for the reply
        llm.script(answer)
        flows.reply("confirmo")
        flows.run()
        run = flows.enrollment(enrollment_id)
        assert (run.current_node_id, run.status, run.attempts, run.last_error) == (
            "ler", "waiting_reply", 1, "ai_unavailable")
        assert run.next_eval_at == clock.now() + timedelta(seconds=30)  # the first step of the backoff
        last = flows.steps(enrollment_id)[-1]
        assert (last["status"], last["reason"], last["params"]["code"]) == ("deferred", "ai_unavailable", code)
        [streamed] = llm.streams
        assert streamed.done.wait(30) and not streamed.finished  # the client hung up before the end

        llm.script()  # the model answers again: the step goes on at its next attempt
        clock.advance(timedelta(seconds=30))
        flows.run()
        assert flows.enrollment(enrollment_id).current_node_id == "confirm"


def _idle_in_transaction(database_url: str) -> int:
    # Its own connection (not the runtime's pool), in autocommit: it adds no transaction of its own.
    engine = create_engine(database_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'idle in transaction' AND pid <> pg_backend_pid()")).scalar_one())
    finally:
        engine.dispose()


def test_no_connection_nor_transaction_is_held_while_the_model_answers(rt, clock):
    held = Held(LLMFake(classify=ROUTES, write=lambda call: "Oi! Quer agendar?"))
    with FakeServer(held) as server:
        world, flows, flow, enrollment_id = _setup(rt, f"{server.url}/v1")
        flows.ai = lambda agent: ai_for(agent, rt.keyring, timeout=30, egress=rt.settings.egress)
        worker = threading.Thread(target=flows.tick)  # claims, reads, then asks the model to write
        worker.start()
        try:
            assert held.arrived.wait(30), "the step never called the model"
            checked_out = rt.db.engine.pool.checkedout()
            idle = _idle_in_transaction(rt.settings.database_url) if IS_POSTGRES else 0
        finally:
            held.release.set()
            worker.join(60)
        assert not worker.is_alive()
    assert checked_out == 0  # advance gave its connection back before the call
    assert idle == 0
    steps = flows.steps(enrollment_id)
    assert [s["reason"] for s in steps] == ["trigger_fired", "ai_message_queued"]
