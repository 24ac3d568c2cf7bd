"""The flow builder's page and JSON endpoints (admin/views/followup/builder.py) and the Fluxos list:
a saved draft reloads exactly, a draft the engine refuses is not written at all, publish issues come
back on their node, every write needs the session's CSRF token and an owner or manager, and another
org's ids answer 404 as if they did not exist; the page warns of a template Meta calls marketing
and shows the flow's estimated cost per run this month, as the list does."""

from __future__ import annotations

import copy
import html
import json
import re

import pytest
from sqlalchemy import func, select

from admin.app import create_app
from engine.flows.conversation.fields import create_field
from engine.flows import triggers, versions
from engine.store.models import audit_log, flow_pointers, flow_versions, users
from tests.admin.conftest import csrf, login
from tests.flows.helpers import Flows, edge, node
from tests.test_meta_flow import Graph, meta_world, post
from tests.test_meta_pricing import _console, category_body

GOOD_GRAPH = {
    "nodes": [
        {"id": "gatilho_1", "type": "trigger", "label": "Início", "position": {"x": 12.5, "y": -40}, "config": {}},
        {"id": "espera_1", "type": "wait", "position": {"x": 260, "y": 0.25}, "config": {"mode": "fixed", "minutes": 180}},
        {"id": "mensagem_1", "type": "action", "label": "Lembrete", "position": {"x": 520, "y": 10},
         "config": {"mode": "template", "template": "session_reminder", "channel_kinds": ["whatsapp"]}},
        {"id": "fim_1", "type": "end", "position": {"x": 800, "y": 10}, "config": {"outcome": "converted", "note": ""}},
    ],
    "edges": [
        {"id": "ligacao_1", "source": "gatilho_1", "target": "espera_1", "condition": {"type": "always"}},
        {"source": "espera_1", "target": "mensagem_1", "condition": {"type": "always"}, "priority": 2},
        {"id": "ligacao_3", "source": "mensagem_1", "target": "fim_1", "condition": {"type": "always", "value": None}},
    ],
}


def _flow(rt, org_id: int, name: str, graph: dict | None = None) -> int:
    with rt.db.begin() as conn:
        return versions.create_flow(conn, org_id, name=name, draft_graph=graph)


def _url(flow_id: int, action: str = "") -> str:
    return f"/admin/followup/builder/{flow_id}/{action}"


def _token(client, flow_id: int) -> str:
    page = client.get(_url(flow_id))
    assert page.status_code == 200, page.text
    match = re.search(r'<meta name="csrf-token" content="([^"]+)"', page.text)
    assert match, "no CSRF meta tag on the builder page"
    return match.group(1)


def _post(client, flow_id: int, action: str, body: dict, token: str | None):
    headers = {"X-CSRFToken": token} if token else {}
    return client.post(_url(flow_id, action), json=body, headers=headers)


def _boot(html: str) -> dict:
    match = re.search(r'<script type="application/json" id="lembra-builder-boot">(.*?)</script>', html, re.S)
    assert match, "no boot blob"
    return json.loads(match.group(1))


def _pointer(rt, flow_id: int):
    with rt.db.connect() as conn:
        return conn.execute(select(flow_pointers).where(flow_pointers.c.id == flow_id)).one()


@pytest.fixture
def flows(rt, tenants):
    a, b = tenants
    return _flow(rt, a.world.org_id, "Pós-consulta"), _flow(rt, b.world.org_id, "Fluxo só da B")


# --- reading ------------------------------------------------------------------------------------------

def test_the_page_loads_the_bundle_with_the_nonce_and_hands_over_schema_strings_and_templates(owner, flows):
    mine, _ = flows
    page = owner.get(_url(mine))
    assert page.status_code == 200
    html = page.text
    nonce = re.search(r"'nonce-([^']+)'", page.headers["Content-Security-Policy"]).group(1)
    assert re.search(rf'<script nonce="{re.escape(nonce)}" src="/static/flows/builder\.js\?v=[0-9a-f]{{16}}">', html)
    assert '<link rel="stylesheet" href="/static/flows/builder.css?v=' in html
    boot = _boot(html)
    assert boot["can_edit"] is True
    assert boot["flow"]["id"] == mine and boot["flow"]["name"] == "Pós-consulta" and boot["flow"]["status"] == "draft"
    assert set(boot["schema"]["$defs"]) >= {"config_wait", "config_action", "trigger_config", "check"}
    assert boot["strings"]["node_types"]["ai_classify"]["name"] == "Classificar resposta (IA)"
    assert boot["strings"]["edges"]["cond_true"] == "Sim" and boot["strings"]["edges"]["no_reply"] == "Sem resposta"
    reminder = next(t for t in boot["templates"] if t["key"] == "session_reminder")
    previews = reminder["previews"]
    assert reminder["label"] == "Lembrete de sessão" and "Dra. Beatriz Costa" in json.dumps(previews)  # sample data
    assert previews["sms"]["text"] == "Modelo da clinica-a: Ana"  # the org's own template wins over the default
    assert "Paciente Da A" not in json.dumps(boot["templates"])
    assert boot["urls"]["save"] == _url(mine, "draft")
    # The bundle is served (static) and only the builder page loads it.
    with owner.get("/static/flows/builder.js") as bundle:  # closed: a file response holds the file open
        assert bundle.status_code == 200
    assert "builder.js" not in owner.get("/admin/followup/flows/").text
    assert "builder.js" not in owner.get("/admin/").text


