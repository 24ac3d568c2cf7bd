"""Intent triggers: a patient's free text that no run is reading starts the org's flow bound to
what it means, and that flow reads the message as its first reply — "posso remarcar para sexta de
manhã?" gets free Friday mornings back, not a question it already answered."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select

from engine.flows.contact_events import record_contact_event
from engine.people.agenda import create_professional
from engine.store.models import appointments, enrollments, inbound_messages
from tests.factories import World
from tests.flows.helpers import Flows, conversation_fields, edge, node, turn

SP = ZoneInfo("America/Sao_Paulo")
BOOKED_AT = datetime(2026, 12, 3, 14, 0, tzinfo=SP)  # T0 is Tuesday 2026-12-01 09:00 in São Paulo


@pytest.fixture
def world(rt, clock):
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    world.channel("whatsapp")
    conversation_fields(rt, world.org_id,
                        {"slug": "data", "label": "Data", "type": "date", "question": "Qual dia fica melhor para você?"},
                        {"slug": "periodo", "label": "Período", "type": "period", "question": "De manhã ou à tarde?"})
    with rt.db.begin() as conn:
        world.professional_id = create_professional(
            conn, world.org_id, name="Dra. Beatriz Costa", slot_minutes=30,
            hours=[{"weekday": d, "starts": "08:00", "ends": "12:00"} for d in range(5)]).id
    return world


@pytest.fixture
def flows(world):
    return Flows(world)


def remarcar(flows: Flows, repeat: str = "always", name: str = "Remarcar") -> int:
    graph = {"nodes": [node("inicio", "trigger"), node("quando", "ask", fields=["data", "periodo"]),
                       node("oferta", "do", action="offer_slots", date_field="data", period_field="periodo"),
                       node("remarca", "do", action="move"), node("feito", "end", outcome="converted"),
                       node("falhou", "end", outcome="exhausted")],
             "edges": [edge("inicio", "quando"), edge("quando", "oferta", "complete"),
                       edge("quando", "falhou", "gave_up"), edge("quando", "falhou", "no_reply"),
                       edge("oferta", "remarca", "ok"), edge("oferta", "falhou", "unavailable"),
                       edge("oferta", "falhou", "failed"), edge("oferta", "falhou", "no_reply"),
                       edge("remarca", "feito", "ok"), edge("remarca", "falhou", "unavailable"),
                       edge("remarca", "falhou", "failed")]}
    return flows.flow(graph, name=name, trigger={"kind": "intent", "intent": "reschedule", "repeat": repeat})


def runs(flows: Flows) -> list:
    with flows.rt.db.connect() as conn:
        return list(conn.execute(select(enrollments).where(enrollments.c.org_id == flows.org_id)
                                 .order_by(enrollments.c.id)))


def test_a_wish_to_reschedule_starts_the_flow_which_reads_the_message_itself(world, flows, clock, rt):
    remarcar(flows)
    contact = world.contact()
    appt = world.appointment(contact, BOOKED_AT, professional_id=world.professional_id)
    turn(flows, clock, "posso remarcar para sexta de manhã?")
    [run] = runs(flows)
    assert (run.trigger_kind, run.appointment_id, run.current_node_id) == ("intent", appt, "oferta")
    assert run.data["periodo"] == "morning" and run.data["data"] == "2026-12-04"
    texts = [(row.payload or {}).get("text") for row in flows.followups(run.id)]
    assert len(texts) == 1 and texts[0].splitlines()[1] == "1. sexta-feira, 04/12 às 08:00 (Dra. Beatriz Costa)"
    with rt.db.connect() as conn:
        held = conn.execute(select(inbound_messages.c.flow_enrollment_id).where(
            inbound_messages.c.org_id == world.org_id)).scalars().all()
    assert held == [run.id], "Conversas shows the message as the flow's, not as waiting for a person"
    turn(flows, clock, "1")
    with rt.db.connect() as conn:
        moved = conn.execute(select(appointments.c.starts_at).where(appointments.c.id == appt)).scalar_one()
    assert moved.astimezone(SP) == datetime(2026, 12, 4, 8, 0, tzinfo=SP)
    assert len(runs(flows)) == 1, "the pick went to the run, it did not start another"


def test_other_intents_a_person_holding_the_conversation_and_the_repeat_policy_start_nothing(world, flows, clock,
                                                                                              rt):
    remarcar(flows, repeat="once")
    contact = world.contact()
    world.appointment(contact, BOOKED_AT, professional_id=world.professional_id)
    turn(flows, clock, "qual o endereço da clínica?")
    assert runs(flows) == []
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="handoff_started")
    turn(flows, clock, "dá pra remarcar?")
    assert runs(flows) == [], "a person holds the conversation"
    with rt.db.begin() as conn:
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="handoff_ended")
    turn(flows, clock, "dá pra remarcar?")
    assert len(runs(flows)) == 1
    clock.advance(timedelta(days=1))  # the run gave up by now or not: `once` starts it once
    flows.run()
    turn(flows, clock, "quero remarcar")
    assert len(runs(flows)) == 1


def test_another_orgs_intent_flow_never_starts_for_this_org(world, flows, clock, rt):
    other = World(rt, slug="outra")
    other.channel("whatsapp")
    conversation_fields(rt, other.org_id, {"slug": "data", "label": "Data", "type": "date", "question": "Dia?"},
                        {"slug": "periodo", "label": "Período", "type": "period", "question": "Período?"})
    remarcar(Flows(other))
    contact = world.contact()
    world.appointment(contact, BOOKED_AT, professional_id=world.professional_id)
    turn(flows, clock, "posso remarcar para sexta?")
    assert runs(flows) == [] and runs(Flows(other)) == []


def test_one_message_starts_one_conversation_when_two_flows_share_an_intent(world, flows, clock, rt):
    first = remarcar(flows)
    remarcar(flows, name="Remarcar outra vez")
    contact = world.contact()
    world.appointment(contact, BOOKED_AT, professional_id=world.professional_id)
    turn(flows, clock, "posso remarcar para sexta de manhã?")
    [run] = runs(flows)
    assert run.pointer_id == first, "the oldest flow bound to the intent takes the message"
    assert len(flows.followups(run.id)) == 1, "one offer, not two flows talking over each other"
