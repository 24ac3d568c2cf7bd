"""The schema: migrations are repeatable, the two dialects agree, the ORM matches the tables."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import create_engine, inspect, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError

from engine.store.db import Database
from engine.store.migrate import upgrade
from engine.store.models import Base, messages, orgs
from engine.tenants.orgs import create_org
from tests.conftest import DATABASE_URL, IS_POSTGRES
from tests.factories import World

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
PG_URL = DATABASE_URL if IS_POSTGRES else os.environ.get(
    "LEMBRA_SCHEMA_PG_URL", "postgresql+psycopg://postgres@127.0.0.1/postgres")


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("schema") / "schema.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    return url


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A throwaway migrated PostgreSQL database; the test is skipped when PG is unreachable."""
    base = make_url(PG_URL)
    admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT",
                          connect_args={"connect_timeout": 3})
    name = f"lembra_schema_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError:
        admin.dispose()
        pytest.skip("PostgreSQL is not reachable")
    url = base.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _shape(url: str) -> dict[str, dict[str, object]]:
    """Tables → their columns, index names and unique column sets, as the database reports them."""
    engine = create_engine(url)
    try:
        insp = inspect(engine)
        shape: dict[str, dict[str, object]] = {}
        for table in insp.get_table_names():
            if table.startswith("_yoyo") or table == "yoyo_lock":
                continue
            indexes = {
                ix["name"] for ix in insp.get_indexes(table)
                if not ix.get("duplicates_constraint") and not ix["name"].startswith("sqlite_autoindex")
            }
            # Column-level UNIQUE: an autoindex on SQLite, a constraint on PostgreSQL.
            uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints(table)}
            shape[table] = {
                "columns": [c["name"] for c in insp.get_columns(table)],
                # SQLite reports an INTEGER PRIMARY KEY as nullable; primary keys are not compared.
                "nullable": {c["name"]: c["nullable"] for c in insp.get_columns(table)
                             if c["name"] not in insp.get_pk_constraint(table)["constrained_columns"]},
                "pk": insp.get_pk_constraint(table)["constrained_columns"],
                "indexes": indexes,
                "uniques": uniques,
                "fks": sorted((tuple(fk["constrained_columns"]), fk["referred_table"])
                              for fk in insp.get_foreign_keys(table)),
            }
        return shape
    finally:
        engine.dispose()


def test_migrations_applied_twice_change_nothing(owner_database_url):
    # The fixture's database is already migrated: a second upgrade (by its owner) applies nothing.
    assert upgrade(owner_database_url) == []
    assert upgrade(owner_database_url) == []


def test_fresh_database_gets_every_migration(tmp_path, capfd):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    applied = upgrade(url)
    assert applied == sorted(p.stem for p in (Path(__file__).parent.parent / "sql" / "sqlite").glob("*.sql"))
    assert upgrade(url) == []
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), "a first start prints nothing of the migrations' SQL"


def test_sqlite_and_postgresql_schemas_agree(sqlite_url, pg_url):
    lite, pg = _shape(sqlite_url), _shape(pg_url)
    assert set(lite) == set(pg)
    for table in sorted(lite):
        assert lite[table]["columns"] == pg[table]["columns"], table
        assert lite[table]["nullable"] == pg[table]["nullable"], table
        assert lite[table]["pk"] == pg[table]["pk"], table
        assert lite[table]["indexes"] == pg[table]["indexes"], table
        assert lite[table]["uniques"] == pg[table]["uniques"], table
        assert lite[table]["fks"] == pg[table]["fks"], table


def test_every_table_but_orgs_carries_org_id(sqlite_url):
    shape = _shape(sqlite_url)
    for table, info in shape.items():
        if table != "orgs":
            assert "org_id" in info["columns"], table


def _check_models_match(url: str) -> None:
    shape = _shape(url)
    mapped = {table.name: table for table in Base.metadata.sorted_tables}
    assert set(mapped) == set(shape)
    for name, table in mapped.items():
        assert [c.name for c in table.columns] == shape[name]["columns"], name
        for column in table.columns:
            if column.primary_key:
                continue
            assert column.nullable == shape[name]["nullable"][column.name], f"{name}.{column.name}"


def test_orm_models_match_migrated_sqlite(sqlite_url):
    _check_models_match(sqlite_url)


def test_orm_models_match_migrated_postgresql(pg_url):
    _check_models_match(pg_url)


def test_timestamps_read_back_in_utc_whatever_the_server_zone(pg_url):
    # A server (or a URL's options) set to São Paulo: the engine's sessions still run in UTC, and
    # every timestamp comes back the same instant, in UTC, as UTCDateTime promises.
    url = make_url(pg_url).update_query_dict({"options": "-c TimeZone=America/Sao_Paulo"})
    db = Database(url.render_as_string(hide_password=False))
    written = datetime(2026, 12, 1, 9, 30, tzinfo=ZoneInfo("America/Sao_Paulo"))
    try:
        with db.begin() as conn:
            assert conn.execute(text("SHOW TimeZone")).scalar() == "UTC"
            org_id = create_org(conn, slug="fuso", name="Fuso")
            # Written by the driver itself, not through UTCDateTime: the instant as São Paulo wrote it.
            conn.execute(text("UPDATE orgs SET updated_at = :at WHERE id = :id"), {"at": written, "id": org_id})
        with db.connect() as conn:
            read = conn.execute(select(orgs.c.created_at, orgs.c.updated_at).where(orgs.c.id == org_id)).one()
    finally:
        db.dispose()
    assert read.created_at.tzinfo is timezone.utc
    assert read.updated_at == written and read.updated_at.tzinfo is timezone.utc
    assert read.updated_at.hour == 12  # 09:30 in São Paulo (UTC-3)


def _message(org_id: int, contact_id: int, key: str) -> dict[str, object]:
    return dict(org_id=org_id, purpose="adhoc", contact_id=contact_id, channel_kind="whatsapp",
                idempotency_key=key, status="pending", attempts=0, respect_window=False,
                created_at=NOW, updated_at=NOW)


def test_idempotency_key_is_unique_per_org(rt, clock):
    a = World(rt, "clinica-a")
    b = World(rt, "clinica-b")
    ca, cb = a.contact(), b.contact()
    db: Database = rt.db
    with db.begin() as conn:
        conn.execute(insert(messages).values(**_message(a.org_id, ca, "k-1")))
    with pytest.raises(IntegrityError):
        with db.begin() as conn:
            conn.execute(insert(messages).values(**_message(a.org_id, ca, "k-1")))
    # The same key in another org is another message.
    with db.begin() as conn:
        conn.execute(insert(messages).values(**_message(b.org_id, cb, "k-1")))
    with db.connect() as conn:
        rows = conn.execute(select(messages.c.org_id).where(messages.c.idempotency_key == "k-1")).all()
    assert sorted(r.org_id for r in rows) == sorted([a.org_id, b.org_id])
