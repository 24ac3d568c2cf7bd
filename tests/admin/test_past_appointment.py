"""An appointment saved in the console says what its reminders will do (issue "The console a
receptionist would choose", finding 10): a time in the past, or one so soon that a reminder's
moment has gone, is not accepted silently with "0 lembretes na fila" — the message warns and
lists each skipped reminder with its reason sentence from the catalogue."""

from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import select

from engine.core import clock as engine_clock
from engine.words.catalogue import CATALOGUE
from engine.store.models import appointments, messages
from tests.admin.conftest import csrf

#: T0 (tests/conftest.py) is 2026-12-01 12:00 UTC, 09:00 in São Paulo; A's rule sends 2 h before.
FIELDS = {"professional": "", "mode": "", "location": "", "status": "scheduled", "external_id": ""}


def _create(owner, contact_id: int, starts_at: str):
    token = csrf(owner.get("/admin/appointments/new/").text)
    return owner.post("/admin/appointments/new/", data={"csrf_token": token, "contact_id": contact_id,
                                                        "starts_at": starts_at, **FIELDS}, follow_redirects=True)


def _alerts(html: str) -> str:
    return " ".join(re.sub(r"\s+", " ", m) for m in re.findall(r'class="alert[^"]*"[^>]*>(.*?)</div>', html, re.S))


def test_a_time_well_ahead_still_says_how_many_reminders_are_queued(owner, tenants):
    a, _ = tenants
    shown = _alerts(_create(owner, a.contact_id, "2026-12-03T15:00").text)
    assert "Agendamento criado; 1 lembrete na fila." in shown and "alert-warning" not in shown


def test_a_time_earlier_today_warns_and_names_the_skipped_reminder_and_why(owner, rt, tenants):
    a, _ = tenants
    response = _create(owner, a.contact_id, "2026-12-01T07:00")
    shown = _alerts(response.text)
    assert "0 lembretes na fila" not in shown
    assert "horário que já passou" in shown
    assert "before_start 120 (2 horas antes)" in shown  # the rule, by its name and timing
    assert CATALOGUE["too_late"].msgid in shown and "too_late" not in shown  # a sentence, never the code
    assert 'alert-warning' in response.text


def test_a_time_days_ago_warns_too(owner, tenants):
    a, _ = tenants
    shown = _alerts(_create(owner, a.contact_id, "2026-11-20T10:00").text)
    assert "horário que já passou" in shown and CATALOGUE["appointment_in_past"].msgid in shown


def test_a_time_too_soon_for_one_reminder_says_which_and_why(owner, rt, tenants):
    a, _ = tenants
    a.world.rule(30)  # a second rule, 30 min before
    shown = _alerts(_create(owner, a.contact_id, "2026-12-01T10:00").text)  # in 1 h: 2 h before has gone
    assert "1 lembrete na fila, 1 não vai sair" in shown
    assert "before_start 120 (2 horas antes)" in shown and CATALOGUE["too_late"].msgid in shown
    assert "before_start 30" not in shown


def test_a_patient_without_consent_is_named_as_the_reason(owner, tenants):
    a, _ = tenants
    silent = a.world.contact(name="Sem Consentimento", phone="+5516977776666", consent=())
    shown = _alerts(_create(owner, silent, "2026-12-03T15:00").text)
    assert "0 lembretes na fila" not in shown and "nenhum lembrete vai sair" in shown
    assert CATALOGUE["reminder_no_consent"].msgid in shown


def test_moving_an_appointment_into_the_past_warns(owner, rt, tenants):
    a, _ = tenants
    page = owner.get(f"/admin/appointments/edit/?id={a.appointment_id}")
    response = owner.post(f"/admin/appointments/edit/?id={a.appointment_id}", data={
        "csrf_token": csrf(page.text), "contact_id": a.contact_id, "starts_at": "2026-12-01T08:00", **FIELDS},
        follow_redirects=True)
    shown = _alerts(response.text)
    assert "Agendamento salvo com um horário que já passou" in shown and CATALOGUE["too_late"].msgid in shown
    with rt.db.connect() as conn:
        assert conn.execute(select(appointments.c.starts_at).where(appointments.c.id == a.appointment_id)) \
            .scalar_one().isoformat().startswith("2026-12-01T11:00")
        assert conn.execute(select(messages.c.status).where(messages.c.id == a.message_id)).scalar_one() == "cancelled"


def test_marking_a_past_appointment_done_does_not_warn(owner, rt, tenants):
    a, _ = tenants
    past = a.world.appointment(a.contact_id, engine_clock.now() - timedelta(hours=3))
    page = owner.get(f"/admin/appointments/edit/?id={past}")
    response = owner.post(f"/admin/appointments/edit/?id={past}", data={
        "csrf_token": csrf(page.text), "contact_id": a.contact_id, "starts_at": "2026-12-01T06:00",
        **{**FIELDS, "status": "completed"}}, follow_redirects=True)
    assert "horário que já passou" not in _alerts(response.text)
