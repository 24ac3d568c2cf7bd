"""Finding a patient (issue "The console a receptionist would choose", finding 8): the lists of
Agendamentos, Fila and Registros find rows by the patient's name or phone in any spelling; an
appointment's and a contact's page list their messages and the patient's replies; the appointment
form picks the patient with an org-scoped search box, never a dropdown of every contact."""

from __future__ import annotations

from sqlalchemy import func, insert, select, update

from engine.core import clock as engine_clock
from engine.store.models import appointments, inbound_messages, messages
from tests.admin.conftest import csrf


def _reply(rt, tenant, text: str) -> None:
    """A's message went out (provider id) and the patient answered it."""
    with rt.db.begin() as conn:
        conn.execute(update(messages).where(messages.c.id == tenant.message_id)
                     .values(status="sent", sent_at=engine_clock.now(), provider_message_id=f"wamid-{tenant.message_id}"))
        conn.execute(insert(inbound_messages).values(
            org_id=tenant.world.org_id, channel_id=tenant.channel_id, provider_message_id=f"in-{tenant.message_id}",
            contact_id=tenant.contact_id, from_address="+5516999887766", text=text, intent="confirm",
            in_reply_to=f"wamid-{tenant.message_id}", received_at=engine_clock.now(), outcome="confirmed"))


# --- list search -------------------------------------------------------------------------------------
def test_agendamentos_finds_the_patient_by_name_and_by_a_phone_typed_any_way(owner, tenants):
    a, b = tenants
    for term in ("Paciente Da", "paciente da a", "(16) 99988-7766", "16 9 9988 7766", "016999887766"):
        page = owner.get("/admin/appointments/", query_string={"search": term})
        assert page.status_code == 200
        assert f"id={a.appointment_id}" in page.text, term
        assert "Paciente Só Da B" not in page.text  # B's patient has the same phone: never listed to A
    assert f"id={a.appointment_id}" not in owner.get("/admin/appointments/", query_string={"search": "Beltrano"}).text


def test_the_queue_and_the_logs_find_messages_by_the_patients_name_or_phone(owner, rt, tenants):
    a, b = tenants
    _reply(rt, a, "sim")  # sent: now in Registros too
    for path in ("/admin/queue/", "/admin/logs/"):
        page = owner.get(path)
        assert "nome ou telefone" in page.text  # the search box is there and says what it finds
        for term in ("Da A", "99988-7766"):
            found = owner.get(path, query_string={"search": term}).text
            assert f"id={a.message_id}" in found, (path, term)
            assert f"id={b.message_id}" not in found
        assert f"id={a.message_id}" not in owner.get(path, query_string={"search": "Ninguém"}).text
        assert owner.get(path, query_string={"search": "Só Da B"}).status_code == 200


def test_contacts_are_found_by_a_formatted_phone(owner, tenants):
    a, _ = tenants
    page = owner.get("/admin/contacts/", query_string={"search": "(16) 99988-7766"}).text
    assert "Paciente Da A" in page and "Paciente Só Da B" not in page


# --- the patient search box ------------------------------------------------------------------------------
def test_the_lookup_returns_only_the_signed_in_orgs_contacts(owner, agent, tenants):
    a, b = tenants
    mine = owner.get("/admin/appointments/patients/", query_string={"q": "Paciente"})
    assert mine.status_code == 200 and mine.headers["Cache-Control"] == "no-store"
    assert mine.get_json()["results"] == [{"id": a.contact_id, "label": "Paciente Da A", "detail": "+5516999887766"}]
    # B's patient, by name, by phone (the same number) and by id: nothing of B's comes back.
    for q in ("Só Da B", "99988-7766", str(b.contact_id)):
        ids = [r["id"] for r in owner.get("/admin/appointments/patients/", query_string={"q": q}).get_json()["results"]]
        assert b.contact_id not in ids
    assert owner.get("/admin/appointments/patients/", query_string={"q": "   "}).get_json() == {"results": []}
    assert owner.get("/admin/appointments/patients/", query_string={"q": "50%_\x00"}).get_json() == {"results": []}
    assert agent.get("/admin/appointments/patients/", query_string={"q": "Paciente"}).get_json()["results"]


