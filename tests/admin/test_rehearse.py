"""The builder's "Testar" chat endpoint (POST /admin/followup/builder/<id>/rehearse): the transcript
in the reader's words, nothing kept, the CSRF token and an owner or manager required, another org's
flow a 404, bad input a clear error."""

from __future__ import annotations

import re

from sqlalchemy import func, select, update

from engine.flows import versions
from engine.store import models
from tests.admin.conftest import login

GRAPH = {
    "nodes": [
        {"id": "inicio", "type": "trigger", "config": {}},
        {"id": "pergunta", "type": "action", "label": "Pergunta",
         "config": {"mode": "template", "template": "session_reminder", "channel_kinds": ["whatsapp"]}},
        {"id": "resposta", "type": "ai_classify",
         "config": {"classes": ["confirmar"], "grace_minutes": 60, "keywords": {"confirmar": ["pode ser"]}}},
        {"id": "fim", "type": "end", "label": "Confirmado", "config": {"outcome": "converted"}},
        {"id": "outro", "type": "end", "config": {"outcome": "custom"}},
    ],
    "edges": [
        {"source": "inicio", "target": "pergunta", "condition": {"type": "always"}},
        {"source": "pergunta", "target": "resposta", "condition": {"type": "always"}},
        {"source": "resposta", "target": "fim", "condition": {"type": "class_match", "value": "confirmar"}},
        {"source": "resposta", "target": "outro", "condition": {"type": "no_reply"}},
        {"source": "resposta", "target": "outro", "condition": {"type": "always"}},
    ],
}
TABLES = ("messages", "enrollments", "enrollment_events", "appointments", "contacts", "inbound_messages",
          "flow_versions", "audit_log")


def _flow(rt, org_id: int, *, publish: bool, name: str = "Confirmação") -> int:
    with rt.db.begin() as conn:
        pk = versions.create_flow(conn, org_id, name=name, draft_graph=GRAPH)
        if publish:
            versions.publish(conn, org_id, pk)
    return pk


def _token(client, pk: int) -> str:
    page = client.get(f"/admin/followup/builder/{pk}/")
    assert page.status_code == 200
    return re.search(r'<meta name="csrf-token" content="([^"]+)"', page.text).group(1)


def _rehearse(client, pk: int, body: dict, token: str | None):
    headers = {"X-CSRFToken": token} if token else {}
    return client.post(f"/admin/followup/builder/{pk}/rehearse", json=body, headers=headers)


def _counts(rt) -> dict[str, int]:
    with rt.db.connect() as conn:
        return {name: conn.execute(select(func.count()).select_from(getattr(models, name))).scalar_one()
                for name in TABLES}


def test_the_transcript_comes_back_in_words_and_nothing_is_kept(owner, rt, tenants):
    a, _ = tenants
    pk = _flow(rt, a.world.org_id, publish=False)
    token = _token(owner, pk)
    before = _counts(rt)
    response = _rehearse(owner, pk, {"version": "draft", "replies": ["pode ser, obrigado"]}, token)
    assert response.status_code == 200, response.text
    body = response.get_json()
    bot, reply = body["turns"]
    assert bot["role"] == "bot" and bot["text"] and bot["node_label"] == "Pergunta"
    assert reply == {**reply, "role": "patient", "text": "pode ser, obrigado", "label": "confirmar",
                     "understood": ["confirmar"], "exit_label": "confirmar", "next_label": "Confirmado"}
    assert (body["status"], body["outcome"], body["outcome_label"], body["waiting"]) == \
        ("completed", "converted", "Convertido", False)
    assert _counts(rt) == before
    with rt.db.connect() as conn:
        assert versions.get_flow(conn, a.world.org_id, pk).active_version_id is None, "the draft was not published"
    # The published version: none yet, said in words.
    refused = _rehearse(owner, pk, {"version": "published", "replies": []}, token)
    assert refused.status_code == 400 and refused.get_json()["code"] == "rehearsal_not_published"
    assert "publicada" in refused.get_json()["error"]
    # The fallback exit of a classifier reads as "Outra resposta"; English readers get English words.
    other = _rehearse(owner, pk, {"version": "draft", "replies": ["hmm"]}, token).get_json()
    assert other["turns"][1]["exit_label"] == "Outra resposta"
    with rt.db.begin() as conn:
        conn.execute(update(models.users).where(models.users.c.email == "owner@a.com.br").values(locale="en"))
    english = _rehearse(owner, pk, {"version": "draft", "replies": ["hmm"]}, token).get_json()
    assert english["turns"][1]["exit_label"] == "Other reply" and english["outcome_label"] == "Other"
    refused = _rehearse(owner, pk, {"version": "published", "replies": []}, token).get_json()
    assert refused["error"] == "This flow has no published version yet. Test the draft or publish it."


