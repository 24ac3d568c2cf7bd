"""The `lembra` command line as ops scripts use it: exit codes, one-line errors, idempotent
upgrade, and the embedded default delivering the demo's reminders within a minute."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IS_POSTGRES
from tests.processes import LEMBRA, Processes, lembra_env, wait_until


def run(args: list[str], env: dict[str, str], cwd: Path | None = None, stdin: str | None = None):
    return subprocess.run([LEMBRA, *args], env=env, cwd=cwd, input=stdin, capture_output=True, text=True,
                          timeout=120)


def one_line_error(result) -> str:
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert lines[0].startswith("lembra: error: ")
    return lines[0]


def test_db_upgrade_twice_is_a_no_op(tmp_path):
    env = lembra_env(f"sqlite:///{tmp_path}/fresh.db")
    first = run(["db", "upgrade"], env)
    assert first.returncode == 0, first.stderr
    assert "0001.initial-schema" in first.stdout
    second = run(["db", "upgrade"], env)
    assert second.returncode == 0
    assert second.stdout.strip() == "schema is up to date"


@pytest.mark.parametrize("url, expected", [
    ("mysql://x@y/z", "unsupported database"),
    ("not a url", "not a database URL"),
    ("sqlite:////nonexistent/folder/x.db", "does not exist"),
    ("postgresql+psycopg://lembra:s3cret-pw@127.0.0.1:1/lembra", "cannot connect"),
])
def test_bad_database_url_is_one_line_and_exit_2(tmp_path, url, expected):
    result = run(["messages"], lembra_env(url))
    assert result.returncode == 2
    line = one_line_error(result)
    assert expected in line
    assert "s3cret-pw" not in result.stderr


def test_a_command_in_a_folder_without_lembra_says_so_and_creates_nothing(tmp_path):
    """Issue 11, finding 11: `lembra messages` elsewhere created lembra.db and printed a traceback."""
    env = lembra_env("")
    for name in ("DATABASE_URL", "BROKER_URL", "LEMBRA_SECRET_KEYS"):
        env.pop(name)
    result = run(["messages"], env, cwd=tmp_path)
    assert result.returncode == 2
    assert "no Lembra database at" in one_line_error(result)
    assert list(tmp_path.iterdir()) == [], "no empty lembra.db or key left behind"

    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    result = run(["messages"], lembra_env(f"sqlite:///{empty}"), cwd=tmp_path)
    assert result.returncode == 2 and "lembra db upgrade" in one_line_error(result)


def test_up_on_a_taken_port_says_so_in_one_line(tmp_path):
    """Issue 11, finding 11: a second `lembra up` (or anything on 8000) is not a traceback."""
    env = lembra_env("")
    for name in ("DATABASE_URL", "BROKER_URL", "LEMBRA_SECRET_KEYS"):
        env.pop(name)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(["up", "--no-demo", "--port", str(port)], env, cwd=tmp_path)
    assert result.returncode == 2
    assert f"port {port} is already in use" in one_line_error(result) and "--port" in result.stderr


@pytest.mark.parametrize("url, expected", [
    ("kafka://x", "BROKER_URL must start with"),
    ("redis://127.0.0.1:1/0", "cannot connect to redis"),
])
def test_bad_broker_url_is_one_line_and_exit_2(tmp_path, url, expected):
    env = lembra_env(f"sqlite:///{tmp_path}/x.db", BROKER_URL=url)
    result = run(["scheduler", "--once"], env)
    assert result.returncode == 2
    assert expected in one_line_error(result)


def test_orgs_and_users_create_validate_and_write_nothing_on_error(tmp_path, database_url):
    env = lembra_env(database_url)
    bad_tz = run(["orgs", "create", "--slug", "clinica", "--name", "Clínica", "--timezone", "Mars/Olympus"], env)
    assert bad_tz.returncode == 2 and "unknown timezone" in one_line_error(bad_tz)
    bad_state = run(["orgs", "create", "--slug", "clinica", "--name", "Clínica", "--state", "XX"], env)
    assert bad_state.returncode == 2 and "unknown state" in one_line_error(bad_state)
    ok = run(["orgs", "create", "--slug", "clinica", "--name", "Clínica", "--state", "sp"], env)
    assert ok.returncode == 0 and ok.stdout.strip().isdigit()
    again = run(["orgs", "create", "--slug", "clinica", "--name", "Outra"], env)
    assert again.returncode == 2 and "already exists" in one_line_error(again)

    prompted = run(["users", "create", "--org", "clinica", "--email", "dona@clinica.com.br", "--role", "owner"],
                   env, stdin="correct horse battery\ncorrect horse battery\n")
    assert prompted.returncode == 0, prompted.stderr
    assert "correct horse" not in prompted.stdout
    dup = run(["users", "create", "--org", "clinica", "--email", "dona@clinica.com.br", "--role", "agent",
               "--password", "another-password"], env)
    assert dup.returncode == 2 and "already exists" in one_line_error(dup)
    short = run(["users", "create", "--org", "clinica", "--email", "x@clinica.com.br", "--role", "agent",
                 "--password", "short"], env)
    assert short.returncode == 2 and "at least 8" in one_line_error(short)
    no_org = run(["users", "create", "--org", "nope", "--email", "y@clinica.com.br", "--role", "agent",
                  "--password", "long-enough-pw"], env)
    assert no_org.returncode == 2 and "no org" in one_line_error(no_org)


def test_scheduler_once_sends_due_demo_messages_and_logs_no_pii(tmp_path, database_url, owner_database_url):
    env = lembra_env(database_url, LEMBRA_LOG_LEVEL="DEBUG")
    # `demo seed` migrates first, which the application's role may not (LEMBRA_TEST_APP_ROLE): the owner does.
    owner = {"LEMBRA_OWNER_DATABASE_URL": owner_database_url} if owner_database_url != database_url else {}
    seeded = run(["demo", "seed"], {**env, **owner})
    assert seeded.returncode == 0, seeded.stderr
    once = run(["scheduler", "--once"], env)
    assert once.returncode == 0, once.stderr
    assert once.stdout.strip().startswith("claimed ")
    assert int(once.stdout.split()[1]) >= 1
    table = run(["messages", "--org", "demo"], env)
    assert table.returncode == 0
    assert "session_confirmation" in table.stdout and "totals:" in table.stdout
    everything = once.stderr + once.stdout + table.stdout + table.stderr + seeded.stderr
    for pii in ("Ana Clara", "Bruno", "99876", "ana@example.com", "Olá", "lembra-demo"):
        assert pii not in everything, f"{pii!r} leaked into CLI output or logs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: A message that went out: the demo's sandbox reports it delivered and read seconds later.
GONE_OUT = "('sent', 'delivered', 'read')"


@pytest.mark.skipif(IS_POSTGRES, reason="the embedded default is SQLite")
def test_embedded_default_sends_demo_reminders_within_a_minute(tmp_path):
    """The README's first command, minus the install: `lembra up` in an empty folder."""
    env = lembra_env("")
    for name in ("DATABASE_URL", "BROKER_URL", "LEMBRA_SECRET_KEYS"):
        env.pop(name)
    port = _free_port()
    procs = Processes(tmp_path)
    started = time.monotonic()
    with open(tmp_path / "up.log", "wb") as log:  # the child writes to its own copy
        proc = subprocess.Popen([LEMBRA, "up", "--port", str(port)], cwd=tmp_path, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    procs.children.append(proc)
    db_file = tmp_path / "lembra.db"

    def reminders_sent() -> int:
        if not db_file.exists():
            return 0
        try:
            with sqlite3.connect(db_file, timeout=1) as conn:
                return conn.execute(
                    f"SELECT count(*) FROM messages WHERE purpose = 'session_reminder' AND status IN {GONE_OUT}"
                ).fetchone()[0]
        except sqlite3.OperationalError:
            return 0

    try:
        # The demo reminders are due 30-50 s after start; the deadline only bounds a broken run.
        wait_until(lambda: reminders_sent() >= 2, timeout=180, what="demo reminders in the sandbox",
                   on_fail=lambda: (tmp_path / "up.log").read_text(errors="replace")[-3000:])
        elapsed = time.monotonic() - started
        with sqlite3.connect(db_file) as conn:
            in_sandbox = conn.execute("SELECT count(*) FROM sandbox_messages").fetchone()[0]
        assert in_sandbox >= 2
        assert (tmp_path / "lembra.key").exists(), "embedded mode keeps its own credential key"
        print(f"demo reminders sent {elapsed:.0f}s after start")
        _demo_follow_up_is_sent_and_a_reply_is_routed(db_file, port, tmp_path)
    finally:
        procs.stop_all()


def _demo_follow_up_is_sent_and_a_reply_is_routed(db_file, port: int, tmp_path) -> None:
    """The demo's follow-up flow: the enrolled patient gets the follow-up, and a reply typed as the
    patient (the sandbox webhook the console's chat also feeds) is classified and routed."""

    def one(sql: str) -> Any:
        try:
            with sqlite3.connect(db_file, timeout=1) as conn:
                row = conn.execute(sql).fetchone()
                return row[0] if row else None
        except sqlite3.OperationalError:
            return None

    log = lambda: (tmp_path / "up.log").read_text(errors="replace")[-3000:]  # noqa: E731
    wait_until(lambda: one(f"SELECT count(*) FROM messages WHERE purpose = 'followup' AND status IN {GONE_OUT}") == 1,
               timeout=120, what="the demo follow-up in the sandbox", on_fail=log)
    wait_until(lambda: one("SELECT status FROM enrollments") == "waiting_reply", timeout=60,
               what="the demo run waiting for a reply", on_fail=log)
    channel = one("SELECT id FROM channels WHERE kind = 'whatsapp'")
    phone = one("SELECT c.phone FROM contacts c JOIN enrollments e ON e.contact_id = c.id")
    body = json.dumps({"type": "message", "id": "demo-reply-1", "from": phone, "text": "Posso remarcar para sexta?",
                       "timestamp": time.time()}).encode()
    url = f"http://127.0.0.1:{port}/webhooks/sandbox/{channel}"
    unsigned = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:  # the demo's sandbox has a secret, like every one
        urllib.request.urlopen(unsigned, timeout=10)
    assert refused.value.code == 401
    refused.value.close()  # the error is the response, which holds its connection open until closed
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "X-Sandbox-Secret": _sandbox_secret(db_file, tmp_path, channel)})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    wait_until(lambda: one("SELECT current_node_id FROM enrollments") == "remarcar", timeout=60,
               what="the reply classified and routed", on_fail=log)
    assert one("SELECT last_class FROM enrollments") == "reschedule"


def _sandbox_secret(db_file, tmp_path, channel_id: int) -> str:
    """The secret the demo's sandbox channel got at creation, opened with the embedded key file."""
    from gateway.crypto import Keyring

    keyring = Keyring.parse((tmp_path / "lembra.key").read_text().strip())
    with sqlite3.connect(db_file, timeout=5) as conn:
        org_id, credentials, key_version = conn.execute(
            "SELECT org_id, credentials, key_version FROM channels WHERE id = ?", (channel_id,)).fetchone()
    return str(keyring.open(credentials, key_version=key_version, table="channels", org_id=org_id,
                            row_id=channel_id)["webhook_secret"])
