"""`lembra understand`: the reader from the command line, with an org's timezone and keywords."""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import update

from admin.cli import main
from engine.store.models import orgs
from engine.tenants.orgs import create_org
from tests.processes import lembra_env

NOW = ["--now", "2026-12-07T10:00:00-03:00"]


def test_understand_prints_json_without_a_database():
    result = CliRunner().invoke(main, ["understand", *NOW, "--json", "dá pra ser sexta de manhã?"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "intent": "reschedule", "fields": {"date": "2026-12-11", "time": None, "period": "morning"},
        "confidence": json.loads(result.output)["confidence"], "engine": "builtin", "llm_calls": 0}


def test_understand_prints_lines_and_reads_naive_times_in_the_timezone():
    result = CliRunner().invoke(main, ["understand", "--now", "2026-12-11T10:00:00",
                                       "--appointment-at", "2026-12-11T16:00:00", "sexta às 18h"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["intent: reschedule (confidence 0.66)", "date: 2026-12-11",
                                          "time: 18:00", "period: -"]


def test_understand_menu_choice_when_pending():
    result = CliRunner().invoke(main, ["understand", *NOW, "--pending", "choice", "--json", "2"])
    assert json.loads(result.output)["fields"]["choice"] == 2


def test_understand_refuses_a_bad_now():
    result = CliRunner().invoke(main, ["understand", "--now", "ontem", "ok"])
    assert result.exit_code == 2 and "--now must be an ISO date-time" in result.output


def test_understand_uses_the_org_timezone_and_keywords(rt):
    with rt.db.begin() as conn:
        create_org(conn, slug="clinica-tz", name="Clínica", timezone="America/Manaus")
        conn.execute(update(orgs).where(orgs.c.slug == "clinica-tz").values(confirm_keywords="tamo junto, fechou"))
    env = lembra_env(rt.settings.database_url)
    runner = CliRunner()
    # 03:30 UTC on Tuesday is still Monday in Manaus (UTC-4): "amanhã" is Tuesday the 8th.
    result = runner.invoke(main, ["understand", "--org", "clinica-tz", "--now", "2026-12-08T03:30:00+00:00",
                                  "--json", "tamo junto, amanhã"], env=env)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["intent"] == "confirm" and shown["fields"]["date"] == "2026-12-08"
    missing = runner.invoke(main, ["understand", "--org", "nope", "ok"], env=env)
    assert missing.exit_code == 2 and "no org" in missing.output
