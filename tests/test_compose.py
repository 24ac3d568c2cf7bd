"""docker-compose.yml, .dockerignore and the image (issue 9, point 16): one image built once and
named, healthchecks on every Lembra service, restart policies, the settings each service needs, a
first run that needs nothing but Docker.

The compose file is read through `docker compose config` where the compose plugin is installed
(it needs no daemon), else parsed as YAML. The image is built only where a Docker daemon answers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from engine.core import metrics
from tests.conftest import IS_POSTGRES

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
LEMBRA_SERVICES = ("migrate", "web", "worker", "scheduler")
LONG_RUNNING = ("postgres", "redis", "web", "worker", "scheduler")
IMAGE = "lembra:local"


def _docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str] | None:
    if shutil.which("docker") is None:
        return None
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _compose_plugin() -> bool:
    done = _docker("compose", "version")
    return done is not None and done.returncode == 0


def _daemon() -> bool:
    done = _docker("info", "--format", "{{.ServerVersion}}")
    return done is not None and done.returncode == 0 and bool(done.stdout.strip())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The compose model: `docker compose config` (interpolated, normalised) or the YAML itself."""
    if _compose_plugin():
        env = {**os.environ, "LEMBRA_SECRET_KEYS": "1:" + "A" * 43 + "="}
        done = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--format", "json"],
                              capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout) | {"_normalised": True}
    yaml = pytest.importorskip("yaml", reason="neither the docker compose plugin nor PyYAML is installed")
    return yaml.safe_load(COMPOSE.read_text()) | {"_normalised": False}


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else list(command)


def _env(compose: dict[str, Any], name: str) -> dict[str, str]:
    env = compose["services"][name].get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def test_the_services_of_a_full_deployment(compose):
    assert set(compose["services"]) == {"postgres", "redis", *LEMBRA_SERVICES}
    services = compose["services"]
    assert _command(services["migrate"]) == ["lembra", "db", "upgrade"]
    assert _command(services["web"])[:2] == ["lembra", "web"] and "0.0.0.0:8000" in _command(services["web"])
    assert _command(services["worker"])[:2] == ["lembra", "worker"]
    assert _command(services["scheduler"]) == ["lembra", "scheduler"]
    [published] = services["web"]["ports"]
    if isinstance(published, dict):  # normalised by `docker compose config`
        assert (published["target"], str(published["published"])) == (8000, "8000")
    else:
        assert published == "8000:8000"


def test_one_image_is_built_once_named_and_reused(compose):
    services = compose["services"]
    builders = [name for name in LEMBRA_SERVICES if services[name].get("build")]
    assert builders == ["web"], "exactly one service builds the image"
    for name in LEMBRA_SERVICES:
        assert services[name]["image"] == IMAGE, name
        if name not in builders:
            assert services[name].get("pull_policy") == "never", f"{name} must not try to pull {IMAGE}"


def test_every_lembra_service_has_a_healthcheck_on_its_own_port(compose):
    services = compose["services"]
    ports = {"web": 8000, "worker": metrics.DEFAULT_PORT["worker"], "scheduler": metrics.DEFAULT_PORT["scheduler"]}
    for name, port in ports.items():
        check = services[name]["healthcheck"]
        test = check["test"]
        assert test[0] == "CMD", f"{name}: exec form, no shell in the image needed"
        assert f"http://127.0.0.1:{port}/healthz" in " ".join(test), name
        assert test[1] == "python" and test[2] == "-c"
        compile(test[3], f"{name} healthcheck", "exec")  # the probe is valid Python
        assert check.get("interval") and check.get("retries"), name
    for name in ("postgres", "redis"):
        assert services[name]["healthcheck"]["test"], name


def test_restart_policies(compose):
    services = compose["services"]
    for name in LONG_RUNNING:
        assert services[name].get("restart") == "unless-stopped", name
    # The migration is a one-shot that the others wait for (service_completed_successfully).
    assert services["migrate"].get("restart", "no") == "no"


