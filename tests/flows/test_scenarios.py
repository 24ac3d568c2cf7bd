"""The conversation scenarios of one-flow-rfc §12, adapted to Lembra, end to end through the
sandbox on both readers: the built-in one (no model) and an agent's model (the loopback Chat
Completions fake, scripted with what a model would answer). Each asserts the exact messages the
patient got, the model calls counted on the run, and the steps Execuções shows.

- S1: fields collected in any order, a correction, a field given up at max_asks, then offered.
- S3: a no-show invited to rebook, day and period read from the answer, times offered, one picked,
  a new appointment booked, its confirmation and reminders planned, the clinic's system told.
- S4: "quero falar com alguém" hands the conversation to staff, who are told in Pendências.
- S8: a reply to a reminder, "não vou poder, dá pra quinta de manhã?", starts the reschedule flow;
  the time picked moves the appointment and the old time's reminders are cancelled.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select

from engine.flows import triggers
from engine.flows.agents import create_agent
from engine.flows.ai.factory import ai_for
from engine.flows.conversation.fields import create_field
from engine.people.agenda import create_professional
from engine.people.appointments import set_status
from engine.store.models import appointments, enrollments, inbox_items, messages, webhook_deliveries
from engine.tenants.webhooks.endpoints import create_endpoint
from tests.factories import World
from tests.fakes.llm import LLMFake
from tests.flows.helpers import Flows, edge, node

SP = ZoneInfo("America/Sao_Paulo")
BOOKED_AT = datetime(2026, 12, 3, 14, 0, tzinfo=SP)  # T0 is Tuesday 2026-12-01 09:00 in São Paulo
PHONE = "+5516999887766"
DIA, PERIODO, HORA = "Qual dia fica melhor para você?", "De manhã ou à tarde?", "Que horas fica melhor?"


def reading(intent: str = "other", *, date: str | None = None, time: str | None = None,
            period: str | None = None, choice: int | None = None) -> dict[str, Any]:
    """What the model answers for one turn (the `choice` key only when a menu is pending)."""
    answer: dict[str, Any] = {"intent": intent, "confidence": 0.9, "date": date, "time": time, "period": period}
    if choice is not None:
        answer["choice"] = choice
    return answer


class Scenario:
    """A clinic with a built-in agenda, the demo's fields, a reminder rule, a webhook endpoint and
    one reader (`builtin` or `llm`)."""

    def __init__(self, rt, clock, reader: str, llm: LLMFake) -> None:
        self.rt, self.clock, self.reader, self.llm = rt, clock, reader, llm
        self.world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
        self.world.channel("whatsapp")
        self.world.rule(offset_minutes=1440)
        self.world.rule(offset_minutes=120)
        self.world.rule(offset_minutes=0, trigger="on_create", template_key="session_confirmation")
        with rt.db.begin() as conn:
            for slug, kind, question in (("data", "date", DIA), ("periodo", "period", PERIODO),
                                         ("horario", "time", HORA)):
                create_field(conn, self.world.org_id, {"slug": slug, "label": slug, "type": kind,
                                                       "question": question})
            self.professional = create_professional(
                conn, self.world.org_id, name="Dra. Beatriz Costa", slot_minutes=30,
                hours=[{"weekday": d, "starts": s, "ends": e} for d in range(5)
                       for s, e in (("08:00", "12:00"), ("13:00", "18:00"))]).id
            create_endpoint(conn, rt.keyring, self.world.org_id, url="http://127.0.0.1:9/hooks",
                            event_types=["appointment.booked", "appointment.moved"], egress=rt.settings.egress)
        self.flows = Flows(self.world, ai=lambda agent: ai_for(agent, rt.keyring, timeout=2,
                                                               egress=rt.settings.egress))
        self.contact = self.world.contact()
        self.appointment = self.world.appointment(self.contact, BOOKED_AT, professional_id=self.professional)

    def flow(self, graph: dict, trigger: dict) -> int:
        pointer = self.flows.flow(graph, trigger=trigger, agent=False)
        llm = {"llm_base_url": self.llm.base_url, "llm_model": "llama3", "llm_api_key": "sk-test"} \
            if self.reader == "llm" else {}
        with self.rt.db.begin() as conn:
            self.flows.agent_id = create_agent(conn, self.rt.keyring, self.world.org_id, name="Assistente",
                                               followup_enabled=True, flow_ids=[pointer], **llm)
        return pointer

    def start(self, pointer: int) -> int:
        """A receptionist includes the patient, about their appointment."""
        with self.rt.db.begin() as conn:
            return triggers.enroll(conn, self.world.org_id, pointer, self.contact, trigger_kind="manual",
                                   trigger_key="manual", appointment_id=self.appointment,
                                   automatic=False).enrollment_id

    def say(self, text: str, model: dict[str, Any] | None = None) -> None:
        """The patient writes; on the model's path, `model` is what it answers for this turn."""
        if self.reader == "llm":
            self.llm.script(model or reading())
        self.flows.reply(text, sender=PHONE)
        self.clock.advance(timedelta(seconds=9))
        self.flows.run()

    def texts(self) -> list[str]:
        """What the patient got, in order: a template's key, or the text written for them."""
        with self.rt.db.connect() as conn:
            rows = conn.execute(select(messages.c.template_key, messages.c.payload, messages.c.rule_id).where(
                messages.c.org_id == self.world.org_id, messages.c.status.in_(("sent", "delivered", "read")))
                .order_by(messages.c.id)).all()
        return [(row.payload or {}).get("text") or row.template_key for row in rows
                if not (row.rule_id is not None and row.template_key == "session_reminder")]

    def run(self) -> Any:
        with self.rt.db.connect() as conn:
            return conn.execute(select(enrollments).where(enrollments.c.org_id == self.world.org_id)
                                .order_by(enrollments.c.id.desc()).limit(1)).one()

    def steps(self, run_id: int) -> list[tuple[str, str]]:
        return [(s["node"], s["reason"]) for s in self.flows.steps(run_id) if s["node"] != "inicio"]

    def calls(self, per_turn: int) -> int:
        """The model calls expected: `per_turn` on the model's path, none on the built-in one."""
        return per_turn if self.reader == "llm" else 0

    def events(self) -> list[tuple[str, dict]]:
        with self.rt.db.connect() as conn:
            return [(r.event_type, r.payload["data"]) for r in conn.execute(
                select(webhook_deliveries.c.event_type, webhook_deliveries.c.payload).where(
                    webhook_deliveries.c.org_id == self.world.org_id).order_by(webhook_deliveries.c.id))]

    def appointments(self) -> list[tuple[datetime, str]]:
        with self.rt.db.connect() as conn:
            return [(r.starts_at.astimezone(SP), r.status) for r in conn.execute(
                select(appointments.c.starts_at, appointments.c.status).where(
                    appointments.c.org_id == self.world.org_id).order_by(appointments.c.id))]

    def reminders(self) -> list[tuple[datetime, str]]:
        with self.rt.db.connect() as conn:
            return [(r.appointment_starts_at.astimezone(SP), r.status) for r in conn.execute(
                select(messages.c.appointment_starts_at, messages.c.status).where(
                    messages.c.org_id == self.world.org_id, messages.c.template_key == "session_reminder")
                .order_by(messages.c.id))]


