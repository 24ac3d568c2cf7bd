"""Pendências: the operator's inbox lists what engine code opened (open ones first), links to what
each item is about, lets every role — agents included — resolve, and never shows another org's."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from sqlalchemy import select, update

from engine.core import clock as engine_clock
from engine.queue.inbox import open_inbox_item
from engine.store.models import audit_log, inbox_items, users
from tests.admin.conftest import csrf


def _open(rt, tenant, kind: str, key: str, detail: str, **refs) -> int:
    with rt.db.begin() as conn:
        open_inbox_item(conn, tenant.world.org_id, kind, key, detail=detail, **refs)
        return conn.execute(select(inbox_items.c.id).where(inbox_items.c.org_id == tenant.world.org_id,
                                                           inbox_items.c.dedupe_key == key)).scalar_one()


def _items(rt, tenants, clock):
    """A: a resolved item (oldest), then three open ones; B: one open item."""
    a, b = tenants
    old = _open(rt, a, "message_unknown", "old", "outcome unknown: old-marker", message_id=a.message_id)
    with rt.db.begin() as conn:
        conn.execute(update(inbox_items).where(inbox_items.c.id == old).values(resolved_at=engine_clock.now()))
    clock.advance(timedelta(minutes=5))
    dead = _open(rt, a, "message_dead", f"message:{a.message_id}:dead", "gave up after 6 attempts (last error: x)",
                 message_id=a.message_id)
    clock.advance(timedelta(minutes=5))
    cancel = _open(rt, a, "appointment_cancelled_by_patient", "appt", "the patient cancelled",
                   appointment_id=a.appointment_id)
    clock.advance(timedelta(minutes=5))
    broken = _open(rt, a, "channel_broken", "chan", "channel stopped working (auth)", channel_id=a.channel_id)
    other = _open(rt, b, "channel_broken", "chan-b", "b-only-marker", channel_id=b.channel_id)
    return {"old": old, "dead": dead, "cancel": cancel, "broken": broken, "other": other}


def _rows(page: str) -> str:
    """The list's table body (the labels also appear in filters and menus)."""
    start = page.index("model-list")
    return page[start:page.index("</table>", start)]


def test_the_inbox_lists_open_items_first_with_labels_and_links(owner, rt, tenants, clock):
    a, _ = tenants
    ids = _items(rt, tenants, clock)
    page = owner.get("/admin/inbox/").text
    rows = _rows(page)
    # Open first (newest first), then the resolved one.
    order = [rows.index(label) for label in ("Canal com problema", "Cancelado pelo paciente",
                                             "Mensagem não enviada", "Envio incerto")]
    assert order == sorted(order)
    assert "Aberta" in rows and "Resolvida" in rows
    # Links named by the patient and the time, not "Agendamento #2".
    assert f'href="/admin/queue/details/?id={a.message_id}"' in rows and "Paciente Da A" in rows
    assert f'href="/admin/appointments/details/?id={a.appointment_id}"' in rows
    assert "Agendamento #" not in rows and "Mensagem #" not in rows
    assert f'href="/admin/channels/details/?id={a.channel_id}"' in rows and "Canal clinica-a" in rows
    # What happened is a sentence, never the engine's technical note.
    assert "O Lembra tentou" in rows
    for note in ("gave up after", "channel stopped working", "the patient cancelled", "old-marker"):
        assert note not in page, note
    assert "Pendências (3)" in page  # the menu counts the org's open items (B's is not one of them)

    details = owner.get(f"/admin/inbox/details/?id={ids['cancel']}").text
    assert "O que fazer" in details and "Libere o horário" in details and "Resolver" in details


def test_the_state_filter_splits_open_and_resolved(owner, rt, tenants, clock):
    _items(rt, tenants, clock)
    opened = _rows(owner.get("/admin/inbox/?flt0_0=open").text)
    resolved = _rows(owner.get("/admin/inbox/?flt0_0=resolved").text)
    assert "Envio incerto" not in opened and "Canal com problema" in opened
    assert "Envio incerto" in resolved and "Canal com problema" not in resolved


