"""The follow-up console beyond the builder (issue 10): Fila de follow-ups, Execuções, Agentes,
enrolling by hand (contact page and bulk) and hand-off from the contact page and the sandbox.

Flows are published and runs advanced through the engine's own functions (tests/flows/helpers.py),
on a frozen clock; "Testar conexão" calls the loopback LLM fake. Two clinics: every view and
action answers 404 for B's ids, every state change needs the CSRF token, agents (the role) read
the queue and runs but neither cancel nor edit agents.
"""

from __future__ import annotations

import csv
import html
import io
import re
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from engine.flows import agents as agent_ops
from engine.flows.ai.base import AIError
from engine.store.models import agents, audit_log, enrollments, flow_pointers, flow_versions, inbox_items, preferences
from engine.people.contacts import opt_out
from tests.admin.conftest import csrf, login
from tests.fakes.llm import Error, LLMFake
from tests.flows.helpers import Flows, linear, node  # noqa: F401

MISSING = 10**9
API_KEY = "sk-segredo-do-agente-0xC0FFEE"


def graph(label: str = "Esperar 1 hora") -> dict[str, Any]:
    espera = node("espera", "wait", mode="fixed", minutes=60)
    espera["label"] = label
    return linear(node("inicio", "trigger"), espera, node("fim", "end", outcome="exhausted"))


@pytest.fixture
def world(rt, tenants):
    """A: flows "Retorno" and "Pós-consulta", a run of A's contact in Retorno, one step taken
    (it waits 60 min); B: its own flow and run."""
    a, b = tenants
    fa, fb = Flows(a.world), Flows(b.world)
    retorno = fa.flow(graph(), name="Retorno")
    pos = fa.flow(graph("Esperar 1h (pós)"), name="Pós-consulta")
    run = fa.enroll(retorno, a.contact_id)
    b_flow = fb.flow(graph(), name="Fluxo da B")
    b_run = fb.enroll(b_flow, b.contact_id)
    fa.tick()
    fb.tick()
    return {"a": a, "b": b, "fa": fa, "fb": fb, "retorno": retorno, "pos": pos, "run": run, "b_flow": b_flow,
            "b_run": b_run}


def text_of(response) -> str:
    return html.unescape(response.get_data(as_text=True))


def status_of(rt, enrollment_id: int) -> str:
    with rt.db.connect() as conn:
        return conn.execute(select(enrollments.c.status).where(enrollments.c.id == enrollment_id)).scalar_one()


def audit_rows(rt, action: str) -> list[Any]:
    with rt.db.connect() as conn:
        return conn.execute(select(audit_log).where(audit_log.c.action == action).order_by(audit_log.c.id)).all()


def runs_of(rt, org_id: int) -> list[Any]:
    with rt.db.connect() as conn:
        return conn.execute(select(enrollments).where(enrollments.c.org_id == org_id)
                            .order_by(enrollments.c.id)).all()


# --- Fila de follow-ups --------------------------------------------------------------------------

def test_the_queue_shows_live_runs_with_step_next_run_status_and_reason(owner, rt, world):
    page = text_of(owner.get("/admin/followup_queue/"))
    assert "Paciente Da A" in page and "Retorno" in page
    assert "Esperar 1 hora" in page  # the node's label, not its id
    assert "em 1 h" in page and "01/12/2026 10:00" in page  # relative, and absolute in São Paulo (UTC-3)
    assert "Em andamento" in page
    assert "Paciente Só Da B" not in page and "Fluxo da B" not in page
    assert f"/admin/followup_runs/?enrollment={world['run']}" in page

    # A failing step's code is shown as the catalogue's sentence, never raw.
    with rt.db.begin() as conn:
        conn.execute(update(enrollments).where(enrollments.c.id == world["run"]).values(last_error="node_error"))
    page = text_of(owner.get("/admin/followup_queue/"))
    assert "Um erro interno impediu esta etapa" in page and "node_error" not in page


def test_the_queue_filters_by_flow_status_and_period(owner, rt, world):
    a = world["a"]
    other_contact = a.world.contact(name="Segunda Paciente", phone="+5516988887777", email="s@example.com")
    world["fa"].enroll(world["pos"], other_contact)
    world["fa"].tick()
    view = owner.get("/admin/followup_queue/").text
    assert "Segunda Paciente" in html.unescape(view) and "Paciente Da A" in html.unescape(view)

    by_flow = text_of(owner.get(f"/admin/followup_queue/?flt0_0={world['pos']}"))
    assert "Segunda Paciente" in by_flow and "Paciente Da A" not in by_flow
    theirs = text_of(owner.get(f"/admin/followup_queue/?flt0_0={world['b_flow']}"))
    assert "Paciente Só Da B" not in theirs and "Paciente Da A" not in theirs

    # Ended runs leave the default list; the status filter finds them, with their reason.
    with rt.db.begin() as conn:
        from engine.flows import lifecycle
        lifecycle.end_live(conn, a.world.org_id, enrollments.c.id == world["run"], status="cancelled",
                           outcome=None, reason="cancelled_by_clinic")
    default = text_of(owner.get("/admin/followup_queue/"))
    assert "Paciente Da A" not in default and "Segunda Paciente" in default
    cancelled = text_of(owner.get("/admin/followup_queue/?flt0_1=cancelled"))
    assert "Paciente Da A" in cancelled and "A clínica cancelou este acompanhamento." in cancelled
    assert "Segunda Paciente" not in cancelled

    # Period of the next run, typed in the clinic's time zone (the run is due at 10:00 São Paulo).
    inside = text_of(owner.get("/admin/followup_queue/?flt0_2=2026-12-01+09:30:00+to+2026-12-01+10:30:00"))
    outside = text_of(owner.get("/admin/followup_queue/?flt0_2=2026-12-01+10:30:00+to+2026-12-01+11:30:00"))
    assert "Segunda Paciente" in inside and "Segunda Paciente" not in outside
    bad = text_of(owner.get("/admin/followup_queue/?flt0_2=ontem"))
    assert "Filtro ignorado" in bad


