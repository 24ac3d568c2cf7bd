"""The Dramatiq broker named by BROKER_URL. It only carries "this work is due now" pokes: the
database is the source of truth, so a flushed or restarted broker loses nothing."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.stub import StubBroker

from engine.core.config import ConfigError, Settings


def make_broker(settings: Settings) -> dramatiq.Broker:
    """Build (not yet install) the broker for BROKER_URL."""
    kind = settings.broker_kind
    if kind == "stub":
        return StubBroker()
    if kind == "redis":
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=settings.broker_url, heartbeat_timeout=60_000)
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    # Dramatiq refuses a URL together with pika keyword parameters, so the heartbeat goes into the
    # URL's query (unless BROKER_URL already sets one).
    return RabbitmqBroker(url=_with_default_query(settings.broker_url, heartbeat="30"))


def _with_default_query(url: str, **defaults: str) -> str:
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit(parts._replace(query=urlencode({**defaults, **query})))


class BrokerUnavailable(Exception):
    """The broker could not take a message: down, unreachable or restarting (transient). The work
    stays in the database and is handed over once the broker answers again."""


def connection_errors() -> tuple[type[BaseException], ...]:
    """The exception types with which handing a message to the broker says "the broker is not
    there" (rather than a bug): Dramatiq's own, and the Redis client's, which Dramatiq's Redis
    broker lets through."""
    from dramatiq.errors import BrokerConnectionError

    errors: list[type[BaseException]] = [BrokerConnectionError]
    try:
        import redis
    except ImportError:  # pragma: no cover - a dependency, but only the Redis broker needs it
        pass
    else:
        errors += [redis.ConnectionError, redis.TimeoutError]
    return tuple(errors)


def ping(settings: Settings, *, timeout: float = 5) -> None:
    """Raise BrokerUnavailable with a one-line reason (no credentials) when the broker cannot be
    reached; the stub broker always can."""
    kind = settings.broker_kind
    if kind == "stub":
        return
    host = settings.broker_url.split("@")[-1].split("://")[-1].split("/")[0]
    if kind == "redis":
        import redis

        client = None
        try:
            client = redis.Redis.from_url(settings.broker_url, socket_connect_timeout=timeout,
                                          socket_timeout=timeout)
            client.ping()
        except (redis.RedisError, ValueError) as exc:
            raise BrokerUnavailable(f"cannot connect to redis at {host} ({type(exc).__name__})") from None
        finally:
            if client is not None:
                client.close()
        return
    import pika

    try:
        params = pika.URLParameters(settings.broker_url)
        params.socket_timeout = timeout
        params.connection_attempts = 1
        pika.BlockingConnection(params).close()
    except Exception as exc:  # pika raises many unrelated types for one cause
        raise BrokerUnavailable(f"cannot connect to rabbitmq at {host} ({type(exc).__name__})") from None


def check_broker(settings: Settings) -> None:
    """Raise ConfigError with a one-line reason when the broker cannot be reached."""
    try:
        ping(settings)
    except BrokerUnavailable as exc:
        raise ConfigError(f"BROKER_URL: {exc}") from None


def setup_broker(settings: Settings) -> dramatiq.Broker:
    """Install the broker and declare the actors on it. Call once per process, before sending."""
    broker = make_broker(settings)
    dramatiq.set_broker(broker)
    import engine.fleet.actors  # noqa: F401  (declares the actors on the broker just installed)

    for actor_name in engine.fleet.actors.ACTOR_NAMES:
        actor = getattr(engine.fleet.actors, actor_name)
        actor.broker = broker
        broker.declare_actor(actor)
    return broker