def test_an_agent_resolves_from_the_list_and_from_details(agent, rt, tenants, clock):
    ids = _items(rt, tenants, clock)
    token = csrf(agent.get("/admin/inbox/").text)
    assert "Resolver" in agent.get("/admin/inbox/").text
    clock.advance(timedelta(hours=1))
    response = agent.post("/admin/inbox/action/", data={"csrf_token": token, "action": "resolve",
                                                         "rowid": [ids["dead"], ids["cancel"], ids["old"]]})
    assert response.status_code == 302
    details = agent.get(f"/admin/inbox/details/?id={ids['broken']}").text
    assert agent.post(f"/admin/inbox/resolve/{ids['broken']}/", data={"csrf_token": csrf(details)}).status_code == 302

    with rt.db.connect() as conn:
        agent_id = conn.execute(select(users.c.id).where(users.c.email == "agent@a.com.br")).scalar_one()
        rows = {r.id: r for r in conn.execute(select(inbox_items))}
        audits = conn.execute(select(audit_log).where(audit_log.c.entity == "inbox_items")
                              .order_by(audit_log.c.id)).all()
    for key in ("dead", "cancel", "broken"):
        assert rows[ids[key]].resolved_at == engine_clock.now() and rows[ids[key]].resolved_by == agent_id, key
    assert rows[ids["old"]].resolved_by is None  # already resolved: left as it was
    assert [(a.action, a.entity_id, a.user_id) for a in audits] == [
        ("resolve", ids["dead"], agent_id), ("resolve", ids["cancel"], agent_id), ("resolve", ids["broken"], agent_id)]
    after = agent.get(f"/admin/inbox/details/?id={ids['broken']}").text
    assert "agent@a.com.br" in after and f"/admin/inbox/resolve/{ids['broken']}/" not in after
    assert "Pendências (" not in agent.get("/admin/inbox/").text  # nothing open any more


def test_an_empty_inbox_says_so(owner, tenants):
    page = owner.get("/admin/inbox/").text
    assert "Nada pendente." in page and "Pendências (" not in page


def test_the_other_orgs_items_answer_404_and_never_show(owner, rt, tenants, clock):
    ids = _items(rt, tenants, clock)
    other = ids["other"]
    token = csrf(owner.get("/admin/inbox/").text)
    assert owner.get(f"/admin/inbox/details/?id={other}").status_code == 404
    assert owner.post(f"/admin/inbox/resolve/{other}/", data={"csrf_token": token}).status_code == 404
    owner.post("/admin/inbox/action/", data={"csrf_token": token, "action": "resolve", "rowid": [other]})
    assert owner.get(f"/admin/inbox/edit/?id={other}").status_code in (302, 404)
    with rt.db.connect() as conn:
        assert conn.execute(select(inbox_items.c.resolved_at).where(inbox_items.c.id == other)).scalar_one() is None
    for url in ("/admin/inbox/", "/admin/inbox/?flt0_0=open", "/admin/inbox/export/csv/"):
        body = owner.get(url).get_data(as_text=True)
        assert "b-only-marker" not in body and "Canal clinica-b" not in body, url


def test_the_export_has_codes_and_no_markup(owner, rt, tenants, clock):
    a, _ = tenants
    _items(rt, tenants, clock)
    rows = list(csv.reader(io.StringIO(owner.get("/admin/inbox/export/csv/").get_data(as_text=True))))
    assert len(rows) == 1 + 4
    kinds = {row[0] for row in rows[1:]}
    assert kinds == {"message_unknown", "message_dead", "appointment_cancelled_by_patient", "channel_broken"}
    assert any(f"channel:{a.channel_id}" in cell for row in rows for cell in row)
    assert not any("<a " in cell for row in rows for cell in row)


def test_resolving_without_a_csrf_token_is_refused(owner, rt, tenants, clock):
    ids = _items(rt, tenants, clock)
    assert owner.post(f"/admin/inbox/resolve/{ids['dead']}/").status_code == 400
    assert owner.post("/admin/inbox/action/", data={"action": "resolve", "rowid": [ids["dead"]]}).status_code == 400
    with rt.db.connect() as conn:
        dead = conn.execute(select(inbox_items.c.resolved_at).where(inbox_items.c.id == ids["dead"])).scalar_one()
    assert dead is None