def test_owner_cancels_with_csrf_and_audit_and_b_is_untouched(owner, rt, world):
    page = owner.get("/admin/followup_queue/")
    # Without the token nothing happens.
    assert owner.post("/admin/followup_queue/action/", data={"action": "cancel", "rowid": [world["run"]]}
                      ).status_code == 400
    assert owner.post(f"/admin/followup_queue/cancel/{world['run']}/").status_code == 400
    assert status_of(rt, world["run"]) == "active"

    token = csrf(page.text)
    response = owner.post("/admin/followup_queue/action/", follow_redirects=True,
                          data={"csrf_token": token, "action": "cancel", "rowid": [world["run"], world["b_run"]]})
    assert "1 acompanhamento cancelado" in text_of(response)
    assert status_of(rt, world["run"]) == "cancelled" and status_of(rt, world["b_run"]) == "active"
    [row] = audit_rows(rt, "cancel")
    assert row.entity == "enrollments" and row.entity_id == world["run"] and row.user_id is not None

    # The run page's button: B's run is a 404, a run that already ended says so.
    assert owner.post(f"/admin/followup_queue/cancel/{world['b_run']}/", data={"csrf_token": token}).status_code == 404
    assert owner.post(f"/admin/followup_queue/cancel/{MISSING}/", data={"csrf_token": token}).status_code == 404
    # Flask-Admin's own routes (no details, edit or delete here) change nothing of B's either.
    for path in (f"/admin/followup_queue/details/?id={world['b_run']}",
                 f"/admin/followup_queue/edit/?id={world['b_run']}"):
        assert owner.get(path).status_code in (302, 404), path
    assert owner.post("/admin/followup_queue/delete/", data={"csrf_token": token, "id": world["b_run"]}
                      ).status_code in (302, 404)
    again = owner.post(f"/admin/followup_queue/cancel/{world['run']}/", data={"csrf_token": token},
                       follow_redirects=True)
    assert "Nenhum dos selecionados estava em andamento." in text_of(again)
    assert status_of(rt, world["b_run"]) == "active"


def test_an_agent_reads_the_queue_and_runs_but_cannot_cancel(agent, rt, world):
    page = text_of(agent.get("/admin/followup_queue/"))
    assert "Paciente Da A" in page and 'value="cancel"' not in page
    token = csrf(agent.get("/admin/followup_queue/").text)
    agent.post("/admin/followup_queue/action/", data={"csrf_token": token, "action": "cancel",
                                                      "rowid": [world["run"]]})
    assert agent.post(f"/admin/followup_queue/cancel/{world['run']}/", data={"csrf_token": token}).status_code == 403
    assert status_of(rt, world["run"]) == "active"
    run_page = text_of(agent.get(f"/admin/followup_runs/?enrollment={world['run']}"))
    assert "Linha do tempo" in run_page and "Cancelar acompanhamento" not in run_page


# --- Execuções -------------------------------------------------------------------------------------

def test_a_runs_timeline_says_what_happened_why_and_when(owner, rt, world, clock):
    clock.advance(timedelta(minutes=61))
    world["fa"].tick()  # the wait ends, the run reaches its end
    page = text_of(owner.get(f"/admin/followup_runs/?enrollment={world['run']}"))
    assert "Execução #" in page and "Retorno" in page and "Paciente Da A" in page and "Concluído" in page
    for label in ("Entrou no fluxo", "Etapa executada", "Encerrado", "O paciente entrou no fluxo.",
                  "O fluxo começou.", "A espera terminou.", "segue para Esperar 1 hora", "Feito"):
        assert label in page, label
    assert "01/12/2026 09:00" in page and "01/12/2026 10:01" in page  # instants in the org's time zone
    assert "trigger_fired" not in page and "wait_elapsed" not in page
    assert "Cancelar acompanhamento" not in page  # it ended

    contact_runs = text_of(owner.get(f"/admin/followup_runs/?contact={world['a'].contact_id}"))
    assert "Execuções de Paciente Da A" in contact_runs and f"enrollment={world['run']}" in contact_runs
    latest = text_of(owner.get("/admin/followup_runs/"))
    assert f"enrollment={world['run']}" in latest and f"enrollment={world['b_run']}" not in latest


def test_runs_of_another_org_answer_404(owner, world):
    b = world["b"]
    for path in (f"/admin/followup_runs/?enrollment={world['b_run']}", f"/admin/followup_runs/?enrollment={MISSING}",
                 "/admin/followup_runs/?enrollment=abc", f"/admin/followup_runs/?enrollment={2**64}",
                 f"/admin/followup_runs/?contact={b.contact_id}", "/admin/followup_runs/?contact=-1"):
        assert owner.get(path).status_code == 404, path


