"""`lembra templates` (issue 30, point 1) as an operator runs it: list and show templates with their
Meta mapping, map one to an approved template of the clinic's WABA (the loopback Graph fake), change
its texts; every mapping that cannot work at Meta refused before anything is written; another org's
template unknown."""

from __future__ import annotations

import json
import subprocess
from typing import Any, Iterator

import pytest
from sqlalchemy import insert, select

from engine.core import clock
from engine.tenants.channels import create_channel
from engine.store.models import meta_template_states, templates
from tests.factories import World
from tests.fakes.meta import FakeGraph
from tests.fakes.server import Reply
from tests.processes import LEMBRA, lembra_env

WABA = "102290129340398"


@pytest.fixture(scope="module")
def graph() -> Iterator[FakeGraph]:
    with FakeGraph() as server:
        yield server


@pytest.fixture
def fake(graph: FakeGraph) -> FakeGraph:
    return graph.reset()


@pytest.fixture
def clinic(rt, fake) -> World:
    world = World(rt, slug="sorriso")
    with rt.db.begin() as conn:
        world.channels["whatsapp"] = create_channel(
            conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="meta", name="WhatsApp oficial",
            credentials={"phone_number_id": "1122334455667", "access_token": "EAAG-token", "app_secret": "s" * 32,
                         "verify_token": "verifique-o-webhook", "base_url": fake.url, "waba_id": WABA})
    return world


def lembra(database_url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LEMBRA, "templates", *args], env=lembra_env(database_url), input=stdin,
                          capture_output=True, text=True, timeout=120)


def default_id(rt: Any) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(templates.c.id).where(
            templates.c.org_id.is_(None), templates.c.key == "session_reminder", templates.c.channel_kind == "whatsapp",
            templates.c.locale == "pt_BR")).scalar_one()


def own(rt: Any, org_id: int) -> list[Any]:
    with rt.db.connect() as conn:
        return conn.execute(select(templates).where(templates.c.org_id == org_id)).all()


SORRISO = ("--name", "lembrete_sorriso", "--language", "pt_BR", "--param", "nome", "--param", "profissional",
           "--param", "data", "--param", "hora", "--button", "confirm", "--button", "cancel")


def test_list_map_show_and_back_to_the_default(rt, database_url, clinic, fake):
    listed = lembra(database_url, "list", "--org", "sorriso")
    assert listed.returncode == 0, listed.stderr
    line = next(l for l in listed.stdout.splitlines() if l.split()[0] == str(default_id(rt)))
    assert "default" in line and "session_reminder_v1 (pt_BR): nome, profissional, data, hora, modalidade" in line

    mapped = lembra(database_url, "map", "--org", "sorriso", str(default_id(rt)), *SORRISO)
    assert mapped.returncode == 0, mapped.stderr
    new_id = int(mapped.stdout.strip().splitlines()[-1])
    assert f"created sorriso's own template {new_id}" in mapped.stderr
    [row] = own(rt, clinic.org_id)
    assert (row.id, row.meta_template_name, row.meta_parameters, row.meta_buttons) == \
        (new_id, "lembrete_sorriso", ["nome", "profissional", "data", "hora"], ["confirm", "cancel"])

    shown = lembra(database_url, "show", "--org", "sorriso", str(new_id))
    assert shown.returncode == 0, shown.stderr
    preview = json.loads(shown.stdout.split("(sample data):\n", 1)[1])
    assert preview["name"] == "lembrete_sorriso"
    assert [p["text"] for p in preview["components"][0]["parameters"]] == ["Ana", "Dra. Beatriz Costa", "21/03",
                                                                         "14:00"]

    back = lembra(database_url, "map", "--org", "sorriso", str(new_id), "--default")
    assert back.returncode == 0, back.stderr
    assert own(rt, clinic.org_id)[0].meta_template_name is None
    assert "session_reminder_v1 (pt_BR): nome, profissional, data, hora, modalidade [confirm, cancel] (the default's)" \
        in lembra(database_url, "list", "--org", "sorriso").stdout


@pytest.mark.parametrize("args, sentence", [
    (("--name", "volte_a_sorrir", "--language", "pt_BR", "--param", "nome"),
     "meta.name: O modelo volte_a_sorrir (pt_BR) está em análise na Meta"),
    (("--name", "lembrete_sorriso", "--language", "pt_BR", "--param", "nome", "--button", "confirm",
      "--button", "cancel"), "meta.parameters: O modelo lembrete_sorriso na Meta tem 4 variáveis no texto, e o "
                             "mapeamento lista 1."),
    (("--name", "lembrete sorriso", "--language", "pt-br", "--param", "cpf"), "meta.parameters: A variável cpf não "
                                                                              "existe."),
], ids=["pending", "parameter-count", "malformed"])
def test_a_mapping_that_cannot_work_is_refused_and_nothing_is_written(rt, database_url, clinic, fake, args, sentence):
    refused = lembra(database_url, "map", "--org", "sorriso", str(default_id(rt)), *args)
    assert refused.returncode == 1
    assert refused.stderr.startswith("lembra: not saved:") and sentence in refused.stderr
    assert refused.stdout == "" and own(rt, clinic.org_id) == []


