"""Configuration and domain input: bad values are refused with a one-line reason, nothing half-written."""

from __future__ import annotations

from datetime import datetime, time, timedelta

import pytest
from sqlalchemy import func, select

from engine.people.appointments import create_appointment
from engine.fleet.broker import check_broker
from engine.core.config import ConfigError, Settings
from engine.people.contacts import create_contact
from engine.store.db import Database
from engine.core.errors import DomainError
from engine.store.models import contacts, orgs, preferences
from engine.tenants.orgs import create_org
from engine.reminders.windows import WindowPolicy
from tests.factories import World


def _one_line(exc: BaseException) -> str:
    message = str(exc)
    assert message and "\n" not in message and "Traceback" not in message
    return message


# --- Settings.from_env -----------------------------------------------------------------------


def test_defaults_are_valid():
    settings = Settings.from_env({})
    assert settings.database_url == "sqlite:///lembra.db"
    assert settings.broker_kind == "stub"
    assert settings.retry_delays == (timedelta(minutes=5), timedelta(minutes=15),
                                     timedelta(minutes=60), timedelta(hours=4))
    assert settings.lease == timedelta(seconds=120)


def test_failed_sign_ins_are_counted_where_every_web_process_sees_them():
    assert Settings.from_env({}).ratelimit_url == "memory://"
    redis = Settings.from_env({"BROKER_URL": "redis://cache:6379/2"})
    assert redis.ratelimit_url == "redis://cache:6379/2"
    amqp = Settings.from_env({"BROKER_URL": "amqp://guest:guest@mq:5672/", "LEMBRA_RATELIMIT_URL": "redis://r:6379/3"})
    assert amqp.ratelimit_url == "redis://r:6379/3"
    with pytest.raises(ConfigError, match="LEMBRA_RATELIMIT_URL") as exc:
        Settings.from_env({"LEMBRA_RATELIMIT_URL": "memcached://x"})
    _one_line(exc.value)


def test_postgres_spellings_are_normalised():
    settings = Settings.from_env({"DATABASE_URL": "postgres://u@db.example/lembra"})
    assert settings.database_url == "postgresql+psycopg://u@db.example/lembra"


def test_retry_delays_are_configurable():
    settings = Settings.from_env({"LEMBRA_RETRY_DELAYS": "30s, 2m,1h"})
    assert settings.retry_delays == (timedelta(seconds=30), timedelta(minutes=2), timedelta(hours=1))


@pytest.mark.parametrize("url, expected", [
    ("not a url", "DATABASE_URL"),
    ("postgresql+psycopg://lembra:s3cr3t-pw@db:notaport/lembra", "DATABASE_URL"),
    ("postgresql+psycopg://lembra:s3cr3t-pw@db", "names no database"),
    ("mysql://lembra:s3cr3t-pw@db/lembra", "unsupported database"),
    ("oracle+cx_oracle://lembra:s3cr3t-pw@db/lembra", "unsupported database"),
    ("sqlite:////no/such/folder/lembra.db", "does not exist"),
])
def test_bad_database_url(url, expected):
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"DATABASE_URL": url})
    message = _one_line(info.value)
    assert expected in message
    assert "s3cr3t-pw" not in message


def test_the_owner_url_is_for_migrations_only_and_defaults_to_the_database_url():
    single = Settings.from_env({"DATABASE_URL": "postgresql+psycopg://lembra@db/lembra"})
    assert single.migration_url == single.database_url and single.owner_database_url == ""
    apart = Settings.from_env({"DATABASE_URL": "postgresql+psycopg://lembra_app:pw@db/lembra",
                               "LEMBRA_OWNER_DATABASE_URL": "postgres://lembra:owner-pw@db/lembra"})
    assert apart.database_url == "postgresql+psycopg://lembra_app:pw@db/lembra"
    assert apart.migration_url == "postgresql+psycopg://lembra:owner-pw@db/lembra"


