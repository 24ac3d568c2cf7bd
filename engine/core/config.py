"""Settings from environment variables, validated once, with one-line reasons on bad input."""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Mapping

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from gateway.egress import EgressPolicy


class ConfigError(Exception):
    """A configuration value is missing or wrong. The message is one line, safe to print."""


#: Every environment variable Lembra reads, with its default and meaning (shown by `lembra --help`).
ENV_VARS: dict[str, tuple[str, str]] = {
    "DATABASE_URL": ("sqlite:///lembra.db", "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB; on PostgreSQL "
                     + "the application's role (no superuser, no BYPASSRLS: row-level security applies to it)"),
    "LEMBRA_OWNER_DATABASE_URL": ("", "PostgreSQL only: the schema owner's URL, for `lembra db upgrade` alone; it "
                                  + "migrates as the owner, then creates DATABASE_URL's role if missing and grants it "
                                  + "the tables (default: DATABASE_URL does both)"),
    "BROKER_URL": ("stub://", "stub:// (in-process), redis://HOST:6379/0 or amqp://USER:PASS@HOST:5672/"),
    "LEMBRA_SECRET_KEYS": ("", "credential keys 'VERSION:BASE64KEY,...' (newest first); required with PostgreSQL"),
    "LEMBRA_PUBLIC_URL": ("http://127.0.0.1:8000", "base URL of webhooks and opt-out links"),
    "LEMBRA_LOG_LEVEL": ("INFO", "DEBUG, INFO, WARNING or ERROR"),
    "LEMBRA_LOG_FORMAT": ("json", "json or text"),
    "LEMBRA_LEASE_SECONDS": ("120", "how long a claimed message is reserved for one worker (> send timeout)"),
    "LEMBRA_RETRY_DELAYS": ("5m,15m,60m,4h", "waits between attempts after a transient failure; then dead"),
    "LEMBRA_DISPATCH_INTERVAL": ("2", "seconds between scheduler dispatch passes"),
    "LEMBRA_POPULATE_INTERVAL": ("60", "seconds between populate passes"),
    "LEMBRA_POPULATE_HORIZON_DAYS": ("8", "reminders are created for appointments starting within this many days"),
    "LEMBRA_CLAIM_BATCH": ("1000", "messages claimed per dispatch pass"),
    "LEMBRA_SEND_BATCH": ("200", "message ids carried by one worker task"),
    "LEMBRA_SEND_CONCURRENCY": ("8", "provider calls one worker process makes at once"),
    "LEMBRA_MAX_IN_FLIGHT": ("5000", "claimed-but-unsent messages allowed at once across the fleet"),
    "LEMBRA_SEND_TIMEOUT": ("15", "seconds a provider call may take"),
    "LEMBRA_METRICS_HOST": ("127.0.0.1", "address of the worker and scheduler metrics servers (engine/core/metrics.py)"),
    "LEMBRA_WORKER_METRICS_PORT": ("9191", "lembra worker's /metrics (all its processes) and /healthz; 0 = off"),
    "LEMBRA_SCHEDULER_METRICS_PORT": ("9192", "lembra scheduler's /metrics and /healthz; 0 = off"),
    "LEMBRA_METRICS_DIR": ("", "parent folder of the web and worker groups' metric files (default: temp folder)"),
    "LEMBRA_META_PRICES": ("", "an ops copy of Meta's price table (CSV, docs/pricing.md) used for the Painel's "
                           + "estimated cost (default: engine/messaging/pricing/meta_prices.csv)"),
    "LEMBRA_RATELIMIT_URL": ("", "where failed sign-ins are counted: memory:// or redis://HOST:6379/N "
                             + "(default: the broker's Redis, else memory://)"),
    "LEMBRA_PROVIDER_ALLOW": ("", "internal hosts and CIDRs (comma-separated, e.g. evolution,10.0.5.0/24) that "
                              + "tenant-set addresses (channel base_url, SMTP host, agent LLM URL) may reach; "
                              + "everything else may only be public; 'none' allows nothing internal "
                              + "(default: none, but loopback 127.0.0.0/8,::1 on the embedded default, "
                              + "SQLite + stub://)"),
}
#: What `LEMBRA_PROVIDER_ALLOW` defaults to on the embedded default (SQLite + stub broker, what
#: `lembra up` runs): one machine, where a local Evolution or Ollama is the point of the demo.
EMBEDDED_PROVIDER_ALLOW = "127.0.0.0/8,::1/128"

