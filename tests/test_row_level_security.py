"""Row-level security on PostgreSQL: defence in depth behind every query's org filter. A
connection that declares its org (`SET LOCAL lembra.org_id`) sees only that org's rows, even
with a query that forgets the filter."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.conftest import IS_POSTGRES
from tests.factories import World

pytestmark = pytest.mark.skipif(not IS_POSTGRES, reason="row-level security is a PostgreSQL feature")


@pytest.fixture
def app_role(rt, database_url):
    """A non-superuser role like the one a production web process would use."""
    role = f"lembra_app_{uuid.uuid4().hex[:8]}"
    with rt.db.engine.connect() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {role}"))
        conn.commit()
    engine = create_engine(make_url(database_url).set(username=role, password=None))
    yield engine
    engine.dispose()
    with rt.db.engine.connect() as conn:
        conn.execute(text(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}"))
        conn.execute(text(f"DROP ROLE {role}"))
        conn.commit()


def test_a_declared_org_sees_only_its_rows(rt, clock, app_role):
    clinic_a, clinic_b = World(rt, slug="clinica-a"), World(rt, slug="clinica-b")
    for world in (clinic_a, clinic_b):
        world.channel("whatsapp")
        world.rule(120)
        world.appointment(world.contact(), clock.now() + timedelta(hours=5))

    with app_role.begin() as conn:
        conn.execute(text("SELECT set_config('lembra.org_id', :org, true)"), {"org": str(clinic_a.org_id)})
        orgs_seen = conn.execute(text("SELECT DISTINCT org_id FROM messages")).scalars().all()
        contacts_seen = conn.execute(text("SELECT DISTINCT org_id FROM contacts")).scalars().all()
        templates_seen = conn.execute(text("SELECT count(*) FROM templates WHERE org_id IS NULL")).scalar_one()
        hijack = conn.execute(text("UPDATE appointments SET status = 'cancelled' WHERE org_id = :b"),
                              {"b": clinic_b.org_id})
    assert orgs_seen == [clinic_a.org_id]
    assert contacts_seen == [clinic_a.org_id]
    assert templates_seen > 0, "global default templates stay visible to every org"
    assert hijack.rowcount == 0

    with app_role.begin() as conn:
        with pytest.raises(Exception, match="row-level security"):
            conn.execute(text("SELECT set_config('lembra.org_id', :org, true)"), {"org": str(clinic_a.org_id)})
            conn.execute(text(
                "INSERT INTO contacts (org_id, name, created_at, updated_at) VALUES (:b, 'x', now(), now())"
            ), {"b": clinic_b.org_id})


def test_every_table_with_an_org_is_under_row_level_security(rt):
    with rt.db.engine.connect() as conn:
        tables = conn.execute(text(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN information_schema.columns col "
            "ON col.table_schema = n.nspname AND col.table_name = c.relname AND col.column_name = 'org_id' "
            "WHERE n.nspname = 'public' AND c.relkind = 'r'")).all()
    assert {t.relname for t in tables} >= {"flow_pointers", "flow_versions", "enrollments", "enrollment_events",
                                           "agents", "flow_claims"}
    assert [t.relname for t in tables if not (t.relrowsecurity and t.relforcerowsecurity)] == []


def test_a_declared_org_sees_only_its_flows_and_enrollments(rt, clock, app_role):
    from tests.flows.helpers import Flows, linear, node

    worlds = [World(rt, slug="clinica-a"), World(rt, slug="clinica-b")]
    for world in worlds:
        world.channel("whatsapp")
        flows = Flows(world)
        flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                                 node("fim", "end", outcome="exhausted")))
        flows.enroll(flow, world.contact(), key="k")
        flows.run()
    with app_role.begin() as conn:
        conn.execute(text("SELECT set_config('lembra.org_id', :org, true)"), {"org": str(worlds[0].org_id)})
        for table in ("flow_pointers", "flow_versions", "enrollments", "enrollment_events", "agents", "flow_claims"):
            seen = conn.execute(text(f"SELECT DISTINCT org_id FROM {table}")).scalars().all()
            assert seen == [worlds[0].org_id], table