class SilentAI:
    """An AI whose server never answers in time (every call a transient `timeout`)."""

    def write(self, **kwargs: Any) -> Any:
        raise AIError("LLM request timed out", permanent=False, code="timeout")

    classify = plan = write


def test_a_run_that_gives_up_is_in_pendencias_with_a_link_to_its_timeline(owner, rt, tenants, clock):
    a, _ = tenants
    flows = Flows(a.world, ai=lambda agent: SilentAI())
    flow = flows.flow(linear(node("inicio", "trigger"),
                             node("escreve", "action", mode="ai_message", prompt_hint="Pergunte como foi a consulta",
                                  fallback_template=None, max_chars=300),
                             node("fim", "end", outcome="exhausted")), name="Pesquisa")
    run = flows.enroll(flow, a.contact_id)
    with rt.db.begin() as conn:  # one attempt only, so the first failure is the last
        conn.execute(update(enrollments).where(enrollments.c.id == run).values(max_attempts=0))
    flows.tick()
    assert status_of(rt, run) == "dead"  # the engine gave up and opened the Pendências item itself
    page = text_of(owner.get("/admin/inbox/"))
    assert "Follow-up parado" in page and f'href="/admin/followup_runs/?enrollment={run}"' in page
    assert "O serviço de IA não respondeu (tempo esgotado)" in page
    assert "ai_unavailable" not in page and "%(code)s" not in page and "(timeout)" not in page
    with rt.db.connect() as conn:
        item = conn.execute(select(inbox_items.c.id).where(inbox_items.c.kind == "enrollment_dead")).scalar_one()
    assert "Abra a execução" in text_of(owner.get(f"/admin/inbox/details/?id={item}"))
    timeline = text_of(owner.get(f"/admin/followup_runs/?enrollment={run}"))
    assert "Falhou" in timeline and "O serviço de IA não respondeu (tempo esgotado)" in timeline
    dead = text_of(owner.get("/admin/followup_queue/?flt0_1=dead"))
    assert "Pesquisa" in dead and "O serviço de IA não respondeu (tempo esgotado)" in dead


# --- Agentes ---------------------------------------------------------------------------------------

def agent_form(token: str, **overrides: Any) -> dict[str, Any]:
    data = {"csrf_token": token, "name": "Lia", "persona": "Recepção, breve e gentil", "llm_base_url": "",
            "llm_model": "", "new_api_key": "", "handoff_policy": "pause", "followup_enabled": "y", "flow_ids": []}
    data.update(overrides)
    return data


def agent_rows(rt, org_id: int) -> list[Any]:
    with rt.db.connect() as conn:
        return conn.execute(select(agents).where(agents.c.org_id == org_id).order_by(agents.c.id)).all()


def test_the_agent_form_offers_the_flows_as_checkboxes(owner, world):
    # A Ctrl-click list box loses the other flows with one plain click: one checkbox per flow instead.
    page = owner.get("/admin/followup_agents/new/").text
    assert "<select multiple" not in page and 'name="flow_ids"' in page
    boxes = re.findall(r'<input[^>]*name="flow_ids"[^>]*>', page)
    assert boxes and all('type="checkbox"' in box for box in boxes)
    assert f'value="{world["retorno"]}"' in " ".join(boxes)


def test_an_agent_profile_is_saved_and_its_key_is_never_shown(owner, rt, world):
    a = world["a"]
    before = len(agent_rows(rt, a.world.org_id))  # Flows made one ("Assistente")
    token = csrf(owner.get("/admin/followup_agents/new/").text)
    response = owner.post("/admin/followup_agents/new/", data=agent_form(
        token, llm_base_url="http://127.0.0.1:9/v1", llm_model="llama3", new_api_key=API_KEY,
        flow_ids=[str(world["retorno"])]))
    assert response.status_code == 302, text_of(response)[-1500:]
    rows = agent_rows(rt, a.world.org_id)
    assert len(rows) == before + 1
    new = rows[-1]
    assert new.llm_api_key is not None and API_KEY.encode() not in bytes(new.llm_api_key)
    assert new.flow_pointer_ids == [world["retorno"]] and new.followup_enabled is True
    [created] = audit_rows(rt, "create")[-1:]
    assert created.entity == "agents" and API_KEY not in str(created.changes)

    pages = {}
    for path in ("/admin/followup_agents/", f"/admin/followup_agents/details/?id={new.id}",
                 f"/admin/followup_agents/edit/?id={new.id}", "/admin/followup_agents/export/csv/",
                 "/admin/audit/", "/admin/audit/export/csv/"):
        response = owner.get(path)  # read at once: an export streams inside its request
        pages[path] = response.get_data(as_text=True)
        assert response.status_code == 200, path
        assert API_KEY not in pages[path], path
    assert "definida" in html.unescape(pages["/admin/followup_agents/"])
    assert "Retorno" in html.unescape(pages[f"/admin/followup_agents/details/?id={new.id}"])

    # A blank key field keeps the key; the rest changes.
    edit_token = csrf(pages[f"/admin/followup_agents/edit/?id={new.id}"])
    response = owner.post(f"/admin/followup_agents/edit/?id={new.id}", data=agent_form(
        edit_token, name="Lia 2", llm_base_url="http://127.0.0.1:9/v1", llm_model="llama3",
        flow_ids=[str(world["retorno"]), str(world["pos"])]))
    assert response.status_code == 302
    after = agent_rows(rt, a.world.org_id)[-1]
    assert after.name == "Lia 2" and bytes(after.llm_api_key) == bytes(new.llm_api_key)
    assert sorted(after.flow_pointer_ids) == sorted([world["retorno"], world["pos"]])

    # Remover a chave: "não definida".
    owner.post(f"/admin/followup_agents/edit/?id={new.id}", data=agent_form(
        edit_token, name="Lia 2", llm_base_url="http://127.0.0.1:9/v1", llm_model="llama3", clear_api_key="y"))
    assert agent_rows(rt, a.world.org_id)[-1].llm_api_key is None
    assert "não definida" in text_of(owner.get(f"/admin/followup_agents/details/?id={new.id}"))


