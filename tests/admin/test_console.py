"""What the console does: CSRF, roles, appointments that queue reminders at once, templates
validated and previewed, write-only credentials, queue actions through the outbox, audit rows,
formula-safe CSV."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

from sqlalchemy import select

from engine.core import clock as engine_clock
from engine.store.models import appointments, audit_log, channels, messages, templates
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
    assert "Erro no modelo" in bad.text and "cada {{ tem o seu }}" in bad.text and "syntax error" not in bad.text
    with rt.db.connect() as conn:
        assert conn.execute(select(templates).where(templates.c.org_id == a.world.org_id,
                                                    templates.c.channel_kind == "email")).first() is None

    preview = owner.post("/admin/templates/preview/", data={"body": "Oi {{ nome }}, {{ hora }}"},
                         headers={"X-CSRFToken": token})
    assert preview.get_json() == {"text": "Oi Ana, 14:00", "error": None, "meta": None, "meta_error": None,
                                  "meta_inherited": False}
    assert owner.post("/admin/templates/preview/", data={"body": "x"}).status_code == 400  # CSRF
    # The sample patient is made up, but the clinic is the reader's own, never "Clínica Exemplo".
    signed = owner.post("/admin/templates/preview/", data={"body": "{{ clinica }}"}, headers={"X-CSRFToken": token})
    assert signed.get_json()["text"] == "Clínica Clinica-A"

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
    assert "Nova tentativa agendada" in queue_details.text and "pediu um novo envio desta mensagem na Fila" in queue_details.text and "Cancelada" in queue_details.text


def test_csv_export_escapes_formulas(owner, tenants, rt):
    a, _ = tenants
    a.world.contact(name='=HYPERLINK("http://evil.invalid","clique")', phone="+5516999001122")
    a.world.contact(name="+SUM(1,2)", phone="+5516999001133")
    body = owner.get("/admin/contacts/export/csv/").get_data(as_text=True)
    names = [row[0] for row in csv.reader(io.StringIO(body))][1:]
    assert "'=HYPERLINK(\"http://evil.invalid\",\"clique\")" in names
    assert "'+SUM(1,2)" in names
    assert not any(n.startswith(("=", "+", "-", "@")) for n in names)


# --- Caixa do sandbox -------------------------------------------------------------------------------


def _send_due(rt) -> list[str]:
    from engine.messaging import dispatch

    return [dispatch.send_one(rt, mid) for mid in dispatch.claim_due(rt, limit=50)]


def _bubbles(html: str, direction: str) -> list[str]:
    """The text of each bubble of one direction ("out": the clinic's, "in": the patient's), in page order."""
    thread = html[html.index('id="lembra-thread"'):html.index('class="card-footer"')]
    chunks = thread.split('<div class="lembra-msg ')[1:]
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", chunk.partition(">")[2])).strip()
            for chunk in chunks if chunk.startswith(direction + '"')]


def _sandbox_ids(rt, org_id: int) -> list[int]:
    from engine.store.models import sandbox_messages

    with rt.db.connect() as conn:
        return list(conn.execute(select(sandbox_messages.c.id).where(sandbox_messages.c.org_id == org_id)
                                 .order_by(sandbox_messages.c.id)).scalars())


def test_sandbox_inbox_is_a_chat_per_contact_and_the_reply_confirms(owner, tenants, rt, clock):
    a, _ = tenants
    clock.advance(timedelta(hours=3, minutes=1))  # the 2 h reminder of the 5 h appointment is due (12:01 local)
    assert _send_due(rt) == ["sent", "sent"]  # one per clinic
    page = owner.get("/admin/sandbox/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert len(re.findall(r"<h4[^>]*>\s*Caixa do sandbox\s*</h4>", html)) == 1  # the console's own page title
    assert "Paciente Da A" in html and "Paciente Só Da B" not in html
    [reminder] = _bubbles(html, "out")
    assert "Lembrete de sessão" in reminder and "WhatsApp" in reminder
    assert "01/12/2026 12:01" in reminder  # when it was sent, in São Paulo time
    assert "Enviada" in reminder  # the message's status badge
    assert 'name="button" value="confirm:' in html  # the reminder's quick replies, answerable here
    assert _bubbles(html, "in") == []

    sandbox_id = _sandbox_ids(rt, a.world.org_id)[0]
    refused = owner.post("/admin/sandbox/reply/", data={"sandbox_message_id": sandbox_id, "text": "CONFIRMAR"})
    assert refused.status_code == 400  # no CSRF token
    reply = owner.post("/admin/sandbox/reply/", data={"sandbox_message_id": sandbox_id, "text": "CONFIRMAR",
                                                      "csrf_token": csrf(html)})
    assert reply.status_code == 302
    assert reply.headers["Location"].endswith(f"/admin/sandbox/?contact={a.contact_id}")
    with rt.db.connect() as conn:
        status = conn.execute(select(appointments.c.status).where(appointments.c.id == a.appointment_id)).scalar_one()
    assert status == "confirmed"  # through the sandbox webhook, signed with the channel's secret

    assert _send_due(rt) == ["sent"]  # the acknowledgement
    html = owner.get(reply.headers["Location"]).get_data(as_text=True)
    assert "Resposta enviada como o paciente." in html
    out, inbound = _bubbles(html, "out"), _bubbles(html, "in")
    assert len(out) == 2 and "Resposta: confirmado" in out[1]
    assert len(inbound) == 1 and "CONFIRMAR" in inbound[0] and "O paciente confirmou o agendamento." in inbound[0]
    # chat order: reminder, the patient's reply, then the acknowledgement (all at the same frozen instant)
    assert html.index(out[0][:20]) < html.index("CONFIRMAR") < html.index("Resposta: confirmado")


def test_sandbox_quick_reply_button_cancels(owner, tenants, rt, clock):
    a, _ = tenants
    clock.advance(timedelta(hours=3, minutes=1))
    _send_due(rt)
    html = owner.get("/admin/sandbox/").get_data(as_text=True)
    sandbox_id = _sandbox_ids(rt, a.world.org_id)[0]
    token = csrf(html)
    forged = owner.post("/admin/sandbox/reply/", data={"sandbox_message_id": sandbox_id, "button": "cancel:999",
                                                       "csrf_token": token})
    assert forged.status_code == 400  # only the message's own buttons
    owner.post("/admin/sandbox/reply/", data={"sandbox_message_id": sandbox_id, "csrf_token": token,
                                              "button": f"cancel:{a.appointment_id}"})
    with rt.db.connect() as conn:
        status = conn.execute(select(appointments.c.status).where(appointments.c.id == a.appointment_id)).scalar_one()
    assert status == "cancelled"
    html = owner.get(f"/admin/sandbox/?contact={a.contact_id}").get_data(as_text=True)
    [inbound] = _bubbles(html, "in")
    assert "Tocou no botão “Cancelar”" in inbound and "O paciente cancelou o agendamento" in inbound


def test_sandbox_is_scoped_to_the_org(owner, tenants, rt, clock):
    _, b = tenants
    clock.advance(timedelta(hours=3, minutes=1))
    _send_due(rt)
    html = owner.get("/admin/sandbox/").get_data(as_text=True)
    assert owner.get(f"/admin/sandbox/?contact={b.contact_id}").status_code == 404
    assert owner.get("/admin/sandbox/?contact=abc").status_code == 404
    # B's reminder went to the same phone number: A's user finds no conversation under it
    assert owner.get("/admin/sandbox/?address=%2B5516999887766").status_code == 404
    b_sandbox_id = _sandbox_ids(rt, b.world.org_id)[0]
    poke = owner.post("/admin/sandbox/reply/", data={"sandbox_message_id": b_sandbox_id, "text": "CANCELAR",
                                                     "csrf_token": csrf(html)})
    assert poke.status_code == 404
    assert owner.post("/admin/sandbox/reply/", data={"sandbox_message_id": "x", "text": "CANCELAR",
                                                     "csrf_token": csrf(html)}).status_code == 404
    with rt.db.connect() as conn:
        from engine.store.models import inbound_messages

        assert conn.execute(select(inbound_messages.c.id)).first() is None
        assert conn.execute(select(appointments.c.status).where(appointments.c.id == b.appointment_id)
                            ).scalar_one() == "scheduled"


def test_the_agent_reads_and_replies(agent, tenants, rt, clock):
    a, _ = tenants
    clock.advance(timedelta(hours=3, minutes=1))
    _send_due(rt)
    html = agent.get("/admin/sandbox/").get_data(as_text=True)
    assert "Paciente Da A" in html and 'id="lembra-reply"' in html
    response = agent.post("/admin/sandbox/reply/", data={"sandbox_message_id": _sandbox_ids(rt, a.world.org_id)[0],
                                                         "text": "ok", "csrf_token": csrf(html)})
    assert response.status_code == 302
    assert a.world.message(a.message_id).status == "sent"
    with rt.db.connect() as conn:
        assert conn.execute(select(appointments.c.status).where(appointments.c.id == a.appointment_id)
                            ).scalar_one() == "confirmed"


def test_an_empty_reply_is_refused_with_a_message(owner, tenants, rt, clock):
    a, _ = tenants
    clock.advance(timedelta(hours=3, minutes=1))
    _send_due(rt)
    html = owner.get("/admin/sandbox/").get_data(as_text=True)
    response = owner.post("/admin/sandbox/reply/", data={"sandbox_message_id": _sandbox_ids(rt, a.world.org_id)[0],
                                                         "text": "   ", "csrf_token": csrf(html)},
                          follow_redirects=True)
    assert "Escreva a resposta do paciente." in response.text


def test_a_channel_test_send_to_a_stranger_is_its_own_conversation(owner, tenants, rt):
    a, _ = tenants
    token = csrf(owner.get(f"/admin/channels/details/?id={a.channel_id}").text)
    owner.post(f"/admin/channels/test/{a.channel_id}/", data={"csrf_token": token, "to": "+5516999001122"})
    html = owner.get("/admin/sandbox/").get_data(as_text=True)
    assert "+5516999001122" in html and "sem contato cadastrado" in html
    [test] = _bubbles(html, "out")
    assert "Teste do canal" in test and "Teste do Lembra" in test
    owner.post("/admin/sandbox/reply/", data={"sandbox_message_id": _sandbox_ids(rt, a.world.org_id)[0],
                                              "text": "quem é?", "csrf_token": csrf(html)})
    html = owner.get("/admin/sandbox/?address=%2B5516999001122").get_data(as_text=True)
    [inbound] = _bubbles(html, "in")
    assert "quem é?" in inbound and "número sem cadastro" in inbound


def test_sandbox_empty_state_login_and_old_address(app, owner, agent, tenants):
    html = owner.get("/admin/sandbox/").get_data(as_text=True)
    assert "Nenhuma mensagem ainda." in html
    assert "Canal sandbox cadastrado." in html  # the tenant has a sandbox channel
    assert 'href="/admin/rules/new/"' in html and 'href="/admin/appointments/new/"' in html
    agent_html = agent.get("/admin/sandbox/").get_data(as_text=True)
    assert "Nenhuma mensagem ainda." in agent_html and 'href="/admin/rules/new/"' not in agent_html
    anonymous = app.test_client().get("/admin/sandbox/")
    assert anonymous.status_code == 302 and "/login" in anonymous.headers["Location"]
    assert owner.get("/sandbox").headers["Location"].endswith("/admin/sandbox/")
    assert owner.get("/").headers["Location"].endswith("/admin/")
    menu = owner.get("/admin/").get_data(as_text=True)
    assert 'href="/admin/sandbox/"' in menu and 'href="/sandbox"' not in menu


def test_the_audit_page_says_codes_in_words_and_redacts_only_personal_data(owner, tenants, rt):
    # "Resultado: failed", "Origem: console_bulk", "Modelo: session_reminder", "Idioma: pt_BR",
    # "Provedor: meta" and a flow named "[redacted]" were what Auditoria used to show.
    import html as html_lib

    from engine.tenants.audit import audit

    a, b = tenants
    with rt.db.begin() as conn:
        for entity, changes in (
                ("channels", {"result": "failed", "provider": "meta"}),
                ("enrollments", {"source": "console_bulk"}),
                ("appointments", {"mode": "in_person"}),
                ("templates", {"key": "session_reminder", "locale": "pt_BR"}),
                ("flows", {"name": "Retomar contato"}),
                ("contacts", {"name": "Ana Clara Souza"})):
            audit(conn, org_id=a.world.org_id, action="update", entity=entity, entity_id=1, changes=changes)
    raw = owner.get("/admin/audit/").text
    page = html_lib.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"(?s)<(style|script)\b.*?</\1>", "", raw)))
    page = re.sub(r"[ \t]+", " ", page)
    for said in ("Resultado: falhou", "Provedor: Meta WhatsApp Cloud API (oficial)",
                 "Origem: pelo console, vários de uma vez", "Modalidade: Presencial",
                 "Modelo: Lembrete de sessão", "Idioma: Português (Brasil)", "Nome: Retomar contato",
                 "Nome: alterado (dado pessoal, não registrado)"):
        assert said in page, said
    for code in ("failed", "console_bulk", "in_person", "session_reminder", "pt_BR", "[redacted]", "Ana Clara"):
        assert code not in page, code  # the visible text
