"""The `do` node: a flow offers the agenda's free times, the patient picks one, and the flow moves
or books the appointment — re-planning its reminders and telling the clinic's system in the same
transaction — or confirms, cancels, notifies the staff. Only an offered time can be picked; a time
taken meanwhile takes `unavailable`; two actors on one claim book once."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select

from engine.flows import runtime, triggers, versions
from engine.flows.versions import FlowRejected
from engine.people.agenda import create_professional
from engine.people.appointments import create_appointment, set_status
from engine.store.models import appointments, inbox_items, messages, webhook_deliveries
from engine.tenants.webhooks.endpoints import create_endpoint
from tests.factories import World
from tests.flows.helpers import DEBOUNCE, Flows, conversation_fields, edge, node, turn

SP = ZoneInfo("America/Sao_Paulo")
QUESTION = "Qual dia fica melhor para você?"
# T0 is Tuesday 2026-12-01 09:00 in São Paulo; Thursday the 3rd, 14:00 is the appointment.
BOOKED_AT = datetime(2026, 12, 3, 14, 0, tzinfo=SP)


@pytest.fixture
def world(rt, clock):
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    world.channel("whatsapp")
    world.rule(offset_minutes=1440)
    conversation_fields(rt, world.org_id, {"slug": "data", "label": "Data", "type": "date", "question": QUESTION},
                        {"slug": "periodo", "label": "Período", "type": "period", "question": "De manhã ou à tarde?"})
    with rt.db.begin() as conn:
        world.professional_id = create_professional(
            conn, world.org_id, name="Dra. Beatriz Costa", slot_minutes=30,
            hours=[{"weekday": d, "starts": s, "ends": e} for d in range(5)
                   for s, e in (("08:00", "12:00"), ("14:00", "18:00"))]).id
    return world


@pytest.fixture
def flows(world):
    return Flows(world)


def booked(world: World, **kwargs) -> tuple[int, int]:
    contact = world.contact()
    kwargs.setdefault("professional_id", world.professional_id)
    return contact, world.appointment(contact, BOOKED_AT, **kwargs)


def enroll(flows: Flows, pointer: int, contact: int, appointment: int) -> int:
    with flows.rt.db.begin() as conn:
        result = triggers.enroll(conn, flows.org_id, pointer, contact, trigger_kind="manual",
                                 trigger_key=f"manual:{appointment}", appointment_id=appointment, automatic=False)
    return result.enrollment_id


def move_graph(*, offer: dict | None = None) -> dict:
    return {"nodes": [node("inicio", "trigger"), node("quando", "ask", fields=["data", "periodo"]),
                      node("oferta", "do", action="offer_slots", date_field="data", period_field="periodo",
                           **(offer or {})),
                      node("remarca", "do", action="move"),
                      node("feito", "end", outcome="converted"), node("sem_vaga", "end", outcome="custom"),
                      node("falhou", "end", outcome="exhausted")],
            "edges": [edge("inicio", "quando"), edge("quando", "oferta", "complete"),
                      edge("quando", "falhou", "gave_up"), edge("quando", "falhou", "no_reply"),
                      edge("oferta", "remarca", "ok"), edge("oferta", "sem_vaga", "unavailable"),
                      edge("oferta", "falhou", "failed"), edge("oferta", "falhou", "no_reply"),
                      edge("remarca", "feito", "ok"), edge("remarca", "sem_vaga", "unavailable"),
                      edge("remarca", "falhou", "failed")]}


def sent(flows: Flows, run: int) -> list[str]:
    return [(row.payload or {}).get("text") for row in flows.followups(run)]


def reasons(flows: Flows, run: int) -> list[tuple[str, str]]:
    return [(step["node"], step["reason"]) for step in flows.steps(run) if step["node"] in ("oferta", "remarca",
                                                                                           "marca", "acao")]



def appointment(rt, org_id: int, appointment_id: int):
    with rt.db.connect() as conn:
        return conn.execute(select(appointments).where(appointments.c.org_id == org_id,
                                                       appointments.c.id == appointment_id)).one()


def reminders(rt, org_id: int, appointment_id: int) -> list[tuple[datetime, str]]:
    with rt.db.connect() as conn:
        rows = conn.execute(select(messages.c.appointment_starts_at, messages.c.status).where(
            messages.c.org_id == org_id, messages.c.appointment_id == appointment_id,
            messages.c.rule_id.is_not(None)).order_by(messages.c.id)).all()
    return [(row.appointment_starts_at.astimezone(SP), row.status) for row in rows]


def deliveries(rt, org_id: int) -> list[tuple[str, dict]]:
    with rt.db.connect() as conn:
        rows = conn.execute(select(webhook_deliveries.c.event_type, webhook_deliveries.c.payload).where(
            webhook_deliveries.c.org_id == org_id).order_by(webhook_deliveries.c.id)).all()
    return [(row.event_type, row.payload) for row in rows]


def subscribe(world: World, rt, *events: str) -> None:
    with rt.db.begin() as conn:
        create_endpoint(conn, rt.keyring, world.org_id, url="http://127.0.0.1:9/hooks", event_types=list(events),
                        egress=rt.settings.egress)


def test_a_reply_to_a_reminder_moves_the_appointment_to_a_time_offered_and_picked(world, flows, clock, rt):
    """S8: "não vou poder, dá pra quinta de manhã?" → the free Thursday mornings are offered →
    "2" → the appointment moves there, its reminders follow it, the clinic's system hears it."""
    subscribe(world, rt, "appointment.moved")
    contact, appt = booked(world)
    assert [status for _, status in reminders(rt, world.org_id, appt)] == ["pending"]
    run = enroll(flows, flows.flow(move_graph()), contact, appt)
    flows.run()
    assert sent(flows, run) == [QUESTION]
    turn(flows, clock, "não vou poder, dá pra quinta de manhã?")
    assert sent(flows, run)[1] == ("Tenho estes horários livres:\n"
                                   "1. quinta-feira, 03/12 às 08:00 (Dra. Beatriz Costa)\n"
                                   "2. quinta-feira, 03/12 às 09:30 (Dra. Beatriz Costa)\n"
                                   "3. quinta-feira, 03/12 às 11:30 (Dra. Beatriz Costa)\n"
                                   "Responda com o número do horário que preferir.")
    assert flows.enrollment(run).status == "waiting_reply"
    turn(flows, clock, "2")
    done = flows.enrollment(run)
    assert (done.status, done.current_node_id) == ("completed", "feito")
    assert appointment(rt, world.org_id, appt).starts_at.astimezone(SP) == datetime(2026, 12, 3, 9, 30, tzinfo=SP)
    assert reasons(flows, run) == [("oferta", "do_slots_offered"), ("oferta", "do_slot_picked"),
                                   ("remarca", "do_moved")]
    planned = reminders(rt, world.org_id, appt)
    assert (BOOKED_AT, "cancelled") in planned or (BOOKED_AT, "skipped") in planned, planned
    assert (datetime(2026, 12, 3, 9, 30, tzinfo=SP), "pending") in planned
    [(event, payload)] = deliveries(rt, world.org_id)
    assert event == "appointment.moved"
    assert payload["data"]["starts_at"].startswith("2026-12-03T09:30") and \
        payload["data"]["old_starts_at"].startswith("2026-12-03T14:00")
    assert len(sent(flows, run)) == 2 and done.llm_calls == 0