def test_agent_form_refuses_an_internal_url_and_another_orgs_flow(owner, rt, world):
    a = world["a"]
    before = agent_rows(rt, a.world.org_id)
    token = csrf(owner.get("/admin/followup_agents/new/").text)
    refused = owner.post("/admin/followup_agents/new/", data=agent_form(
        token, llm_base_url="http://10.0.0.1/v1", llm_model="llama3"))
    assert refused.status_code == 200 and "Endereço não permitido: 10.0.0.1" in text_of(refused)
    half = owner.post("/admin/followup_agents/new/", data=agent_form(token, llm_base_url="https://x.example/v1"))
    assert "Informe o endereço e o modelo juntos" in text_of(half)
    theirs = owner.post("/admin/followup_agents/new/", data=agent_form(token, flow_ids=[str(world["b_flow"])]))
    assert theirs.status_code == 200
    no_token = owner.post("/admin/followup_agents/new/", data={**agent_form(token), "csrf_token": ""})
    assert no_token.status_code == 400
    assert agent_rows(rt, a.world.org_id) == before


def test_agents_of_another_org_answer_404_and_the_agent_role_only_reads(owner, agent, rt, world):
    b = world["b"]
    b_agent = world["fb"].agent_id
    token = csrf(owner.get("/admin/followup_agents/").text)
    for path in (f"/admin/followup_agents/details/?id={b_agent}", f"/admin/followup_agents/edit/?id={b_agent}"):
        assert owner.get(path).status_code == 404, path
    assert owner.post(f"/admin/followup_agents/test/{b_agent}/", data={"csrf_token": token}).status_code == 404
    edited = owner.post(f"/admin/followup_agents/edit/?id={b_agent}", data=agent_form(token, name="Tomado"))
    assert edited.status_code == 404
    deleted = owner.post("/admin/followup_agents/delete/", data={"csrf_token": token, "id": b_agent})
    assert deleted.status_code in (302, 404)
    assert [r.name for r in agent_rows(rt, b.world.org_id)] == ["Assistente"]

    mine = world["fa"].agent_id
    listing = text_of(agent.get("/admin/followup_agents/"))
    assert "Assistente" in listing
    details = text_of(agent.get(f"/admin/followup_agents/details/?id={mine}"))
    assert "Só proprietários e gestores podem testar" in details
    agent_token = csrf(agent.get("/admin/followup_queue/").text)
    assert agent.post(f"/admin/followup_agents/test/{mine}/", data={"csrf_token": agent_token}).status_code == 403
    assert agent.get("/admin/followup_agents/new/").status_code in (302, 403)
    agent.post(f"/admin/followup_agents/edit/?id={mine}", data=agent_form(agent_token, name="Mudado"))
    assert agent.post("/admin/followup_agents/new/", data=agent_form(agent_token)).status_code in (302, 403)
    rows = agent_rows(rt, world["a"].world.org_id)
    assert [r.name for r in rows] == ["Assistente"]


def _llm_agent(rt, org_id: int, base_url: str, key: str | None = API_KEY) -> int:
    with rt.db.begin() as conn:
        # No egress here: as one saved before the guard existed (or whose name now resolves inside).
        return agent_ops.create_agent(conn, rt.keyring, org_id, name="IA", llm_base_url=base_url, llm_model="llama3",
                                      llm_api_key=key)


def test_testar_conexao_calls_the_llm_through_the_agents_client(owner, rt, world, serve):
    a = world["a"]
    fake = LLMFake(api_key=API_KEY)
    with serve(fake) as server:
        agent_id = _llm_agent(rt, a.world.org_id, f"{server.url}/v1")
        token = csrf(owner.get(f"/admin/followup_agents/details/?id={agent_id}").text)
        assert owner.post(f"/admin/followup_agents/test/{agent_id}/").status_code == 400  # no CSRF, no call
        assert fake.calls == []
        ok = text_of(owner.post(f"/admin/followup_agents/test/{agent_id}/", data={"csrf_token": token},
                                follow_redirects=True))
        assert "Conexão funcionando: o modelo llama3 respondeu." in ok and API_KEY not in ok
        assert len(fake.calls) == 1 and fake.calls[0].model == "llama3"
        assert fake.calls[0].recorded.header("Authorization") == f"Bearer {API_KEY}"

        fake.script(Error(401))
        refused = text_of(owner.post(f"/admin/followup_agents/test/{agent_id}/", data={"csrf_token": token},
                                     follow_redirects=True))
        assert "A conexão falhou: chave de API recusada." in refused and API_KEY[-8:] not in refused
    results = [row.changes["result"] for row in audit_rows(rt, "test_connection")]
    assert results == ["ok", "http_401"]