def test_the_page_and_data_need_a_session(app, flows):
    mine, _ = flows
    anonymous = app.test_client()
    page = anonymous.get(_url(mine))
    assert page.status_code == 302 and "/login" in page.headers["Location"]
    assert anonymous.get(_url(mine, "data")).status_code == 401


# --- saving and reloading -----------------------------------------------------------------------------

def test_a_saved_draft_reloads_exactly_positions_configs_and_edges(owner, rt, flows):
    mine, _ = flows
    token = _token(owner, mine)
    body = {"draft_graph": GOOD_GRAPH, "name": "Pós-consulta 2", "handoff_policy": "cancel", "cancel_on_reply": True,
            "max_steps": 12, "resume_grace_minutes": 45,
            "trigger_config": {"kind": "appointment", "appointment_event": "completed", "repeat": "cooldown",
                               "cooldown_minutes": 10080}}
    saved = _post(owner, mine, "draft", body, token)
    assert saved.status_code == 200, saved.text
    reloaded = owner.get(_url(mine, "data")).get_json()["flow"]
    assert reloaded["draft_graph"] == GOOD_GRAPH  # key for key: positions, labels, configs, edge ids, priority
    assert json.dumps(reloaded["draft_graph"], sort_keys=True) == json.dumps(GOOD_GRAPH, sort_keys=True)
    for key in ("name", "handoff_policy", "cancel_on_reply", "max_steps", "resume_grace_minutes", "trigger_config"):
        assert reloaded[key] == body[key], key
    # And the page a reload opens carries the same draft.
    assert _boot(owner.get(_url(mine)).text)["flow"]["draft_graph"] == GOOD_GRAPH
    with rt.db.connect() as conn:
        row = conn.execute(select(audit_log).where(audit_log.c.entity == "flow_pointers",
                                                   audit_log.c.entity_id == mine)).one()
    assert row.action == "update" and "draft_graph_sha256" in row.changes and "draft_graph" not in row.changes


def test_a_draft_the_engine_refuses_is_not_written_at_all(owner, rt, flows):
    mine, _ = flows
    token = _token(owner, mine)
    assert _post(owner, mine, "draft", {"draft_graph": GOOD_GRAPH}, token).status_code == 200
    before = _pointer(rt, mine)

    broken = copy.deepcopy(GOOD_GRAPH)
    broken["nodes"][1]["selected"] = True  # React Flow's own key: the schema refuses unknown keys
    broken["nodes"][2]["id"] = "não vale"
    response = _post(owner, mine, "draft", {"draft_graph": broken, "name": "Outro nome", "max_steps": 50}, token)
    assert response.status_code == 422
    answer = response.get_json()
    assert answer["error"] == "O rascunho não foi salvo: corrija os problemas apontados."
    by_node = {(i["node_id"], i["code"]) for i in answer["issues"]}
    assert ("espera_1", "invalid_node") in by_node
    assert any(i["code"] == "invalid_node" and "campo desconhecido" in i["message"] for i in answer["issues"])
    assert all("_" not in i["message"].split(" ")[0] for i in answer["issues"])  # sentences, not codes
    after = _pointer(rt, mine)
    assert (after.name, after.max_steps, after.draft_graph, after.updated_at) == \
        (before.name, before.max_steps, before.draft_graph, before.updated_at)

    # A bad trigger with a fine graph: the graph is not saved either.
    other = copy.deepcopy(GOOD_GRAPH)
    other["nodes"][0]["position"] = {"x": 999, "y": 999}
    refused = _post(owner, mine, "draft", {"draft_graph": other, "trigger_config": {"kind": "silence"}}, token)
    assert refused.status_code == 422
    assert refused.get_json()["issues"][0]["code"] == "invalid_trigger"
    assert _pointer(rt, mine).draft_graph == GOOD_GRAPH

    # Malformed bodies are refused before anything is looked at.
    for bad in ([1, 2], {"selected": True}, {"cancel_on_reply": "sim"}, {"status": "active"}):
        assert _post(owner, mine, "draft", bad, token).status_code == 400, bad
    assert _pointer(rt, mine).draft_graph == GOOD_GRAPH