def test_a_time_taken_after_it_was_offered_takes_unavailable(world, flows, clock, rt):
    contact, appt = booked(world)
    run = enroll(flows, flows.flow(move_graph()), contact, appt)
    flows.run()
    turn(flows, clock, "quinta de manhã")
    other = world.contact(name="Outro Paciente", phone="+5516988887777", email=None)
    world.appointment(other, datetime(2026, 12, 3, 9, 30, tzinfo=SP), professional_id=world.professional_id)
    turn(flows, clock, "a segunda")
    done = flows.enrollment(run)
    assert done.current_node_id == "sem_vaga"
    assert reasons(flows, run)[-1] == ("remarca", "do_slot_taken")
    assert appointment(rt, world.org_id, appt).starts_at.astimezone(SP) == BOOKED_AT


def test_a_reply_that_picks_nothing_gets_the_list_again_then_the_failed_exit(world, flows, clock):
    contact, appt = booked(world)
    run = enroll(flows, flows.flow(move_graph(offer={"max_asks": 2})), contact, appt)
    flows.run()
    turn(flows, clock, "quinta de manhã")
    turn(flows, clock, "hmm deixa eu ver")
    assert sent(flows, run)[2] == sent(flows, run)[1], "the same list once more"
    turn(flows, clock, "7")  # not a number on the list
    assert flows.enrollment(run).current_node_id == "falhou"
    assert reasons(flows, run)[-1] == ("oferta", "do_no_pick")


