"""Row-level security on PostgreSQL: defence in depth behind every query's org filter (issue 30,
point 8). It never applies to a superuser or a BYPASSRLS role, so web, workers and the scheduler
connect as an application role that `lembra db upgrade` creates (NOSUPERUSER NOBYPASSRLS) and
grants; as that role, a connection that declares its org (`set_config('lembra.org_id', …)`) sees
only that org's rows, even with a query that forgets the filter, and cannot write another org's.

Role names are cluster-wide and other suites run on the same server: every role made here has a
name of its own and is dropped after its test."""

from __future__ import annotations

import re
import socket
import subprocess
import uuid
from datetime import timedelta
from typing import Any, Iterator

import psycopg
import pytest
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import Engine, make_url

from engine.store.app_role import MIGRATION_TABLES, grant_app_role
from engine.store.models import meta_template_states
from engine.words.catalogue import describe
from engine.core.config import ConfigError
from tests.conftest import IS_POSTGRES
from tests.factories import World
from tests.processes import LEMBRA, lembra_env

pytestmark = pytest.mark.skipif(not IS_POSTGRES, reason="row-level security is a PostgreSQL feature")

#: The English of the start-up warning's sentence would do as well; the pt-BR one is what the CLI prints.
WARNING_START = str(describe("row_security_bypassed", role="ROLE")).split("ROLE")[0]


def _role_name() -> str:
    return f"lembra_rls_{uuid.uuid4().hex[:10]}"


def _drop_role(owner: Engine, role: str) -> None:
    with owner.begin() as conn:
        exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
        if exists:
            conn.execute(text(f'DROP OWNED BY "{role}"'))  # its grants in this database
            conn.execute(text(f'DROP ROLE "{role}"'))