def test_every_write_needs_the_csrf_token(owner, rt, flows):
    mine, _ = flows
    _token(owner, mine)  # a session exists, but the request does not carry its token
    for action, body in (("draft", {"name": "sem token"}), ("publish", {}), ("disable", {"live": "finish"}),
                         ("rollback", {"version": 1})):
        assert _post(owner, mine, action, body, None).status_code == 400, action
        assert _post(owner, mine, action, body, "not-the-token").status_code == 400, action
    assert _pointer(rt, mine).name == "Pós-consulta"
    response = owner.post("/admin/followup/flows/new/", data={"name": "Sem token"})
    assert response.status_code == 400
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(flow_pointers)
                            .where(flow_pointers.c.name == "Sem token")).scalar() == 0


# --- publish, history, rollback, disable ------------------------------------------------------------------

def test_publish_issues_come_back_on_their_node_and_a_fixed_draft_publishes(owner, rt, tenants, flows):
    a, _ = tenants
    mine, _ = flows
    token = _token(owner, mine)
    graph = copy.deepcopy(GOOD_GRAPH)
    del graph["nodes"][2]["config"]["template"]  # the message step has no template yet
    graph["edges"] = graph["edges"][:2]  # and no way out
    assert _post(owner, mine, "draft", {"draft_graph": graph}, token).status_code == 200
    refused = _post(owner, mine, "publish", {}, token)
    assert refused.status_code == 422
    answer = refused.get_json()
    assert answer["error"] == "O fluxo não foi publicado: corrija os problemas apontados."
    codes = {(i["node_id"], i["code"]) for i in answer["issues"]}
    assert ("mensagem_1", "invalid_config") in codes and ("mensagem_1", "dead_end") in codes
    message = next(i["message"] for i in answer["issues"] if i["code"] == "dead_end")
    assert message.startswith("Esta etapa não tem saída.")
    assert _pointer(rt, mine).status == "draft"
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(flow_versions)).scalar() == 0

    assert _post(owner, mine, "draft", {"draft_graph": GOOD_GRAPH}, token).status_code == 200
    published = _post(owner, mine, "publish", {}, token)
    assert published.status_code == 200, published.text
    state = published.get_json()
    assert state["published"] == 1 and state["flow"]["status"] == "active" and state["flow"]["active_version"] == 1
    [version] = state["versions"]
    assert version["created_by_email"] == "owner@a.com.br" and re.fullmatch(r"\d\d/\d\d/\d{4} \d\d:\d\d",
                                                                            version["created_at_text"])
    # 12:00 UTC is 09:00 in São Paulo: the history shows the org's time.
    assert version["created_at_text"].endswith("09:00")
    with rt.db.connect() as conn:
        owner_id = conn.execute(select(users.c.id).where(users.c.email == "owner@a.com.br")).scalar_one()
        assert conn.execute(select(flow_versions.c.created_by)).scalar_one() == owner_id


def test_rollback_to_an_earlier_version_and_disable(owner, rt, flows, clock):
    mine, _ = flows
    token = _token(owner, mine)
    assert _post(owner, mine, "draft", {"draft_graph": GOOD_GRAPH}, token).status_code == 200
    assert _post(owner, mine, "publish", {}, token).status_code == 200
    second = copy.deepcopy(GOOD_GRAPH)
    second["nodes"][1]["config"]["minutes"] = 60
    assert _post(owner, mine, "draft", {"draft_graph": second}, token).status_code == 200
    assert _post(owner, mine, "publish", {}, token).get_json()["published"] == 2

    back = _post(owner, mine, "rollback", {"version": 1}, token)
    assert back.status_code == 200 and back.get_json()["flow"]["active_version"] == 1
    assert back.get_json()["flow"]["draft_graph"] == second  # the draft stays as it was
    assert _post(owner, mine, "rollback", {"version": 7}, token).status_code == 404
    assert _post(owner, mine, "rollback", {"version": "1"}, token).status_code == 400
    assert _post(owner, mine, "disable", {"live": "everything"}, token).status_code == 400
    off = _post(owner, mine, "disable", {"live": "cancel"}, token)
    assert off.status_code == 200 and off.get_json()["flow"]["status"] == "disabled"
    with rt.db.connect() as conn:
        actions = [r.action for r in conn.execute(select(audit_log.c.action).where(
            audit_log.c.entity == "flow_pointers").order_by(audit_log.c.id))]
    assert actions == ["update", "publish", "update", "publish", "rollback", "disable"]


# --- roles and tenants ------------------------------------------------------------------------------------