def test_asking_for_another_day_offers_that_day(world, flows, clock):
    contact, appt = booked(world)
    run = enroll(flows, flows.flow(move_graph()), contact, appt)
    flows.run()
    turn(flows, clock, "quinta de manhã")
    turn(flows, clock, "tem na sexta à tarde?")
    assert sent(flows, run)[-1].splitlines()[1] == "1. sexta-feira, 04/12 às 14:00 (Dra. Beatriz Costa)"
    turn(flows, clock, "sexta 17h30")
    assert appointment(flows.rt, flows.org_id, appt).starts_at.astimezone(SP) == datetime(2026, 12, 4, 17, 30,
                                                                                          tzinfo=SP)


def test_no_free_time_takes_unavailable(world, flows, clock):
    contact, appt = booked(world)
    run = enroll(flows, flows.flow(move_graph()), contact, appt)
    flows.run()
    turn(flows, clock, "sábado de manhã")  # the professional does not work on Saturdays
    assert flows.enrollment(run).current_node_id == "sem_vaga"
    assert reasons(flows, run) == [("oferta", "do_no_free_slots")]


def test_a_no_show_is_rebooked_and_the_clinic_hears_of_the_new_appointment(world, flows, clock, rt):
    """S3: a missed appointment starts "Remarcar falta": the date and period are asked, free times
    offered, one picked, a new appointment booked; the run follows the new one."""
    subscribe(world, rt, "appointment.booked")
    graph = move_graph()
    graph["nodes"][3] = node("remarca", "do", action="book")
    flows.flow(graph, trigger={"kind": "appointment", "appointment_event": "no_show"})
    contact, appt = booked(world)
    clock.set(datetime(2026, 12, 3, 15, 0, tzinfo=SP))
    with rt.db.begin() as conn:
        set_status(conn, world.org_id, appt, "scheduled", "no_show")
    flows.run()
    [run] = [row.enrollment_id for row in flows.followups()]
    turn(flows, clock, "pode ser segunda de tarde")
    turn(flows, clock, "1")
    done = flows.enrollment(run)
    assert done.current_node_id == "feito" and done.appointment_id != appt
    new = appointment(rt, world.org_id, done.appointment_id)
    assert (new.status, new.professional_id, new.contact_id) == ("scheduled", world.professional_id, contact)
    assert new.starts_at.astimezone(SP) == datetime(2026, 12, 7, 14, 0, tzinfo=SP)
    assert appointment(rt, world.org_id, appt).status == "no_show"
    [(event, payload)] = deliveries(rt, world.org_id)
    assert event == "appointment.booked" and payload["data"]["replaces_appointment_id"] == appt
    assert [s for _, s in reminders(rt, world.org_id, new.id)] == ["pending"]


def test_two_actors_on_one_claim_move_the_appointment_once(world, flows, clock, rt):
    subscribe(world, rt, "appointment.moved")
    contact, appt = booked(world)
    run = enroll(flows, flows.flow(move_graph()), contact, appt)
    flows.run()
    turn(flows, clock, "quinta de manhã")
    flows.reply("1")
    clock.advance(DEBOUNCE)
    claims = runtime.claim_due(rt, limit=10)
    first = runtime.advance(rt, claims)  # the pick
    assert first[run].reason == "do_slot_picked"
    follow = [(run, first[run].continue_with)]
    steps = [runtime.advance(rt, follow), runtime.advance(rt, follow)]
    assert sorted(step[run].reason for step in steps) == ["do_moved", "stale_wake"]
    assert [event for event, _ in deliveries(rt, world.org_id)] == ["appointment.moved"]


