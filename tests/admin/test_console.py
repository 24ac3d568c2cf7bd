"""What the console does: CSRF, roles, appointments that queue reminders at once, templates
validated and previewed, write-only credentials, queue actions through the outbox, audit rows,
formula-safe CSV."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from sqlalchemy import select

from engine import clock as engine_clock
from engine.models import appointments, audit_log, channels, message_events, messages, templates
from tests.admin.conftest import SECRET, csrf


def test_a_post_without_csrf_token_is_refused(owner, tenants, rt):
    a, _ = tenants
    refused = owner.post("/admin/contacts/new/", data={"name": "Sem token", "consent": "whatsapp"})
    assert refused.status_code == 400
    action = owner.post("/admin/queue/action/", data={"action": "cancel", "rowid": [a.message_id]})
    assert action.status_code == 400
    assert "Sem token" not in owner.get("/admin/contacts/").text


def test_agent_reads_but_cannot_change(agent, tenants, rt):
    a, _ = tenants
    assert agent.get("/admin/queue/").status_code == 200
    assert agent.get("/admin/appointments/").status_code == 200
    token = csrf(agent.get("/admin/queue/").text)
    agent.post(f"/admin/appointments/edit/?id={a.appointment_id}",
               data={"csrf_token": token, "contact_id": a.contact_id, "starts_at": "2026-12-10T10:00",
                     "status": "cancelled"})
    agent.post("/admin/queue/action/", data={"csrf_token": token, "action": "cancel", "rowid": [a.message_id]})
    assert agent.post(f"/admin/channels/test/{a.channel_id}/", data={"csrf_token": token, "to": "+5516999887766"}).status_code == 403
    assert "/admin/appointments/new/" not in agent.get("/admin/appointments/").text
    with rt.db.connect() as conn:
        assert conn.execute(select(appointments.c.status).where(appointments.c.id == a.appointment_id)).scalar_one() == "scheduled"
        assert conn.execute(select(messages.c.status).where(messages.c.id == a.message_id)).scalar_one() == "pending"


def test_login_required_redirects_to_login(app, tenants):
    response = app.test_client().get("/admin/contacts/")
    assert response.status_code == 302 and "/login" in response.headers["Location"]


def test_creating_an_appointment_queues_its_reminders_and_is_audited(owner, tenants, rt):
    a, _ = tenants
    token = csrf(owner.get("/admin/appointments/new/").text)
    starts = (engine_clock.now() + timedelta(days=2)).astimezone().strftime("%Y-%m-%dT%H:%M")
    response = owner.post("/admin/appointments/new/", data={
        "csrf_token": token, "contact_id": a.contact_id, "starts_at": "2026-12-03T15:00",
        "professional": "Dr. Console", "mode": "in_person", "location": "", "status": "scheduled", "external_id": "",
    })
    assert response.status_code == 302, response.text
    with rt.db.connect() as conn:
        appt = conn.execute(select(appointments).where(appointments.c.professional == "Dr. Console")).one()
        queued = conn.execute(select(messages).where(messages.c.appointment_id == appt.id)).all()
        audit = conn.execute(select(audit_log).where(audit_log.c.entity == "appointments",
                                                     audit_log.c.entity_id == appt.id)).one()
    assert appt.org_id == a.world.org_id
    assert appt.starts_at.isoformat().startswith("2026-12-03T18:00")  # 15:00 in São Paulo
    assert queued and queued[0].status in ("pending", "new")
    assert audit.action == "create" and audit.user_id is not None

    # cancelling from the console cancels the pending reminder at once
    token = csrf(owner.get("/admin/appointments/").text)
    owner.post("/admin/appointments/action/", data={"csrf_token": token, "action": "cancel", "rowid": [appt.id]})
    with rt.db.connect() as conn:
        statuses = conn.execute(select(messages.c.status).where(messages.c.appointment_id == appt.id,
                                                                messages.c.purpose == "session_reminder")).scalars().all()
    assert statuses and all(s == "cancelled" for s in statuses)


def test_template_syntax_error_is_shown_in_the_form_and_preview_renders_sample_data(owner, tenants, rt):
    a, _ = tenants
    page = owner.get("/admin/templates/new/")
    token = csrf(page.text)
    bad = owner.post("/admin/templates/new/", data={"csrf_token": token, "key": "session_reminder",
                                                     "channel_kind": "email", "locale": "pt_BR",
                                                     "body": "Olá {{ nome }"})
    assert bad.status_code == 200
    assert "Erro no modelo" in bad.text and "syntax error" in bad.text
    with rt.db.connect() as conn:
        assert conn.execute(select(templates).where(templates.c.org_id == a.world.org_id,
                                                    templates.c.channel_kind == "email")).first() is None

    preview = owner.post("/admin/templates/preview/", data={"body": "Oi {{ nome }}, {{ hora }}"},
                         headers={"X-CSRFToken": token})
    assert preview.get_json() == {"text": "Oi Ana, 14:00", "error": None}
    assert owner.post("/admin/templates/preview/", data={"body": "x"}).status_code == 400  # CSRF

    edit = owner.get(f"/admin/templates/edit/?id={a.template_id}")
    assert "Pré-visualização" in edit.text and "Modelo da clinica-a: Ana" in edit.text

    good = owner.post("/admin/templates/new/", data={"csrf_token": token, "key": "session_reminder",
                                                      "channel_kind": "email", "locale": "pt_BR",
                                                      "subject": "Lembrete", "body": "Olá {{ nome }}!"})
    assert good.status_code == 302
    with rt.db.connect() as conn:
        row = conn.execute(select(templates).where(templates.c.org_id == a.world.org_id,
                                                   templates.c.channel_kind == "email")).one()
    assert row.body == "Olá {{ nome }}!"


def test_channel_credentials_are_write_only(owner, tenants, rt):
    a, _ = tenants
    url = f"/admin/channels/edit/?id={a.channel_id}"
    page = owner.get(url)
    assert 'type="password"' in page.text and SECRET not in page.text
    response = owner.post(url, data={"csrf_token": csrf(page.text), "name": "Renomeado", "status": "active",
                                     "is_default": "y", "cred_webhook_secret": ""})
    assert response.status_code == 302
    with rt.db.connect() as conn:
        row = conn.execute(select(channels).where(channels.c.id == a.channel_id)).one()
        audits = conn.execute(select(audit_log.c.changes).where(audit_log.c.entity == "channels")).scalars().all()
    opened = rt.keyring.open(row.credentials, key_version=row.key_version, table="channels",
                             org_id=row.org_id, row_id=row.id)
    assert row.name == "Renomeado" and opened == {"webhook_secret": SECRET}  # blank kept the stored value
    owner.post(url, data={"csrf_token": csrf(page.text), "name": "Renomeado", "status": "active",
                          "is_default": "y", "cred_webhook_secret": "novo-segredo-123"})
    with rt.db.connect() as conn:
        row = conn.execute(select(channels).where(channels.c.id == a.channel_id)).one()
        audits = conn.execute(select(audit_log.c.changes).where(audit_log.c.entity == "channels")).scalars().all()
    assert rt.keyring.open(row.credentials, key_version=row.key_version, table="channels", org_id=row.org_id,
                           row_id=row.id) == {"webhook_secret": "novo-segredo-123"}
    assert all("novo-segredo-123" not in str(c) and SECRET not in str(c) for c in audits)
    assert "novo-segredo-123" not in owner.get("/admin/audit/").text


def test_channel_test_send_goes_through_the_provider(owner, tenants, rt):
    a, _ = tenants
    token = csrf(owner.get(f"/admin/channels/details/?id={a.channel_id}").text)
    response = owner.post(f"/admin/channels/test/{a.channel_id}/", data={"csrf_token": token, "to": "+5516999887766"},
                          follow_redirects=True)
    assert "Teste enviado" in response.text
    assert any("Teste do Lembra" in (m.body or "") for m in a.world.sandbox())


def test_queue_cancel_and_retry_write_message_events(owner, tenants, rt):
    a, _ = tenants
    token = csrf(owner.get("/admin/queue/").text)
    owner.post("/admin/queue/action/", data={"csrf_token": token, "action": "cancel", "rowid": [a.message_id]})
    assert a.world.message(a.message_id).status == "cancelled"
    assert a.world.events(a.message_id)[-1] == "cancelled"
    # a cancelled message is not retryable; a failed one is
    owner.post("/admin/queue/action/", data={"csrf_token": token, "action": "retry", "rowid": [a.message_id]})
    assert a.world.message(a.message_id).status == "cancelled"
    from sqlalchemy import update
    with rt.db.begin() as conn:
        conn.execute(update(messages).where(messages.c.id == a.message_id).values(status="failed", error_code="x"))
    owner.post("/admin/queue/action/", data={"csrf_token": token, "action": "retry", "rowid": [a.message_id]})
    retried = a.world.message(a.message_id)
    assert retried.status == "pending" and retried.next_attempt_at == engine_clock.now()
    assert a.world.events(a.message_id)[-1] == "retried"
    details = owner.get(f"/admin/logs/details/?id={a.message_id}")
    assert details.status_code == 404  # pending is not a log row yet
    queue_details = owner.get(f"/admin/queue/details/?id={a.message_id}")
    assert "Reenvio pedido" in queue_details.text and "Cancelada" in queue_details.text


def test_csv_export_escapes_formulas(owner, tenants, rt):
    a, _ = tenants
    a.world.contact(name='=HYPERLINK("http://evil.invalid","clique")', phone="+5516999001122")
    a.world.contact(name="+SUM(1,2)", phone="+5516999001133")
    body = owner.get("/admin/contacts/export/csv/").get_data(as_text=True)
    names = [row[0] for row in csv.reader(io.StringIO(body))][1:]
    assert "'=HYPERLINK(\"http://evil.invalid\",\"clique\")" in names
    assert "'+SUM(1,2)" in names
    assert not any(n.startswith(("=", "+", "-", "@")) for n in names)


def test_dashboard_counts_and_alerts(owner, tenants, rt):
    a, _ = tenants
    from sqlalchemy import update
    now = engine_clock.now()
    with rt.db.begin() as conn:
        conn.execute(update(messages).where(messages.c.id == a.message_id)
                     .values(status="failed", failed_at=now - timedelta(minutes=5)))
    page = owner.get("/admin/")
    assert page.status_code == 200
    assert "Últimos 30 dias" in page.text and "falharam na última hora" in page.text