def test_an_agent_reads_the_builder_but_changes_nothing(agent, owner, rt, flows):
    mine, _ = flows
    owner_token = _token(owner, mine)
    assert _post(owner, mine, "draft", {"draft_graph": GOOD_GRAPH}, owner_token).status_code == 200
    assert _post(owner, mine, "publish", {}, owner_token).status_code == 200
    before = _pointer(rt, mine)

    page = agent.get(_url(mine))
    assert page.status_code == 200
    boot = _boot(page.text)
    assert boot["can_edit"] is False and boot["flow"]["draft_graph"] == GOOD_GRAPH
    assert agent.get(_url(mine, "data")).status_code == 200
    token = _token(agent, mine)
    for action, body in (("draft", {"name": "do atendente"}), ("publish", {}), ("disable", {"live": "cancel"}),
                         ("rollback", {"version": 1})):
        response = _post(agent, mine, action, body, token)
        assert response.status_code == 403, action
        assert response.get_json()["error"] == "Apenas proprietários e gestores alteram fluxos."
    after = _pointer(rt, mine)
    assert (after.name, after.status, after.updated_at) == (before.name, before.status, before.updated_at)
    listing = agent.get("/admin/followup/flows/").text
    assert "Pós-consulta" in listing and "Ver no construtor" in listing and "Novo fluxo" not in listing
    assert agent.post("/admin/followup/flows/new/", data={"name": "x", "csrf_token": csrf(listing)}).status_code == 403


def test_the_other_orgs_flow_answers_404_everywhere(owner, rt, tenants, flows):
    _, b = tenants
    mine, theirs = flows
    token = _token(owner, mine)
    before = _pointer(rt, theirs)
    assert owner.get(_url(theirs)).status_code == 404
    assert owner.get(_url(theirs, "data")).status_code == 404
    for action, body in (("draft", {"name": "roubado"}), ("publish", {}), ("disable", {"live": "cancel"}),
                         ("rollback", {"version": 1})):
        assert _post(owner, theirs, action, body, token).status_code == 404, action
    after = _pointer(rt, theirs)
    assert (after.name, after.status, after.updated_at) == (before.name, before.status, before.updated_at)
    for bad in ("0", "abc", "99999999999999999999", str(2 ** 63)):
        assert owner.get(f"/admin/followup/builder/{bad}/").status_code == 404, bad
        assert owner.get(f"/admin/followup/builder/{bad}/data").status_code == 404, bad
    listing = owner.get("/admin/followup/flows/").text
    assert "Pós-consulta" in listing and "Fluxo só da B" not in listing


# --- Testar -------------------------------------------------------------------------------------------

def test_testar_is_the_rehearsal_chat_only(owner, rt, tenants, flows):
    # One way to test a flow: the chat (tests/admin/test_rehearse.py); no route enrolls a contact by hand.
    mine, _ = flows
    token = _token(owner, mine)
    boot = _boot(owner.get(_url(mine)).text)
    assert set(boot["urls"]) == {"data", "save", "publish", "disable", "rollback", "rehearse"}
    assert "test_contacts" not in boot and boot["strings"]["rehearse"]["open"] == "Testar"
    assert _post(owner, mine, "test", {"contact_id": tenants[0].contact_id}, token).status_code in (404, 405)


# --- the list ------------------------------------------------------------------------------------------

def test_the_list_shows_status_version_live_runs_and_who_published(owner, rt, tenants, flows):
    a, _ = tenants
    mine, _ = flows
    token = _token(owner, mine)
    assert _post(owner, mine, "draft", {"draft_graph": GOOD_GRAPH}, token).status_code == 200
    assert _post(owner, mine, "publish", {}, token).status_code == 200
    with rt.db.begin() as conn:  # one live run, as the flow's trigger would start it
        assert triggers.enroll(conn, a.world.org_id, mine, a.contact_id, trigger_kind="manual",
                               trigger_key="lista-1", automatic=False).enrollment_id is not None
    draft = _flow(rt, a.world.org_id, "Ainda em rascunho")
    page = owner.get("/admin/followup/flows/").text
    row = re.search(rf'<tr data-flow-id="{mine}">(.*?)</tr>', page, re.S).group(1)
    assert "Publicado" in row and "v1" in row and "owner@a.com.br" in row and "01/12/2026 09:00" in row
    assert re.search(r"<td>1</td>", row)  # one live enrollment
    assert f'href="/admin/followup/builder/{mine}/"' in row and "Editar no construtor" in row
    other = re.search(rf'<tr data-flow-id="{draft}">(.*?)</tr>', page, re.S).group(1)
    assert "Rascunho" in other and "<td>0</td>" in other
    # The builder opened without a flow shows the same list to pick one from.
    picker = owner.get("/admin/followup/builder/")
    assert picker.status_code == 200 and f'<tr data-flow-id="{mine}">' in picker.text
    assert "Fluxo só da B" not in picker.text