@pytest.fixture
def owner(owner_database_url: str) -> Iterator[Engine]:
    """The session database as its owner (the suite's PostgreSQL superuser)."""
    engine = create_engine(owner_database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def app_role(rt, owner_database_url: str, owner: Engine) -> Iterator[tuple[str, Engine]]:
    """An application role as `lembra db upgrade` makes it, and an engine connected as it."""
    role = _role_name()
    app_url = make_url(owner_database_url).set(username=role, password=None).render_as_string(hide_password=False)
    made = grant_app_role(owner_database_url, app_url)
    assert made is not None and made.created and not made.bypasses_row_security
    engine = create_engine(app_url)
    yield role, engine
    engine.dispose()
    _drop_role(owner, role)


def _org_tables(owner: Engine) -> list[str]:
    with owner.connect() as conn:
        return list(conn.execute(text(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN information_schema.columns col ON col.table_schema = n.nspname AND col.table_name = c.relname "
            "AND col.column_name = 'org_id' WHERE n.nspname = current_schema() AND c.relkind = 'r' "
            "ORDER BY c.relname")).scalars())


def _declare(conn: Any, org_id: int) -> None:
    conn.execute(text("SELECT set_config('lembra.org_id', :org, true)"), {"org": str(org_id)})


# --- the role ------------------------------------------------------------------------------------


def test_the_application_role_is_no_superuser_and_cannot_bypass_or_change_anything(app_role, owner):
    role, engine = app_role
    with owner.connect() as conn:
        attrs = conn.execute(text(
            "SELECT rolsuper, rolbypassrls, rolcreatedb, rolcreaterole, rolreplication, rolcanlogin "
            "FROM pg_roles WHERE rolname = :r"), {"r": role}).one()
        yoyo = [name for name in MIGRATION_TABLES if conn.execute(text(
            "SELECT has_table_privilege(:r, :t, 'SELECT,INSERT,UPDATE,DELETE')"), {"r": role, "t": name}).scalar()]
    assert tuple(attrs) == (False, False, False, False, False, True)
    assert yoyo == [], "only the owner migrates"
    for statement in ("ALTER TABLE contacts NO FORCE ROW LEVEL SECURITY",
                      "DROP POLICY contacts_org_isolation ON contacts",
                      "CREATE TABLE intruder (id int)", "TRUNCATE contacts", "SET ROLE postgres"):
        with engine.begin() as conn, pytest.raises(Exception, match="must be owner|permission denied"):
            conn.execute(text(statement))


# --- reads and writes as the role, org declared ---------------------------------------------------


@pytest.fixture
def two_clinics(rt, clock, monkeypatch) -> tuple[Any, Any]:
    """Two clinics with a row in every org table: the security probe's world (tests/security), plus
    the rows no page shows (a day's retention run, a paced channel's counters, a recipient's slot)."""
    from admin.app import create_app
    from engine.queue import recipient_pacing
    from engine.queue.pacing import DbPacingStore
    from engine.privacy.retention import DailyRetention
    from gateway.pacing import PacingPolicy
    from tests.security import conftest as probe

    monkeypatch.setattr(socket, "getaddrinfo", probe._getaddrinfo)  # the agents' example.com LLM URL
    app = create_app(rt)
    app.config["TESTING"] = True
    app.test_client_class = probe.ProbeClient
    a = probe._seed(rt, app, "clinica-a", lambda f: probe.A_TEXT[f])
    b = probe._seed(rt, app, "clinica-b", lambda f: probe.B_TEXT[f])
    DailyRetention(rt.db).maybe_run()
    now = clock.now()
    for org in (a, b):
        with rt.db.begin() as conn:
            DbPacingStore(conn, org.org_id).reserve(org.channels["sandbox"], PacingPolicy(
                min_interval=timedelta(seconds=1), jitter=timedelta(0), daily_cap=None),
                now, now.date().isoformat(), now + timedelta(days=1))
            # What a WABA says of a template (the webhooks and the list record it).
            conn.execute(insert(meta_template_states).values(
                org_id=org.org_id, channel_id=org.channels["sandbox"], name="session_reminder_v1", language="pt_BR",
                category="UTILITY", status="APPROVED", updated_at=now))
            recipient_pacing.push_back(conn, recipient_pacing.RecipientHasher(rt.keyring), org.org_id,
                                       org.channels["sandbox"], "+5516999887766", now + timedelta(seconds=6))
    return a, b


def test_as_the_role_a_declared_org_sees_only_its_rows_in_every_org_table(app_role, owner, two_clinics):
    _, engine = app_role
    a, b = two_clinics
    tables = _org_tables(owner)
    assert len(tables) >= 26
    with owner.connect() as conn:
        unseeded = [t for t in tables if conn.execute(text(
            f"SELECT count(DISTINCT org_id) FROM {t} WHERE org_id IN (:a, :b)"), {"a": a.org_id, "b": b.org_id}
        ).scalar() != 2]
    assert unseeded == [], "give both clinics a row in these tables (two_clinics), or the check proves nothing"

    with engine.begin() as conn:
        _declare(conn, a.org_id)
        seen = {t: sorted(conn.execute(text(f"SELECT DISTINCT org_id FROM {t}")).scalars(), key=str) for t in tables}
    expected = {t: [a.org_id] for t in tables} | {"templates": [a.org_id, None]}  # + the global defaults
    assert seen == expected

    with engine.begin() as conn:  # and the other way round
        _declare(conn, b.org_id)
        assert conn.execute(text("SELECT DISTINCT org_id FROM contacts")).scalars().all() == [b.org_id]


def test_as_the_role_another_orgs_rows_cannot_be_written(app_role, owner, two_clinics):
    _, engine = app_role
    a, b = two_clinics
    refused: dict[str, list[str]] = {}
    for table in _org_tables(owner):
        with engine.begin() as conn:
            _declare(conn, a.org_id)
            # Invisible, so untouched: an UPDATE or DELETE of B's rows matches nothing.
            assert conn.execute(text(f"UPDATE {table} SET org_id = org_id WHERE org_id = :b"),
                                {"b": b.org_id}).rowcount == 0, table
            assert conn.execute(text(f"DELETE FROM {table} WHERE org_id = :b"), {"b": b.org_id}).rowcount == 0, table
            for kind, statement in (
                # A copy of one of A's rows, written as B's.
                ("insert", f"INSERT INTO {table} SELECT (jsonb_populate_record(NULL::{table}, "
                           f"to_jsonb(t) || jsonb_build_object('org_id', CAST(:b AS bigint)))).* "
                           f"FROM {table} t WHERE org_id = :a LIMIT 1"),
                # One of A's rows, moved to B.
                ("update", f"UPDATE {table} SET org_id = :b WHERE ctid = (SELECT ctid FROM {table} "
                           "WHERE org_id = :a LIMIT 1)"),
            ):
                savepoint = conn.begin_nested()
                try:
                    conn.execute(text(statement), {"a": a.org_id, "b": b.org_id})
                except Exception as exc:  # noqa: BLE001 - the policy's refusal, checked below
                    savepoint.rollback()
                    if "row-level security" in str(exc):
                        refused.setdefault(table, []).append(kind)
                    else:
                        raise
                else:
                    savepoint.rollback()
    assert refused == {table: ["insert", "update"] for table in _org_tables(owner)}
    with owner.connect() as conn:  # nothing of B's was touched
        assert conn.execute(text("SELECT count(*) FROM contacts WHERE org_id = :b"), {"b": b.org_id}).scalar() == 2


def test_a_declared_org_sees_only_its_rows(rt, clock, app_role):
    _, engine = app_role
    clinic_a, clinic_b = World(rt, slug="clinica-a"), World(rt, slug="clinica-b")
    for world in (clinic_a, clinic_b):
        world.channel("whatsapp")
        world.rule(120)
        world.appointment(world.contact(), clock.now() + timedelta(hours=5))

    with engine.begin() as conn:
        _declare(conn, clinic_a.org_id)
        orgs_seen = conn.execute(text("SELECT DISTINCT org_id FROM messages")).scalars().all()
        contacts_seen = conn.execute(text("SELECT DISTINCT org_id FROM contacts")).scalars().all()
        templates_seen = conn.execute(text("SELECT count(*) FROM templates WHERE org_id IS NULL")).scalar_one()
        hijack = conn.execute(text("UPDATE appointments SET status = 'cancelled' WHERE org_id = :b"),
                              {"b": clinic_b.org_id})
    assert orgs_seen == [clinic_a.org_id]
    assert contacts_seen == [clinic_a.org_id]
    assert templates_seen > 0, "global default templates stay visible to every org"
    assert hijack.rowcount == 0

    with engine.begin() as conn:
        with pytest.raises(Exception, match="row-level security"):
            _declare(conn, clinic_a.org_id)
            conn.execute(text(
                "INSERT INTO contacts (org_id, name, created_at, updated_at) VALUES (:b, 'x', now(), now())"
            ), {"b": clinic_b.org_id})


def test_every_table_with_an_org_is_under_row_level_security(owner):
    with owner.connect() as conn:
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

    _, engine = app_role
    worlds = [World(rt, slug="clinica-a"), World(rt, slug="clinica-b")]
    for world in worlds:
        world.channel("whatsapp")
        flows = Flows(world)
        flow = flows.flow(linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                                 node("fim", "end", outcome="exhausted")))
        flows.enroll(flow, world.contact(), key="k")
        flows.run()
    with engine.begin() as conn:
        _declare(conn, worlds[0].org_id)
        for table in ("flow_pointers", "flow_versions", "enrollments", "enrollment_events", "agents", "flow_claims"):
            seen = conn.execute(text(f"SELECT DISTINCT org_id FROM {table}")).scalars().all()
            assert seen == [worlds[0].org_id], table