def test_testar_conexao_says_a_refused_address_and_sends_nothing(owner, rt, world, serve):
    a = world["a"]
    fake = LLMFake()
    with serve(fake) as server:
        agent_id = _llm_agent(rt, a.world.org_id, "http://10.11.12.13:8080/v1")
        token = csrf(owner.get(f"/admin/followup_agents/details/?id={agent_id}").text)
        page = text_of(owner.post(f"/admin/followup_agents/test/{agent_id}/", data={"csrf_token": token},
                                  follow_redirects=True))
        assert "A conexão falhou: endereço não permitido." in page and "LEMBRA_PROVIDER_ALLOW" in page
        assert server.requests == []
    builtin = world["fa"].agent_id  # no base URL: nothing to test
    page = text_of(owner.post(f"/admin/followup_agents/test/{builtin}/", data={"csrf_token": token},
                              follow_redirects=True))
    assert "usa a IA embutida" in page


# --- enrolling by hand ---------------------------------------------------------------------------------

def enroll_form(page: str) -> dict[str, str]:
    key = re.search(r'name="key" value="([0-9a-f]{32})"', page)
    assert key, "no enrolment form"
    return {"csrf_token": csrf(page), "key": key.group(1)}


def test_enroll_from_the_contact_page_once_per_form_with_readable_refusals(owner, rt, world):
    a = world["a"]
    contact = a.world.contact(name="Nova Paciente", phone="+5516977776666", email="n@example.com")
    page = owner.get(f"/admin/contacts/details/?id={contact}").text
    assert "Incluir no fluxo" in page and "Fluxo da B" not in page
    form = enroll_form(page)
    assert owner.post(f"/admin/contacts/enroll/{contact}/", data={"key": form["key"], "flow_id": world["pos"]}
                      ).status_code == 400  # no CSRF
    first = owner.post(f"/admin/contacts/enroll/{contact}/", data={**form, "flow_id": world["pos"]},
                       follow_redirects=True)
    second = owner.post(f"/admin/contacts/enroll/{contact}/", data={**form, "flow_id": world["pos"]},
                        follow_redirects=True)  # a double click: the same form, the same key
    assert "Paciente incluído no fluxo." in text_of(first)
    assert "o paciente foi incluído uma vez só" in text_of(second)
    mine = [r for r in runs_of(rt, a.world.org_id) if r.contact_id == contact]
    assert len(mine) == 1 and mine[0].pointer_id == world["pos"] and mine[0].trigger_kind == "manual"
    assert [r.entity_id for r in audit_rows(rt, "enroll")] == [mine[0].id]
    assert "Pós-consulta" in text_of(owner.get(f"/admin/contacts/details/?id={contact}"))

    # A new form for the same flow: the contact is already in it.
    again = owner.post(f"/admin/contacts/enroll/{contact}/", follow_redirects=True,
                       data={**enroll_form(owner.get(f"/admin/contacts/details/?id={contact}").text),
                             "flow_id": world["pos"]})
    assert "O paciente não foi incluído: O paciente já está neste fluxo." in text_of(again)

    # Opted out of everything: refused with the catalogue's sentence.
    with rt.db.begin() as conn:
        opt_out(conn, a.world.org_id, a.contact_id, source="console", evidence="test")
    refused = owner.post(f"/admin/contacts/enroll/{a.contact_id}/", follow_redirects=True,
                         data={**enroll_form(owner.get(f"/admin/contacts/details/?id={a.contact_id}").text),
                               "flow_id": world["pos"]})
    assert "O paciente não foi incluído: O paciente pediu para não receber mensagens." in text_of(refused)
    assert "contact_opted_out" not in text_of(refused)

    # B's flow or contact: 404, nothing written.
    form = enroll_form(owner.get(f"/admin/contacts/details/?id={contact}").text)
    count = len(runs_of(rt, a.world.org_id))
    assert owner.post(f"/admin/contacts/enroll/{contact}/", data={**form, "flow_id": world["b_flow"]}
                      ).status_code == 404
    assert owner.post(f"/admin/contacts/enroll/{world['b'].contact_id}/", data={**form, "flow_id": world["pos"]}
                      ).status_code == 404
    assert owner.post(f"/admin/contacts/enroll/{contact}/", data={**form, "flow_id": world["pos"], "key": "x"}
                      ).status_code == 400
    assert len(runs_of(rt, a.world.org_id)) == count
    assert len(runs_of(rt, world["b"].world.org_id)) == 1


def test_an_agent_cannot_enroll(agent, rt, world):
    a = world["a"]
    page = agent.get(f"/admin/contacts/details/?id={a.contact_id}").text
    assert "Incluir no fluxo" not in html.unescape(page)
    response = agent.post(f"/admin/contacts/enroll/{a.contact_id}/",
                          data={"csrf_token": csrf(page), "key": "0" * 32, "flow_id": world["pos"]})
    assert response.status_code == 403
    assert agent.get(f"/admin/contacts/enroll-bulk/?ids={a.contact_id}").status_code == 403


