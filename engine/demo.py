"""The demo clinic seeded on first start of the embedded default, so that reminders visibly go
out within a minute: sandbox channels, rules, five patients with appointments, a follow-up flow.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection

from engine import clock
from engine.appointments import create_appointment
from engine.channels import create_channel
from engine.contacts import create_contact
from engine.models import flow_pointers, orgs, reminder_rule_kinds, reminder_rules
from engine.orgs import create_org, create_user
from engine.populate import refresh_appointment
from gateway.crypto import Keyring

DEMO_SLUG = "demo"
DEMO_EMAIL = "dona@clinica-demo.local"
DEMO_PASSWORD = "lembra-demo"

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

FLOW_GRAPH = {
    "nodes": [
        {"id": "inicio", "type": "trigger", "config": {"kind": "silence", "minutes": 2880}},
        {"id": "espera", "type": "wait", "config": {"mode": "fixed", "duration_minutes": 2880}},
        {"id": "mensagem", "type": "action", "config": {"template_key": "session_confirmation"}},
        {"id": "fim", "type": "end", "config": {"outcome": "exhausted"}},
    ],
    "edges": [
        {"from": "inicio", "to": "espera"},
        {"from": "espera", "to": "mensagem"},
        {"from": "mensagem", "to": "fim"},
    ],
}


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
                       name=f"Sandbox ({kind})", is_default=True)
    now = clock.now()
    for name, purpose, trigger, offset, kinds in RULES:
        rule_id = conn.execute(insert(reminder_rules).values(
            org_id=org_id, name=name, purpose=purpose, template_key=purpose, trigger=trigger,
            offset_minutes=offset, respect_window=True, active=True, created_at=now, updated_at=now,
        ).returning(reminder_rules.c.id)).scalar_one()
        for position, kind in enumerate(kinds):
            conn.execute(insert(reminder_rule_kinds).values(org_id=org_id, rule_id=rule_id, kind=kind,
                                                            position=position))
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
    conn.execute(insert(flow_pointers).values(
        org_id=org_id, name="Retomar contato após 2 dias sem resposta", status="draft",
        draft_graph=FLOW_GRAPH, handoff_policy="pause", cancel_on_reply=True, trigger_config={},
        max_steps=30, created_at=now, updated_at=now,
    ))
    return DemoSeed(org_id=org_id, created=True)