def test_an_owner_creates_a_flow_from_the_list_and_lands_in_the_builder(owner, rt, tenants):
    page = owner.get("/admin/followup/flows/").text
    assert "Nenhum fluxo ainda." in page
    created = owner.post("/admin/followup/flows/new/", data={"name": "  Reativação  ", "csrf_token": csrf(page)})
    assert created.status_code == 302
    flow_id = int(re.search(r"/admin/followup/builder/(\d+)/$", created.headers["Location"]).group(1))
    assert _pointer(rt, flow_id).name == "Reativação"
    again = owner.post("/admin/followup/flows/new/", data={"name": "Reativação", "csrf_token": csrf(page)},
                       follow_redirects=True)
    assert "Já existe um fluxo com esse nome." in again.text
    empty = owner.post("/admin/followup/flows/new/", data={"name": " ", "csrf_token": csrf(page)},
                       follow_redirects=True)
    assert "Dê ao fluxo um nome de 1 a 120 caracteres." in empty.text
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(flow_pointers)).scalar() == 1


def test_a_manager_edits_flows_too(app, rt, tenants, flows):
    mine, _ = flows
    manager = login(app.test_client(), "manager@a.com.br")
    token = _token(manager, mine)
    assert _post(manager, mine, "draft", {"name": "Do gestor"}, token).status_code == 200
    assert _pointer(rt, mine).name == "Do gestor"


# --- ask and do steps ------------------------------------------------------------------------------------

ASK_AND_DO = {
    "nodes": [
        {"id": "inicio", "type": "trigger", "position": {"x": 0, "y": 0}, "config": {}},
        {"id": "quando", "type": "ask", "label": "Dia", "position": {"x": 240, "y": 0},
         "config": {"fields": ["data"], "max_asks": 2, "grace_minutes": 120, "phrasing": "ai",
                    "channel_kinds": ["whatsapp"]}},
        {"id": "confirma", "type": "do", "position": {"x": 480, "y": 0}, "config": {"action": "confirm"}},
        {"id": "marca", "type": "do", "config": {"action": "book", "date_field": "data", "time_field": None}},
        {"id": "fim", "type": "end", "position": {"x": 960, "y": 0}, "config": {"outcome": "converted"}},
    ],
    "edges": [
        {"id": "a", "source": "inicio", "target": "quando", "condition": {"type": "always"}},
        {"id": "b", "source": "quando", "target": "confirma", "condition": {"type": "complete"}},
        {"id": "c", "source": "quando", "target": "fim", "condition": {"type": "gave_up"}},
        {"source": "quando", "target": "fim", "condition": {"type": "no_reply", "value": None}, "priority": 3},
        {"id": "e", "source": "confirma", "target": "marca", "condition": {"type": "ok"}},
        {"id": "f", "source": "confirma", "target": "fim", "condition": {"type": "failed"}},
        {"id": "g", "source": "marca", "target": "fim", "condition": {"type": "ok"}},
        {"id": "h", "source": "marca", "target": "fim", "condition": {"type": "failed"}},
        {"id": "i", "source": "marca", "target": "fim", "condition": {"type": "unavailable"}},
    ],
}


def test_ask_and_do_steps_get_their_words_in_both_languages(owner, rt, flows):
    mine, _ = flows
    boot = _boot(owner.get(_url(mine)).text)
    strings = boot["strings"]
    assert {"config_ask", "config_do"} <= set(boot["schema"]["$defs"])
    assert (strings["node_types"]["ask"]["name"], strings["node_types"]["do"]["name"]) == ("Perguntar", "Ação")
    assert {key: strings["edges"][key] for key in ("complete", "gave_up", "no_reply", "ok", "failed", "unavailable")} \
        == {"complete": "Completo", "gave_up": "Desistiu", "no_reply": "Sem resposta", "ok": "Feito",
            "failed": "Falhou", "unavailable": "Sem horário"}
    assert strings["choices"]["action"] == {
        "confirm": "Confirmar", "cancel": "Cancelar", "move": "Remarcar", "book": "Marcar consulta",
        "offer_slots": "Oferecer horários", "notify_staff": "Avisar a equipe", "handoff": "Passar para uma pessoa",
        "set_stage": "Mudar a etapa do contato", "start_flow": "Começar outro fluxo",
        "notify_clinic": "Avisar o sistema da clínica"}
    # Every action the engine knows has its words (a new one would show as its bare code).
    do_actions = {v for branch in boot["schema"]["$defs"]["config_do"]["oneOf"]
                  for v in branch["properties"]["action"]["enum"]}
    assert do_actions == set(strings["choices"]["action"])
    assert "pela API" in strings["ui"]["config_api_only"]

    with rt.db.begin() as conn:
        conn.execute(users.update().where(users.c.email == "owner@a.com.br").values(locale="en"))
    english = _boot(owner.get(_url(mine)).text)["strings"]
    assert (english["node_types"]["ask"]["name"], english["node_types"]["do"]["name"]) == ("Ask", "Action")
    assert (english["edges"]["complete"], english["edges"]["gave_up"], english["edges"]["unavailable"]) == \
        ("Complete", "Gave up", "No free time")
    assert english["choices"]["action"]["offer_slots"] == "Offer free times"
    assert english["ui"]["config_read_only"] == "Settings (read-only)"