def test_bulk_enroll_from_contatos_is_idempotent(owner, rt, world):
    a = world["a"]
    second = a.world.contact(name="Bruno", phone="+5516966665555", email="b@example.com")
    third = a.world.contact(name="Carla", phone="+5516955554444", email="c@example.com")
    token = csrf(owner.get("/admin/contacts/").text)
    chosen = [a.contact_id, second, third, world["b"].contact_id]
    response = owner.post("/admin/contacts/action/", data={"csrf_token": token, "action": "enroll", "rowid": chosen})
    assert response.status_code == 302
    target = response.headers["Location"]
    assert "enroll-bulk" in target and f"ids={world['b'].contact_id}" not in target  # B's id left out
    page = owner.get(target).text
    assert "Bruno" in page and "Carla" in page and "Paciente Da A" in page and "Paciente Só Da B" not in page
    form = enroll_form(page)
    ids = [a.contact_id, second, third]
    done = owner.post("/admin/contacts/enroll-bulk/", follow_redirects=True,
                      data={**form, "flow_id": world["retorno"], "ids": ids})
    text = text_of(done)
    assert "2 pacientes incluídos no fluxo." in text
    assert "1 não incluído: O paciente já está neste fluxo." in text  # A's contact is in Retorno already
    repeat = text_of(owner.post("/admin/contacts/enroll-bulk/", follow_redirects=True,
                                data={**form, "flow_id": world["retorno"], "ids": ids}))
    assert "0 pacientes incluídos no fluxo." in repeat and "2 já tinham sido incluídos por este mesmo pedido." in repeat
    in_retorno = [r.contact_id for r in runs_of(rt, a.world.org_id) if r.pointer_id == world["retorno"]]
    assert sorted(in_retorno) == sorted(ids)

    # B's contact named on the page itself, or no CSRF: refused, nothing written.
    assert owner.get(f"/admin/contacts/enroll-bulk/?ids={second}&ids={world['b'].contact_id}").status_code == 404
    assert owner.post("/admin/contacts/enroll-bulk/", data={**form, "flow_id": world["retorno"],
                                                           "ids": [world["b"].contact_id]}).status_code == 404
    assert owner.post("/admin/contacts/enroll-bulk/", data={"key": form["key"], "flow_id": world["retorno"],
                                                           "ids": ids}).status_code == 400
    assert len(runs_of(rt, world["b"].world.org_id)) == 1


# --- hand-off ------------------------------------------------------------------------------------------

def test_handoff_from_the_contact_page_pauses_and_ending_it_resumes(agent, rt, world, clock):
    a = world["a"]
    run = world["run"]
    page = agent.get(f"/admin/contacts/details/?id={a.contact_id}").text  # a receptionist (agent role)
    assert 'data-handoff="off"' in page and "Assumir a conversa" in html.unescape(page)
    assert agent.post(f"/admin/contacts/handoff/{a.contact_id}/", data={"op": "start"}).status_code == 400
    started = agent.post(f"/admin/contacts/handoff/{a.contact_id}/", follow_redirects=True,
                         data={"csrf_token": csrf(page), "op": "start"})
    text = text_of(started)
    assert "Atendimento humano iniciado: 1 acompanhamento pausado" in text
    assert 'data-handoff="on"' in text and "Encerrar atendimento humano" in text
    assert status_of(rt, run) == "paused_handoff"
    assert "Pausado: atendimento humano" in text_of(agent.get("/admin/followup_queue/"))

    clock.advance(timedelta(minutes=10))
    ended = agent.post(f"/admin/contacts/handoff/{a.contact_id}/", follow_redirects=True,
                       data={"csrf_token": csrf(page), "op": "end"})
    assert "1 acompanhamento retomado" in text_of(ended)
    with rt.db.connect() as conn:
        row = conn.execute(select(enrollments).where(enrollments.c.id == run)).one()
    # A 10-minute hand-off in a 60-minute wait: the wait ends when it would have (not 30 min after).
    assert row.status == "active" and row.next_eval_at == clock.now() + timedelta(minutes=50)
    timeline = text_of(agent.get(f"/admin/followup_runs/?enrollment={run}"))
    assert "Pausado" in timeline and "Retomado" in timeline and "Uma pessoa da equipe assumiu a conversa." in timeline
    assert "O fluxo retoma no prazo que esta etapa já tinha antes da pausa" in timeline
    assert "até 01/12/2026 10:00" in timeline  # the wait's own end, in the org's time zone
    assert [r.action for r in audit_rows(rt, "handoff_started")] == ["handoff_started"]
    assert [r.action for r in audit_rows(rt, "handoff_ended")] == ["handoff_ended"]

    # Ending twice says so; B's contact is a 404.
    twice = agent.post(f"/admin/contacts/handoff/{a.contact_id}/", follow_redirects=True,
                       data={"csrf_token": csrf(page), "op": "end"})
    assert "Não há atendimento humano em andamento" in text_of(twice)
    assert agent.post(f"/admin/contacts/handoff/{world['b'].contact_id}/",
                      data={"csrf_token": csrf(page), "op": "start"}).status_code == 404
    assert status_of(rt, world["b_run"]) == "active"


