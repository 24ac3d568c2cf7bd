"""Agenda (Configuração): professionals' weekly hours, breaks and slot length saved through the engine
(refused whole, in the catalogue's words), and their next free times from the function the flows'
`offer_slots` uses; another org's professional a 404, CSRF and the role checked."""

from __future__ import annotations

from sqlalchemy import func, select

from admin.views.base import DATETIME_FORMATS
from engine.core import clock as engine_clock
from engine.people import agenda
from engine.store.models import audit_log, professional_hours, professionals
from tests.admin.conftest import csrf

URL = "/admin/settings/agenda/"
WEEK = {"day-0": "08:00-12:00, 13:00-18:00", "day-2": "09:00-12:00"}


def _pro(rt, org_id: int, name: str = "Dra. Ana") -> int:
    with rt.db.begin() as conn:
        return agenda.create_professional(conn, org_id, name=name, slot_minutes=30, hours=[
            {"weekday": d, "starts": "08:00", "ends": "18:00"} for d in range(5)]).id


def _post(client, path: str, **data):
    return client.post(path, data={"csrf_token": csrf(client.get(URL + "new/").text), **data})


def _read(rt, org_id: int) -> list[agenda.Professional]:
    with rt.db.connect() as conn:
        return agenda.list_professionals(conn, org_id)


def test_the_week_and_a_break_are_saved_and_the_next_free_times_shown(rt, owner, tenants):
    a, _ = tenants
    made = _post(owner, URL + "new/", name="Dr. Bruno", slot_minutes="45", active="y", **WEEK)
    assert made.status_code == 302, made.text
    [pro] = _read(rt, a.world.org_id)
    assert pro.slot_minutes == 45 and [(i.weekday, i.starts, i.ends) for i in pro.hours] == [
        (0, "08:00", "12:00"), (0, "13:00", "18:00"), (2, "09:00", "12:00")]
    page = owner.get(URL).text
    assert "Dr. Bruno" in page and "45 minutos" in page and "Segunda: 08:00-12:00, 13:00-18:00" in page
    with rt.db.connect() as conn:
        org = agenda.org_row(conn, a.world.org_id)
        expected = agenda.free_slots(conn, org, agenda.SlotQuery(professional_id=pro.id, limit=5), engine_clock.now())
    assert expected, "the week has free times"
    for slot in expected:
        assert slot.starts_at.strftime(DATETIME_FORMATS["pt_BR"]) in page

    edited = _post(owner, f"{URL}{pro.id}/edit/", name="Dr. Bruno", slot_minutes="20", active="y",
                   **{"day-4": "14:00-17:00"})
    assert edited.status_code == 302
    [pro] = _read(rt, a.world.org_id)
    assert pro.slot_minutes == 20 and [(i.weekday, i.starts) for i in pro.hours] == [(4, "14:00")]
    with rt.db.connect() as conn:
        actions = conn.execute(select(audit_log.c.action).where(audit_log.c.entity == "professionals")
                               .order_by(audit_log.c.id)).scalars().all()
    assert actions == ["create", "update"]


def test_bad_hours_are_refused_whole_in_words(rt, owner, tenants):
    a, _ = tenants
    pro_id = _pro(rt, a.world.org_id)
    cases = [({"day-1": "08:00-12:00, 11:00-13:00"}, "Dois intervalos do mesmo dia se sobrepõem"),
             ({"day-1": "18:00-08:00"}, "O fim do expediente (08:00) deve ser depois do início (18:00)."),
             ({"day-1": "oito às doze"}, "Use um horário HH:MM, como 08:00 ou 13:30."),
             ({"day-1": "25:00-26:00"}, "Use um horário HH:MM, como 08:00 ou 13:30.")]
    for week, sentence in cases:
        page = _post(owner, f"{URL}{pro_id}/edit/", name="Dra. Ana", slot_minutes="30", **week)
        assert page.status_code == 200 and sentence in page.text, week
    page = _post(owner, f"{URL}{pro_id}/edit/", name="Dra. Ana", slot_minutes="2", **WEEK)
    assert "A duração do horário deve ser um número inteiro de 5 a 480 minutos." in page.text
    page = _post(owner, URL + "new/", name="Dra. Ana", slot_minutes="30", **WEEK)
    assert "Já existe um profissional com este nome." in page.text
    [pro] = _read(rt, a.world.org_id)
    assert pro.slot_minutes == 30 and len(pro.hours) == 5 and pro.hours[0].starts == "08:00"


def test_another_orgs_professional_answers_404(rt, owner, tenants):
    _, b = tenants
    theirs = _pro(rt, b.world.org_id, "Dr. Outra Clínica")
    assert owner.get(f"{URL}{theirs}/edit/").status_code == 404
    assert _post(owner, f"{URL}{theirs}/edit/", name="hijack", slot_minutes="30").status_code == 404
    assert owner.get(f"{URL}99999999999999999999/edit/").status_code == 404
    assert _read(rt, b.world.org_id)[0].name == "Dr. Outra Clínica"
    assert "Dr. Outra Clínica" not in owner.get(URL).text


def test_a_post_without_csrf_is_refused(rt, owner, tenants):
    a, _ = tenants
    pro_id = _pro(rt, a.world.org_id)
    assert owner.post(URL + "new/", data={"name": "Dr. Sem Token", "slot_minutes": "30"}).status_code == 400
    assert owner.post(f"{URL}{pro_id}/edit/", data={"name": "Outro", "slot_minutes": "30"}).status_code == 400
    assert [p.name for p in _read(rt, a.world.org_id)] == ["Dra. Ana"]


def test_agents_get_403(rt, agent, tenants):
    a, _ = tenants
    pro_id = _pro(rt, a.world.org_id)
    for path in (URL, URL + "new/", f"{URL}{pro_id}/edit/"):
        assert agent.get(path).status_code == 403, path
    token = csrf(agent.get("/admin/queue/").text)
    assert agent.post(f"{URL}{pro_id}/edit/", data={"csrf_token": token, "name": "x",
                                                    "slot_minutes": "30"}).status_code == 403
    assert URL not in agent.get("/admin/").text
    with rt.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(professional_hours)).scalar_one() == 5
        assert conn.execute(select(professionals.c.name)).scalar_one() == "Dra. Ana"