@pytest.fixture(params=["builtin", "llm"])
def scenario(request, rt, clock):
    with LLMFake() as llm:
        yield Scenario(rt, clock, request.param, llm)


def _rebook(first: str, last: str, *, before: list, offer_exits: str = "avisar") -> dict:
    """ask (day, period[, time]) → offer → `last` (move or book) → end; every miss to the staff."""
    return {"nodes": [node("inicio", "trigger"), *before,
                      node("quando", "ask", fields=first.split(","), max_asks=2),
                      node("oferta", "do", action="offer_slots", date_field="data", period_field="periodo"),
                      node("acao", "do", action=last), node("feito", "end", outcome="converted"),
                      node("avisar", "do", action="notify_staff", note="Paciente quer outro horário"),
                      node("equipe", "end", outcome="custom")],
            "edges": [*([edge("inicio", before[0]["id"])] if before else [edge("inicio", "quando")]),
                      edge("quando", "oferta", "complete"), edge("quando", "oferta", "gave_up"),
                      edge("quando", offer_exits, "no_reply"), edge("oferta", "acao", "ok"),
                      edge("oferta", "avisar", "unavailable"), edge("oferta", "avisar", "failed"),
                      edge("oferta", "avisar", "no_reply"), edge("acao", "feito", "ok"),
                      edge("acao", "avisar", "unavailable"), edge("acao", "avisar", "failed"),
                      edge("avisar", "equipe", "ok")]}


def test_s1_fields_in_any_order_a_correction_and_one_given_up(scenario):
    s = scenario
    run_id = s.start(s.flow(_rebook("data,periodo,horario", "move", before=[]), {"kind": "manual"}))
    s.flows.run()
    s.say("de manhã", reading(period="morning"))  # the period first: the day is still asked
    s.say("quinta", reading(date="2026-12-03"))
    s.say("na verdade prefiro à tarde", reading(period="afternoon"))  # a correction; the time is asked again
    s.say("tanto faz", reading())  # the time asked twice: given up, offered on day and period
    offer = ("Tenho estes horários livres:\n"
             "1. quinta-feira, 03/12 às 13:00 (Dra. Beatriz Costa)\n"
             "2. quinta-feira, 03/12 às 15:00 (Dra. Beatriz Costa)\n"
             "3. quinta-feira, 03/12 às 17:30 (Dra. Beatriz Costa)\n"
             "Responda com o número do horário que preferir.")
    assert s.texts() == ["session_confirmation", DIA, DIA, HORA, HORA, offer]
    run = s.flows.enrollment(run_id)
    assert run.data == {"data": "2026-12-03", "periodo": "afternoon"} and run.status == "waiting_reply"
    assert s.steps(run_id) == [("quando", "ask_question"), ("quando", "ask_question"), ("quando", "ask_question"),
                               ("quando", "ask_question"), ("quando", "ask_gave_up"), ("oferta", "do_slots_offered")]
    assert run.llm_calls == s.calls(4)