@pytest.mark.parametrize("database_url, owner_url, expected", [
    ("sqlite:///lembra.db", "postgresql+psycopg://lembra:s3cr3t-pw@db/lembra", "for PostgreSQL"),
    ("postgresql+psycopg://app@db/lembra", "sqlite:///lembra.db", "for PostgreSQL"),
    ("postgresql+psycopg://app@db/lembra", "postgresql+psycopg://lembra:s3cr3t-pw@db",
     "LEMBRA_OWNER_DATABASE_URL names no"),
    ("postgresql+psycopg://app@db/lembra", "not a url", "LEMBRA_OWNER_DATABASE_URL is not a database URL"),
    ("postgresql+psycopg://db/lembra", "postgresql+psycopg://lembra:s3cr3t-pw@db/lembra",
     "must name the application's role"),
])
def test_a_bad_owner_url_is_refused_in_one_line(database_url, owner_url, expected):
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"DATABASE_URL": database_url, "LEMBRA_OWNER_DATABASE_URL": owner_url})
    message = _one_line(info.value)
    assert expected in message and "s3cr3t-pw" not in message


@pytest.mark.parametrize("url", ["http://broker:6379", "redis", "kafka://broker:9092", "redis:/broker"])
def test_bad_broker_url(url):
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"BROKER_URL": url})
    assert "BROKER_URL" in _one_line(info.value)


@pytest.mark.parametrize("name, value", [
    ("LEMBRA_RETRY_DELAYS", "5x"),
    ("LEMBRA_RETRY_DELAYS", "5m,soon"),
    ("LEMBRA_RETRY_DELAYS", ","),
    ("LEMBRA_RETRY_DELAYS", "99999999999999999999d"),
    ("LEMBRA_LEASE_SECONDS", "two minutes"),
    ("LEMBRA_LEASE_SECONDS", "-5"),
    ("LEMBRA_LEASE_SECONDS", "0"),
    ("LEMBRA_POPULATE_HORIZON_DAYS", "a week"),
    ("LEMBRA_POPULATE_HORIZON_DAYS", "0"),
    ("LEMBRA_DISPATCH_INTERVAL", "-1"),
    ("LEMBRA_DISPATCH_INTERVAL", "nan"),
    ("LEMBRA_POPULATE_INTERVAL", "inf"),
    ("LEMBRA_CLAIM_BATCH", "1.5"),
    ("LEMBRA_SEND_TIMEOUT", "fast"),
    ("LEMBRA_LOG_LEVEL", "LOUD"),
    ("LEMBRA_LOG_FORMAT", "xml"),
])
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: value})
    assert name in _one_line(info.value)


@pytest.mark.parametrize("lease, timeout", [("15", "15"), ("10", "30"), ("3", None)])
def test_a_lease_no_longer_than_the_send_timeout_is_refused(lease, timeout):
    """A call is begun only while its lease has the send timeout left, so such a lease sends nothing."""
    env = {"LEMBRA_LEASE_SECONDS": lease, **({"LEMBRA_SEND_TIMEOUT": timeout} if timeout else {})}
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    text = _one_line(info.value)
    assert "LEMBRA_LEASE_SECONDS" in text and "LEMBRA_SEND_TIMEOUT" in text


def test_a_short_lease_with_a_shorter_send_timeout_is_accepted():
    settings = Settings.from_env({"LEMBRA_LEASE_SECONDS": "3", "LEMBRA_SEND_TIMEOUT": "1"})
    assert (settings.lease, settings.send_timeout) == (timedelta(seconds=3), 1.0)


# --- reaching the database and the broker ------------------------------------------------------


def test_unreachable_postgres_is_a_config_error_without_password():
    db = Database("postgresql+psycopg://lembra:s3cr3t-pw@127.0.0.1:1/lembra")
    try:
        with pytest.raises(ConfigError) as info:
            db.check()
    finally:
        db.dispose()
    message = _one_line(info.value)
    assert message.startswith("DATABASE_URL: cannot connect")
    assert "s3cr3t-pw" not in message


def test_unreachable_redis_is_a_config_error():
    settings = Settings(broker_url="redis://:s3cr3t-pw@127.0.0.1:1/0")
    with pytest.raises(ConfigError) as info:
        check_broker(settings)
    message = _one_line(info.value)
    assert message.startswith("BROKER_URL: cannot connect to redis")
    assert "s3cr3t-pw" not in message


