"""Two clinics, A and B, each with a channel (with a credential), a rule, a contact, an
appointment (so messages), a template override and an audit row; users of A with each role."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy import insert

from admin.app import create_app
from engine.core import clock as engine_clock
from engine.tenants.channels import create_channel
from engine.store.models import audit_log, templates
from engine.tenants.orgs import create_user
from tests.factories import World

SECRET = "s3gredo-super-secreto-0xDEADBEEF"


def csrf(html: str) -> str:
    match = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', html) or \
        re.search(r'value="([^"]+)"[^>]*name="csrf_token"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


@dataclass
class Tenant:
    world: World
    channel_id: int
    rule_id: int
    contact_id: int
    appointment_id: int
    message_id: int
    template_id: int
    audit_id: int


def _tenant(rt, slug: str, contact_name: str) -> Tenant:
    world = World(rt, slug=slug)
    with rt.db.begin() as conn:
        channel_id = create_channel(conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="sandbox",
                                    name=f"Canal {slug}", credentials={"webhook_secret": SECRET})
    world.channels["whatsapp"] = channel_id
    rule_id = world.rule(120)
    contact_id = world.contact(name=contact_name)
    appointment_id = world.appointment(contact_id, engine_clock.now() + timedelta(hours=5))
    message_id = world.messages()[0].id
    now = engine_clock.now()
    with rt.db.begin() as conn:
        template_id = conn.execute(insert(templates).values(
            org_id=world.org_id, key="session_reminder", channel_kind="sms", locale="pt_BR",
            body=f"Modelo da {slug}: {{{{ nome }}}}", updated_at=now).returning(templates.c.id)).scalar_one()
        audit_id = conn.execute(insert(audit_log).values(
            org_id=world.org_id, action="update", entity="channels", entity_id=channel_id,
            changes={"marker": f"audit-{slug}"}, created_at=now).returning(audit_log.c.id)).scalar_one()
    return Tenant(world, channel_id, rule_id, contact_id, appointment_id, message_id, template_id, audit_id)


@pytest.fixture
def app(rt):
    app = create_app(rt)
    app.config["TESTING"] = True
    return app


@pytest.fixture
def tenants(rt, clock):
    a = _tenant(rt, "clinica-a", "Paciente Da A")
    b = _tenant(rt, "clinica-b", "Paciente Só Da B")
    with rt.db.begin() as conn:
        for role in ("owner", "manager", "agent"):
            create_user(conn, org_id=a.world.org_id, email=f"{role}@a.com.br", role=role, password="senha-forte-a")
    return a, b


def login(client, email: str, password: str = "senha-forte-a"):
    page = client.get("/login")
    response = client.post("/login", data={"email": email, "password": password, "csrf_token": csrf(page.text)})
    assert response.status_code == 302, response.text
    return client


@pytest.fixture
def owner(app, tenants):
    return login(app.test_client(), "owner@a.com.br")


@pytest.fixture
def agent(app, tenants):
    return login(app.test_client(), "agent@a.com.br")
