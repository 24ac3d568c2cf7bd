"""A worker's send threads apart from its conversation threads: a follow-up step waiting on a
slow LLM holds a conversation thread, and the reminders due meanwhile still go out."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Iterator

import pytest

from admin.embedded import Embedded
from engine.flows import triggers
from engine.flows.agents import create_agent
from engine.runtime import Runtime
from tests.factories import World, local
from tests.fakes.llm import LLMFake
from tests.fakes.server import FakeServer, Recorded, Reply
from tests.flows.helpers import Flows
from tests.flows.test_ai_flows import ANY_HOUR, ai_graph
from tests.processes import wait_until

APPOINTMENT = local(2026, 12, 3, 14, 0)
DUE = local(2026, 12, 2, 14, 0)


class HeldLLM(FakeServer):
    """The Chat Completions fake, holding every answer until the test lets it go."""

    def __init__(self) -> None:
        self.llm = LLMFake(write=lambda call: "Oi! Quer agendar seu horário?")
        self.asked = threading.Event()
        self.release = threading.Event()
        self.answered = threading.Event()
        super().__init__(self._answer)

    def _answer(self, request: Recorded) -> Reply:
        self.asked.set()
        self.release.wait(timeout=15)  # below the engine's 20 s LLM timeout
        self.answered.set()
        return self.llm(request)


@pytest.fixture
def held_llm() -> Iterator[HeldLLM]:
    with HeldLLM() as server:
        yield server
        server.release.set()


def test_a_follow_up_waiting_on_the_llm_does_not_hold_the_reminders_up(rt: Runtime, clock, held_llm):
    world = World(rt, **ANY_HOUR)
    world.channel("whatsapp")
    world.rule(1440)
    world.appointment(world.contact(name="Paciente do lembrete", phone="+5516999000101"), APPOINTMENT)
    [reminder] = world.messages()
    flows = Flows(world)
    flow = flows.flow(ai_graph(), agent=False)
    with rt.db.begin() as conn:
        create_agent(conn, rt.keyring, world.org_id, name="Assistente", llm_base_url=held_llm.url,
                     llm_model="llama3", llm_api_key="sk-test", followup_enabled=True, flow_ids=[flow])
    patient = world.contact(name="Paciente do fluxo")
    clock.set(DUE - timedelta(seconds=10))  # the follow-up is due first, the reminder 10 s later
    with rt.db.begin() as conn:
        enrolled = triggers.enroll(conn, world.org_id, flow, patient, trigger_kind="event", trigger_key="t1")
    assert enrolled.created, enrolled.reason

    embedded = Embedded(rt, worker_threads=1)  # one send thread, one conversation thread
    embedded.start_workers()
    try:
        embedded.scheduler.tick()  # hands out the follow-up step
        wait_until(held_llm.asked.is_set, timeout=30, what="the follow-up step asking the model")
        clock.set(DUE)
        embedded.scheduler.tick()  # and now the reminder
        wait_until(lambda: world.message(reminder.id).status == "sent", timeout=30,
                   what="the reminder sent while the only conversation thread waits on the model")
        assert not held_llm.answered.is_set() and [m.to_address for m in world.sandbox()] == ["+5516999000101"]

        held_llm.release.set()
        wait_until(lambda: len(world.messages()) == 2, timeout=30, what="the follow-up the model wrote, queued")
        embedded.scheduler.tick()
        wait_until(lambda: len(world.sandbox()) == 2, timeout=30, what="the follow-up sent")
        assert world.sandbox()[1].body == "Oi! Quer agendar seu horário?"
    finally:
        held_llm.release.set()
        embedded.stop_workers()