def test_dependencies_wait_for_healthy_stores_and_the_migration(compose):
    services = compose["services"]

    def condition(name: str, on: str) -> str | None:
        depends = services[name].get("depends_on") or {}
        return depends.get(on, {}).get("condition") if isinstance(depends, dict) else None

    assert condition("migrate", "postgres") == "service_healthy"
    for name in ("web", "worker", "scheduler"):
        assert condition(name, "migrate") == "service_completed_successfully", name
        assert condition(name, "redis") == "service_healthy", name


def test_environment_of_the_lembra_services(compose):
    for name in LEMBRA_SERVICES:
        env = _env(compose, name)
        assert env["DATABASE_URL"].startswith("postgresql+psycopg://") and "@postgres:5432/" in env["DATABASE_URL"]
        assert env["BROKER_URL"].startswith("redis://redis:6379/")
        assert env["LEMBRA_METRICS_HOST"] == "0.0.0.0", "Prometheus scrapes worker and scheduler over the network"
        assert "LEMBRA_PUBLIC_URL" in env
        keys = env["LEMBRA_SECRET_KEYS"]
        if compose["_normalised"]:
            assert keys == "1:" + "A" * 43 + "=", "taken from the environment (.env)"
        else:
            assert re.fullmatch(r"\$\{LEMBRA_SECRET_KEYS(:?-[^}]*)?\}", keys), \
                "from the environment (.env), never a key written in the file"


def _postgres_superuser(compose: dict[str, Any]) -> str:
    """The official image makes POSTGRES_USER a superuser (row-level security never applies to it)."""
    return _env(compose, "postgres").get("POSTGRES_USER") or "postgres"


def test_only_the_migration_connects_as_the_owner_the_others_as_the_application_role(compose):
    """Issue 30, point 8: web, worker and scheduler connected as the image's superuser, to which
    row-level security never applies."""
    from sqlalchemy.engine import make_url

    from engine.core.config import Settings

    superuser = _postgres_superuser(compose)
    migrate = _env(compose, "migrate")
    owner = make_url(migrate["LEMBRA_OWNER_DATABASE_URL"])
    assert owner.username == superuser, "the migration runs as the schema's owner"
    for name in ("web", "worker", "scheduler"):
        env = _env(compose, name)
        app = make_url(env["DATABASE_URL"])
        assert app.username not in (superuser, "postgres", None), f"{name} connects as a superuser"
        assert (app.host, app.port, app.database) == (owner.host, owner.port, owner.database), name
        assert "LEMBRA_OWNER_DATABASE_URL" not in env, f"{name} must not be given the owner's URL"
        # The migration grants DATABASE_URL's role: the one these services use.
        assert migrate["DATABASE_URL"] == env["DATABASE_URL"], name
    settings = Settings.from_env({**migrate, "LEMBRA_SECRET_KEYS": ""})
    assert settings.migration_url.startswith("postgresql+psycopg://" + superuser + ":")
    assert make_url(settings.database_url).username == make_url(_env(compose, "web")["DATABASE_URL"]).username