def test_confirm_cancel_and_an_appointment_no_longer_booked(world, flows, rt):
    graph = {"nodes": [node("inicio", "trigger"), node("acao", "do", action="confirm"),
                       node("feito", "end", outcome="converted"), node("falhou", "end", outcome="exhausted")],
             "edges": [edge("inicio", "acao"), edge("acao", "feito", "ok"), edge("acao", "falhou", "failed")]}
    pointer = flows.flow(graph)
    contact, appt = booked(world)
    run = enroll(flows, pointer, contact, appt)
    flows.run()
    assert appointment(rt, world.org_id, appt).status == "confirmed"
    assert reasons(flows, run) == [("acao", "do_confirmed")]
    graph["nodes"][1] = node("acao", "do", action="cancel")
    cancel = flows.flow(graph)
    other_contact = world.contact(name="Bia", phone="+5516911112222", email=None)
    with rt.db.begin() as conn:
        gone = create_appointment(conn, org_id=world.org_id, contact_id=other_contact,
                                  starts_at=BOOKED_AT + timedelta(days=1), status="completed")
    for target, expected in ((appt, ("feito", "cancelled")), (gone, ("falhou", "completed"))):
        run = enroll(flows, cancel, contact if target == appt else other_contact, target)
        flows.run()
        assert (flows.enrollment(run).current_node_id, appointment(rt, world.org_id, target).status) == expected


def test_notify_staff_opens_a_pendencias_item_once(world, flows, rt):
    graph = {"nodes": [node("inicio", "trigger"), node("acao", "do", action="notify_staff",
                                                        note="Paciente quer remarcar: ligar hoje"),
                       node("feito", "end", outcome="converted")],
             "edges": [edge("inicio", "acao"), edge("acao", "feito", "ok")]}
    contact, appt = booked(world)
    run = enroll(flows, flows.flow(graph), contact, appt)
    flows.run()
    with rt.db.connect() as conn:
        items = conn.execute(select(inbox_items.c.kind, inbox_items.c.detail, inbox_items.c.enrollment_id).where(
            inbox_items.c.org_id == world.org_id)).all()
    assert [tuple(i) for i in items] == [("flow_notification", "Paciente quer remarcar: ligar hoje", run)]


def test_a_do_node_needs_the_exits_of_its_action(world, rt):
    graph = {"nodes": [node("inicio", "trigger"), node("acao", "do", action="move"),
                       node("fim", "end", outcome="custom")],
             "edges": [edge("inicio", "acao"), edge("acao", "fim", "ok"), edge("acao", "fim", "no_reply")]}
    with rt.db.begin() as conn:
        pointer = versions.create_flow(conn, world.org_id, name="Remarcar", draft_graph=graph,
                                       trigger_config={"kind": "manual"})
    with pytest.raises(FlowRejected) as refused, rt.db.begin() as conn:
        versions.publish(conn, world.org_id, pointer)
    assert sorted((i.node_id, i.code, tuple(sorted(i.params.items()))) for i in refused.value.issues) == [
        ("acao", "edge_not_allowed", (("condition", "no_reply"),)),
        ("acao", "missing_edge", (("which", "failed"),)),
        ("acao", "missing_edge", (("which", "unavailable"),)),
    ]


def test_an_offer_reads_only_its_orgs_fields_and_agenda(world, rt):
    other = World(rt, slug="outra")
    with rt.db.begin() as conn:
        pointer = versions.create_flow(conn, other.org_id, name="Oferta", draft_graph=move_graph(),
                                       trigger_config={"kind": "manual"})
    with pytest.raises(FlowRejected) as refused, rt.db.begin() as conn:
        versions.publish(conn, other.org_id, pointer)
    assert {(i.node_id, i.code) for i in refused.value.issues} == {("quando", "unknown_field"),
                                                                   ("oferta", "unknown_field")}


