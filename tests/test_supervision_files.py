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
MIGRATE = "lembra-migrate.service"


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
    for unit in (*UNITS, MIGRATE):
        text = (ROOT / "docs" / "systemd" / unit).read_text().replace("/opt/lembra/.venv/bin/lembra", lembra)
        (tmp_path / unit).write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / u) for u in (*UNITS, MIGRATE))],
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def _directives(unit: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (ROOT / "docs" / "systemd" / unit).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _env_file(name: str) -> dict[str, str]:
    lines = (ROOT / "docs" / "systemd" / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def test_the_units_connect_as_the_application_role_and_only_the_migration_as_the_owner():
    """Issue 30, point 8: row-level security never applies to a superuser, so web, worker and
    scheduler read an environment whose DATABASE_URL is the application's role; the owner's URL
    is in a file only the migration unit reads."""
    from sqlalchemy.engine import make_url

    from engine.core.config import Settings

    app = _env_file("lembra.env.example")
    owner = _env_file("owner.env.example")
    assert "LEMBRA_OWNER_DATABASE_URL" not in app
    app_role, owner_role = make_url(app["DATABASE_URL"]).username, make_url(owner["LEMBRA_OWNER_DATABASE_URL"]).username
    assert app_role and app_role not in (owner_role, "postgres")
    settings = Settings.from_env({**app, **owner})  # both files together are valid settings
    assert make_url(settings.migration_url).username == owner_role
    for unit in UNITS:
        assert _directives(unit)["EnvironmentFile"] == ["/etc/lembra/lembra.env"], unit
    migrate = _directives(MIGRATE)
    assert migrate["EnvironmentFile"] == ["/etc/lembra/lembra.env", "/etc/lembra/owner.env"]
    assert migrate["Type"] == ["oneshot"]
    assert migrate["ExecStart"][0].split()[1:] == ["db", "upgrade"]