def test_a_draft_with_ask_and_do_steps_reloads_exactly_and_a_wrong_exit_is_flagged_on_its_step(owner, rt, tenants,
                                                                                               flows):
    a, _ = tenants
    mine, _ = flows
    with rt.db.begin() as conn:
        create_field(conn, a.world.org_id, {"slug": "data", "label": "Data", "type": "date", "question": "Que dia?"})
    token = _token(owner, mine)
    saved = _post(owner, mine, "draft", {"draft_graph": ASK_AND_DO}, token)
    assert saved.status_code == 200, saved.text
    reloaded = owner.get(_url(mine, "data")).get_json()["flow"]["draft_graph"]
    assert json.dumps(reloaded, sort_keys=True) == json.dumps(ASK_AND_DO, sort_keys=True)
    assert _boot(owner.get(_url(mine)).text)["flow"]["draft_graph"] == ASK_AND_DO

    # A confirm step has no "Sem horário" exit: publishing says so on that step, and nothing is published.
    wrong = copy.deepcopy(ASK_AND_DO)
    wrong["edges"].append({"id": "x", "source": "confirma", "target": "fim", "condition": {"type": "unavailable"}})
    assert _post(owner, mine, "draft", {"draft_graph": wrong}, token).status_code == 200
    refused = _post(owner, mine, "publish", {}, token)
    assert refused.status_code == 422
    issues = refused.get_json()["issues"]
    assert {(i["node_id"], i["code"]) for i in issues} == {("confirma", "edge_not_allowed")}
    assert _pointer(rt, mine).status == "draft"
    # Without that edge it publishes.
    assert _post(owner, mine, "draft", {"draft_graph": ASK_AND_DO}, token).status_code == 200
    published = _post(owner, mine, "publish", {}, token)
    assert published.status_code == 200, published.text
    assert published.get_json()["flow"]["draft_graph"] == ASK_AND_DO


# --- the palette's Perguntar / Ação / Oferecer horários steps (issue 33) --------------------------------

#: A graph as the builder writes it right after three steps are dropped: Perguntar with no field chosen
#: yet, an Ação with no action picked, "Oferecer horários" (a `do` preset) and a Fim with no outcome.
DROPPED = {
    "nodes": [
        {"id": "gatilho_1", "type": "trigger", "label": "Gatilho 1", "position": {"x": 0, "y": 0}, "config": {}},
        {"id": "pergunta_1", "type": "ask", "label": "Perguntar 1", "position": {"x": 300, "y": 0},
         "config": {"fields": [], "max_asks": 3}},
        {"id": "acao_1", "type": "do", "label": "Ação 1", "position": {"x": 600, "y": 0}, "config": {}},
        {"id": "acao_2", "type": "do", "label": "Oferecer horários 1", "position": {"x": 600, "y": 200},
         "config": {"action": "offer_slots", "limit": 3, "same_professional": True, "max_asks": 2}},
        {"id": "fim_1", "type": "end", "label": "Fim 1", "position": {"x": 900, "y": 0}, "config": {}},
    ],
    "edges": [
        {"id": "ligacao_1", "source": "gatilho_1", "target": "pergunta_1", "condition": {"type": "always"}},
        {"id": "ligacao_2", "source": "pergunta_1", "target": "acao_2", "condition": {"type": "complete"}},
        {"id": "ligacao_3", "source": "acao_2", "target": "fim_1", "condition": {"type": "ok"}},
    ],
}


