"""The demo clinic seeded on first start of the embedded default, so that reminders visibly go
out within a minute: sandbox channels, rules, five patients with appointments, a follow-up flow,
and the conversations that rebook: "Remarcar" (a patient who writes that they want another time)
and "Remarcar falta" (an appointment marked "não compareceu").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.people.agenda import create_professional, link_appointments
from engine.people.appointments import create_appointment
from engine.tenants.channels import create_channel
from engine.people.contacts import create_contact
from engine.store.models import agents, orgs, reminder_rule_kinds, reminder_rules
from engine.tenants.orgs import create_org, create_user
from engine.reminders.populate import refresh_appointment
from gateway.crypto import Keyring

DEMO_SLUG = "demo"
DEMO_EMAIL = "dona@clinica-demo.local"
DEMO_PASSWORD = "lembra-demo"
#: The demo's sandbox channels report each message delivered this many seconds after the send and
#: read twice as late, so the dashboard shows the whole funnel (providers/sandbox/provider.py).
DEMO_RECEIPTS_SECONDS = 3

RULES = (
    # name, purpose/template, trigger, offset minutes, kinds in order of preference
    ("Lembrete 24h antes", "session_reminder", "before_start", 1440, ("whatsapp", "email")),
    ("Lembrete 2h antes", "session_reminder", "before_start", 120, ("whatsapp", "sms")),
    ("Confirmação ao agendar", "session_confirmation", "on_create", 0, ("whatsapp", "email")),
    ("Aviso de cancelamento", "session_cancellation", "on_cancel", 0, ("whatsapp", "email")),
)

PATIENTS = (
    # name, phone, email, consented kinds, appointment starts in
    ("Ana Clara Souza", "(11) 99876-1001", "ana@example.com", ("whatsapp", "email"), timedelta(hours=2, seconds=40)),
    ("Bruno Lima", "(11) 99876-1002", "bruno@example.com", ("whatsapp", "email"), timedelta(hours=24, seconds=30)),
    ("Carla Mendes", "(11) 99876-1003", None, ("whatsapp", "sms"), timedelta(days=1, hours=5)),
    ("Daniel Rocha", None, "daniel@example.com", ("email",), timedelta(hours=24, seconds=50)),
    ("Eduarda Alves", "(11) 99876-1005", "eduarda@example.com", ("sms",), timedelta(days=3, hours=2)),
)

#: The built-in agenda's professionals: name, slot minutes, weekly hours (Monday to Friday, with a
#: lunch break), so that a rebooking in the sandbox finds free times without any setup.
PROFESSIONALS = (
    ("Dra. Beatriz Costa", 30, (("08:00", "12:00"), ("13:00", "18:00"))),
    ("Dr. Carlos Nunes", 60, (("09:00", "12:00"), ("14:00", "19:00"))),
)

FLOW_NAME = "Retomar contato"
#: Asks a patient who went quiet whether to book, reads the reply and routes it. The demo enrolls
#: one patient at once, so the follow-up shows in the sandbox within a minute of start.
FLOW_GRAPH = {
    "nodes": [
        {"id": "inicio", "type": "trigger", "label": "Início", "config": {}},
        {"id": "pergunta", "type": "action", "label": "Perguntar se quer agendar",
         "config": {"mode": "template", "template": "followup_checkin"}},
        {"id": "resposta", "type": "ai_classify", "label": "Ler a resposta",
         "config": {"classes": ["confirm", "reschedule", "not_interested"], "grace_minutes": 1440,
                    "labels": {"confirm": "Quer agendar", "reschedule": "Quer remarcar",
                               "not_interested": "Não quer"}}},
        {"id": "obrigado", "type": "action", "label": "Agradecer",
         "config": {"mode": "template", "template": "followup_reply_ack"}},
        {"id": "agendar", "type": "end", "label": "Quer agendar",
         "config": {"outcome": "converted"}},
        {"id": "recepcao", "type": "action", "label": "Avisar que a recepção vai falar",
         "config": {"mode": "template", "template": "followup_reply_ack"}},
        {"id": "remarcar", "type": "end", "label": "Remarcar com a recepção",
         "config": {"outcome": "custom", "note": "A recepção combina o novo horário."}},
        {"id": "sem_interesse", "type": "end", "label": "Sem interesse",
         "config": {"outcome": "exhausted"}},
        {"id": "espera", "type": "wait", "label": "Esperar 3 dias",
         "config": {"mode": "fixed", "minutes": 4320}},
        {"id": "lembrar", "type": "action", "label": "Convidar para remarcar",
         "config": {"mode": "template", "template": "followup_rebook"}},
        {"id": "fim", "type": "end", "label": "Encerrar",
         "config": {"outcome": "exhausted"}},
    ],
    "edges": [
        {"source": "inicio", "target": "pergunta", "condition": {"type": "always"}},
        {"source": "pergunta", "target": "resposta", "condition": {"type": "always"}},
        {"source": "resposta", "target": "obrigado", "condition": {"type": "class_match", "value": "confirm"}},
        {"source": "resposta", "target": "recepcao", "condition": {"type": "class_match", "value": "reschedule"}},
        {"source": "resposta", "target": "sem_interesse",
         "condition": {"type": "class_match", "value": "not_interested"}},
        {"source": "resposta", "target": "espera", "condition": {"type": "no_reply"}},
        {"source": "resposta", "target": "recepcao", "condition": {"type": "always"}},
        {"source": "obrigado", "target": "agendar", "condition": {"type": "always"}},
        {"source": "recepcao", "target": "remarcar", "condition": {"type": "always"}},
        {"source": "espera", "target": "lembrar", "condition": {"type": "always"}},
        {"source": "lembrar", "target": "fim", "condition": {"type": "always"}},
    ],
}

def _n(node_id: str, node_type: str, label: str, **config: object) -> dict:
    # No position: the builder lays the demo's flows out itself (left to right, nothing overlapping).
    return {"id": node_id, "type": node_type, "label": label, "config": config}


def _e(source: str, target: str, condition: str = "always") -> dict:
    return {"source": source, "target": target, "condition": {"type": condition}}


#: When the patient cannot find a time, the reception takes over: told, and the patient told so.
_TO_RECEPTION = (
    _n("avisar", "action", "Avisar que a recepção vai falar", mode="template", template="followup_reply_ack"),
    _n("recepcao", "do", "Avisar a equipe", action="notify_staff",
       note="Paciente quer outro horário e não encontrou um livre; fale com ele em Conversas."),
    _n("com_recepcao", "end", "Com a recepção", outcome="custom"),
)
_ASK_AND_OFFER = (
    _n("quando", "ask", "Perguntar dia e período", fields=["data", "periodo"], max_asks=2,
       grace_minutes=240),
    _n("oferta", "do", "Oferecer horários livres", action="offer_slots", date_field="data",
       period_field="periodo", limit=3),
)

RESCHEDULE_FLOW = "Remarcar"
#: Started by a patient who writes that they want another time ("posso remarcar para sexta de
#: manhã?"): asks what is missing, offers free times, moves the appointment, confirms it.
RESCHEDULE_GRAPH = {
    "nodes": [_n("inicio", "trigger", "Paciente quer remarcar"), *_ASK_AND_OFFER,
              _n("remarca", "do", "Remarcar a consulta", action="move"),
              _n("confirma", "action", "Confirmar o novo horário", mode="template",
                 template="session_confirmation"),
              _n("remarcado", "end", "Remarcado", outcome="converted"), *_TO_RECEPTION],
    "edges": [_e("inicio", "quando"), _e("quando", "oferta", "complete"), _e("quando", "avisar", "gave_up"),
              _e("quando", "avisar", "no_reply"), _e("oferta", "remarca", "ok"), _e("oferta", "avisar", "unavailable"),
              _e("oferta", "avisar", "failed"), _e("oferta", "avisar", "no_reply"), _e("remarca", "confirma", "ok"),
              _e("remarca", "avisar", "unavailable"), _e("remarca", "avisar", "failed"), _e("confirma", "remarcado"),
              _e("avisar", "recepcao"), _e("recepcao", "com_recepcao", "ok")],
}

NO_SHOW_FLOW = "Remarcar falta"
#: Started when an appointment is marked "não compareceu": invites the patient to rebook, reads the
#: answer as the day and period, offers free times and books a new appointment (the demo's
#: "Confirmação ao agendar" rule confirms it).
NO_SHOW_GRAPH = {
    "nodes": [_n("inicio", "trigger", "Paciente faltou"),
              _n("convite", "action", "Convidar para remarcar", mode="template", template="followup_rebook"),
              _n("espera", "wait", "Esperar a resposta", mode="fixed", minutes=2880),
              *_ASK_AND_OFFER,
              _n("marca", "do", "Marcar nova consulta", action="book"),
              _n("remarcado", "end", "Remarcado", outcome="converted"),
              _n("sem_resposta", "end", "Sem resposta", outcome="exhausted"), *_TO_RECEPTION],
    "edges": [_e("inicio", "convite"), _e("convite", "espera"), _e("espera", "quando", "replied"),
              _e("espera", "sem_resposta"), _e("quando", "oferta", "complete"), _e("quando", "avisar", "gave_up"),
              _e("quando", "avisar", "no_reply"), _e("oferta", "marca", "ok"), _e("oferta", "avisar", "unavailable"),
              _e("oferta", "avisar", "failed"), _e("oferta", "avisar", "no_reply"), _e("marca", "remarcado", "ok"),
              _e("marca", "avisar", "unavailable"), _e("marca", "avisar", "failed"), _e("avisar", "recepcao"),
              _e("recepcao", "com_recepcao", "ok")],
}

#: The demo patient the flow starts with (index in PATIENTS).
FOLLOWED_UP = 2


@dataclass
class DemoSeed:
    """What `seed` created (or found)."""

    org_id: int
    created: bool
    owner_email: str = DEMO_EMAIL
    owner_password: str = DEMO_PASSWORD


def seed(conn: Connection, keyring: Keyring) -> DemoSeed:
    """Create the demo clinic unless it exists; safe to call on every start."""
    existing = conn.execute(select(orgs.c.id).where(orgs.c.slug == DEMO_SLUG)).scalar()
    if existing is not None:
        return DemoSeed(org_id=int(existing), created=False)
    # Open all day, every day: the demo must show reminders going out whenever it is started.
    org_id = create_org(conn, slug=DEMO_SLUG, name="Clínica Demo", timezone="America/Sao_Paulo", state="SP",
                        quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    create_user(conn, org_id=org_id, email=DEMO_EMAIL, role="owner", password=DEMO_PASSWORD)
    for kind in ("whatsapp", "email", "sms"):
        create_channel(conn, keyring, org_id=org_id, kind=kind, provider="sandbox",
                       name=f"Sandbox ({kind})", is_default=True,
                       settings={"receipts_seconds": DEMO_RECEIPTS_SECONDS})
    now = clock.now()
    for name, purpose, trigger, offset, kinds in RULES:
        rule_id = conn.execute(insert(reminder_rules).values(
            org_id=org_id, name=name, purpose=purpose, template_key=purpose, trigger=trigger,
            offset_minutes=offset, respect_window=True, active=True, created_at=now, updated_at=now,
        ).returning(reminder_rules.c.id)).scalar_one()
        for position, kind in enumerate(kinds):
            conn.execute(insert(reminder_rule_kinds).values(org_id=org_id, rule_id=rule_id, kind=kind,
                                                            position=position))
    for name, minutes, intervals in PROFESSIONALS:
        create_professional(conn, org_id, name=name, slot_minutes=minutes, hours=[
            {"weekday": day, "starts": starts, "ends": ends} for day in range(5) for starts, ends in intervals])
    contact_ids = []
    for index, (name, phone, email, kinds, starts_in) in enumerate(PATIENTS, start=1):
        contact_id = create_contact(conn, org_id=org_id, name=name, phone=phone, email=email,
                                    external_id=f"demo-{index}", consent=kinds, consent_source="demo",
                                    consent_evidence="dados de demonstração")
        appointment_id = create_appointment(
            conn, org_id=org_id, contact_id=contact_id, starts_at=now + starts_in,
            professional="Dra. Beatriz Costa", mode="in_person" if index % 2 else "online",
            location="Rua das Flores, 100 — sala 3" if index % 2 else "https://meet.example.com/demo",
            external_id=f"demo-appt-{index}",
        )
        refresh_appointment(conn, org_id, appointment_id)
        contact_ids.append(contact_id)
    link_appointments(conn, org_id)  # the appointments name Dra. Beatriz Costa: they are hers
    _seed_fields(conn, org_id)  # before the flows: their `ask` steps name the fields
    _seed_flow(conn, org_id, contact_ids[FOLLOWED_UP])
    return DemoSeed(org_id=org_id, created=True)


#: What the demo's conversations ask a patient who wants another time.
FIELDS = (
    {"slug": "data", "label": "Data", "type": "date", "question": "Qual dia fica melhor para você?"},
    {"slug": "periodo", "label": "Período", "type": "period",
     "question": "Você prefere de manhã, à tarde ou à noite?"},
    {"slug": "horario", "label": "Horário", "type": "time", "question": "Que horas fica melhor?"},
)


def _seed_fields(conn: Connection, org_id: int) -> None:
    from engine.flows.conversation.fields import create_field

    for data in FIELDS:
        create_field(conn, org_id, data)


def _seed_flow(conn: Connection, org_id: int, contact_id: int) -> None:
    """Publish the demo follow-up flow, let the demo assistant start it, and enroll one patient."""
    from engine.flows import triggers, versions

    published = []
    for name, graph, trigger in ((FLOW_NAME, FLOW_GRAPH, {"kind": "manual"}),
                                 (RESCHEDULE_FLOW, RESCHEDULE_GRAPH,
                                  {"kind": "intent", "intent": "reschedule", "repeat": "always"}),
                                 (NO_SHOW_FLOW, NO_SHOW_GRAPH,
                                  {"kind": "appointment", "appointment_event": "no_show", "repeat": "always"})):
        flow_id = versions.create_flow(conn, org_id, name=name, draft_graph=graph, trigger_config=trigger,
                                       handoff_policy="pause")
        versions.publish(conn, org_id, flow_id, by="demo")  # the flow list says "Lembra (demonstração)"
        published.append(flow_id)
    pointer_id = published[0]
    now = clock.now()
    conn.execute(insert(agents).values(
        org_id=org_id, name="Assistente da Clínica Demo", persona="Recepcionista cordial e objetiva.",
        handoff_policy="pause", followup_enabled=True, flow_pointer_ids=published, created_at=now, updated_at=now,
    ))
    triggers.enroll(conn, org_id, pointer_id, contact_id, trigger_kind="manual", trigger_key="demo",
                    caller_key="demo", automatic=False)