# --- domain input ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {"timezone": "America/Sao_Paolo"},
    {"timezone": "Mars/Olympus_Mons"},
    {"timezone": ""},
    {"state": "XX"},
])
def test_window_policy_refuses_unknown_timezone_or_state(kwargs):
    with pytest.raises(ValueError) as info:
        WindowPolicy(**kwargs)
    assert "unknown" in _one_line(info.value)


def test_window_policy_refuses_an_empty_window():
    with pytest.raises(ValueError):
        WindowPolicy(allowed_start=time(20, 0), allowed_end=time(8, 0))


BAD_ORGS = [
    ({"timezone": "America/Sao_Paolo"}, "unknown timezone"),
    ({"state": "XX"}, "unknown state"),
    ({"quiet_start": "8h"}, "not a time of day"),
    ({"quiet_start": "21:00", "quiet_end": "08:00"}, "allowed_end"),
    ({"slug": "Clínica!"}, "slug"),
]


def test_create_org_refuses_bad_settings(rt):
    for kwargs, expected in BAD_ORGS:
        args = {"slug": "clinica", "name": "Clínica", **kwargs}
        with rt.db.begin() as conn:
            with pytest.raises(DomainError) as info:
                create_org(conn, **args)
            assert expected in _one_line(info.value), kwargs
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(orgs)).scalar_one() == 0


def test_create_org_accepts_lowercase_state(rt):
    with rt.db.begin() as conn:
        org_id = create_org(conn, slug="clinica", name="Clínica", state="rj")
        assert conn.execute(select(orgs.c.state).where(orgs.c.id == org_id)).scalar_one() == "RJ"


BAD_CONTACTS = [
    ({"phone": "12345"}, "phone"),
    ({"phone": "+55 16 0000"}, "phone"),
    ({"phone": "not a phone"}, "phone"),
    ({"email": "ana.example.com"}, "email"),
    ({"consent": ("whatsapp", "pigeon")}, "kind"),
]


def test_create_contact_refuses_bad_input_and_writes_nothing(rt, clock):
    world = World(rt)
    for kwargs, expected in BAD_CONTACTS:
        args = {"org_id": world.org_id, "name": "Ana Clara", "phone": "+5516999887766",
                "email": "ana@example.com", "consent": ("whatsapp",), **kwargs}
        with rt.db.begin() as conn:
            # The caller catches the error and goes on: the transaction must hold nothing of it.
            with pytest.raises(DomainError) as info:
                create_contact(conn, **args)
        message = _one_line(info.value)
        assert expected in message, kwargs
        for value in (kwargs.get("phone"), kwargs.get("email")):
            if value:
                assert value not in message  # no PII echoed back
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(contacts)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(preferences)).scalar_one() == 0


def test_create_contact_normalises_phone(rt, clock):
    world = World(rt)
    with rt.db.begin() as conn:
        cid = create_contact(conn, org_id=world.org_id, name="Ana", phone="(16) 99988-7766", email=" Ana@Example.COM ")
        row = conn.execute(select(contacts).where(contacts.c.id == cid)).one()
    assert row.phone == "+5516999887766"
    assert row.email == "ana@example.com"


def test_create_appointment_refuses_bad_input(rt, clock):
    world = World(rt)
    contact_id = world.contact()
    for kwargs, expected in [
        ({"timezone": "Europe/Atlantis"}, "unknown timezone"),
        ({"starts_at": datetime(2026, 12, 2, 14, 0)}, "timezone offset"),
        ({"status": "maybe"}, "status"),
        ({"contact_id": 999_999}, "no such contact"),
    ]:
        args = {"org_id": world.org_id, "contact_id": contact_id, "starts_at": clock.now() + timedelta(days=1),
                **kwargs}
        with rt.db.begin() as conn:
            with pytest.raises(DomainError) as info:
                create_appointment(conn, **args)
        assert expected in _one_line(info.value), kwargs
    from engine.store.models import appointments
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(appointments)).scalar_one() == 0


def test_appointment_of_another_orgs_contact_is_refused(rt, clock):
    a, b = World(rt, "clinica-a"), World(rt, "clinica-b")
    b_contact = b.contact()
    with rt.db.begin() as conn:
        with pytest.raises(DomainError):
            create_appointment(conn, org_id=a.org_id, contact_id=b_contact,
                               starts_at=clock.now() + timedelta(days=1))
