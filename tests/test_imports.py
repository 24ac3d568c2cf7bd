"""CSV import of appointments (engine.people.imports): 10,000 rows with 3 bad ones, re-import, tenant
isolation, every per-row reason, the file-level limits."""

from __future__ import annotations

import time
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import func, select

from engine.people import imports
from engine.people.contacts import opt_out
from engine.people.imports import ImportFileError, import_appointments
from engine.store.models import appointments, contacts, messages, preferences
from tests.factories import World

HEADER = "external_id;contact_external_id;contact_name;phone;email;starts_at;professional;mode;location;status;consent"
SP = ZoneInfo("America/Sao_Paulo")
BAD_LINES = {101: "bad date", 5001: "missing contact", 9001: "bad phone"}


def big_csv(clock, n: int = 10_000, *, bad: bool = True) -> str:
    """n data rows (two appointments per contact), with the BAD_LINES broken; line 1 is the header."""
    start = clock.now().astimezone(SP).replace(minute=0, second=0, microsecond=0)
    lines = [HEADER]
    for i in range(n):
        line = i + 2
        at = start + timedelta(days=1 + i % 6, hours=i % 9)
        when = at.strftime("%d/%m/%Y %H:%M") if i % 2 else at.isoformat()
        contact = f"PAC-{i // 2}"
        phone = f"(16) 9{9000_0000 + i // 2:08d}"
        if bad and BAD_LINES.get(line) == "bad date":
            when = "31/02/2026 10:00"
        if bad and BAD_LINES.get(line) == "missing contact":
            contact = ""
        if bad and BAD_LINES.get(line) == "bad phone":
            phone = "12345"
        lines.append(f"AG-{i};{contact};Paciente {i // 2};{phone};p{i // 2}@example.com;{when};Dra. Bia;"
                     f"presencial;Sala {i % 3};agendado;whatsapp|email")
    return "\r\n".join(lines) + "\r\n"


@pytest.fixture
def world(rt):
    w = World(rt, slug="clinica-a")
    w.channel("whatsapp")
    w.rule(1440, ("whatsapp",))
    return w


def count(rt, table, *where):
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def test_ten_thousand_rows_with_three_bad_ones(rt, clock, world, capsys):
    body = big_csv(clock)
    t0 = time.perf_counter()
    report = import_appointments(rt.db, world.org_id, body)
    first = time.perf_counter() - t0
    assert report.rows == 10_000
    assert report.created == 9_997 and report.updated == 0 and report.unchanged == 0
    assert [line for line, _ in report.errors] == [101, 5001, 9001]
    reasons = {line: str(reason) for line, reason in report.errors}
    assert "starts_at inválido" in reasons[101]
    assert "contact_external_id em branco" in reasons[5001]
    assert "telefone inválido" in reasons[9001] and "12345" not in reasons[9001]
    assert count(rt, appointments, appointments.c.org_id == world.org_id) == 9_997
    assert count(rt, contacts, contacts.c.org_id == world.org_id) == 5_000
    # one set-based populate at the end queued reminders for the imported appointments
    queued = count(rt, messages, messages.c.org_id == world.org_id)
    assert queued > 1000 and report.reminders_created == queued
    assert count(rt, messages, messages.c.org_id == world.org_id, messages.c.status == "new") == 0

    # the same file again: nothing new, nothing changed
    t0 = time.perf_counter()
    again = import_appointments(rt.db, world.org_id, body.encode("utf-8-sig"))
    second = time.perf_counter() - t0
    assert (again.created, again.updated, again.unchanged) == (0, 0, 9_997)
    assert again.contacts_created == 0 and again.reminders_created == 0
    assert [line for line, _ in again.errors] == [101, 5001, 9001]
    assert count(rt, appointments, appointments.c.org_id == world.org_id) == 9_997
    assert count(rt, messages, messages.c.org_id == world.org_id) == queued
    with capsys.disabled():
        print(f"\n[import timing] {rt.db.dialect}: 10,000 rows first import {first:.1f}s "
              f"(of which populate {report.populate_seconds:.1f}s), re-import {second:.1f}s")