# --- `lembra db upgrade` makes the role; the long-running commands say when RLS is off -------------


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LEMBRA, *args], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_db_upgrade_creates_the_application_role_once_and_grants_it(owner_database_url, owner):
    role, password = _role_name(), f"pw-{uuid.uuid4().hex}"
    app_url = make_url(owner_database_url).set(username=role, password=password).render_as_string(hide_password=False)
    env = lembra_env(app_url, LEMBRA_OWNER_DATABASE_URL=owner_database_url)
    try:
        first = _run(["db", "upgrade"], env)
        assert first.returncode == 0, first.stderr
        assert first.stdout.splitlines() == ["schema is up to date",
                                             str(describe("app_role_created", role=role))]
        second = _run(["db", "upgrade"], env)  # the role exists: granted again, no error
        assert second.returncode == 0, second.stderr
        assert second.stdout.splitlines() == ["schema is up to date", str(describe("app_role_granted", role=role))]
        assert WARNING_START not in first.stderr + second.stderr
        with owner.connect() as conn:
            row = conn.execute(text("SELECT rolsuper, rolbypassrls, rolcreatedb, rolcreaterole, rolpassword "
                                    "FROM pg_authid WHERE rolname = :r"), {"r": role}).one()
            ungranted = conn.execute(text(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname NOT LIKE '%yoyo%' "
                "AND NOT has_table_privilege(:r, c.oid, 'SELECT,INSERT,UPDATE,DELETE')"), {"r": role}).all()
        assert tuple(row)[:4] == (False, False, False, False)
        assert row.rolpassword.startswith("SCRAM-SHA-256$") and password not in row.rolpassword
        assert ungranted == []
        # The runtime as that role: a long-running command starts without the warning and works.
        once = _run(["scheduler", "--once"], lembra_env(app_url))
        assert once.returncode == 0, once.stderr
        assert WARNING_START not in once.stderr
        with psycopg.connect(make_url(app_url).set(drivername="postgresql").render_as_string(hide_password=False)) \
                as conn:
            assert conn.execute("SELECT current_user").fetchone() == (role,)
    finally:
        _drop_role(owner, role)


