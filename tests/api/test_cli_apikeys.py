"""`lembra apikeys create` prints a working key once, on its last line; only its hash is stored."""

from __future__ import annotations

import subprocess

from sqlalchemy import select

from engine.store.models import api_keys
from tests.factories import World
from tests.processes import LEMBRA, lembra_env


def test_apikeys_create_prints_a_working_key_once(rt, client, database_url):
    world = World(rt, slug="clinica-cli")
    done = subprocess.run([LEMBRA, "apikeys", "create", "--org", "clinica-cli", "--name", "Agenda"],
                          env=lembra_env(database_url), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip().splitlines()[-1]
    assert key.startswith("lembra_")
    with rt.db.connect() as conn:
        row = conn.execute(select(api_keys).where(api_keys.c.org_id == world.org_id)).one()
    assert row.name == "Agenda" and key not in str(tuple(row)) and key.split("_")[1] == row.prefix
    assert client.get("/api/v1/contacts", headers={"Authorization": f"Bearer {key}"}).status_code == 200

    unknown = subprocess.run([LEMBRA, "apikeys", "create", "--org", "nope", "--name", "x"],
                             env=lembra_env(database_url), capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "no org" in unknown.stderr and "lembra_" not in unknown.stdout
