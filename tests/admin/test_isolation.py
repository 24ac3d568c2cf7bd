"""Two-tenant isolation for every console view: org A's user never sees or touches org B's rows
(lists, filters, details, edits, deletes, actions, CSV exports), and no credential is ever shown."""

from __future__ import annotations

from sqlalchemy import select

from engine.store.models import appointments, messages, templates
from tests.admin.conftest import SECRET, csrf

VIEWS = {
    # endpoint: attribute of Tenant holding an id of that view
    "appointments": "appointment_id",
    "contacts": "contact_id",
    "rules": "rule_id",
    "templates": "template_id",
    "channels": "channel_id",
    "queue": "message_id",
    "logs": None,
    "audit": "audit_id",
    # The Tenant fixture has no keys, users of B or inbox items; their 404s and B rows are in
    # test_access.py and test_inbox.py. Here: lists and exports answer and leak nothing.
    "apikeys": None,
    "users": None,
    "inbox": None,
}
B_MARKERS = ("Paciente Só Da B", "Canal clinica-b", "Modelo da clinica-b", "audit-clinica-b")


def _pages(client):
    for endpoint in VIEWS:
        yield f"/admin/{endpoint}/"
        yield f"/admin/{endpoint}/export/csv/"
    yield "/admin/"


def test_lists_exports_and_dashboard_never_show_the_other_org(owner, tenants):
    for url in _pages(owner):
        response = owner.get(url)
        assert response.status_code == 200, url
        text = response.get_data(as_text=True)
        for marker in B_MARKERS:
            assert marker not in text, (url, marker)
        assert SECRET not in text, url
    assert "Paciente Da A" in owner.get("/admin/contacts/").text
    assert "Canal clinica-a" in owner.get("/admin/channels/").text


def test_other_orgs_ids_answer_404_in_every_view(owner, tenants):
    _, b = tenants
    token = csrf(owner.get("/admin/contacts/").text)
    for endpoint, attr in VIEWS.items():
        if not attr:
            continue
        other = getattr(b, attr)
        assert owner.get(f"/admin/{endpoint}/details/?id={other}").status_code == 404, endpoint
        assert owner.get(f"/admin/{endpoint}/edit/?id={other}").status_code in (404, 302), endpoint
        edit = owner.post(f"/admin/{endpoint}/edit/?id={other}", data={"csrf_token": token, "name": "hijack"})
        assert edit.status_code in (404, 302), endpoint
        delete = owner.post(f"/admin/{endpoint}/delete/", data={"csrf_token": token, "id": other})
        assert delete.status_code in (404, 302), endpoint
        assert "hijack" not in owner.get(f"/admin/{endpoint}/").text
    assert owner.get("/admin/logs/details/?id=999999").status_code == 404
    assert owner.get("/admin/contacts/details/?id=abc").status_code == 404


def test_filters_with_the_other_orgs_values_find_nothing(owner, tenants):
    a, b = tenants
    logs = owner.get("/admin/logs/")
    assert "Canal clinica-b" not in logs.text  # the channel filter's options are the org's own
    for url in (f"/admin/queue/?flt0_0={'pending'}", "/admin/appointments/?search=Dra",
                "/admin/contacts/?search=Paciente", "/admin/contacts/export/csv/?search=Paciente"):
        text = owner.get(url).get_data(as_text=True)
        assert "Paciente Só Da B" not in text, url


def test_actions_on_the_other_orgs_ids_change_nothing(rt, owner, tenants):
    a, b = tenants
    page = owner.get("/admin/queue/")
    token = csrf(page.text)
    owner.post("/admin/queue/action/", data={"csrf_token": token, "action": "cancel", "rowid": [b.message_id]})
    owner.post("/admin/appointments/action/", data={"csrf_token": token, "action": "cancel", "rowid": [b.appointment_id]})
    owner.post(f"/admin/channels/test/{b.channel_id}/", data={"csrf_token": token, "to": "+5516999887766"})
    with rt.db.connect() as conn:
        status = conn.execute(select(messages.c.status).where(messages.c.id == b.message_id)).scalar_one()
        appt = conn.execute(select(appointments.c.status).where(appointments.c.id == b.appointment_id)).scalar_one()
    assert status == "pending" and appt == "scheduled"
    assert owner.post(f"/admin/channels/test/{b.channel_id}/", data={"csrf_token": token, "to": "x"}).status_code == 404


def test_a_global_default_template_can_be_read_not_edited(owner, rt, tenants):
    with rt.db.connect() as conn:
        default_id = conn.execute(select(templates.c.id).where(templates.c.org_id.is_(None))).first()[0]
    listing = owner.get("/admin/templates/").text
    assert "Padrão" in listing and "Modelo da clinica-a" in listing
    assert owner.get(f"/admin/templates/details/?id={default_id}").status_code == 200
    assert owner.get(f"/admin/templates/edit/?id={default_id}").status_code == 404
    token = csrf(owner.get("/admin/templates/").text)
    assert owner.post("/admin/templates/delete/", data={"csrf_token": token, "id": default_id}).status_code == 404
    owner.post("/admin/templates/action/", data={"csrf_token": token, "action": "delete", "rowid": [default_id]})
    with rt.db.connect() as conn:
        assert conn.execute(select(templates.c.id).where(templates.c.id == default_id)).first() is not None


def test_credentials_never_in_any_page(owner, tenants):
    a, _ = tenants
    for url in (f"/admin/channels/details/?id={a.channel_id}", f"/admin/channels/edit/?id={a.channel_id}",
                "/admin/channels/new/", "/admin/audit/", "/admin/audit/export/csv/"):
        response = owner.get(url)
        assert response.status_code == 200, url
        assert SECRET not in response.get_data(as_text=True), url