def test_a_superuser_still_runs_but_the_start_says_row_level_security_is_off(database_url, owner_database_url):
    once = _run(["scheduler", "--once"], lembra_env(owner_database_url))  # the suite's owner is a superuser
    assert once.returncode == 0, once.stderr
    assert once.stderr.count(WARNING_START) == 1, once.stderr
    upgrade = _run(["db", "upgrade"], lembra_env(owner_database_url))
    assert upgrade.returncode == 0 and upgrade.stdout.strip() == "schema is up to date"
    assert upgrade.stderr.count(WARNING_START) == 1


def test_the_application_role_cannot_migrate_and_is_told_to_use_the_owner(app_role):
    role, engine = app_role
    url = engine.url.render_as_string(hide_password=False)
    result = _run(["db", "upgrade"], lembra_env(url))
    assert result.returncode == 2
    assert result.stderr.strip() == f"lembra: error: {describe('migration_needs_owner')}"


def test_an_owner_that_may_not_create_roles_is_told_the_one_command(owner_database_url, owner):
    weak, app = _role_name(), _role_name()
    with owner.begin() as conn:
        conn.execute(text(f'CREATE ROLE "{weak}" LOGIN NOCREATEROLE'))
    try:
        weak_url = make_url(owner_database_url).set(username=weak, password=None).render_as_string(hide_password=False)
        app_url = make_url(owner_database_url).set(username=app, password="x").render_as_string(hide_password=False)
        with pytest.raises(ConfigError) as info:
            grant_app_role(weak_url, app_url)
        message = str(info.value)
        assert "\n" not in message and re.search(rf'CREATE ROLE "{app}" LOGIN PASSWORD .* NOSUPERUSER NOBYPASSRLS',
                                                 message)
        with owner.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": app}).scalar() == 0
    finally:
        _drop_role(owner, weak)
        _drop_role(owner, app)


def test_the_documented_fresh_server_an_owner_with_createrole_and_an_application_role(owner_database_url, owner):
    """docs/operations.md's recipe: an owner that is no superuser (CREATEROLE, owns the database)
    migrates and creates the application's role; the application then works as that role, which
    row-level security applies to."""
    owner_role, app, database = _role_name(), _role_name(), f"lembra_rls_{uuid.uuid4().hex[:10]}"
    server = make_url(owner_database_url)
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{owner_role}" LOGIN CREATEROLE'))
        conn.execute(text(f'CREATE DATABASE "{database}" OWNER "{owner_role}"'))
    try:
        owner_url = server.set(username=owner_role, password=None, database=database)
        app_url = owner_url.set(username=app, password="app-pw").render_as_string(hide_password=False)
        env = lembra_env(app_url, LEMBRA_OWNER_DATABASE_URL=owner_url.render_as_string(hide_password=False))
        upgraded = _run(["db", "upgrade"], env)
        assert upgraded.returncode == 0, upgraded.stderr
        assert upgraded.stdout.splitlines()[-1] == str(describe("app_role_created", role=app))
        created = [_run(["orgs", "create", "--slug", slug, "--name", slug], lembra_env(app_url))
                   for slug in ("um", "dois")]
        assert [c.returncode for c in created] == [0, 0], [c.stderr for c in created]
        engine = create_engine(app_url)
        try:
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO contacts (org_id, name, created_at, updated_at) "
                                  "SELECT id, 'x', now(), now() FROM orgs"))
                _declare(conn, int(created[0].stdout.strip()))
                assert conn.execute(text("SELECT DISTINCT org_id FROM contacts")).scalars().all() == \
                    [int(created[0].stdout.strip())]
        finally:
            engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
            for role in (app, owner_role):
                conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()