_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """Parse '90', '90s', '5m', '4h' or '2d' into a timedelta."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(f"not a duration: {text!r} (use e.g. 30s, 5m, 4h)")
    try:
        return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])
    except OverflowError:
        raise ConfigError(f"duration too large: {text!r}") from None


@dataclass(frozen=True)
class Settings:
    """The process's configuration. Build with `Settings.from_env()`."""

    database_url: str = "sqlite:///lembra.db"
    broker_url: str = "stub://"
    secret_keys: str = ""
    public_url: str = "http://127.0.0.1:8000"
    log_level: str = "INFO"
    log_format: str = "json"
    lease: timedelta = timedelta(seconds=120)
    retry_delays: tuple[timedelta, ...] = field(
        default=(timedelta(minutes=5), timedelta(minutes=15), timedelta(minutes=60), timedelta(hours=4))
    )
    dispatch_interval: float = 2.0
    populate_interval: float = 60.0
    populate_horizon: timedelta = timedelta(days=8)
    claim_batch: int = 1000
    send_batch: int = 200
    send_concurrency: int = 8
    max_in_flight: int = 5000
    send_timeout: float = 15.0
    #: Where failed sign-ins are counted; every web process must share it (see admin/throttle.py).
    ratelimit_url: str = "memory://"
    #: An ops copy of Meta's price table ("" = the one in the repo; engine/messaging/pricing).
    meta_prices: str = ""
    #: Internal hosts / CIDRs a tenant-set address may reach (`gateway.egress`); "" = public only.
    #: `from_env` puts the loopback default of the embedded mode here; built directly, it is strict.
    provider_allow: str = ""
    #: The schema owner's URL (LEMBRA_OWNER_DATABASE_URL), which only migrations use; "" = DATABASE_URL.
    owner_database_url: str = ""

    @property
    def migration_url(self) -> str:
        """The URL migrations run with: the owner's when set apart from the application's."""
        return self.owner_database_url or self.database_url

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def broker_kind(self) -> str:
        """'stub', 'redis' or 'rabbitmq'."""
        scheme = self.broker_url.split("://", 1)[0]
        return {"stub": "stub", "redis": "redis", "rediss": "redis", "amqp": "rabbitmq", "amqps": "rabbitmq"}[scheme]

    @property
    def egress(self) -> EgressPolicy:
        """The guard every connection to a tenant-set address goes through."""
        return _egress_policy(self.provider_allow)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """Read and validate every setting; raise ConfigError naming the first bad one."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str:
            return env.get(name, "").strip() or ENV_VARS[name][0]

        database_url = _check_database_url(get("DATABASE_URL"))
        owner_database_url = _owner_database_url(env.get("LEMBRA_OWNER_DATABASE_URL", "").strip(), database_url)
        broker_url = get("BROKER_URL")
        if broker_url.split("://", 1)[0] not in ("stub", "redis", "rediss", "amqp", "amqps") or "://" not in broker_url:
            raise ConfigError("BROKER_URL must start with stub://, redis:// or amqp://")
        log_level = get("LEMBRA_LOG_LEVEL").upper()
        if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError("LEMBRA_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR")
        log_format = get("LEMBRA_LOG_FORMAT").lower()
        if log_format not in ("json", "text"):
            raise ConfigError("LEMBRA_LOG_FORMAT must be json or text")
        try:
            delays = tuple(parse_duration(part) for part in get("LEMBRA_RETRY_DELAYS").split(",") if part.strip())
        except ConfigError as exc:
            raise ConfigError(f"LEMBRA_RETRY_DELAYS: {exc}") from None
        if not delays:
            raise ConfigError("LEMBRA_RETRY_DELAYS must list at least one wait (e.g. 5m,15m,60m,4h)")
        try:
            lease = parse_duration(get("LEMBRA_LEASE_SECONDS"))
        except ConfigError as exc:
            raise ConfigError(f"LEMBRA_LEASE_SECONDS: {exc}") from None
        if lease <= timedelta(0):
            raise ConfigError("LEMBRA_LEASE_SECONDS must be greater than zero")
        send_timeout = _positive_float("LEMBRA_SEND_TIMEOUT", get)
        if lease.total_seconds() <= send_timeout:
            # A call is begun only while its lease has the send timeout left (engine.messaging.dispatch.send).
            raise ConfigError(f"LEMBRA_LEASE_SECONDS ({lease.total_seconds():g} s) must be longer than "
                              f"LEMBRA_SEND_TIMEOUT ({send_timeout:g} s): a provider call must fit in a lease")
        try:
            horizon = timedelta(days=_positive_int("LEMBRA_POPULATE_HORIZON_DAYS", get))
        except OverflowError:
            raise ConfigError("LEMBRA_POPULATE_HORIZON_DAYS is too large") from None
        return cls(
            database_url=database_url,
            broker_url=broker_url,
            secret_keys=get("LEMBRA_SECRET_KEYS"),
            public_url=get("LEMBRA_PUBLIC_URL").rstrip("/"),
            log_level=log_level,
            log_format=log_format,
            lease=lease,
            retry_delays=delays,
            dispatch_interval=_positive_float("LEMBRA_DISPATCH_INTERVAL", get),
            populate_interval=_positive_float("LEMBRA_POPULATE_INTERVAL", get),
            populate_horizon=horizon,
            claim_batch=_positive_int("LEMBRA_CLAIM_BATCH", get),
            send_batch=_positive_int("LEMBRA_SEND_BATCH", get),
            send_concurrency=_positive_int("LEMBRA_SEND_CONCURRENCY", get),
            max_in_flight=_positive_int("LEMBRA_MAX_IN_FLIGHT", get),
            send_timeout=send_timeout,
            ratelimit_url=_ratelimit_url(get("LEMBRA_RATELIMIT_URL"), broker_url),
            meta_prices=env.get("LEMBRA_META_PRICES", "").strip(),
            provider_allow=_provider_allow(
                env.get("LEMBRA_PROVIDER_ALLOW", "").strip(),
                embedded=database_url.startswith("sqlite") and broker_url.startswith("stub://"),
            ),
            owner_database_url=owner_database_url,
        )


def _owner_database_url(value: str, database_url: str) -> str:
    """LEMBRA_OWNER_DATABASE_URL, checked against DATABASE_URL: both PostgreSQL, and DATABASE_URL
    naming its role, since that is the role `lembra db upgrade` creates and grants."""
    if not value:
        return ""
    owner = _check_database_url(value, name="LEMBRA_OWNER_DATABASE_URL")
    if not owner.startswith("postgresql") or not database_url.startswith("postgresql"):
        raise ConfigError("LEMBRA_OWNER_DATABASE_URL is for PostgreSQL: DATABASE_URL and it must both be "
                          "postgresql+psycopg:// URLs")
    if not make_url(database_url).username:
        raise ConfigError("DATABASE_URL must name the application's role (postgresql+psycopg://ROLE:PASSWORD@HOST/DB) "
                          "when LEMBRA_OWNER_DATABASE_URL is set")
    return owner


def _provider_allow(value: str, *, embedded: bool) -> str:
    """LEMBRA_PROVIDER_ALLOW, normalised; unset means loopback on the embedded default, else nothing."""
    if not value:
        return EMBEDDED_PROVIDER_ALLOW if embedded else ""
    if value.lower() == "none":
        return ""
    try:
        return str(EgressPolicy.parse(value))
    except ValueError as exc:
        raise ConfigError(f"LEMBRA_PROVIDER_ALLOW: {exc}") from None


def _ratelimit_url(value: str, broker_url: str) -> str:
    if not value:
        return broker_url if broker_url.startswith(("redis://", "rediss://")) else "memory://"
    if not value.startswith(("memory://", "redis://", "rediss://")):
        raise ConfigError("LEMBRA_RATELIMIT_URL must start with memory:// or redis://")
    return value


def _positive_int(name: str, get) -> int:  # type: ignore[no-untyped-def]
    try:
        value = int(get(name))
    except ValueError:
        raise ConfigError(f"{name} must be a whole number") from None
    if value <= 0:
        raise ConfigError(f"{name} must be greater than zero")
    return value


def _positive_float(name: str, get) -> float:  # type: ignore[no-untyped-def]
    try:
        value = float(get(name))
    except ValueError:
        raise ConfigError(f"{name} must be a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be greater than zero")
    return value


def _check_database_url(url: str, *, name: str = "DATABASE_URL") -> str:
    """Accept SQLite and PostgreSQL (psycopg 3) URLs; normalise postgres:// spellings."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            url = "postgresql+psycopg://" + url[len(prefix):]
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigError(
            f"{name} is not a database URL (expected sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
        ) from None
    if parsed.drivername == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            parent = Path(parsed.database).expanduser().resolve().parent
            if not parent.is_dir():
                raise ConfigError(f"{name}: folder {parent} does not exist")
        return url
    if parsed.drivername == "postgresql+psycopg":
        if not parsed.database:
            raise ConfigError(f"{name} names no database (postgresql+psycopg://USER@HOST/DB)")
        return url
    raise ConfigError(f"{name}: unsupported database {parsed.drivername!r} (use sqlite or postgresql+psycopg)")


@functools.lru_cache(maxsize=16)
def _egress_policy(text: str | None) -> EgressPolicy:
    # The policy is immutable and read once per claim and per send: parsing its CIDRs every time
    # was 3 % of a worker's samples in bench/flows.py --with-send.
    return EgressPolicy.parse(text)