@pytest.mark.skipif(not IS_POSTGRES, reason="runs the compose file's migration on PostgreSQL")
def test_the_compose_migration_makes_the_role_the_services_then_run_as(compose, owner_database_url):
    """The compose environment, pointed at the test server: `migrate` (as the owner, which the
    suite's superuser stands for) creates the application's role; the scheduler's environment
    then runs as it, and its start does not warn that row-level security is off."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from engine.words.catalogue import describe
    from tests.processes import LEMBRA, lembra_env

    test_db = make_url(owner_database_url)
    role = f"lembra_compose_{uuid.uuid4().hex[:8]}"

    def here(url: str, **user: Any) -> str:
        parsed = make_url(url).set(host=test_db.host, port=test_db.port, database=test_db.database, **user)
        return parsed.render_as_string(hide_password=False)

    migrate, scheduler = _env(compose, "migrate"), _env(compose, "scheduler")
    app_url = here(scheduler["DATABASE_URL"], username=role)
    owner_url = here(migrate["LEMBRA_OWNER_DATABASE_URL"], username=test_db.username, password=test_db.password)
    warning = str(describe("row_security_bypassed", role="ROLE")).split("ROLE")[0]
    try:
        done = subprocess.run([LEMBRA, *_command(compose["services"]["migrate"])[1:]], capture_output=True, text=True,
                              timeout=120, check=False, env=lembra_env(app_url, LEMBRA_OWNER_DATABASE_URL=owner_url))
        assert done.returncode == 0, done.stderr
        assert warning not in done.stderr
        once = subprocess.run([LEMBRA, "scheduler", "--once"], capture_output=True, text=True, timeout=120, check=False,
                              env=lembra_env(app_url))
        assert once.returncode == 0, once.stderr
        assert warning not in once.stderr
    finally:
        engine = create_engine(test_db)
        with engine.begin() as conn:
            if conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
                conn.execute(text(f'DROP OWNED BY "{role}"'))
                conn.execute(text(f'DROP ROLE "{role}"'))
        engine.dispose()


def test_postgres_keeps_its_data_in_a_named_volume(compose):
    volumes = compose["services"]["postgres"]["volumes"]
    sources = [v["source"] if isinstance(v, dict) else v.split(":", 1)[0] for v in volumes]
    targets = [v["target"] if isinstance(v, dict) else v.split(":", 2)[1] for v in volumes]
    assert "/var/lib/postgresql/data" in targets
    assert "pgdata" in sources and "pgdata" in compose["volumes"]


@pytest.mark.skipif(not _compose_plugin(), reason="the docker compose plugin is not installed "
                                                  "(`docker compose version` fails); the YAML was checked instead")
def test_docker_compose_accepts_the_file_without_a_daemon():
    done = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={**os.environ, "LEMBRA_SECRET_KEYS": ""}, check=False)
    assert done.returncode == 0, done.stderr  # keys may be missing: `lembra keys generate` runs through it


# --- .dockerignore -----------------------------------------------------------------------------


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker reads it (Go filepath.Match, plus `**`), for a path and
    everything under it."""
    pattern = pattern.strip("/")
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "(?:/.*)?")


def _ignored(path: str) -> bool:
    return any(_pattern(p).fullmatch(path) for p in _dockerignore())


def test_dockerignore_keeps_local_state_secrets_and_history_out_of_the_image():
    assert not any(p.startswith("!") for p in _dockerignore()), "no exceptions: every line excludes"
    for path in (".venv/bin/python", "lembra.db", "lembra.db-wal", "data/other.db", "lembra.key", "keys/old.key",
                 ".git/HEAD", "test-artifacts/screenshot.png", ".env", "engine/__pycache__/x.cpython-311.pyc"):
        assert _ignored(path), f"{path} would be copied into the image"
    for path in ("README.md", "pyproject.toml", "engine/core/metrics.py", "admin/templates/base.html",
                 "sql/postgresql/0001.initial-schema.sql", "providers/sandbox/provider.py"):
        assert not _ignored(path), f"{path} is needed in the image"


# --- the image ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not _daemon(), reason="no Docker daemon answers here (`docker info` fails): the image "
                                          "build is tested where one runs")
def test_the_image_builds_without_local_state_and_runs_lembra(tmp_path):
    tag = "lembra:test-build"
    done = _docker("build", "-t", tag, ".", timeout=1800)
    assert done is not None and done.returncode == 0, done and done.stderr[-3000:]
    try:
        listing = _docker("run", "--rm", tag, "sh", "-c", "ls -A /app", timeout=120)
        assert listing is not None and listing.returncode == 0
        present = set(listing.stdout.split())
        assert not present & {".venv", ".git", "lembra.db", "lembra.key", ".env", "test-artifacts", "tests"}
        assert {"engine", "admin", "sql", "README.md"} <= present
        keys = _docker("run", "--rm", tag, "lembra", "keys", "generate", timeout=120)
        assert keys is not None and re.fullmatch(r"\d+:[A-Za-z0-9+/=]{44}", keys.stdout.strip())
    finally:
        _docker("image", "rm", "-f", tag, timeout=120)
