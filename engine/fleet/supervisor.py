"""`lembra worker`'s process supervisor: keep N worker processes running.

The `dramatiq` command's main process, when one of its children dies (SIGKILL, the OOM killer),
stops every other child and exits, so one bad message or one OOM kill takes the whole `lembra
worker` down and the fleet shrinks until something outside restarts it. This supervisor instead
runs N single-process workers (engine/fleet/worker_process.py) and replaces the one that died, after a
backoff, while its siblings keep sending.

- A child that dies is started again after 1 s, doubling up to 30 s while it keeps dying young
  (within `young` seconds of its start); a child that lived longer restarts after 1 s again.
- A child that dies young `give_up_after` times in a row is a broken deploy, not bad luck: the
  supervisor stops the others and exits 1, so systemd or compose (which restart it) show a failing
  service instead of a quiet restart loop.
- SIGTERM, SIGINT or SIGHUP: one SIGTERM to every child (a graceful stop: the messages being
  worked on finish), wait for them, exit 0. A second signal: SIGKILL to every child.
- The children are in the supervisor's process group, so `kill -9 -PGID` or systemd's cgroup
  kill still takes them all; each also gets a SIGTERM from the kernel if the supervisor dies.

`lembra worker` checks the settings, the database and the broker, then execs
`python -m engine.fleet.supervisor --processes N -- CHILD...`, so the process that stays is small
(standard library and logging only).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.core import metrics
from engine.fleet.worker_process import SUPERVISOR_PID_ENV

log = logging.getLogger("engine.fleet.supervisor")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float = 0.0
    young_deaths: int = 0
    last_exit: int | None = None
    #: The signals already sent to `proc`, so that no child gets the same one twice.
    sent: set[int] = field(default_factory=set)


class Supervisor:
    """Run `count` copies of `argv` and keep them running; `run()` returns the exit status."""

    def __init__(self, argv: Sequence[str], count: int, *, first_delay: float = 1.0, max_delay: float = 30.0,
                 young: float = 10.0, give_up_after: int = 5, poll: float = 0.2) -> None:
        if count < 1:
            raise ValueError("count must be at least 1")
        self.argv = list(argv)
        self.slots = [_Slot(i) for i in range(count)]
        self.first_delay, self.max_delay = first_delay, max_delay
        self.young, self.give_up_after, self.poll = young, give_up_after, poll
        self.stopping = False
        self.restarts = 0
        self._signals = 0

    # -- children ---------------------------------------------------------------------------

    def _start(self, slot: _Slot) -> None:
        env = dict(os.environ, **{SUPERVISOR_PID_ENV: str(os.getpid())})
        slot.proc = subprocess.Popen(self.argv, env=env)
        slot.sent = set()
        slot.started_at = time.monotonic()
        log.info("worker process started", extra={"slot": slot.index, "pid": slot.proc.pid})

    def _signal_children(self, sig: int) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None and sig not in slot.sent:
                slot.sent.add(sig)
                try:
                    slot.proc.send_signal(sig)
                except ProcessLookupError:
                    pass

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals += 1
        self.stopping = True
        if self._signals == 1:
            log.info("stopping worker processes", extra={"signal": signal.Signals(signum).name})
            self._signal_children(signal.SIGTERM)
        else:
            log.warning("killing worker processes", extra={"signal": signal.Signals(signum).name})
            self._signal_children(signal.SIGKILL)

    def _reap(self, slot: _Slot, now: float) -> bool:
        """Notice a dead child and plan its restart; False when the supervisor should give up."""
        assert slot.proc is not None
        metrics.worker_process_exited(slot.proc.pid)
        code = slot.proc.returncode
        lived = now - slot.started_at
        slot.young_deaths = slot.young_deaths + 1 if lived < self.young else 0
        delay = min(self.first_delay * 2 ** max(slot.young_deaths - 1, 0), self.max_delay)
        slot.last_exit, slot.proc, slot.restart_at = code, None, now + delay
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
        if slot.young_deaths >= self.give_up_after:
            log.error("worker process keeps dying at start; giving up",
                      extra={"slot": slot.index, "exit": how, "deaths": slot.young_deaths})
            return False
        log.warning("worker process died; starting a new one", extra={
            "slot": slot.index, "exit": how, "lived_seconds": round(lived, 1), "restart_in_seconds": delay})
        return True

    # -- main loop ----------------------------------------------------------------------------

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        status = 0
        try:
            for slot in self.slots:
                if not self.stopping:
                    self._start(slot)
            while not self.stopping:
                now = time.monotonic()
                for slot in self.slots:
                    if self.stopping:
                        break
                    if slot.proc is None:
                        if now >= slot.restart_at:
                            self.restarts += 1
                            self._start(slot)
                    elif slot.proc.poll() is not None and not self._reap(slot, now):
                        # (`_reap` plans the restart, unless the slot keeps dying at start.)
                        status = 1
                        self.stopping = True
                        self._signal_children(signal.SIGTERM)
                        break
                time.sleep(self.poll)
            # Again, for a child started while the signal was being handled.
            self._signal_children(signal.SIGTERM if self._signals < 2 else signal.SIGKILL)
            for slot in self.slots:
                if slot.proc is not None:
                    slot.proc.wait()
            log.info("worker processes stopped", extra={"status": status})
            return status
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.fleet.supervisor")
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("child", nargs=argparse.REMAINDER, help="-- then the command of one child")
    args = parser.parse_args(argv)
    child = args.child[1:] if args.child[:1] == ["--"] else args.child
    if not child or args.processes < 1:
        parser.error("needs --processes N (N >= 1) and a child command after --")
    from engine.core.logs import configure

    # Already validated by `lembra worker` (Settings.from_env), which execs this module.
    configure(os.environ.get("LEMBRA_LOG_LEVEL", "").strip().upper() or "INFO",
              os.environ.get("LEMBRA_LOG_FORMAT", "").strip().lower() or "json")
    log.info("supervising worker processes", extra={"processes": args.processes})
    metrics.serve("worker")  # the fleet's metrics (multiprocess directory, set up before the children start)
    return Supervisor(child, args.processes).run()


if __name__ == "__main__":
    sys.exit(main())
