"""Run real `lembra` processes from tests, against the test's database and broker."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tests.conftest import BROKER_URL, TEST_KEY

LEMBRA = str(Path(sys.executable).with_name("lembra"))
#: 'stub', 'redis' or 'rabbitmq': the broker the process tests run on (LEMBRA_TEST_BROKER_URL).
BROKER_KIND = {"stub": "stub", "redis": "redis", "rediss": "redis", "amqp": "rabbitmq",
               "amqps": "rabbitmq"}[BROKER_URL.split("://", 1)[0]]


def flush_broker() -> None:
    """Drop every message waiting in the test broker: FLUSHDB on Redis (the tests' own db), a purge
    of Lembra's queues (with their delay and dead-letter queues) on RabbitMQ, nothing on the stub.
    Tests call it before they start (no actor message of an earlier test may reach this test's
    reused ids) and to lose the broker's contents mid-run."""
    if BROKER_KIND == "redis":
        import redis

        redis.Redis.from_url(BROKER_URL).flushdb()
    elif BROKER_KIND == "rabbitmq":
        import pika
        from dramatiq.common import dq_name, xq_name

        from engine.fleet.actors import FLOWS_QUEUE, INBOUND_QUEUE, SEND_QUEUE, WEBHOOKS_QUEUE

        logging.getLogger("pika").setLevel(logging.ERROR)  # a queue not declared yet is a 404 warning
        connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
        try:
            channel = connection.channel()
            for queue in (SEND_QUEUE, INBOUND_QUEUE, FLOWS_QUEUE, WEBHOOKS_QUEUE):
                for name in (queue, dq_name(queue), xq_name(queue)):
                    try:
                        channel.queue_purge(name)
                    except pika.exceptions.ChannelClosedByBroker:  # 404: not declared yet
                        channel = connection.channel()
        finally:
            connection.close()


def child_pids(pid: int) -> list[int]:
    """The live (not zombie) child processes of `pid`, as `ps` lists them."""
    out = subprocess.run(["ps", "-o", "pid=,stat=", "--ppid", str(pid)], capture_output=True, text=True,
                         check=False).stdout
    return sorted(int(p) for p, stat in (line.split() for line in out.splitlines()) if not stat.startswith("Z"))


def lembra_env(database_url: str, **extra: str) -> dict[str, str]:
    """Environment for a child `lembra` process bound to the test's database and broker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMBRA_", "DATABASE_URL", "BROKER_URL"))}
    env.update({
        "DATABASE_URL": database_url,
        "BROKER_URL": BROKER_URL,
        "LEMBRA_SECRET_KEYS": TEST_KEY,
        "LEMBRA_LOG_LEVEL": "WARNING",
        "LEMBRA_DISPATCH_INTERVAL": "0.2",
        "LEMBRA_POPULATE_INTERVAL": "3600",
        # The provider fakes listen on 127.0.0.1, which the egress guard refuses by default.
        "LEMBRA_PROVIDER_ALLOW": "127.0.0.0/8",
    })
    env.update(extra)
    return env


class Processes:
    """Child processes, each in its own process group so a SIGKILL takes its children too."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.children: list[subprocess.Popen[bytes]] = []
        self.names: dict[int, str] = {}

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.logdir / f"{name}.log", "ab") as log:  # the child writes to its own copy
            proc = subprocess.Popen([LEMBRA, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.children.append(proc)
        self.names[proc.pid] = name
        return proc

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def stop_all(self) -> None:
        """Stop every group, also one whose leader a test already killed: its children would
        otherwise go on consuming from the shared test broker during later tests."""
        for proc in self.children:
            self.kill(proc, signal.SIGTERM)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group outlived its leader
            except ProcessLookupError:
                pass

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
        """Wait until a started process logs that it is ready to work (needs LEMBRA_LOG_LEVEL=INFO)."""
        path = self.logdir / f"{self.names[proc.pid]}.log"
        markers = ("ready for action", "embedded scheduler and workers started", "scheduler is active")
        wait_until(lambda: any(m in path.read_text(errors="replace") for m in markers), timeout=timeout,
                   what=f"{self.names[proc.pid]} to be ready", on_fail=self.logs)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logdir.glob("*.log"))


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str, on_fail: Callable[[], str] = str) -> None:
    """Poll `condition` until true; fail with `what` (and diagnostics) after `timeout` seconds.
    A deadline, not a timing assertion: it only bounds how long a broken run may hang."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{on_fail()}")