def test_an_unmapped_template_is_refused_when_its_text_changes_and_accepted_once_mapped(rt, database_url, clinic,
                                                                                         fake, tmp_path):
    # A Spanish reminder written before the clinic moved to Meta: no Spanish default to take a mapping from.
    with rt.db.begin() as conn:
        spanish = conn.execute(insert(templates).values(
            org_id=clinic.org_id, key="session_reminder", channel_kind="whatsapp", locale="es", body="Hola",
            updated_at=clock.now()).returning(templates.c.id)).scalar_one()
    text = tmp_path / "es.txt"
    text.write_text("Hola {{ nome }}, su sesión es el {{ data }}.", encoding="utf-8")
    refused = lembra(database_url, "update", "--org", "sorriso", str(spanish), "--body-file", str(text))
    assert refused.returncode == 1 and "meta.name: Pelo WhatsApp oficial (Meta), esta mensagem também sai" in \
        refused.stderr
    assert own(rt, clinic.org_id)[0].body == "Hola"
    fake.reset(*[Reply(503, b"")] * 8)  # Meta down: the mapping is kept, with a warning
    mapped = lembra(database_url, "map", "--org", "sorriso", str(spanish), "--name", "lembrete_sorriso",
                    "--language", "es", "--param", "nome")
    assert mapped.returncode == 0, mapped.stderr
    assert "warning: A Meta não respondeu agora à consulta dos modelos" in mapped.stderr
    updated = lembra(database_url, "update", "--org", "sorriso", str(spanish), "--body-file", "-",
                     stdin="Hola {{ nome }}!")
    assert updated.returncode == 0, updated.stderr
    assert own(rt, clinic.org_id)[0].body == "Hola {{ nome }}!"


def test_another_org_s_template_is_unknown(rt, database_url, clinic, fake):
    other = World(rt, slug="outra")
    with rt.db.begin() as conn:
        theirs = conn.execute(insert(templates).values(
            org_id=other.org_id, key="session_reminder", channel_kind="sms", locale="pt_BR", body="Delas",
            updated_at=clock.now()).returning(templates.c.id)).scalar_one()
    for args in (("show", "--org", "sorriso", str(theirs)),
                 ("map", "--org", "sorriso", str(theirs), "--name", "x", "--language", "pt_BR"),
                 ("update", "--org", "sorriso", str(theirs), "--subject", "Invadi")):
        result = lembra(database_url, *args)
        assert result.returncode == 2 and f"sorriso has no template {theirs}" in result.stderr
    assert "Delas" not in lembra(database_url, "list", "--org", "sorriso").stdout
    with rt.db.connect() as conn:
        assert conn.execute(select(templates.c.subject).where(templates.c.id == theirs)).scalar_one() is None


def test_the_waba_s_templates_and_why_they_cannot_be_listed(rt, database_url, clinic, fake):
    listed = lembra(database_url, "waba", "--org", "sorriso")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert rows[0][:3] == ["aviso_com_nome", "pt_BR", "APPROVED"]  # approved first, then by name
    assert ["lembrete_sorriso", "pt_BR", "APPROVED", "UTILITY", "4", "QUICK_REPLY,", "QUICK_REPLY,",
            "PHONE_NUMBER"] in rows
    assert ["aviso_com_nome", "pt_BR", "APPROVED", "UTILITY", "named", "-"] in rows
    with rt.db.connect() as conn:  # what the list says of each template's category is recorded as read
        recorded = {(r.name, r.language): r.category for r in conn.execute(select(meta_template_states))}
    assert recorded[("lembrete_sorriso", "pt_BR")] == "UTILITY"
    World(rt, slug="sem-meta").channel("whatsapp")
    sandbox = lembra(database_url, "waba", "--org", "sem-meta")
    assert sandbox.returncode == 2 and "não sai pela API oficial da Meta" in sandbox.stderr
    bad = lembra(database_url, "map", "--org", "sorriso", "1")
    assert bad.returncode == 2 and "give --name and --language" in bad.stderr


def test_the_group_and_its_commands_explain_themselves(database_url):
    group = lembra(database_url, "--help")
    assert group.returncode == 0
    assert "approved Meta template" in group.stdout
    assert all(name in group.stdout for name in ("list", "show", "map", "update", "waba"))
    mapped = lembra(database_url, "map", "--help")
    assert "--param VARIABLE" in mapped.stdout and "1 refused" in mapped.stdout and "--default" in mapped.stdout
