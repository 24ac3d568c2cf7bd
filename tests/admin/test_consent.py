"""Consent is a deliberate act with its evidence (issue "The console a receptionist would
choose", finding 9): a new contact starts with nothing ticked; ticking a channel asks how the
patient agreed, and who (the signed-in user) and when (now) are recorded with it, on the form and
on the contact's page; the API and the CSV import keep saying where consent came from."""

from __future__ import annotations

import re

from sqlalchemy import func, select

from engine.core import clock as engine_clock
from engine.people.contacts import opt_out
from engine.people.imports import EVIDENCE, import_appointments
from engine.store.models import audit_log, contacts, preferences, users
from engine.privacy import consent
from tests.admin.conftest import csrf
from tests.api.conftest import api_for

NEW = {"name": "Bia Lima", "phone": "(16) 98888-1111", "email": "", "external_id": "", "locale": ""}


def _new(owner, **fields):
    page = owner.get("/admin/contacts/new/")
    return owner.post("/admin/contacts/new/", data={"csrf_token": csrf(page.text), **NEW, **fields},
                      follow_redirects=True)


def _contact(rt, org_id: int, name: str = "Bia Lima"):
    with rt.db.connect() as conn:
        return conn.execute(select(contacts).where(contacts.c.org_id == org_id, contacts.c.name == name)).one_or_none()


def _prefs(rt, contact_id: int) -> dict:
    with rt.db.connect() as conn:
        return {p.kind: p for p in conn.execute(select(preferences).where(preferences.c.contact_id == contact_id))}


def _user_id(rt, email: str) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(users.c.id).where(users.c.email == email)).scalar_one()


def test_nothing_is_ticked_on_a_new_contact(owner, tenants):
    page = owner.get("/admin/contacts/new/").text
    boxes = re.findall(r'<input[^>]*name="consent"[^>]*>', page)
    assert len(boxes) == 3 and not [b for b in boxes if "checked" in b]
    assert "Como o paciente consentiu" in page and "verbal na recepção" in page


def test_a_contact_saved_without_ticking_has_no_consent(owner, rt, tenants):
    a, _ = tenants
    _new(owner)
    row = _contact(rt, a.world.org_id)
    assert row is not None
    assert not any(p.opted_in for p in _prefs(rt, row.id).values())


def test_consent_without_saying_how_is_refused_and_nothing_is_written(owner, rt, tenants):
    a, _ = tenants
    response = _new(owner, consent=["whatsapp"], consent_method="")
    assert "Diga como o paciente consentiu" in response.text
    assert _contact(rt, a.world.org_id) is None
    response = _new(owner, consent=["whatsapp"], consent_method="carrier_pigeon")
    assert "Diga como o paciente consentiu" in response.text and _contact(rt, a.world.org_id) is None


def test_ticked_consent_records_how_who_and_when(owner, rt, tenants, clock):
    a, _ = tenants
    _new(owner, consent=["whatsapp", "sms"], consent_method="signed_form")
    row = _contact(rt, a.world.org_id)
    prefs = _prefs(rt, row.id)
    uid = _user_id(rt, "owner@a.com.br")
    assert sorted(k for k, p in prefs.items() if p.opted_in) == ["sms", "whatsapp"]
    for kind in ("sms", "whatsapp"):
        assert prefs[kind].source == "signed_form" and prefs[kind].evidence == f"user:{uid}"
        assert prefs[kind].opted_in_at == engine_clock.now()
    with rt.db.connect() as conn:
        document = consent.evidence(conn, a.world.org_id, row.id)
        audit = conn.execute(select(audit_log.c.changes, audit_log.c.user_id).where(
            audit_log.c.entity == "contacts", audit_log.c.entity_id == row.id)).one()
    agreed = {c["channel_kind"]: c for c in document["consent"]}
    assert agreed["whatsapp"]["status"] == "agreed" and agreed["whatsapp"]["source"] == "signed_form"
    assert agreed["whatsapp"]["evidence"] == f"user:{uid}" and agreed["email"]["status"] == "never_asked"
    assert audit.user_id == uid and audit.changes["consent_method"] == "signed_form"
    details = owner.get(f"/admin/contacts/details/?id={row.id}").text
    assert "formulário assinado" in details and "owner@a.com.br" in details  # how and who, in words


# --- recording consent later, on the contact's page --------------------------------------------------
def _record(client, contact_id: int, **data):
    page = client.get(f"/admin/contacts/details/?id={contact_id}")
    token = csrf(page.text) if page.status_code == 200 else "x"
    return client.post(f"/admin/contacts/consent/{contact_id}/record/", data={"csrf_token": token, **data},
                       follow_redirects=True)