def test_another_org_gets_its_own_rows_and_cannot_touch_org_a(rt, clock, world):
    body = "\n".join([HEADER, "AG-1;PAC-1;Ana;16999887766;;03/12/2026 14:00;Dra. A;;;;whatsapp",
                      "AG-2;PAC-2;Bia;16999887755;;03/12/2026 15:00;Dra. A;;;;whatsapp"])
    import_appointments(rt.db, world.org_id, body)
    b = World(rt, slug="clinica-b")
    moved = body.replace("03/12/2026", "05/12/2026").replace("Dra. A", "Dr. B")
    report = import_appointments(rt.db, b.org_id, moved)
    assert (report.created, report.updated) == (2, 0)
    with rt.db.connect() as conn:
        a_rows = conn.execute(select(appointments).where(appointments.c.org_id == world.org_id)
                              .order_by(appointments.c.external_id)).all()
        b_rows = conn.execute(select(appointments).where(appointments.c.org_id == b.org_id)).all()
        b_contacts = conn.execute(select(contacts.c.id).where(contacts.c.org_id == b.org_id)).scalars().all()
    assert [r.professional for r in a_rows] == ["Dra. A", "Dra. A"]
    assert all(r.starts_at.astimezone(SP).day == 3 for r in a_rows)
    assert len(b_rows) == 2 and all(r.contact_id in b_contacts for r in b_rows)


def test_a_moved_appointment_reschedules_and_cancelled_cancels(rt, clock, world):
    import_appointments(rt.db, world.org_id, "\n".join([
        HEADER, "AG-1;PAC-1;Ana;16999887766;;02/12/2026 14:00;;;;;whatsapp",
        "AG-2;PAC-1;Ana;16999887766;;02/12/2026 16:00;;;;;whatsapp"]))
    first = {m.appointment_id: m for m in world.messages()}
    assert len(first) == 2 and all(m.status == "pending" for m in first.values())
    report = import_appointments(rt.db, world.org_id, "\n".join([
        HEADER, "AG-1;PAC-1;Ana;16999887766;;2026-12-03T14:00:00-03:00;;;;;whatsapp",
        "AG-2;PAC-1;Ana;;;02/12/2026 16:00;;;;cancelado;"]))
    assert (report.created, report.updated, report.unchanged) == (0, 2, 0)
    by_id = {m.id: m for m in world.messages()}
    assert all(by_id[m.id].status == "cancelled" for m in first.values())
    live = [m for m in by_id.values() if m.status == "pending"]
    assert len(live) == 1 and live[0].appointment_starts_at.astimezone(SP).day == 3


def test_every_row_reason_by_line_and_nothing_written_for_bad_rows(rt, clock, world):
    body = "\n".join([
        "External_ID,Contact_External_ID,Contact_Name,Phone,Email,Starts_At,Status,Consent,Mode",
        "A1,C1,Ana,16999887766,,2026-12-03T10:00:00,,whatsapp,",          # 2 naive ISO
        "A2,C2,Bia,16999887755,,03/12/2026 10:00,talvez,whatsapp,",       # 3 unknown status
        "A3,C3,Caio,16999887744,nao-e-email,03/12/2026 10:00,,whatsapp,",  # 4 bad e-mail
        "A4,C4,Duda,16999887733,,03/12/2026 10:00,,pombo,",               # 5 unknown consent kind
        "A5,C5,,16999887722,,03/12/2026 10:00,,whatsapp,",                # 6 missing name
        "A6,C6,Eva,16999887711,,03/12/2026 10:00,,whatsapp,hibrido",      # 7 unknown mode
        "A7,C7,Fabi,16999887700,,01/11/2026 10:00,,whatsapp,online",      # 8 in the past: recorded
        "A7,C8,Gabi,16999887799,,03/12/2026 10:00,,whatsapp,",            # 9 repeated external_id
        "",
        "A9,C9,\"=HYPERLINK(\"\"http://x\"\")\",16999887788,,03/12/2026 11:00,Confirmado,WhatsApp|E-mail,",  # 11
    ])
    report = import_appointments(rt.db, world.org_id, body)
    lines = {line: str(reason) for line, reason in report.errors}
    assert sorted(lines) == [2, 3, 4, 5, 6, 7, 9]
    assert "sem fuso" in lines[2] and "status desconhecido" in lines[3] and "e-mail inválido" in lines[4]
    assert "consentimento" in lines[5] and "contact_name em branco" in lines[6] and "modalidade" in lines[7]
    assert "linha 8" in lines[9]
    assert report.created == 2
    with rt.db.connect() as conn:
        stored = conn.execute(select(appointments.c.external_id, appointments.c.status, appointments.c.mode)
                              .where(appointments.c.org_id == world.org_id)
                              .order_by(appointments.c.external_id)).all()
        names = conn.execute(select(contacts.c.name).where(contacts.c.org_id == world.org_id)).scalars().all()
    assert [tuple(r) for r in stored] == [("A7", "scheduled", "online"), ("A9", "confirmed", None)]
    assert '=HYPERLINK("http://x")' in names  # stored as text, as given
    assert "C2" not in str(report.errors) and "Bia" not in str(report.errors)