def test_the_boot_hands_the_url_and_the_panels_words(owner, rt, tenants):
    a, _ = tenants
    pk = _flow(rt, a.world.org_id, publish=True)
    page = owner.get(f"/admin/followup/builder/{pk}/").text
    assert f"/admin/followup/builder/{pk}/rehearse" in page
    assert '"restart": "Recome\\u00e7ar"' in page or '"restart": "Recomeçar"' in page


def test_it_needs_the_csrf_token(owner, rt, tenants):
    a, _ = tenants
    pk = _flow(rt, a.world.org_id, publish=True)
    _token(owner, pk)
    assert _rehearse(owner, pk, {"version": "published", "replies": []}, None).status_code == 400
    assert _rehearse(owner, pk, {"version": "published", "replies": []}, "not-the-token").status_code == 400


def test_another_orgs_flow_is_not_found(owner, rt, tenants):
    a, b = tenants
    mine = _flow(rt, a.world.org_id, publish=True)
    theirs = _flow(rt, b.world.org_id, publish=True)
    token = _token(owner, mine)
    before = _counts(rt)
    response = _rehearse(owner, theirs, {"version": "published", "replies": []}, token)
    assert response.status_code == 404 and response.get_json()["error"] == "Fluxo não encontrado."
    assert _rehearse(owner, 0, {"version": "published", "replies": []}, token).status_code == 404
    assert _counts(rt) == before


def test_an_agent_cannot_rehearse(agent, rt, tenants):
    a, _ = tenants
    pk = _flow(rt, a.world.org_id, publish=True)
    response = _rehearse(agent, pk, {"version": "published", "replies": []}, _token(agent, pk))
    assert response.status_code == 403


def test_bad_input_is_a_clear_error(app, rt, tenants):
    a, _ = tenants
    manager = login(app.test_client(), "manager@a.com.br")
    pk = _flow(rt, a.world.org_id, publish=True)
    token = _token(manager, pk)
    for body, code in (({"version": "published", "replies": ["oi"] * 41}, "rehearsal_too_many_replies"),
                       ({"version": "published", "replies": ["x" * 1001]}, "rehearsal_reply_too_long"),
                       ({"version": "ontem", "replies": []}, "rehearsal_bad_version"),
                       ({"version": "published", "replies": "oi"}, "rehearsal_bad_replies"),
                       ({"version": "published", "replies": [], "contact_id": 3}, "rehearsal_bad_replies")):
        response = _rehearse(manager, pk, body, token)
        assert response.status_code == 400, body
        assert response.get_json()["code"] == code and response.get_json()["error"]
    broken = _flow(rt, a.world.org_id, publish=False, name="Quebrado")
    with rt.db.begin() as conn:
        versions.update_flow(conn, a.world.org_id, broken, draft_graph={**GRAPH, "edges": GRAPH["edges"][:2]})
    response = _rehearse(manager, broken, {"version": "draft", "replies": []}, token)
    assert response.status_code == 422 and response.get_json()["issues"]