def test_a_problem_that_comes_back_after_being_resolved_opens_a_new_item(owner, rt, tenants, clock):
    a, _ = tenants
    first = _open(rt, a, "channel_broken", f"channel:{a.channel_id}:broken", "broken", channel_id=a.channel_id)
    with rt.db.begin() as conn:  # while it is open, the same problem is one item, not many
        open_inbox_item(conn, a.world.org_id, "channel_broken", f"channel:{a.channel_id}:broken", detail="again",
                        channel_id=a.channel_id)
    token = csrf(owner.get("/admin/inbox/").text)
    owner.post(f"/admin/inbox/resolve/{first}/", data={"csrf_token": token})
    second = _open(rt, a, "channel_broken", f"channel:{a.channel_id}:broken", "broken again", channel_id=a.channel_id)
    assert second != first
    with rt.db.connect() as conn:
        rows = conn.execute(select(inbox_items.c.id, inbox_items.c.resolved_at).where(
            inbox_items.c.org_id == a.world.org_id, inbox_items.c.kind == "channel_broken")
            .order_by(inbox_items.c.id)).all()
    assert [(r.id, r.resolved_at is None) for r in rows] == [(first, False), (second, True)]


def test_a_message_refused_for_good_is_in_pendencias_with_its_reason(owner, rt, tenants, clock):
    """Issue 11, finding 4: a permanent failure (a wrong number, a refused template) needs a person."""
    from engine.messaging import dispatch
    from tests.test_dispatch import simulate

    a, b = tenants
    for tenant in (a, b):
        simulate(rt, tenant.channel_id, "permanent")
    clock.advance(timedelta(hours=4))  # the 2 h reminders of both orgs are due
    for message_id in dispatch.claim_due(rt, limit=10):
        assert dispatch.send_one(rt, message_id) == "failed"
    with rt.db.connect() as conn:
        items = conn.execute(select(inbox_items.c.org_id, inbox_items.c.kind, inbox_items.c.message_id)
                             .order_by(inbox_items.c.org_id)).all()
    assert [(i.org_id, i.kind, i.message_id) for i in items] == [
        (a.world.org_id, "message_failed", a.message_id), (b.world.org_id, "message_failed", b.message_id)]

    page = owner.get("/admin/inbox/").text
    rows = _rows(page)
    assert "Mensagem recusada" in rows and "Paciente Da A" in rows and "Pendências (1)" in page
    assert "sandbox_permanent" not in page and "Paciente Só Da B" not in page
    [item_id] = _ids(rt, a)
    details = owner.get(f"/admin/inbox/details/?id={item_id}").text
    assert "reenvie pela Fila" in details


def _ids(rt, tenant) -> list[int]:
    with rt.db.connect() as conn:
        return list(conn.execute(select(inbox_items.c.id).where(inbox_items.c.org_id == tenant.world.org_id))
                    .scalars())


def test_pendencias_says_how_many_replies_wait_in_conversas(owner, rt, tenants, clock):
    import json

    from engine.messaging.inbound import process_inbound, receive
    from gateway.contract import WebhookRequest
    from tests.factories import sandbox_headers

    a, b = tenants
    assert "Abrir Conversas" not in owner.get("/admin/inbox/").text
    for tenant, text in ((a, "Oi, posso remarcar para sexta?"), (b, "Mensagem da B")):
        body = json.dumps({"type": "message", "id": f"in-{tenant.world.org_id}", "from": "+5516999887766",
                           "timestamp": engine_clock.now().timestamp(), "text": text}).encode()
        received = receive(rt, "sandbox", tenant.channel_id, WebhookRequest(
            method="POST", url="/webhooks/sandbox", headers=sandbox_headers(rt, tenant.channel_id), body=body))
        for inbound_id in received.inbound_ids:
            process_inbound(rt, inbound_id)
    page = owner.get("/admin/inbox/").text
    assert "1 resposta de paciente espera alguém da equipe." in page
    assert 'href="/admin/conversations/"' in page
