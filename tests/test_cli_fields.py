"""`lembra fields` as an operator runs it: declare, list and remove an org's conversation fields; a
refused save prints the catalogue's sentences and writes nothing; another org's fields are not seen."""

from __future__ import annotations

import json
import subprocess

from sqlalchemy import func, select

from engine.store.models import conversation_fields
from tests.factories import World
from tests.processes import LEMBRA, lembra_env


def lembra(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LEMBRA, "fields", *args], env=lembra_env(database_url), capture_output=True, text=True,
                          timeout=120)


def test_declare_list_and_remove_a_choice_field(rt, database_url):
    World(rt, slug="sorriso")
    World(rt, slug="outra")
    added = lembra(database_url, "add", "--org", "sorriso", "--slug", "unidade", "--label", "Unidade", "--type",
                   "choice", "--question", "Em qual unidade?", "--option", "centro=Centro", "--option", "Zona Sul")
    assert added.returncode == 0, added.stderr
    assert "unidade" in added.stdout and "when_asked" in added.stdout
    listed = json.loads(lembra(database_url, "list", "--org", "sorriso", "--json").stdout)
    assert [(f["slug"], [o["label"] for o in f["options"]]) for f in listed] == [("unidade", ["Centro", "Zona Sul"])]
    assert lembra(database_url, "list", "--org", "outra").stdout.strip() == "no fields"
    assert lembra(database_url, "remove", "--org", "outra", "unidade").returncode == 2, "another org's field"
    removed = lembra(database_url, "remove", "--org", "sorriso", "unidade")
    assert removed.returncode == 0, removed.stderr
    assert lembra(database_url, "list", "--org", "sorriso").stdout.strip() == "no fields"


def test_a_refused_field_prints_every_sentence_and_writes_nothing(rt, database_url):
    World(rt, slug="sorriso")
    refused = lembra(database_url, "add", "--org", "sorriso", "--slug", "Aceita", "--label", "Aceita", "--type",
                     "boolean", "--question", "Aceita?", "--harvest", "any_reply", "--option", "sim")
    assert refused.returncode == 1
    assert "slug:" in refused.stderr and "harvest:" in refused.stderr and "options:" in refused.stderr
    assert "\"sim\" solto" in refused.stderr and "detail_" not in refused.stderr
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(conversation_fields)).scalar_one() == 0
