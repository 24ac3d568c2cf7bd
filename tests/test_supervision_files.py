"""Every long-running process has something that restarts it: compose restart policies and the
example systemd units in docs/systemd/ (checked by `systemd-analyze verify` where it exists)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
UNITS = ("lembra-web.service", "lembra-worker.service", "lembra-scheduler.service")


def test_compose_restarts_every_long_running_service():
    yaml = pytest.importorskip("yaml")
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    long_running = [name for name, spec in services.items() if name != "migrate"]
    assert {"web", "worker", "scheduler"} <= set(long_running)
    assert {name: services[name].get("restart") for name in long_running} == \
        {name: "unless-stopped" for name in long_running}


@pytest.mark.parametrize("unit", UNITS)
def test_each_systemd_unit_restarts_on_failure(unit):
    text = (ROOT / "docs" / "systemd" / unit).read_text()
    lines = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in text.splitlines() if "=" in line
             and not line.startswith("#")}
    assert lines["Restart"] == "on-failure"
    assert lines["ExecStart"].split()[1] == unit.removeprefix("lembra-").removesuffix(".service")


def test_the_systemd_units_verify(tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    lembra = str(Path(sys.executable).with_name("lembra"))
    for unit in UNITS:
        text = (ROOT / "docs" / "systemd" / unit).read_text().replace("/opt/lembra/.venv/bin/lembra", lembra)
        (tmp_path / unit).write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / u) for u in UNITS)],
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
