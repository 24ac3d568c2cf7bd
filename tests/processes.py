"""Run real `lembra` processes from tests, against the test's database and broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tests.conftest import BROKER_URL, TEST_KEY

LEMBRA = str(Path(sys.executable).with_name("lembra"))


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
        log = open(self.logdir / f"{name}.log", "ab")
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
        for proc in self.children:
            if proc.poll() is None:
                self.kill(proc, signal.SIGTERM)

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