def test_the_builder_hands_over_the_orgs_fields_other_flows_and_the_words_of_the_new_forms(owner, rt, tenants,
                                                                                            flows):
    a, b = tenants
    mine, theirs = flows
    other = _flow(rt, a.world.org_id, "Remarcar")
    with rt.db.begin() as conn:
        create_field(conn, a.world.org_id, {"slug": "periodo", "label": "Período", "type": "period",
                                            "question": "De manhã ou à tarde?"})
        create_field(conn, a.world.org_id, {"slug": "data", "label": "Data", "type": "date", "question": "Que dia?"})
        create_field(conn, b.world.org_id, {"slug": "so_da_b", "label": "Só da B", "type": "text",
                                            "question": "?"})
    boot = _boot(owner.get(_url(mine)).text)
    # Only this org's fields (by slug) and its other flows: never the other tenant's, never this flow.
    assert boot["fields"] == [{"slug": "data", "label": "Data", "type": "date"},
                              {"slug": "periodo", "label": "Período", "type": "period"}]
    assert boot["flows"] == [{"id": other, "name": "Remarcar"}]
    assert theirs not in {f["id"] for f in boot["flows"]}
    strings = boot["strings"]
    assert strings["palette"]["offer_slots"]["name"] == "Oferecer horários"
    assert (strings["fields"]["fields"], strings["fields"]["max_asks"]) == ("Campos a perguntar",
                                                                            "Insistir até quantas vezes")
    assert (strings["ui"]["organize"], strings["ui"]["minimap_show"]) == ("Organizar", "Mostrar miniatura")
    assert "vírgula" in strings["ui"]["keywords_help"]
    # The forms refuse a value with the catalogue's own sentences (placeholders filled by the bundle).
    assert strings["details"]["detail_required"] == "campo obrigatório; preencha-o"
    assert strings["details"]["detail_list"] == "use uma lista de %(min)s a %(max)s itens"

    with rt.db.begin() as conn:
        conn.execute(users.update().where(users.c.email == "owner@a.com.br").values(locale="en"))
    english = _boot(owner.get(_url(mine)).text)["strings"]
    assert english["palette"]["offer_slots"]["name"] == "Offer free times"
    assert (english["fields"]["max_asks"], english["ui"]["organize"]) == ("Ask up to how many times", "Arrange")
    assert english["details"]["detail_required"] == "required field; fill it in"
    assert english["details"]["detail_list"] == "use a list of %(min)s to %(max)s items"


def test_freshly_dropped_ask_and_do_steps_save_and_publish_says_what_each_one_still_needs(owner, rt, tenants, flows):
    a, _ = tenants
    mine, _ = flows
    with rt.db.begin() as conn:
        create_field(conn, a.world.org_id, {"slug": "data", "label": "Data", "type": "date", "question": "Que dia?"})
    token = _token(owner, mine)
    # A draft is work in progress: incomplete configs are saved as they are, labels and all.
    saved = _post(owner, mine, "draft", {"draft_graph": DROPPED}, token)
    assert saved.status_code == 200, saved.text
    assert _pointer(rt, mine).draft_graph == DROPPED

    refused = _post(owner, mine, "publish", {}, token)
    assert refused.status_code == 422
    issues = refused.get_json()["issues"]
    by_node = {}
    for issue in issues:
        by_node.setdefault(issue["node_id"], []).append(issue)
    ask = {i["code"]: i["message"] for i in by_node["pergunta_1"]}
    assert "use uma lista de 1 a 10 itens" in ask["invalid_config"]
    act = {i["code"]: i["message"] for i in by_node["acao_1"]}
    assert "action" in act["invalid_config"] and "campo obrigatório" in act["invalid_config"]
    offer = [(i["code"], i["message"]) for i in by_node["acao_2"]]
    assert ("missing_edge", "Falta a saída unavailable desta etapa. Ligue essa saída à próxima etapa.") in offer
    end = {i["code"]: i["message"] for i in by_node["fim_1"]}
    assert "outcome" in end["invalid_config"] and "campo obrigatório" in end["invalid_config"]  # no default outcome

    # Filled in as the forms do it, with a field the org does not have: that one is named on its step.
    fixed = copy.deepcopy(DROPPED)
    fixed["nodes"][1]["config"]["fields"] = ["data", "sumiu"]
    fixed["nodes"][2]["config"] = {"action": "notify_staff", "note": "Paciente quer remarcar"}
    fixed["nodes"][3]["config"]["date_field"] = "data"
    fixed["nodes"][4]["config"] = {"outcome": "custom", "note": ""}
    fixed["edges"] = [
        {"id": "ligacao_1", "source": "gatilho_1", "target": "pergunta_1", "condition": {"type": "always"}},
        {"id": "ligacao_2", "source": "pergunta_1", "target": "acao_2", "condition": {"type": "complete"}},
        {"id": "ligacao_3", "source": "pergunta_1", "target": "acao_1", "condition": {"type": "gave_up"}},
        {"id": "ligacao_4", "source": "pergunta_1", "target": "fim_1", "condition": {"type": "no_reply"}},
        *[{"id": f"ligacao_{5 + n}", "source": "acao_2", "target": "acao_1", "condition": {"type": exit_}}
          for n, exit_ in enumerate(("ok", "failed", "unavailable", "no_reply"))],
        {"id": "ligacao_9", "source": "acao_1", "target": "fim_1", "condition": {"type": "ok"}},
    ]
    assert _post(owner, mine, "draft", {"draft_graph": fixed}, token).status_code == 200
    refused = _post(owner, mine, "publish", {}, token)
    assert refused.status_code == 422
    assert [(i["node_id"], i["code"], i["message"]) for i in refused.get_json()["issues"]] == [
        ("pergunta_1", "unknown_field",
         "A clínica não tem o campo sumiu. Crie o campo em Campos ou tire-o desta etapa.")]
    with rt.db.begin() as conn:
        conn.execute(users.update().where(users.c.email == "owner@a.com.br").values(locale="en"))
    english = _post(owner, mine, "publish", {}, token).get_json()
    assert english["issues"][0]["message"].startswith("The clinic has no field sumiu.")
    assert english["error"] == "The flow was not published: fix the problems shown."

    fixed["nodes"][1]["config"]["fields"] = ["data"]
    assert _post(owner, mine, "draft", {"draft_graph": fixed}, token).status_code == 200
    published = _post(owner, mine, "publish", {}, token)
    assert published.status_code == 200, published.text