def test_set_stage_and_start_flow(world, flows, rt):
    from engine.store.models import contact_events, enrollments

    second = flows.flow({"nodes": [node("inicio", "trigger"), node("fim", "end", outcome="custom")],
                         "edges": [edge("inicio", "fim")]}, trigger={"kind": "manual", "repeat": "once"})
    graph = {"nodes": [node("inicio", "trigger"), node("etapa", "do", action="set_stage", stage="remarcando"),
                       node("outro", "do", action="start_flow", flow_id=second),
                       node("feito", "end", outcome="converted"), node("falhou", "end", outcome="exhausted")],
             "edges": [edge("inicio", "etapa"), edge("etapa", "outro", "ok"), edge("outro", "feito", "ok"),
                       edge("outro", "falhou", "failed")]}
    pointer = flows.flow(graph)
    contact, appt = booked(world)
    first = enroll(flows, pointer, contact, appt)
    flows.run()
    assert flows.enrollment(first).current_node_id == "feito"
    with rt.db.connect() as conn:
        stages = conn.execute(select(contact_events.c.payload).where(
            contact_events.c.org_id == world.org_id, contact_events.c.type == "stage_changed")).scalars().all()
        started = conn.execute(select(enrollments.c.trigger_kind, enrollments.c.appointment_id).where(
            enrollments.c.org_id == world.org_id, enrollments.c.pointer_id == second)).all()
    assert [p["stage"] for p in stages] == ["remarcando"]
    assert [tuple(r) for r in started] == [("flow", appt)]
    with rt.db.begin() as conn:  # the same contact again: `once` refuses, the failed exit is taken
        rerun = triggers.enroll(conn, flows.org_id, pointer, contact, trigger_kind="manual", trigger_key="again",
                                appointment_id=appt, automatic=False).enrollment_id
    flows.run()
    assert flows.enrollment(rerun).current_node_id == "falhou"
    assert [s["reason"] for s in flows.steps(rerun) if s["node"] == "outro"] == ["do_flow_not_started"]


def test_start_flow_never_starts_another_orgs_flow(world, flows, rt):
    other = World(rt, slug="outra")
    foreign = Flows(other).flow({"nodes": [node("inicio", "trigger"), node("fim", "end", outcome="custom")],
                                 "edges": [edge("inicio", "fim")]})
    graph = {"nodes": [node("inicio", "trigger"), node("outro", "do", action="start_flow", flow_id=foreign),
                       node("feito", "end", outcome="converted"), node("falhou", "end", outcome="exhausted")],
             "edges": [edge("inicio", "outro"), edge("outro", "feito", "ok"), edge("outro", "falhou", "failed")]}
    contact, appt = booked(world)
    run = enroll(flows, flows.flow(graph), contact, appt)
    flows.run()
    assert flows.enrollment(run).current_node_id == "falhou"


def test_notify_clinic_sends_the_signal_and_only_what_carries_no_personal_data(world, flows, clock, rt):
    subscribe(world, rt, "run.notified")
    conversation_fields(rt, world.org_id, {"slug": "obs", "label": "Observação", "type": "text",
                                           "question": "Quer deixar um recado?"})
    graph = {"nodes": [node("inicio", "trigger"), node("quando", "ask", fields=["data", "periodo", "obs"]),
                       node("avisa", "do", action="notify_clinic", signal="quer_remarcar"),
                       node("feito", "end", outcome="converted"), node("fim", "end", outcome="custom")],
             "edges": [edge("inicio", "quando"), edge("quando", "avisa", "complete"), edge("quando", "fim", "gave_up"),
                       edge("quando", "fim", "no_reply"), edge("avisa", "feito", "ok")]}
    contact, appt = booked(world)
    run = enroll(flows, flows.flow(graph), contact, appt)
    flows.run()
    turn(flows, clock, "quinta de manhã")
    turn(flows, clock, "Ana Clara, meu telefone é 16 99988-7766")
    assert flows.enrollment(run).current_node_id == "feito"
    [(event, data)] = deliveries(rt, world.org_id)
    assert event == "run.notified"
    assert (data["data"]["signal"], data["data"]["node_id"], data["data"]["appointment_id"]) == (
        "quer_remarcar", "avisa", appt)
    assert data["data"]["collected"] == {"data": "2026-12-03", "periodo": "morning"}, "the text stays home"


def test_a_menu_number_after_the_flows_list_is_not_a_reminder_keyword(world, flows, clock, rt):
    """The patient picks "1" and then, too late, "2": the second is not the reminders' cancel."""
    contact, appt = booked(world)
    run = enroll(flows, flows.flow(move_graph()), contact, appt)
    flows.run()
    turn(flows, clock, "quinta de manhã")
    turn(flows, clock, "1")
    assert flows.enrollment(run).current_node_id == "feito"
    turn(flows, clock, "2")
    moved = appointment(rt, world.org_id, appt)
    assert (moved.status, moved.starts_at.astimezone(SP)) == ("scheduled", datetime(2026, 12, 3, 8, 0, tzinfo=SP))
    with rt.db.connect() as conn:
        acks = conn.execute(select(messages.c.purpose).where(
            messages.c.org_id == world.org_id, messages.c.purpose.in_(("cancel_ack", "confirm_ack")))).all()
    assert acks == []
