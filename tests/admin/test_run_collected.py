"""Execuções shows what a run's conversation collected, each value under its field's label and in
the clinic's words; another org's run is not shown."""

from __future__ import annotations

import html
import re

from datetime import UTC, datetime

from sqlalchemy import insert, update

from engine.flows.conversation.fields import create_field
from engine.store.models import enrollment_events, enrollments
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
                     .values(data={"data": "2026-12-11", "periodo": "morning",
                                   "slot": {"starts_at": "2026-12-11T12:30:00+00:00", "professional": "Dra. Beatriz",
                                            "professional_id": 1}}))
        # The engine writes a sentence's instants as ISO-8601; the page says them in the clinic's time.
        conn.execute(insert(enrollment_events).values(
            org_id=a.world.org_id, enrollment_id=run, node_id="espera", event_type="advanced",
            payload={"status": "ok", "reason": "do_slot_picked", "params": {"starts_at": "2026-12-11T12:30:00+00:00"}},
            idempotency_key=f"picked-{run}", created_at=datetime.now(UTC)))
    page = html.unescape(owner.get(f"/admin/followup_runs/?enrollment={run}").get_data(as_text=True))
    assert "Dados coletados" in page
    assert "Dia preferido: <strong>11/12/2026</strong>" in page and "Período: <strong>de manhã</strong>" in page
    # The picked time in the clinic's time, not the stored dict.
    assert "horário: <strong>11/12/2026 09:30 (Dra. Beatriz)</strong>" in page and "starts_at" not in page
    assert "O paciente escolheu o horário 11/12/2026 09:30." in page and "2026-12-11T12:30" not in page
    other = Flows(b.world)
    theirs = other.enroll(other.flow(graph), b.contact_id)
    assert owner.get(f"/admin/followup_runs/?enrollment={theirs}").status_code == 404


# --- the patient's replies, the fields taken from each and how the run ended (issue 33) --------------

def test_a_runs_page_shows_the_replies_it_read_the_fields_taken_and_its_end(rt, tenants, owner, agent, clock,
                                                                             caplog):
    import logging

    from tests.flows.helpers import conversation_fields, edge, turn

    a, b = tenants
    conversation_fields(rt, a.world.org_id,
                        {"slug": "data", "label": "Dia preferido", "type": "date", "question": "Qual dia?"},
                        {"slug": "periodo", "label": "Período", "type": "period", "question": "Manhã ou tarde?"})
    flows = Flows(a.world)
    graph = {"nodes": [node("inicio", "trigger"), node("pergunta", "ask", fields=["data", "periodo"], max_asks=3,
                                                       grace_minutes=60),
                       node("pronto", "end", outcome="converted"), node("desistiu", "end", outcome="exhausted"),
                       node("calado", "end", outcome="custom")],
             "edges": [edge("inicio", "pergunta"), edge("pergunta", "pronto", "complete"),
                       edge("pergunta", "desistiu", "gave_up"), edge("pergunta", "calado", "no_reply")]}
    flow = flows.flow(graph)
    run = flows.enroll(flow, a.contact_id)
    flows.run()
    live = html.unescape(owner.get(f"/admin/followup_runs/?enrollment={run}").get_data(as_text=True))
    assert "Respostas do paciente" not in live and "Etapa final" not in live
    turn(flows, clock, "pode ser de manhã")
    turn(flows, clock, "quinta à tarde")
    assert flows.enrollment(run).status == "completed"

    caplog.set_level(logging.DEBUG)
    page = html.unescape(owner.get(f"/admin/followup_runs/?enrollment={run}").get_data(as_text=True))
    replies = page.split('id="lembra-run-replies"')[1].split("</table>")[0]
    first, second = replies.split("<tbody>")[1].split("</tr>")[:2]
    assert "pode ser de manhã" in first and "Período: <strong>corrigido depois</strong>" in first
    assert "quinta à tarde" in second and "Período: <strong>à tarde</strong>" in second
    assert re.search(r"Dia preferido: <strong>\d\d/\d\d/\d{4}</strong>", second)
    assert re.search(r"Etapa final</dt><dd[^>]*>Fim \(pronto\)\s*· Resultado: <strong data-outcome>Convertido</strong>", page)
    assert "quinta à tarde" not in caplog.text, "a reply's text is never logged"
    assert "quinta à tarde" in agent.get(f"/admin/followup_runs/?enrollment={run}").get_data(as_text=True), \
        "every role of the clinic reads its runs"

    other = Flows(b.world)
    theirs = other.enroll(other.flow(linear(node("inicio", "trigger"), node("fim", "end", outcome="converted"))),
                          b.contact_id)
    assert owner.get(f"/admin/followup_runs/?enrollment={theirs}").status_code == 404
    assert owner.get("/admin/followup_runs/?enrollment=x1").status_code == 404