def test_the_lookup_needs_a_signed_in_user(app, tenants):
    response = app.test_client().get("/admin/appointments/patients/?q=Paciente")
    assert response.status_code == 302 and "/login" in response.headers["Location"]


def test_the_form_has_a_search_box_and_no_list_of_every_contact(owner, tenants):
    a, _ = tenants
    page = owner.get("/admin/appointments/new/").text
    assert 'data-lembra-lookup="/admin/appointments/patients/"' in page
    assert "Paciente Da A" not in page  # nobody is listed before the search
    edit = owner.get(f"/admin/appointments/edit/?id={a.appointment_id}").text
    assert 'value="Paciente Da A"' in edit and f'name="contact_id" id="contact_id-value" value="{a.contact_id}"' in edit


def _count(rt) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(appointments)).scalar()


def test_another_orgs_or_a_made_up_patient_id_is_refused_and_nothing_is_written(owner, rt, tenants):
    a, b = tenants
    before = _count(rt)
    for contact_id in (b.contact_id, "abc", "99999999999999999999999", "", "-1"):
        page = owner.get("/admin/appointments/new/")
        response = owner.post("/admin/appointments/new/", data={
            "csrf_token": csrf(page.text), "contact_id": contact_id, "starts_at": "2026-12-03T15:00",
            "professional": "", "mode": "", "location": "", "status": "scheduled", "external_id": ""})
        assert response.status_code == 200 and "Escolha o paciente." in response.text, contact_id
    assert _count(rt) == before


def test_creating_an_appointment_without_the_csrf_token_is_refused(owner, rt, tenants):
    a, _ = tenants
    before = _count(rt)
    response = owner.post("/admin/appointments/new/", data={"contact_id": a.contact_id, "starts_at": "2026-12-03T15:00",
                                                            "status": "scheduled"})
    assert response.status_code == 400 and _count(rt) == before


# --- the pages list messages and replies ---------------------------------------------------------------
def test_an_appointments_page_lists_its_messages_and_the_replies(owner, rt, tenants):
    a, b = tenants
    _reply(rt, a, "Sim, confirmo a consulta")
    _reply(rt, b, "Resposta da clínica B")
    page = owner.get(f"/admin/appointments/details/?id={a.appointment_id}").text
    assert f'href="/admin/queue/details/?id={a.message_id}' in page and "Lembrete de sessão" in page
    assert "Sim, confirmo a consulta" in page and "O paciente confirmou o agendamento." in page
    assert "Resposta da clínica B" not in page
    assert owner.get(f"/admin/appointments/details/?id={b.appointment_id}").status_code == 404


def test_a_contacts_page_lists_its_messages_and_replies(owner, rt, tenants):
    a, b = tenants
    _reply(rt, a, "Sim, confirmo a consulta")
    _reply(rt, b, "Resposta da clínica B")
    page = owner.get(f"/admin/contacts/details/?id={a.contact_id}").text
    assert f'href="/admin/queue/details/?id={a.message_id}' in page
    assert "Sim, confirmo a consulta" in page and "Resposta da clínica B" not in page
    assert f"id={b.message_id}" not in page
    assert owner.get(f"/admin/contacts/details/?id={b.contact_id}").status_code == 404


def test_an_agent_can_search_and_read_the_history(agent, rt, tenants):
    a, _ = tenants
    _reply(rt, a, "Pode ser às 15h?")
    assert f"id={a.appointment_id}" in agent.get("/admin/appointments/", query_string={"search": "Da A"}).text
    assert "Pode ser às 15h?" in agent.get(f"/admin/contacts/details/?id={a.contact_id}").text