def test_s3_a_no_show_is_rebooked_in_the_conversation(scenario):
    s = scenario
    graph = _rebook("data,periodo", "book", before=[
        node("convite", "action", mode="template", template="followup_rebook"),
        node("espera", "wait", mode="fixed", minutes=2880)])
    graph["edges"] += [edge("convite", "espera"), edge("espera", "quando", "replied"), edge("espera", "equipe")]
    s.flow(graph, {"kind": "appointment", "appointment_event": "no_show", "repeat": "always"})
    s.clock.set(datetime(2026, 12, 3, 15, 0, tzinfo=SP))
    with s.rt.db.begin() as conn:  # the receptionist marks "não compareceu"
        set_status(conn, s.world.org_id, s.appointment, "scheduled", "no_show")
    s.flows.run()
    s.say("pode ser segunda de tarde", reading("reschedule", date="2026-12-07", period="afternoon"))
    s.say("1", reading(choice=1))
    run = s.run()
    new_at = datetime(2026, 12, 7, 13, 0, tzinfo=SP)
    assert s.texts() == ["followup_rebook",
                         "Tenho estes horários livres:\n"
                         "1. segunda-feira, 07/12 às 13:00 (Dra. Beatriz Costa)\n"
                         "2. segunda-feira, 07/12 às 15:00 (Dra. Beatriz Costa)\n"
                         "3. segunda-feira, 07/12 às 17:30 (Dra. Beatriz Costa)\n"
                         "Responda com o número do horário que preferir.",
                         "session_confirmation"]
    assert s.appointments() == [(BOOKED_AT, "no_show"), (new_at, "scheduled")]
    assert (new_at, "pending") in s.reminders()
    assert s.steps(run.id) == [("convite", "message_queued"), ("espera", "wait_replied"),
                               ("quando", "ask_complete"), ("oferta", "do_slots_offered"),
                               ("oferta", "do_slot_picked"), ("acao", "do_booked")]
    assert [(kind, data["replaces_appointment_id"]) for kind, data in s.events()] == [
        ("appointment.booked", s.appointment)]
    assert (run.current_node_id, run.appointment_id != s.appointment, run.llm_calls) == ("feito", True, s.calls(2))


def test_s4_asking_for_a_person_hands_the_conversation_to_staff(scenario):
    s = scenario
    run_id = s.start(s.flow(_rebook("data,periodo", "move", before=[]), {"kind": "manual"}))
    s.flows.run()
    s.say("quero falar com alguém", reading("human"))
    run = s.flows.enrollment(run_id)
    assert s.texts() == ["session_confirmation", DIA] and run.status == "paused_handoff"
    with s.rt.db.connect() as conn:
        told = conn.execute(select(inbox_items.c.kind).where(inbox_items.c.org_id == s.world.org_id)).scalars().all()
    assert told == ["handoff_requested"]
    assert s.steps(run_id) == [("quando", "ask_question"), ("quando", "ask_wants_person")]
    assert run.llm_calls == s.calls(1)
    s.say("alô?", reading())
    assert s.flows.enrollment(run_id).llm_calls == s.calls(1), "no model call while a person holds it"


def test_s8_a_reply_to_a_reminder_moves_the_appointment(scenario):
    s = scenario
    s.flow(_rebook("data,periodo", "move", before=[]), {"kind": "intent", "intent": "reschedule",
                                                        "repeat": "always"})
    s.flows.send()  # the booking's confirmation
    s.clock.set(datetime(2026, 12, 2, 14, 1, tzinfo=SP))  # the day before: the reminder goes out
    s.world.populate()
    s.flows.send()
    assert s.reminders() == [(BOOKED_AT, "sent"), (BOOKED_AT, "pending")]  # 24 h before, 2 h before
    s.say("não vou poder, dá pra quinta de manhã?", reading("reschedule", date="2026-12-03", period="morning"))
    s.say("2", reading(choice=2))
    run = s.run()
    moved_to = datetime(2026, 12, 3, 9, 30, tzinfo=SP)
    assert s.texts() == ["session_confirmation",
                         "Tenho estes horários livres:\n"
                         "1. quinta-feira, 03/12 às 08:00 (Dra. Beatriz Costa)\n"
                         "2. quinta-feira, 03/12 às 09:30 (Dra. Beatriz Costa)\n"
                         "3. quinta-feira, 03/12 às 11:30 (Dra. Beatriz Costa)\n"
                         "Responda com o número do horário que preferir."]
    assert s.appointments() == [(moved_to, "scheduled")]
    reminders = s.reminders()
    assert (BOOKED_AT, "cancelled") in reminders and (BOOKED_AT, "pending") not in reminders
    assert (moved_to, "pending") in reminders, "the new time's 2 h reminder"
    assert s.steps(run.id) == [("quando", "ask_complete"), ("oferta", "do_slots_offered"),
                               ("oferta", "do_slot_picked"), ("acao", "do_moved")]
    assert [kind for kind, _ in s.events()] == ["appointment.moved"]
    assert (run.trigger_kind, run.current_node_id, run.llm_calls) == ("intent", "feito", s.calls(2))
