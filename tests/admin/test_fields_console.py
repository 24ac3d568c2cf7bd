"""Campos (Configuração): the org's conversation fields from the console, through the engine's one
validator: saved whole or not at all, another org's field a 404, CSRF and the role checked, and a
field a published flow asks for is not deleted."""

from __future__ import annotations

from sqlalchemy import func, select

from engine.flows import versions
from engine.flows.conversation.fields import create_field
from engine.store.models import audit_log, conversation_fields
from tests.admin.conftest import csrf
from tests.flows.helpers import edge, node

URL = "/admin/settings/fields/"


def _rows(rt, org_id: int) -> list:
    with rt.db.connect() as conn:
        return conn.execute(select(conversation_fields).where(conversation_fields.c.org_id == org_id)
                            .order_by(conversation_fields.c.id)).all()


def _field(rt, org_id: int, slug: str = "periodo") -> int:
    with rt.db.begin() as conn:
        return create_field(conn, org_id, {"slug": slug, "label": "Período", "type": "period",
                                           "question": "De manhã, à tarde ou à noite?"}).id


def _post(client, path: str, **data):
    token = csrf(client.get(URL + "new/").text)
    return client.post(path, data={"csrf_token": token, **data})


def test_an_owner_creates_edits_and_deletes_a_choice_field(rt, owner, tenants):
    a, _ = tenants
    page = owner.get(URL + "new/")
    assert page.status_code == 200 and "Como perguntar" in page.text and "Período do dia" in page.text
    made = _post(owner, URL + "new/", label="Convênio", slug="convenio", type="choice",
                 options="Particular\nUnimed\n", question="Qual é o seu convênio?")
    assert made.status_code == 302, made.text
    [row] = _rows(rt, a.world.org_id)
    assert (row.slug, row.type, row.question) == ("convenio", "choice", "Qual é o seu convênio?")
    assert [o["value"] for o in row.options] == ["Particular", "Unimed"]
    listing = owner.get(URL).text
    assert "Convênio" in listing and "Escolha" in listing and "Particular, Unimed" in listing

    edited = _post(owner, f"{URL}{row.id}/edit/", label="Convênio", slug="convenio", type="choice",
                   options="Particular\nUnimed\nBradesco", question="Tem convênio?")
    assert edited.status_code == 302
    [row] = _rows(rt, a.world.org_id)
    assert row.question == "Tem convênio?" and len(row.options) == 3

    assert _post(owner, f"{URL}{row.id}/delete/").status_code == 302
    assert _rows(rt, a.world.org_id) == []
    with rt.db.connect() as conn:
        actions = conn.execute(select(audit_log.c.action).where(
            audit_log.c.org_id == a.world.org_id, audit_log.c.entity == "conversation_fields")
            .order_by(audit_log.c.id)).scalars().all()
    assert actions == ["create", "update", "delete"]


def test_bad_input_says_the_catalogue_sentence_and_writes_nothing(rt, owner, tenants):
    a, _ = tenants
    _field(rt, a.world.org_id, "periodo")
    page = _post(owner, URL + "new/", label="", slug="Com Espaço", type="choice", options="só uma",
                 question="Qual?")
    assert page.status_code == 200
    assert "campo obrigatório; preencha-o" in page.text  # the label
    assert "use de 1 a 40 letras minúsculas sem acento" in page.text  # the slug
    assert "use uma lista de 2 a 20 itens" in page.text  # one option
    taken = _post(owner, URL + "new/", label="Outro", slug="periodo", type="date", question="Que dia?")
    assert "A clínica já tem um campo periodo." in taken.text
    assert len(_rows(rt, a.world.org_id)) == 1
    # An edit that the engine refuses leaves the field as it was.
    field_id = _rows(rt, a.world.org_id)[0].id
    _post(owner, f"{URL}{field_id}/edit/", label="Período", slug="periodo", type="period", question="")
    assert _rows(rt, a.world.org_id)[0].question == "De manhã, à tarde ou à noite?"


def test_a_field_a_published_flow_asks_for_is_not_deleted(rt, owner, tenants):
    a, _ = tenants
    field_id = _field(rt, a.world.org_id)
    graph = {"nodes": [node("inicio", "trigger"), node("pergunta", "ask", fields=["periodo"], max_asks=2,
                                                       grace_minutes=60),
                       node("pronto", "end", outcome="converted"), node("desistiu", "end", outcome="exhausted"),
                       node("calado", "end", outcome="custom")],
             "edges": [edge("inicio", "pergunta"), edge("pergunta", "pronto", "complete"),
                       edge("pergunta", "desistiu", "gave_up"), edge("pergunta", "calado", "no_reply")]}
    with rt.db.begin() as conn:
        pointer = versions.create_flow(conn, a.world.org_id, name="Remarcar falta", draft_graph=graph,
                                       trigger_config={"kind": "manual"})
        versions.publish(conn, a.world.org_id, pointer)
    page = owner.get(owner.post(f"{URL}{field_id}/delete/",
                                data={"csrf_token": csrf(owner.get(URL).text)}).location).text
    assert "O campo Período não foi apagado: o fluxo publicado Remarcar falta pergunta por ele." in page
    assert len(_rows(rt, a.world.org_id)) == 1


def test_another_orgs_field_answers_404_and_stays(rt, owner, tenants):
    _, b = tenants
    other = _field(rt, b.world.org_id)
    assert owner.get(f"{URL}{other}/edit/").status_code == 404
    assert _post(owner, f"{URL}{other}/edit/", label="x", slug="x", type="text", question="x").status_code == 404
    assert _post(owner, f"{URL}{other}/delete/").status_code == 404
    assert owner.get(f"{URL}99999999999999999999/edit/").status_code == 404
    [row] = _rows(rt, b.world.org_id)
    assert row.label == "Período" and "Período" not in owner.get(URL).text


def test_a_post_without_csrf_is_refused(rt, owner, tenants):
    a, _ = tenants
    response = owner.post(URL + "new/", data={"label": "Data", "slug": "data", "type": "date", "question": "Dia?"})
    assert response.status_code == 400
    field_id = _field(rt, a.world.org_id)
    assert owner.post(f"{URL}{field_id}/delete/").status_code == 400
    assert len(_rows(rt, a.world.org_id)) == 1


def test_agents_get_403_and_no_menu_entry(rt, agent, tenants):
    a, _ = tenants
    field_id = _field(rt, a.world.org_id)
    assert agent.get(URL).status_code == 403
    assert agent.get(URL + "new/").status_code == 403
    token = csrf(agent.get("/admin/queue/").text)
    assert agent.post(f"{URL}{field_id}/delete/", data={"csrf_token": token}).status_code == 403
    assert URL not in agent.get("/admin/").text
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(conversation_fields)).scalar_one() == 1
