"""Test fixtures. The backend is chosen by environment:

- default (the README command): SQLite files + Dramatiq StubBroker;
- `LEMBRA_TEST_DATABASE_URL=postgresql+psycopg://…` and `LEMBRA_TEST_BROKER_URL=redis://…`
  (what `.ci/run` also runs): real PostgreSQL and Redis;
- with PostgreSQL, `LEMBRA_TEST_APP_ROLE=1`: the runtime, and every process a test starts, connect
  as an application role of the session's own (no superuser, no BYPASSRLS, granted by
  `engine.store.app_role.grant_app_role` as `lembra db upgrade` grants it), as a deployment's web,
  workers and scheduler do, so row-level security applies to them; migrations, the fixtures'
  cleanup and a test's own DDL run as the owner (`owner_database_url`);
- `LEMBRA_TEST_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/VHOST`: RabbitMQ (`.ci/run` runs the
  real-process tests on it, in a virtual host of the run's own). The process tests empty the
  broker before and after each test (tests/processes.py `flush_broker`: FLUSHDB on Redis, a purge
  of Lembra's queues on RabbitMQ), so give them a Redis db or a vhost nothing else uses.

Every test gets an empty, migrated database, a frozen clock and a runtime bound to both.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import shutil
import socket
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import create_engine, text

import engine.flows.receivers  # noqa: F401  (as every process that runs Lembra does)
from engine.core import clock as engine_clock
from engine.core.config import Settings
from engine.store.migrate import upgrade
from engine.store.runtime import Runtime, install

TEST_KEY = "1:" + base64.b64encode(b"lembra-test-key-0123456789abcdef"[:32]).decode()
DATABASE_URL = os.environ.get("LEMBRA_TEST_DATABASE_URL", "").strip()
#: Under `pytest -n N` (pytest-xdist), worker gwK runs on Redis db (the given db − K), so that one
#: worker's FLUSHDB never drops another's messages; RabbitMQ's vhost cannot be shared that way.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _broker_for_this_worker(url: str) -> str:
    if not XDIST_WORKER or url.startswith("stub"):
        return url
    if not url.startswith(("redis://", "rediss://")):
        raise pytest.UsageError("run the tests on RabbitMQ without -n: the workers would share one vhost")
    parts = urlsplit(url)
    number = int(parts.path.strip("/") or 0) - int(XDIST_WORKER.removeprefix("gw"))
    if number < 0:
        raise pytest.UsageError("LEMBRA_TEST_BROKER_URL's Redis db must be at least the number of xdist workers - 1")
    return urlunsplit(parts._replace(path=f"/{number}"))


BROKER_URL = _broker_for_this_worker(os.environ.get("LEMBRA_TEST_BROKER_URL", "").strip() or "stub://")
IS_POSTGRES = DATABASE_URL.startswith("postgresql")
APP_ROLE = IS_POSTGRES and os.environ.get("LEMBRA_TEST_APP_ROLE", "").strip() not in ("", "0")
#: The instant every test starts at unless it says otherwise: Tuesday 2026-12-01 09:00 in São Paulo.
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)

#: Tables a test's cleanup leaves alone on PostgreSQL: the migrations' bookkeeping. `templates`
#: keeps its global defaults (org_id NULL); `orgs` is emptied last.
_KEPT_TABLES = ("_yoyo_log", "_yoyo_migration", "_yoyo_version", "yoyo_lock", "templates", "orgs")


def pytest_report_header(config: pytest.Config) -> str:
    backend = "postgresql" + (" as the application's role" if APP_ROLE else "") if IS_POSTGRES else "sqlite"
    return f"lembra backend: {backend} + broker {BROKER_URL.split('://')[0]}"


@pytest.fixture(scope="session")
def _session_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated database for the session: a template file (SQLite) or a fresh database (PG)."""
    if IS_POSTGRES:
        from sqlalchemy.engine import make_url

        base = make_url(DATABASE_URL)
        name = f"lembra_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = base.set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        yield url
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    else:
        template = tmp_path_factory.mktemp("template") / "template.db"
        upgrade(f"sqlite:///{template}")
        yield str(template)


@pytest.fixture(scope="session")
def _session_app_url(_session_db: str) -> Iterator[str]:
    """The URL the runtime connects with: the session database's owner's, or (LEMBRA_TEST_APP_ROLE)
    an application role's, made for this session and dropped after it (roles are cluster-wide)."""
    if not APP_ROLE:
        yield _session_db
        return
    from sqlalchemy.engine import make_url

    from engine.store.app_role import grant_app_role

    role = f"lembra_test_app_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    app_url = make_url(_session_db).set(username=role, password=None).render_as_string(hide_password=False)
    grant_app_role(_session_db, app_url)
    yield app_url
    owner = create_engine(_session_db)
    with owner.begin() as conn:
        conn.execute(text(f'DROP OWNED BY "{role}"'))  # its grants in this database
        conn.execute(text(f'DROP ROLE "{role}"'))
    owner.dispose()


