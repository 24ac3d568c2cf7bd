"""`lembra orgs list` as an operator runs it: every org's slug (what `--org` takes) and name, and
nothing else: no user, key or channel secret."""

from __future__ import annotations

import json
import subprocess

from engine.tenants.apikeys import create_key
from engine.tenants.orgs import create_user
from tests.factories import World
from tests.processes import LEMBRA, lembra_env


def lembra(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LEMBRA, "orgs", *args], env=lembra_env(database_url), capture_output=True, text=True,
                          timeout=120)


def test_orgs_list_shows_slug_and_name_and_no_secret(rt, database_url):
    empty = lembra(database_url, "list")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.strip() == "no orgs"
    sorriso = World(rt, slug="sorriso")
    World(rt, slug="ana-clinica")
    sorriso.channel("whatsapp")
    with rt.db.begin() as conn:
        key = create_key(conn, org_id=sorriso.org_id, name="Agenda").key
        create_user(conn, org_id=sorriso.org_id, email="dona@sorriso.local", role="owner", password="s3nh4-longa-o-bastante")
    listed = lembra(database_url, "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.strip().splitlines()
    assert lines[0].split() == ["SLUG", "NAME"]
    assert [line.split(None, 1) for line in lines[1:]] == [["ana-clinica", "Clínica Ana-Clinica"],
                                                           ["sorriso", "Clínica Sorriso"]]
    as_json = json.loads(lembra(database_url, "list", "--json").stdout)
    assert [(o["slug"], o["name"]) for o in as_json] == [("ana-clinica", "Clínica Ana-Clinica"),
                                                         ("sorriso", "Clínica Sorriso")]
    assert set(as_json[0]) == {"id", "slug", "name"}
    for out in (listed.stdout + listed.stderr, json.dumps(as_json)):
        assert key not in out and "s3nh4" not in out and "dona@sorriso.local" not in out


def test_orgs_staff_quiet_sets_the_clinic_phone_quiet_time(rt, database_url):
    from sqlalchemy import select

    from engine.store.models import orgs

    World(rt, slug="sorriso")
    done = lembra(database_url, "staff-quiet", "--org", "sorriso", "--minutes", "45")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "sorriso: 45 minutes"  # out of range: tests/test_clinic_phone.py
    with rt.db.connect() as conn:
        assert conn.execute(select(orgs.c.staff_quiet_minutes).where(orgs.c.slug == "sorriso")).scalar() == 45