def test_handoff_from_the_sandbox_chat(owner, rt, world):
    a = world["a"]
    chat = owner.get(f"/admin/sandbox/?contact={a.contact_id}").text
    assert 'id="lembra-handoff"' in chat and 'data-handoff="off"' in chat
    response = owner.post(f"/admin/contacts/handoff/{a.contact_id}/",
                          data={"csrf_token": csrf(chat), "op": "start", "back": "sandbox"})
    assert response.status_code == 302
    assert response.headers["Location"].endswith(f"/admin/sandbox/?contact={a.contact_id}")
    assert status_of(rt, world["run"]) == "paused_handoff"
    chat = text_of(owner.get(f"/admin/sandbox/?contact={a.contact_id}"))
    assert 'data-handoff="on"' in chat and "Atendimento humano em andamento" in chat
    # A `back` that is not one of ours goes to the contact page, never elsewhere.
    response = owner.post(f"/admin/contacts/handoff/{a.contact_id}/",
                          data={"csrf_token": csrf(chat), "op": "end", "back": "https://evil.example/"})
    assert response.headers["Location"].endswith(f"/admin/contacts/details/?id={a.contact_id}")
    assert status_of(rt, world["run"]) == "active"


def test_every_followup_page_renders_for_each_role(app, rt, world):
    with rt.db.connect() as conn:
        count = conn.execute(select(func.count()).select_from(preferences)).scalar_one()
    assert count  # the tenants' contacts consented
    for email in ("owner@a.com.br", "manager@a.com.br", "agent@a.com.br"):
        client = login(app.test_client(), email)
        for path in ("/admin/followup_queue/", "/admin/followup_runs/",
                     f"/admin/followup_runs/?enrollment={world['run']}", "/admin/followup_agents/",
                     f"/admin/contacts/details/?id={world['a'].contact_id}"):
            response = client.get(path)
            assert response.status_code == 200, (email, path)
        menu = text_of(client.get("/admin/followup_queue/"))
        assert "Acompanhamento" in menu and "Fila de follow-ups" in menu and "Execuções" in menu and "Agentes" in menu
        assert "window.location.reload()" in menu  # the queue polls (followup-spec §8: refresh by polling)
    export = login(app.test_client(), "owner@a.com.br").get("/admin/followup_queue/export/csv/")
    rows = list(csv.reader(io.StringIO(export.get_data(as_text=True))))
    assert len(rows) == 2 and "Paciente Da A" in rows[1] and "Paciente Só Da B" not in export.get_data(as_text=True)


# --- Fluxos: trigger, runs this week, conversion; Duplicar and Apagar (issue 33) ----------------------

def flow_row(page: str, flow_id: int) -> str:
    """The list's row of one flow, as text."""
    match = re.search(rf'<tr data-flow-id="{flow_id}">(.*?)</tr>', page, re.S)
    assert match, f"flow {flow_id} is not listed"
    return match.group(1)


def cell(row: str, name: str) -> str:
    """A cell of a flow's row by its data- attribute ("live": the cell just before runs this week)."""
    if name == "live":
        match = re.search(r"<td>(\d+)</td>\s*<td data-week>", row)
    else:
        match = re.search(rf"<td data-{name}>(.*?)</td>", row, re.S)
    assert match, name
    return match.group(1).strip()


def more_runs(rt, world, flow_id: int, n: int) -> list[int]:
    """`n` more runs of A's flow, each with a contact of its own."""
    a, fa = world["a"], world["fa"]
    return [fa.enroll(flow_id, a.world.contact(name=f"Paciente {i}", phone=f"+55169990011{i:02d}"))
            for i in range(n)]


def end_runs(rt, ids: list[int], status: str, outcome: str | None) -> None:
    with rt.db.begin() as conn:
        conn.execute(update(enrollments).where(enrollments.c.id.in_(ids))
                     .values(status=status, outcome=outcome, next_eval_at=None))


def test_the_flow_list_shows_trigger_runs_this_week_and_conversion(owner, rt, world, clock):
    fa = world["fa"]
    falta = fa.flow(graph(), name="Faltou", trigger={"kind": "appointment", "appointment_event": "no_show",
                                                      "repeat": "always"})
    remarcar = fa.flow(graph(), name="Quer remarcar", trigger={"kind": "intent", "intent": "reschedule",
                                                               "repeat": "always"})
    converted = more_runs(rt, world, world["retorno"], 3)[:2]
    lost = more_runs(rt, world, world["retorno"], 1)
    end_runs(rt, converted, "completed", "converted")
    end_runs(rt, lost, "cancelled", None)
    with rt.db.begin() as conn:  # one run began last week: it is no run of this week
        conn.execute(update(enrollments).where(enrollments.c.id == lost[0])
                     .values(created_at=clock.now() - timedelta(days=8)))

    page = text_of(owner.get("/admin/followup/flows/"))

    retorno = flow_row(page, world["retorno"])
    assert cell(retorno, "trigger") == "Manual"
    assert (cell(retorno, "live"), cell(retorno, "week")) == ("2", "4"), "the first run and one not ended"
    assert cell(retorno, "conversion").startswith("66,7"), "2 converted of 3 ended"
    pos = flow_row(page, world["pos"])
    assert (cell(pos, "live"), cell(pos, "week"), cell(pos, "conversion")) == ("0", "0", "—")
    assert cell(flow_row(page, falta), "trigger") == "Falta (no-show)"
    assert cell(flow_row(page, remarcar), "trigger") == "Intenção: remarcar"
    assert "Fluxo da B" not in page
    # A version no user published is named by who did (flow_versions.published_by).
    with rt.db.begin() as conn:
        conn.execute(update(flow_versions).where(flow_versions.c.pointer_id == remarcar)
                     .values(created_by=None, published_by="api"))
    assert "por API" in text_of(owner.get("/admin/followup/flows/"))


