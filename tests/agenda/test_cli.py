"""`lembra agenda`: professionals, free times and the availability webhook from the command line."""

from __future__ import annotations

import json

from click.testing import CliRunner

from admin.cli import main
from tests.factories import World, local
from tests.processes import lembra_env


def test_professionals_are_added_listed_and_their_free_times_shown(rt, clock):
    world = World(rt, slug="clinica-cli")
    contact = world.contact()
    world.appointment(contact, local(2026, 12, 2, 8), professional="Dra. Beatriz Costa")
    env = lembra_env(rt.settings.database_url)
    runner = CliRunner()
    added = runner.invoke(main, ["agenda", "add", "--org", "clinica-cli", "--name", "Dra. Beatriz Costa",
                                 "--hours", "0-4 08:00-12:00 13:00-18:00"], env=env)
    assert added.exit_code == 0, added.output
    assert "seg 08:00-12:00 13:00-18:00" in added.output and "1 agendamento com este nome ligado" in added.output
    listed = runner.invoke(main, ["agenda", "professionals", "--org", "clinica-cli", "--json"], env=env)
    assert [p["name"] for p in json.loads(listed.output)] == ["Dra. Beatriz Costa"]
    shown = runner.invoke(main, ["agenda", "slots", "--org", "clinica-cli", "--date", "2026-12-02", "--period",
                                 "morning", "--now", "2026-12-01T09:00:00-03:00"], env=env)
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines() == ["1. qua 02/12 08:30 — Dra. Beatriz Costa",
                                         "2. qua 02/12 10:00 — Dra. Beatriz Costa",
                                         "3. qua 02/12 11:30 — Dra. Beatriz Costa"]
    as_json = runner.invoke(main, ["agenda", "slots", "--org", "clinica-cli", "--json", "--limit", "1",
                                   "--now", "2026-12-01T09:00:00-03:00"], env=env)
    assert json.loads(as_json.output)[0]["starts_at"] == "2026-12-01T11:00:00-03:00"


def test_refusals_are_one_line_and_write_nothing(rt, clock):
    World(rt, slug="clinica-cli")
    env = lembra_env(rt.settings.database_url)
    runner = CliRunner()
    overlap = runner.invoke(main, ["agenda", "add", "--org", "clinica-cli", "--name", "X",
                                   "--hours", "0 08:00-12:00 11:00-13:00"], env=env)
    assert overlap.exit_code == 2 and "sobrepõem" in overlap.output
    listed = runner.invoke(main, ["agenda", "professionals", "--org", "clinica-cli", "--json"], env=env)
    assert json.loads(listed.output) == []
    bad = runner.invoke(main, ["agenda", "slots", "--org", "clinica-cli", "--from", "2026-12-05", "--to",
                               "2026-12-04"], env=env)
    assert bad.exit_code == 2 and "data final" in bad.output
    refused = runner.invoke(main, ["agenda", "availability-url", "--org", "clinica-cli", "http://10.0.0.9/slots"],
                            env=env)
    assert refused.exit_code == 2 and "rede interna" in refused.output
    assert runner.invoke(main, ["agenda", "slots", "--org", "nope"], env=env).exit_code == 2


def test_the_demo_clinic_has_an_agenda_with_free_times(rt, clock):
    from sqlalchemy import select

    from engine.fleet.demo import seed
    from engine.people.agenda import SlotQuery, free_slots, list_professionals, org_row
    from engine.store.models import appointments

    with rt.db.begin() as conn:
        made = seed(conn, rt.keyring)
    with rt.db.connect() as conn:
        staff = list_professionals(conn, made.org_id)
        assert [(p.name, len(p.hours)) for p in staff] == [("Dr. Carlos Nunes", 10), ("Dra. Beatriz Costa", 10)]
        linked = set(conn.execute(select(appointments.c.professional_id).where(appointments.c.org_id == made.org_id))
                     .scalars())
        assert linked == {staff[1].id}
        found = free_slots(conn, org_row(conn, made.org_id), SlotQuery(period="morning"), clock.now())
    assert len(found) == 3 and all(s.starts_at.hour < 12 for s in found)
