"""The broker built from BROKER_URL (the real-process tests run on it: tests/test_processes.py)."""

from __future__ import annotations

from dramatiq.brokers.rabbitmq import RabbitmqBroker

from engine.fleet.broker import make_broker
from engine.core.config import Settings


def test_an_amqp_url_builds_a_rabbitmq_broker_with_a_heartbeat():
    broker = make_broker(Settings(broker_url="amqp://lembra:s%40cret@mq.internal:5673/clinic"))
    assert isinstance(broker, RabbitmqBroker)
    params = broker.parameters
    assert (params.host, params.port, params.virtual_host) == ("mq.internal", 5673, "clinic")
    assert (params.credentials.username, params.credentials.password) == ("lembra", "s@cret")
    assert params.heartbeat == 30


def test_the_urls_own_connection_options_win():
    params = make_broker(Settings(broker_url="amqp://guest:guest@127.0.0.1:5672/%2F?heartbeat=5&socket_timeout=3")).parameters
    assert (params.virtual_host, params.heartbeat, params.socket_timeout) == ("/", 5, 3)