def test_consent_recorded_on_the_contacts_page_keeps_its_evidence(owner, rt, tenants):
    a, _ = tenants
    _new(owner)
    row = _contact(rt, a.world.org_id)
    page = owner.get(f"/admin/contacts/details/?id={row.id}").text
    assert 'id="lembra-consent-whatsapp"' in page and "Registrar consentimento" in page
    response = _record(owner, row.id, kinds=["whatsapp"], method="reception_verbal")
    assert "Consentimento registrado: WhatsApp." in response.text
    pref = _prefs(rt, row.id)["whatsapp"]
    assert pref.opted_in and pref.source == "reception_verbal"
    assert pref.evidence == f"user:{_user_id(rt, 'owner@a.com.br')}"
    with rt.db.connect() as conn:
        assert conn.execute(select(audit_log.c.changes).where(
            audit_log.c.action == "consent", audit_log.c.entity_id == row.id)).scalar_one() == {
            "consent": ["whatsapp"], "consent_method": "reception_verbal"}


def test_recording_consent_needs_a_channel_a_method_and_the_token(owner, rt, tenants):
    a, _ = tenants
    _new(owner)
    row = _contact(rt, a.world.org_id)
    assert "Marque ao menos um canal" in _record(owner, row.id, method="signed_form").text
    assert "Diga como o paciente consentiu" in _record(owner, row.id, kinds=["sms"], method="").text
    assert "Diga como o paciente consentiu" in _record(owner, row.id, kinds=["sms"], method="telepathy").text
    no_token = owner.post(f"/admin/contacts/consent/{row.id}/record/", data={"kinds": ["sms"], "method": "signed_form"})
    assert no_token.status_code == 400
    assert not any(p.opted_in for p in _prefs(rt, row.id).values())


def test_a_refusal_is_never_reopened_by_the_clinic(owner, rt, tenants):
    a, _ = tenants
    with rt.db.begin() as conn:
        opt_out(conn, a.world.org_id, a.contact_id, kinds=("whatsapp",), source="patient")
    page = owner.get(f"/admin/contacts/details/?id={a.contact_id}").text
    assert 'id="lembra-consent-whatsapp"' not in page and "não pode reativar" in page
    response = _record(owner, a.contact_id, kinds=["whatsapp"], method="reception_verbal")
    assert "não pode reativá-lo" in response.text
    assert _prefs(rt, a.contact_id)["whatsapp"].opted_out_at is not None


def test_another_orgs_contact_and_an_agent_are_refused(owner, agent, rt, tenants):
    a, b = tenants
    before = _prefs(rt, b.contact_id)
    token = csrf(owner.get(f"/admin/contacts/details/?id={a.contact_id}").text)
    assert owner.post(f"/admin/contacts/consent/{b.contact_id}/record/",
                      data={"csrf_token": token, "kinds": ["sms"], "method": "signed_form"}).status_code == 404
    token = csrf(agent.get(f"/admin/contacts/details/?id={a.contact_id}").text)
    assert agent.post(f"/admin/contacts/consent/{a.contact_id}/record/",
                      data={"csrf_token": token, "kinds": ["sms"], "method": "signed_form"}).status_code == 403
    assert {k: (p.opted_in, p.source) for k, p in _prefs(rt, b.contact_id).items()} == \
        {k: (p.opted_in, p.source) for k, p in before.items()}


# --- the API and the CSV import say where consent came from ------------------------------------------
def test_the_api_and_the_csv_import_keep_the_source_of_consent(app, rt, tenants, clock):
    a, _ = tenants
    api = api_for(rt, app.test_client(), a.world)
    created = api.post("/contacts", {"external_id": "API-1", "name": "Pela API", "phone": "16977776666",
                                     "consent": ["whatsapp"]})
    assert created.status_code in (200, 201), created.get_json()
    header = "external_id;contact_external_id;contact_name;phone;email;starts_at;professional;mode;location;status;consent"
    import_appointments(rt.db, a.world.org_id, f"{header}\nAG-9;CSV-1;Pelo CSV;16955554444;;03/12/2026 14:00;;;;;sms")
    with rt.db.connect() as conn:
        by_api = conn.execute(select(contacts.c.id).where(contacts.c.external_id == "API-1")).scalar_one()
        by_csv = conn.execute(select(contacts.c.id).where(contacts.c.external_id == "CSV-1")).scalar_one()
        api_doc = {c["channel_kind"]: c for c in consent.evidence(conn, a.world.org_id, by_api)["consent"]}
        csv_doc = {c["channel_kind"]: c for c in consent.evidence(conn, a.world.org_id, by_csv)["consent"]}
        assert conn.execute(select(func.count()).select_from(preferences).where(
            preferences.c.contact_id == by_api, preferences.c.opted_in.is_(True))).scalar() == 1
    assert api_doc["whatsapp"]["status"] == "agreed" and api_doc["whatsapp"]["source"] == "api"
    assert csv_doc["sms"]["status"] == "agreed" and csv_doc["sms"]["source"] == "clinic"
    assert csv_doc["sms"]["evidence"] == EVIDENCE
    owner_page = app.test_client()
    from tests.admin.conftest import login

    login(owner_page, "owner@a.com.br")
    assert "pela API" in owner_page.get(f"/admin/contacts/details/?id={by_api}").text
    assert "importação CSV" in owner_page.get(f"/admin/contacts/details/?id={by_csv}").text