def test_the_flow_list_costs_the_same_queries_for_two_flows_or_ten(owner, rt, world):
    from sqlalchemy import event

    def statements() -> int:
        seen: list[str] = []
        listener = lambda *args: seen.append(args[2])  # noqa: E731
        event.listen(rt.db.engine, "before_cursor_execute", listener)
        try:
            assert owner.get("/admin/followup/flows/").status_code == 200
        finally:
            event.remove(rt.db.engine, "before_cursor_execute", listener)
        return len(seen)

    owner.get("/admin/followup/flows/")  # warm the session's caches
    few = statements()
    for i in range(8):
        flow_id = world["fa"].flow(graph(), name=f"Mais um {i}")
        more_runs(rt, world, flow_id, 1) if i < 2 else None
    assert statements() == few


def test_owner_duplicates_a_flow_as_an_unpublished_draft_with_csrf_and_audit(owner, agent, rt, world):
    token = csrf(owner.get("/admin/followup/flows/").text)
    url = f"/admin/followup/flows/{world['retorno']}/duplicate/"
    page = text_of(owner.post(url, data={"csrf_token": token}, follow_redirects=True))
    assert "Cópia criada como rascunho" in page
    again = owner.post(url, data={"csrf_token": token})
    assert again.status_code == 302
    with rt.db.connect() as conn:
        rows = conn.execute(select(flow_pointers).where(flow_pointers.c.org_id == world["a"].world.org_id)
                            .order_by(flow_pointers.c.id)).all()
        source = next(r for r in rows if r.id == world["retorno"])
        copies = [r for r in rows if r.name.startswith("Cópia de")]
    assert [c.name for c in copies] == ["Cópia de Retorno", "Cópia de Retorno (2)"]
    for copy in copies:
        assert (copy.status, copy.active_version_id) == ("draft", None), "a copy starts nobody"
        assert copy.draft_graph == source.draft_graph and copy.trigger_config == source.trigger_config
    assert [(r.entity_id, r.changes) for r in audit_rows(rt, "duplicate")] == [
        (copies[0].id, {"copied_from": world["retorno"]}), (copies[1].id, {"copied_from": world["retorno"]})]

    assert owner.post(f"/admin/followup/flows/{world['b_flow']}/duplicate/",
                      data={"csrf_token": token}).status_code == 404
    assert owner.post(f"/admin/followup/flows/{MISSING}/duplicate/", data={"csrf_token": token}).status_code == 404
    assert owner.post(url, data={}).status_code == 400
    agent_token = csrf(agent.get("/admin/followup_queue/").text)
    assert agent.post(url, data={"csrf_token": agent_token}).status_code == 403
    assert "Duplicar" not in agent.get("/admin/followup/flows/").text
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(flow_pointers).where(
            flow_pointers.c.name.like("Cópia%"))).scalar_one() == 2


def test_delete_takes_a_flow_that_never_ran_and_refuses_one_with_runs(owner, agent, rt, world):
    fa = world["fa"]
    token = csrf(owner.get("/admin/followup/flows/").text)

    def delete(flow_id: int, **kwargs: Any):
        return owner.post(f"/admin/followup/flows/{flow_id}/delete/", data={"csrf_token": token, **kwargs},
                          follow_redirects=True)

    def exists(flow_id: int) -> bool:
        with rt.db.connect() as conn:
            return conn.execute(select(flow_pointers.c.id).where(flow_pointers.c.id == flow_id)).first() is not None

    live = text_of(delete(world["retorno"]))
    assert "tem 1 execução em andamento" in live and exists(world["retorno"])
    ran = fa.flow(graph(), name="Já rodou")
    end_runs(rt, more_runs(rt, world, ran, 1), "completed", "converted")
    history = text_of(delete(ran))
    assert "para guardar o histórico" in history and exists(ran)
    starter = fa.flow(linear(node("inicio", "trigger"), node("vai", "do", action="start_flow", flow_id=world["pos"]),
                             node("fim", "end", outcome="exhausted")), name="Começa o pós", publish=False, agent=False)
    assert "O fluxo Começa o pós começa este fluxo" in text_of(delete(world["pos"])) and exists(world["pos"])

    assert owner.post(f"/admin/followup/flows/{starter}/delete/", data={}).status_code == 400
    assert exists(starter)
    agent_token = csrf(agent.get("/admin/followup_queue/").text)
    assert agent.post(f"/admin/followup/flows/{starter}/delete/",
                      data={"csrf_token": agent_token}).status_code == 403
    assert owner.post(f"/admin/followup/flows/{world['b_flow']}/delete/",
                      data={"csrf_token": token}).status_code == 404
    assert exists(world["b_flow"])

    page = text_of(delete(starter))
    assert "Fluxo apagado." in page and not exists(starter)
    assert "Fluxo apagado." in text_of(delete(world["pos"])), "nothing starts it any more"
    assert not exists(world["pos"])
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(flow_versions).where(
            flow_versions.c.pointer_id == world["pos"])).scalar_one() == 0
        ids = conn.execute(select(agents.c.flow_pointer_ids).where(agents.c.id == fa.agent_id)).scalar_one()
    assert world["pos"] not in ids and world["retorno"] in ids, "the agent's list loses it"
    assert [(r.entity_id, r.changes) for r in audit_rows(rt, "delete") if r.entity == "flow_pointers"] == [
        (starter, {"name": "Começa o pós"}), (world["pos"], {"name": "Pós-consulta"})]
