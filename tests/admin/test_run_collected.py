"""Execuções shows what a run's conversation collected, each value under its field's label and in
the clinic's words; another org's run is not shown."""

from __future__ import annotations

import html

from sqlalchemy import update

from engine.flows.conversation.fields import create_field
from engine.store.models import enrollments
from tests.flows.helpers import Flows, linear, node


def test_a_runs_page_shows_the_values_its_conversation_collected(rt, tenants, owner):
    a, b = tenants
    with rt.db.begin() as conn:
        create_field(conn, a.world.org_id, {"slug": "data", "label": "Dia preferido", "type": "date",
                                            "question": "Qual dia?"})
        create_field(conn, a.world.org_id, {"slug": "periodo", "label": "Período", "type": "period",
                                            "question": "Manhã ou tarde?"})
    flows = Flows(a.world)
    graph = linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                   node("fim", "end", outcome="converted"))
    run = flows.enroll(flows.flow(graph), a.contact_id)
    with rt.db.begin() as conn:
        conn.execute(update(enrollments).where(enrollments.c.id == run)
                     .values(data={"data": "2026-12-11", "periodo": "morning"}))
    page = html.unescape(owner.get(f"/admin/followup_runs/?enrollment={run}").get_data(as_text=True))
    assert "Dados coletados" in page
    assert "Dia preferido: <strong>11/12/2026</strong>" in page and "Período: <strong>de manhã</strong>" in page
    other = Flows(b.world)
    theirs = other.enroll(other.flow(graph), b.contact_id)
    assert owner.get(f"/admin/followup_runs/?enrollment={theirs}").status_code == 404
