"""`lembra flows validate|list|enroll` and `lembra enrollments` as real processes: exit codes,
one-line errors, the engine's sentences, and no patient data in what they print."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from engine.words.catalogue import describe
from engine.flows.queries import sentence
from tests.factories import World
from tests.flows.helpers import Flows, edge, linear, node
from tests.processes import LEMBRA, lembra_env

NAME, PHONE, EMAIL = "Beatriz Nogueira", "+5516988776655", "beatriz@example.com"


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LEMBRA, *args], check=False, env=env, capture_output=True, text=True, timeout=120)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert lines[0].startswith("lembra: error: ")
    return lines[0]


def classify_graph(*, with_no_reply: bool) -> dict[str, Any]:
    graph = {
        "nodes": [node("inicio", "trigger"), node("resposta", "ai_classify", classes=["confirm"], grace_minutes=60),
                  node("confirmou", "end", outcome="converted"), node("outro", "end", outcome="custom")],
        "edges": [edge("inicio", "resposta"), edge("resposta", "confirmou", "class_match", "confirm"),
                  edge("resposta", "outro")],
    }
    if with_no_reply:
        graph["edges"].append(edge("resposta", "outro", "no_reply"))
    return graph


def waiting_graph() -> dict[str, Any]:
    return linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                  node("fim", "end", outcome="exhausted"))


def test_flows_validate_needs_no_database(tmp_path: Path):
    # A database URL that cannot work: validating a file must not touch it.
    env = lembra_env(f"sqlite:///{tmp_path}/missing/never.db")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(classify_graph(with_no_reply=True)))
    ok = run(["flows", "validate", str(good)], env)
    assert (ok.returncode, ok.stdout.strip(), ok.stderr) == (0, "ok", "")

    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(classify_graph(with_no_reply=False)))
    issues = run(["flows", "validate", str(broken)], env)
    assert issues.returncode == 1
    assert issues.stdout.splitlines() == [f"resposta: missing_no_reply — {describe('missing_no_reply')}"]

    # The wrapped form, as GET /flows/{id} exports it: its trigger and max_steps are checked too.
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"name": "Retorno", "draft_graph": classify_graph(with_no_reply=True),
                                   "trigger_config": {"kind": "silence"}, "max_steps": 2}))
    both = run(["flows", "validate", str(wrapped)], env)
    assert both.returncode == 1
    codes = [line.split(" — ")[0] for line in both.stdout.splitlines()]
    assert codes == ["-: too_many_steps", "inicio: invalid_trigger"]

    missing = run(["flows", "validate", str(tmp_path / "nope.json")], env)
    assert missing.returncode == 2 and "does not exist" in one_line_error(missing)
    garbled = tmp_path / "garbled.json"
    garbled.write_text('{"nodes": [')
    bad = run(["flows", "validate", str(garbled)], env)
    assert bad.returncode == 2 and "not valid JSON" in one_line_error(bad)


@pytest.fixture
def seeded(rt) -> dict[str, Any]:
    """Two orgs; A has an active flow with a run, a draft flow, and a second contact."""
    world = World(rt, slug="clinica-cli")
    world.channel("whatsapp")
    flows = Flows(world)
    active = flows.flow(waiting_graph(), name="Retorno", agent=False)
    draft = flows.flow(waiting_graph(), name="Rascunho", publish=False, agent=False)
    first = world.contact(name=NAME, phone=PHONE, email=EMAIL)
    second = world.contact(name="Carlos Lima", phone="+5516977665544", email="carlos@example.com")
    run_id = flows.enroll(active, first, key="seed")
    other = World(rt, slug="outra")
    other_flow = Flows(other).flow(waiting_graph(), name="Retorno", agent=False)
    return {"active": active, "draft": draft, "first": first, "second": second, "run": run_id,
            "other_flow": other_flow}


def test_flows_list_enroll_and_enrollments(database_url, seeded):
    env = lembra_env(database_url)
    listed = run(["flows", "list", "--org", "clinica-cli"], env)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert rows == [[str(seeded["active"]), "active", "1", "1", "Retorno"],
                    [str(seeded["draft"]), "draft", "-", "0", "Rascunho"]]

    enroll = ["flows", "enroll", str(seeded["active"]), "--org", "clinica-cli", "--contact", str(seeded["second"])]
    first = run([*enroll, "--key", "crm-7"], env)
    assert first.returncode == 0, first.stderr
    new_id = first.stdout.strip()
    assert new_id.isdigit() and int(new_id) != seeded["run"]
    again = run([*enroll, "--key", "crm-7"], env)
    assert again.returncode == 0 and again.stdout.strip() == new_id and "already enrolled" in again.stderr

    live = run([*enroll, "--key", "crm-8"], env)
    text = sentence("already_live")  # the catalogue's sentence (the code itself until it has one)
    assert (live.returncode, live.stdout) == (1, "")
    assert live.stderr.strip() == f"lembra: not enrolled: {text or 'already_live'} (already_live)"
    draft = run(["flows", "enroll", str(seeded["draft"]), "--org", "clinica-cli", "--contact", str(seeded["second"])],
                env)
    assert draft.returncode == 1 and "(flow_not_active)" in draft.stderr
    foreign = run(["flows", "enroll", str(seeded["other_flow"]), "--org", "clinica-cli",
                   "--contact", str(seeded["second"])], env)
    assert foreign.returncode == 1 and "(flow_not_found)" in foreign.stderr
    nobody = run(["flows", "enroll", str(seeded["active"]), "--org", "nope", "--contact", "1"], env)
    assert nobody.returncode == 2 and "no org" in one_line_error(nobody)

    shown = run(["enrollments", "--org", "clinica-cli"], env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["ID", "FLOW", "NODE", "STATUS", "NEXT", "(UTC)", "REASON"]
    assert [line.split()[:4] for line in lines[1:]] == [
        [new_id, str(seeded["active"]), "inicio", "active"],
        [str(seeded["run"]), str(seeded["active"]), "inicio", "active"],
    ]
    limited = run(["enrollments", "--org", "clinica-cli", "--flow", str(seeded["draft"]), "--status", "active"], env)
    assert limited.returncode == 0 and len(limited.stdout.splitlines()) == 1
    one = run(["enrollments", "--org", "clinica-cli", "--limit", "1"], env)
    assert [line.split()[0] for line in one.stdout.splitlines()[1:]] == [new_id]
    bad_status = run(["enrollments", "--org", "clinica-cli", "--status", "asleep"], env)
    assert bad_status.returncode == 2 and "status must be one of" in one_line_error(bad_status)

    for result in (listed, first, again, live, draft, foreign, shown, limited, one):
        for private in (NAME, PHONE, EMAIL, "Carlos Lima", "+5516977665544"):
            assert private not in result.stdout + result.stderr
