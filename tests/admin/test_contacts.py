"""Contacts in the console: created with consent, edited without touching consent, bad input
refused with the reason in the form and nothing written."""

from __future__ import annotations

from sqlalchemy import func, select

from engine.store.models import audit_log, contacts, preferences
from tests.admin.conftest import csrf


def _create(owner, **fields):
    page = owner.get("/admin/contacts/new/")
    data = {"csrf_token": csrf(page.text), "name": "Ana Souza", "phone": "(16) 99988-7766",
            "email": "Ana@Example.com.br", "external_id": "", "locale": "", "consent": ["whatsapp", "email"],
            "consent_method": "reception_verbal"}
    data.update(fields)
    return owner.post("/admin/contacts/new/", data=data, follow_redirects=True)


def _count(rt, org_id: int) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(contacts).where(contacts.c.org_id == org_id)).scalar()


def test_a_contact_with_an_email_is_created_with_its_consent(owner, rt, tenants):
    a, _ = tenants
    response = _create(owner)
    assert response.status_code == 200
    with rt.db.connect() as conn:
        row = conn.execute(select(contacts).where(contacts.c.org_id == a.world.org_id,
                                                  contacts.c.name == "Ana Souza")).one()
        kinds = conn.execute(select(preferences.c.kind).where(preferences.c.contact_id == row.id,
                                                              preferences.c.opted_in.is_(True))).scalars().all()
        sources = set(conn.execute(select(preferences.c.source).where(preferences.c.contact_id == row.id)).scalars())
        audit = conn.execute(select(audit_log.c.changes).where(audit_log.c.entity == "contacts",
                                                               audit_log.c.entity_id == row.id)).scalar_one()
    assert row.email == "ana@example.com.br" and row.phone == "+5516999887766"
    assert sorted(kinds) == ["email", "whatsapp"] and sources == {"reception_verbal"}  # how it was given
    assert "ana@example.com.br" not in str(audit) and "99988" not in str(audit)  # no PII in the audit log


def test_a_bad_email_or_phone_is_refused_in_the_form_and_nothing_is_written(owner, rt, tenants):
    a, _ = tenants
    before = _count(rt, a.world.org_id)
    bad_email = _create(owner, email="ana-at-example")
    assert "E-mail inválido." in bad_email.text
    bad_phone = _create(owner, phone="12")
    assert "Telefone inválido." in bad_phone.text
    assert _count(rt, a.world.org_id) == before


def test_editing_a_contact_changes_its_email_and_audits_without_pii(owner, rt, tenants):
    a, _ = tenants
    page = owner.get(f"/admin/contacts/edit/?id={a.contact_id}")
    assert page.status_code == 200 and "Consentiu receber por" not in page.text  # consent comes from the patient
    response = owner.post(f"/admin/contacts/edit/?id={a.contact_id}", data={
        "csrf_token": csrf(page.text), "name": "Paciente Da A", "phone": "", "email": "nova@example.com.br",
        "external_id": "", "locale": ""}, follow_redirects=True)
    assert response.status_code == 200
    with rt.db.connect() as conn:
        assert conn.execute(select(contacts.c.email).where(contacts.c.id == a.contact_id)).scalar() == \
            "nova@example.com.br"
        changes = conn.execute(select(audit_log.c.changes).where(audit_log.c.entity == "contacts",
                                                                 audit_log.c.entity_id == a.contact_id)
                               .order_by(audit_log.c.id.desc())).first()[0]
    assert "nova@example.com.br" not in str(changes)