def test_consent_in_the_file_never_overrides_a_patient_opt_out(rt, clock, world):
    row = "AG-1;PAC-1;Ana;16999887766;;03/12/2026 14:00;;;;;whatsapp"
    import_appointments(rt.db, world.org_id, f"{HEADER}\n{row}")
    with rt.db.begin() as conn:
        cid = conn.execute(select(contacts.c.id).where(contacts.c.external_id == "PAC-1")).scalar_one()
        opt_out(conn, world.org_id, cid, source="patient")
    import_appointments(rt.db, world.org_id, f"{HEADER}\n{row.replace('AG-1', 'AG-2')}")
    with rt.db.connect() as conn:
        pref = conn.execute(select(preferences).where(preferences.c.contact_id == cid,
                                                      preferences.c.kind == "whatsapp")).one()
    assert pref.opted_out_at is not None and not pref.opted_in
    assert all(m.status == "cancelled" for m in world.messages())


def test_file_level_refusals(rt, clock, world, monkeypatch):
    with pytest.raises(ImportFileError, match="Faltam colunas"):
        import_appointments(rt.db, world.org_id, "external_id;phone\nA;16999887766")
    with pytest.raises(ImportFileError, match="vazio"):
        import_appointments(rt.db, world.org_id, "\n\n")
    monkeypatch.setattr(imports, "MAX_ROWS", 3)
    with pytest.raises(ImportFileError, match="Linhas demais"):
        import_appointments(rt.db, world.org_id, big_csv(clock, 4, bad=False))
    monkeypatch.setattr(imports, "MAX_BYTES", 100)
    with pytest.raises(ImportFileError, match="grande demais"):
        import_appointments(rt.db, world.org_id, big_csv(clock, 4, bad=False).encode())
    assert count(rt, appointments, appointments.c.org_id == world.org_id) == 0
    # Windows-1252 (Excel pt-BR) is read too
    monkeypatch.setattr(imports, "MAX_BYTES", 5 * 1024 * 1024)
    body = f"{HEADER}\nAG-1;PAC-1;João Conceição;16999887766;;03/12/2026 14:00;;;;;".encode("cp1252")
    assert import_appointments(rt.db, world.org_id, body).created == 1
    with rt.db.connect() as conn:
        assert conn.execute(select(contacts.c.name)).scalar_one() == "João Conceição"


def test_an_appointment_cannot_move_to_another_patient(rt, clock, world):
    import_appointments(rt.db, world.org_id, f"{HEADER}\nAG-1;PAC-1;Ana;16999887766;;03/12/2026 14:00;;;;;")
    report = import_appointments(rt.db, world.org_id, f"{HEADER}\nAG-1;PAC-2;Bia;16999887755;;03/12/2026 14:00;;;;;")
    assert [(line, str(reason)) for line, reason in report.errors] == [
        (2, "este agendamento já pertence a outro paciente")]
    assert report.contacts_created == 0 and count(rt, contacts, contacts.c.org_id == world.org_id) == 1
