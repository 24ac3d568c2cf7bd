"""Pendências: the operator's inbox lists what engine code opened (open ones first), links to what
each item is about, lets every role — agents included — resolve, and never shows another org's."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from sqlalchemy import select, update

from engine import clock as engine_clock
from engine.inbox import open_inbox_item
from engine.models import audit_log, inbox_items, users
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


def test_the_inbox_lists_open_items_first_with_labels_and_links(owner, rt, tenants, clock):
    a, _ = tenants
    ids = _items(rt, tenants, clock)
    page = owner.get("/admin/inbox/").text
    # Open first (newest first), then the resolved one.
    order = [page.index(marker) for marker in ("channel stopped working", "the patient cancelled",
                                               "gave up after 6 attempts", "old-marker")]
    assert order == sorted(order)
    for label in ("Canal com problema", "Cancelado pelo paciente", "Mensagem não enviada", "Envio incerto",
                  "Aberta", "Resolvida"):
        assert label in page, label
    assert f'href="/admin/queue/details/?id={a.message_id}"' in page
    assert f'href="/admin/appointments/details/?id={a.appointment_id}"' in page
    assert f'href="/admin/channels/details/?id={a.channel_id}"' in page and "Canal clinica-a" in page
    assert "Pendências (3)" in page  # the menu counts the org's open items (B's is not one of them)

    details = owner.get(f"/admin/inbox/details/?id={ids['cancel']}").text
    assert "O que fazer" in details and "Libere o horário" in details and "Resolver" in details


def test_the_state_filter_splits_open_and_resolved(owner, rt, tenants, clock):
    _items(rt, tenants, clock)
    opened = owner.get("/admin/inbox/?flt0_0=open").text
    resolved = owner.get("/admin/inbox/?flt0_0=resolved").text
    assert "old-marker" not in opened and "channel stopped working" in opened
    assert "old-marker" in resolved and "channel stopped working" not in resolved


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
        assert "b-only-marker" not in owner.get(url).get_data(as_text=True), url


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