def test_a_class_named_in_words_is_shown_by_its_name_in_the_runs_timeline_and_the_queue(owner, rt, tenants, clock):
    """The builder names a class "Não quer" (slug `nao_quer` for the engine): Execuções says the reply
    was understood as "Não quer", never the slug."""
    a, _ = tenants
    flows = Flows(a.world)
    classify = node("resposta", "ai_classify", classes=["nao_quer"], grace_minutes=60,
                    keywords={"nao_quer": ["não quero"]}, labels={"nao_quer": "Não quer"})
    graph = {
        "nodes": [node("inicio", "trigger"), classify, node("fim", "end", outcome="exhausted")],
        "edges": [edge("inicio", "resposta"), edge("resposta", "fim", "class_match", "nao_quer"),
                  edge("resposta", "fim", "no_reply"), edge("resposta", "fim")],
    }
    run = flows.enroll(flows.flow(graph), a.contact_id)
    flows.run()
    flows.reply("Obrigada, mas não quero.")
    flows.run()
    assert flows.enrollment(run).status == "completed"
    page = html.unescape(owner.get(f"/admin/followup_runs/?enrollment={run}").get_data(as_text=True))
    assert "A resposta do paciente foi entendida como Não quer." in page
    assert "pela saída Não quer" in page  # the exit the engine recorded, by the class's name
    assert 'data-last-class>Não quer<' in page
    assert "nao_quer" not in page
    queue = html.unescape(owner.get("/admin/followup_queue/?flt0_1=completed").get_data(as_text=True))
    assert "Não quer" in queue and "nao_quer" not in queue


def test_the_page_warns_of_a_marketing_template_and_shows_the_cost_per_run_only_where_they_apply(rt, clock):
    """Above the canvas, what the flow list says of the flow: the template Meta categorised as
    marketing (the catalogue's sentence) and the month's estimated cost per run; a flow that sends
    no such template and cost nothing this month shows neither."""
    rebook = {"nodes": [node("inicio", "trigger"),
                        node("convite", "action", mode="template", template="followup_rebook",
                             channel_kinds=["whatsapp"]),
                        node("fim", "end", outcome="converted")],
              "edges": [edge("inicio", "convite"), edge("convite", "fim")]}
    quiet = {"nodes": [node("inicio", "trigger"), node("fim", "end", outcome="converted")],
             "edges": [edge("inicio", "fim")]}
    with Graph() as graph:
        world, channel_id = meta_world(rt, graph, quiet_start="00:00", quiet_end="23:59", skip_sundays=False,
                                       skip_holidays=False)
        flows = Flows(world)
        sends, silent = flows.flow(rebook), flows.flow(quiet)
        flows.enroll(sends, world.contact(phone="+5516999887766"))
        flows.run()
        assert [m.status for m in flows.followups()] == ["sent"]
        # Meta moves the rebook template to marketing.
        assert post(create_app(rt).test_client(), channel_id,
                    category_body(name="followup_rebook_v1")).status_code == 200
        console = _console(rt, world, "dona@sorriso.com.br")
        page = console.get(_url(sends)).text
        other = console.get(_url(silent)).text
    assert "Este fluxo envia o modelo “Follow-up: remarcar a falta”, que a Meta classificou como marketing" in page
    assert page.count("data-marketing") == 1 and "Custo por acompanhamento: US$ 0,01" in page
    assert "data-marketing" not in other and "data-cost-per-run" not in other
