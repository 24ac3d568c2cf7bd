"""`lembra worker`'s supervisor (engine/fleet/supervisor.py) with stand-in children: a dead child is
replaced and its sibling left alone, a stop is one SIGTERM per child, a second signal kills, and a
child that keeps dying at start makes the supervisor exit 1. The same with real worker processes
on a real broker: tests/test_processes.py::test_a_killed_worker_process_is_replaced_and_the_fleet_keeps_sending."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.processes import child_pids, wait_until

#: A child that notes each SIGTERM in DIR/<pid>.term and stops 0.2 s after the first (or never: "stubborn").
#: It writes DIR/<pid>.ready once its handler is installed: a signal sent before that would kill the
#: interpreter still starting up, which is not what these tests are about.
CHILD = r"""
import os, signal, sys, time
folder, mode = sys.argv[1], sys.argv[2]
stopping = []
def term(*_):
    with open(os.path.join(folder, f"{os.getpid()}.term"), "a") as f:
        f.write("x")
    stopping.append(time.monotonic())
signal.signal(signal.SIGTERM, term)
open(os.path.join(folder, f"{os.getpid()}.ready"), "w").close()
while not (mode == "polite" and stopping and time.monotonic() - stopping[0] > 0.2):
    time.sleep(0.05)
"""


def _supervise(tmp_path: Path, child: list[str], count: int, **options: object) -> subprocess.Popen[str]:
    kwargs = ", ".join(f"{k}={v!r}" for k, v in {"first_delay": 0.1, "poll": 0.05, **options}.items())
    code = (f"import sys; from engine.fleet.supervisor import Supervisor; "
            f"sys.exit(Supervisor({child!r}, {count}, {kwargs}).run())")
    return subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[1], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _children_ready(tmp_path: Path, sup: subprocess.Popen[str], count: int) -> bool:
    pids = child_pids(sup.pid)
    return len(pids) == count and all((tmp_path / f"{pid}.ready").exists() for pid in pids)


def _terms(tmp_path: Path, pid: int) -> int:
    path = tmp_path / f"{pid}.term"
    return len(path.read_text()) if path.exists() else 0


def test_a_dead_child_is_replaced_and_a_stop_is_one_sigterm_each(tmp_path):
    sup = _supervise(tmp_path, [sys.executable, "-c", CHILD, str(tmp_path), "polite"], 2)
    try:
        wait_until(lambda: _children_ready(tmp_path, sup, 2), timeout=30, what="two children ready")
        first, second = child_pids(sup.pid)
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: _children_ready(tmp_path, sup, 2) and first not in child_pids(sup.pid), timeout=30,
                   what="a replacement child ready")
        assert second in child_pids(sup.pid), "the sibling was restarted too"
        assert sup.poll() is None
        # Every child the supervisor started but the killed one, from the files they wrote rather
        # than from another `ps`: a child that died since would show as 0 SIGTERMs, not vanish.
        children = sorted(pid for pid in (int(p.stem) for p in tmp_path.glob("*.ready")) if pid != first)
        assert len(children) == 2 and second in children, "one replacement, and nothing else, was started"

        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=30) == 0
        assert [_terms(tmp_path, pid) for pid in children] == [1, 1], "each child gets one SIGTERM"
        assert child_pids(sup.pid) == []
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        sup.stdout.close()  # the output pipe, which these tests do not read


def test_a_second_signal_kills_children_that_do_not_stop(tmp_path):
    sup = _supervise(tmp_path, [sys.executable, "-c", CHILD, str(tmp_path), "stubborn"], 2)
    try:
        wait_until(lambda: _children_ready(tmp_path, sup, 2), timeout=30, what="two children ready")
        children = child_pids(sup.pid)
        sup.send_signal(signal.SIGINT)
        wait_until(lambda: all(_terms(tmp_path, pid) == 1 for pid in children), timeout=30,
                   what="the SIGTERM forwarded")
        assert sup.poll() is None, "the supervisor waits for a graceful stop"
        sup.send_signal(signal.SIGINT)
        assert sup.wait(timeout=30) == 0
        assert child_pids(sup.pid) == []
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        sup.stdout.close()  # the output pipe, which these tests do not read


def test_a_child_that_keeps_dying_at_start_makes_the_supervisor_exit_1(tmp_path):
    sup = _supervise(tmp_path, [sys.executable, "-c", "import sys; sys.exit(3)"], 2, give_up_after=3)
    out, _ = sup.communicate(timeout=60)
    assert sup.returncode == 1, out