@pytest.fixture
def owner_database_url(_session_db: str, database_url: str) -> str:
    """The database of `database_url` as its owner: for a test's own DDL, roles and truncates."""
    return _session_db if IS_POSTGRES else database_url


_CLEANUP: dict[str, str] = {}


def empty_postgres(owner_url: str) -> None:
    """Empty a PostgreSQL test database as its owner (see `_cleanup_sql`): the global templates
    and the migrations' bookkeeping stay, every id sequence starts again at 1."""
    if owner_url not in _CLEANUP:
        _CLEANUP[owner_url] = _cleanup_sql(owner_url)
    engine = create_engine(owner_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(_CLEANUP[owner_url])
    engine.dispose()


def _cleanup_sql(owner_url: str) -> str:
    """The statements that empty a PostgreSQL test database between tests, read once from the
    catalogue so that a new table is emptied too: every table but the kept ones, then `orgs`, with
    every sequence restarted. DELETE, not TRUNCATE: on tables this small a 33-table TRUNCATE took
    about a second (new files for each table and its indexes), the DELETEs a few milliseconds, and
    the suite runs this after each of its ~3,000 tests. Foreign keys are not checked during the
    cleanup (session_replication_role), so the order of the tables does not matter."""
    engine = create_engine(owner_url)
    with engine.connect() as conn:
        tables = conn.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND NOT tablename = ANY(:kept) "
            "ORDER BY tablename"), {"kept": list(_KEPT_TABLES)}).scalars().all()
        sequences = conn.execute(text(
            "SELECT s.oid::regclass::text FROM pg_class s JOIN pg_namespace n ON n.oid = s.relnamespace "
            "WHERE s.relkind = 'S' AND n.nspname = 'public' AND s.relname NOT LIKE '%yoyo%' "
            "AND s.relname NOT LIKE 'templates%' ORDER BY 1")).scalars().all()
    engine.dispose()
    return "; ".join([
        "SET LOCAL session_replication_role = replica",
        *(f'DELETE FROM "{table}"' for table in tables),
        "DELETE FROM templates WHERE org_id IS NOT NULL",
        "DELETE FROM orgs",
        *(f"SELECT setval('{sequence}', 1, false)" for sequence in sequences),
    ])


@pytest.fixture
def database_url(_session_db: str, _session_app_url: str, tmp_path: Path) -> Iterator[str]:
    """An empty migrated database for one test (as the application's role with LEMBRA_TEST_APP_ROLE)."""
    if IS_POSTGRES:
        yield _session_app_url
        empty_postgres(_session_db)
    else:
        path = tmp_path / "lembra.db"
        shutil.copy(_session_db, path)
        yield f"sqlite:///{path}"


@pytest.fixture
def clock() -> Iterator[engine_clock.FrozenClock]:
    """The engine's clock, frozen at T0; move it with .set() / .advance()."""
    frozen = engine_clock.FrozenClock(T0)
    previous = engine_clock.use(frozen)
    yield frozen
    engine_clock.use(previous)


@pytest.fixture
def settings(database_url: str) -> Settings:
    # The provider fakes listen on 127.0.0.1, which the egress guard refuses by default.
    return Settings(database_url=database_url, broker_url=BROKER_URL, secret_keys=TEST_KEY,
                    provider_allow="127.0.0.0/8")


@pytest.fixture
def rt(settings: Settings, clock: engine_clock.FrozenClock) -> Iterator[Runtime]:
    """The runtime every engine call of the test goes through."""
    runtime = Runtime.build(settings)
    previous = install(runtime)
    yield runtime
    install(previous)
    runtime.close()


@pytest.fixture(scope="module")
def _shared_fake_server() -> Iterator[tuple[Any, dict[str, Any]]]:
    # One loopback server per test module (a FakeServer's shutdown costs ~0.5 s); `serve` swaps the fake.
    from tests.fakes.server import FakeServer

    holder: dict[str, Any] = {}
    with FakeServer(lambda req: holder["fake"](req)) as server:
        yield server, holder


@pytest.fixture
def serve(_shared_fake_server: tuple[Any, dict[str, Any]]) -> Any:
    """`with serve(fake) as server:` — the module's loopback server answering with `fake`, its
    request log emptied."""
    server, holder = _shared_fake_server

    @contextmanager
    def _serve(fake: Any) -> Iterator[Any]:
        holder["fake"] = fake
        server.requests.clear()
        yield server

    return _serve


_REAL_CONNECT = socket.socket.connect


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every socket connect the test makes, as (address, port); only loopback really connects."""
    seen: list[tuple[Any, ...]] = []

    def connect(sock: socket.socket, address: Any) -> None:
        seen.append(tuple(address[:2]) if isinstance(address, tuple) else (address,))
        host = address[0] if isinstance(address, tuple) else ""
        try:
            loopback = ipaddress.ip_address(str(host).split("%", 1)[0]).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ConnectionRefusedError(111, "refused by the test: not a loopback address")
        return _REAL_CONNECT(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return seen
