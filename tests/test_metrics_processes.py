"""Metrics of real processes (engine/core/metrics.py): what worker processes count is scraped from
their supervisor, added up over every process of the fleet (prometheus-client's multiprocess
mode), dead ones included; the scheduler serves its own; `lembra web` adds up its gunicorn
workers on `/metrics`. Over loopback, against the test's database and broker."""

from __future__ import annotations

import os
import signal
import socket
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from engine.store.models import messages
from engine.queue.outbox import enqueue
from tests.conftest import BROKER_URL
from tests.factories import World
from tests.processes import Processes, child_pids, flush_broker, lembra_env, wait_until

REAL_BROKER = not BROKER_URL.startswith("stub")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    flush_broker()
    processes = Processes(tmp_path)
    yield processes
    processes.stop_all()
    flush_broker()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:  # the error is the response: closed, with its connection
            return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        with exc:  # the error is the response: closed, with its connection
            return exc.code


def _sample(text: str, name: str, **labels: str) -> float:
    """A sample's value in an exposition (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def _scrape(port: int, name: str, **labels: str) -> float:
    status, text = _get(f"http://127.0.0.1:{port}/metrics")
    return _sample(text, name, **labels) if status == 200 else -1.0


def _sent(rt) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(messages).where(messages.c.status == "sent")).scalar_one()


def _metrics_dirs(base: Path, role: str) -> list[Path]:
    return sorted(base.glob(f"lembra-{role}-metrics-*")) if base.exists() else []


def _counter_pids(folder: Path) -> set[str]:
    return {p.stem.split("_", 1)[1] for p in folder.glob("counter_*.db")}


@pytest.mark.skipif(not REAL_BROKER, reason="`lembra worker` needs a real broker (Redis or RabbitMQ)")
def test_counters_incremented_in_worker_processes_are_scraped_from_the_fleet(rt, clock, procs, database_url,
                                                                           tmp_path):
    clock.set(datetime.now(UTC))
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    world.channel("whatsapp")
    contact = world.contact(consent=("whatsapp",))
    worker_port, scheduler_port = _free_port(), _free_port()
    folder = tmp_path / "metrics"
    env = lembra_env(database_url, LEMBRA_LOG_LEVEL="INFO", LEMBRA_LEASE_SECONDS="5", LEMBRA_SEND_TIMEOUT="2",
                     LEMBRA_WORKER_METRICS_PORT=str(worker_port), LEMBRA_SCHEDULER_METRICS_PORT=str(scheduler_port),
                     LEMBRA_METRICS_DIR=str(folder))
    fleet = procs.start("worker", ["worker", "--processes", "2", "--threads", "2"], env)
    log = procs.logdir / "worker.log"
    wait_until(lambda: log.read_text(errors="replace").count("ready for action") >= 2, timeout=90,
               what="two worker processes", on_fail=procs.logs)
    procs.start("scheduler", ["scheduler"], env)

    def queue(keys: range) -> None:
        with rt.db.begin() as conn:
            for i in keys:
                enqueue(conn, org_id=world.org_id, contact_id=contact, channel_kind="whatsapp", purpose="notice",
                        idempotency_key=f"metrics:{i}", payload={"text": f"Mensagem {i}"},
                        due_at=datetime.now(UTC) - timedelta(seconds=1), respect_window=False)

    queue(range(3))
    wait_until(lambda: _sent(rt) == 3, timeout=120, what="the first three sent", on_fail=procs.logs)
    wait_until(lambda: _scrape(worker_port, "lembra_sends_total", provider="sandbox", outcome="sent") == 3,
               timeout=30, what="the fleet's /metrics to count three sends", on_fail=procs.logs)

    # Kill a worker process that sent (as the OOM killer would): what it counted stays counted, and
    # the supervisor's replacement adds to it.
    with rt.db.connect() as conn:
        senders = Counter(conn.execute(select(messages.c.claimed_by).where(messages.c.status == "sent")).scalars())
    victim = int(senders.most_common(1)[0][0].rsplit(":", 1)[1])
    assert victim in child_pids(fleet.pid)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: log.read_text(errors="replace").count("ready for action") >= 3, timeout=90,
               what="a replacement worker process", on_fail=procs.logs)
    queue(range(3, 6))
    wait_until(lambda: _sent(rt) == 6, timeout=120, what="all six sent", on_fail=procs.logs)
    wait_until(lambda: _scrape(worker_port, "lembra_sends_total", provider="sandbox", outcome="sent") == 6,
               timeout=30, what="the fleet's /metrics to count six sends", on_fail=procs.logs)

    status, text = _get(f"http://127.0.0.1:{worker_port}/metrics")
    assert status == 200
    assert _sample(text, "lembra_provider_call_seconds_count", provider="sandbox") == 6
    assert _sample(text, "lembra_send_lateness_seconds_count", kind="whatsapp") == 6
    assert _sample(text, "lembra_message_events_total", event="sent") == 6
    assert _sample(text, "lembra_worker_process_exits_total") == 1
    assert _get(f"http://127.0.0.1:{worker_port}/healthz") == (200, "ok\n")
    [fleet_dir] = _metrics_dirs(folder, "worker")
    assert str(victim) in _counter_pids(fleet_dir) and len(_counter_pids(fleet_dir)) >= 2

    status, text = _get(f"http://127.0.0.1:{scheduler_port}/metrics")
    assert status == 200
    assert _sample(text, "lembra_scheduler_passes_total", result="ok") >= 1
    # At least one claim per message: a lease that ran out while the fleet replaced its process is claimed again.
    assert _sample(text, "lembra_scheduler_claimed_total", what="messages") >= 6
    assert _sample(text, "lembra_scheduler_leader") == 1
    assert _get(f"http://127.0.0.1:{scheduler_port}/healthz") == (200, "ok\n")

    procs.kill(fleet, signal.SIGTERM)
    assert _metrics_dirs(folder, "worker") == [], "the fleet removes its metrics directory when it stops"


def test_lembra_web_adds_up_its_gunicorn_workers_on_metrics(database_url, procs, tmp_path):
    port = _free_port()
    folder = tmp_path / "metrics"
    env = lembra_env(database_url, LEMBRA_METRICS_DIR=str(folder))
    web = procs.start("web", ["web", "--bind", f"127.0.0.1:{port}", "--workers", "2"], env)
    wait_until(lambda: _get(f"http://127.0.0.1:{port}/healthz")[0] == 200, timeout=90, what="lembra web",
               on_fail=procs.logs)
    for _ in range(10):
        assert _post(f"http://127.0.0.1:{port}/webhooks/sandbox/999999", b"{}") == 404
    for _ in range(6):  # whichever gunicorn worker answers, the count is the group's
        status, text = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert _sample(text, "lembra_webhooks_total", provider="sandbox", result="unknown_channel") == 10
        assert 'lembra_messages{status="pending"}' in text
    [web_dir] = _metrics_dirs(folder, "web")
    assert web_dir.name.startswith(f"lembra-web-metrics-{web.pid}-")
    assert _counter_pids(web_dir), "the gunicorn workers write their counters there"
    procs.kill(web, signal.SIGTERM)
    assert _metrics_dirs(folder, "web") == [], "lembra web removes its metrics directory when it stops"
