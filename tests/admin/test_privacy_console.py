"""Issue 9, points 11 and 13 in the console: an owner erases a contact after a confirmation page
(managers and agents cannot), an editor records an opt-out the patient told the clinic, anyone
signed in downloads the consent evidence; the details page shows the address refusals and the
other contacts on the same phone. Another org's contacts answer 404."""

from __future__ import annotations

import json

from sqlalchemy import select

from engine.store.models import address_optouts, audit_log, contacts, messages, preferences
from tests.admin.conftest import csrf, login


def _contact(rt, contact_id: int):
    with rt.db.connect() as conn:
        return conn.execute(select(contacts).where(contacts.c.id == contact_id)).one()


def test_only_an_owner_erases_and_only_after_confirming(app, owner, rt, tenants):
    a, b = tenants
    page = owner.get(f"/admin/contacts/erase/{a.contact_id}/")
    assert page.status_code == 200
    assert "Não dá para desfazer" in page.text and "Paciente Da A" in page.text
    for role in ("manager", "agent"):
        other = login(app.test_client(), f"{role}@a.com.br")
        assert other.get(f"/admin/contacts/erase/{a.contact_id}/").status_code == 403
        token = csrf(other.get(f"/admin/contacts/details/?id={a.contact_id}").text)
        assert other.post(f"/admin/contacts/erase/{a.contact_id}/",
                          data={"csrf_token": token, "confirm": "yes"}).status_code == 403
    assert owner.get(f"/admin/contacts/erase/{b.contact_id}/").status_code == 404  # another org's

    unconfirmed = owner.post(f"/admin/contacts/erase/{a.contact_id}/", data={"csrf_token": csrf(page.text)})
    assert unconfirmed.status_code == 200 and _contact(rt, a.contact_id).erased_at is None
    done = owner.post(f"/admin/contacts/erase/{a.contact_id}/",
                      data={"csrf_token": csrf(page.text), "confirm": "yes"}, follow_redirects=True)
    assert done.status_code == 200 and "Paciente apagado" in done.text
    row = _contact(rt, a.contact_id)
    assert row.erased_at is not None and row.name is None and row.erased_by.startswith("user:")
    assert "Paciente Da A" not in owner.get("/admin/contacts/").text
    assert owner.get(f"/admin/contacts/erase/{a.contact_id}/").status_code == 404
    with rt.db.connect() as conn:
        statuses = conn.execute(select(messages.c.status, messages.c.body).where(
            messages.c.contact_id == a.contact_id)).all()
        entry = conn.execute(select(audit_log).where(audit_log.c.action == "erase")).one()
    assert statuses and all(s.status == "cancelled" and s.body is None for s in statuses)
    assert entry.entity_id == a.contact_id and "Paciente" not in json.dumps(entry.changes)
    assert _contact(rt, b.contact_id).name == "Paciente Só Da B"


def test_an_editor_records_an_opt_out_that_follows_the_address(app, owner, rt, tenants):
    a, b = tenants
    details = owner.get(f"/admin/contacts/details/?id={a.contact_id}")
    assert details.status_code == 200 and "Apagar dados do paciente" in details.text
    agent = login(app.test_client(), "agent@a.com.br")
    agent_page = agent.get(f"/admin/contacts/details/?id={a.contact_id}")
    assert "Apagar dados do paciente" not in agent_page.text and "Registrar descadastro" not in agent_page.text
    assert agent.post(f"/admin/contacts/optout/{a.contact_id}/",
                      data={"csrf_token": csrf(agent_page.text)}).status_code == 403
    manager = login(app.test_client(), "manager@a.com.br")
    page = manager.get(f"/admin/contacts/details/?id={a.contact_id}")
    assert manager.post(f"/admin/contacts/optout/{b.contact_id}/", data={"csrf_token": csrf(page.text)}).status_code == 404
    response = manager.post(f"/admin/contacts/optout/{a.contact_id}/", data={"csrf_token": csrf(page.text)},
                            follow_redirects=True)
    assert response.status_code == 200 and "Descadastro registrado" in response.text
    with rt.db.connect() as conn:
        refused = conn.execute(select(preferences.c.kind).where(preferences.c.contact_id == a.contact_id,
                                                                preferences.c.opted_out_at.is_not(None))).scalars().all()
        blocked = conn.execute(select(address_optouts.c.org_id, address_optouts.c.source).distinct()).all()
    assert sorted(refused) == ["email", "sms", "whatsapp"]
    assert [tuple(r) for r in blocked] == [(a.world.org_id, "console")]
    # A second contact on the same phone: its details say the phone refused, and who shares it.
    twin = a.world.contact(name="Irmã Da A", email=None)
    shown = owner.get(f"/admin/contacts/details/?id={twin}").text
    assert "Recusas do telefone ou e-mail" in shown and "Paciente Da A" in shown


def test_the_consent_evidence_downloads_as_json_in_the_users_org_only(owner, rt, tenants):
    a, b = tenants
    response = owner.get(f"/admin/contacts/consent/{a.contact_id}/")
    assert response.status_code == 200 and response.headers["Cache-Control"] == "no-store"
    assert "attachment" in response.headers["Content-Disposition"]
    document = json.loads(response.data)
    assert document["contact"]["id"] == a.contact_id
    assert {c["channel_kind"]: c["status"] for c in document["consent"]}["whatsapp"] == "agreed"
    assert owner.get(f"/admin/contacts/consent/{b.contact_id}/").status_code == 404
