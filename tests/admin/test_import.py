"""The console's CSV import of appointments (Agendamentos → Importar CSV): acceptance 5 through
the browser's path (upload, counts, errors by line), roles, CSRF, tenant isolation, size limits,
audit with counts only, nothing from the file echoed unescaped."""

from __future__ import annotations

import io
import re
import time

from sqlalchemy import func, select
from werkzeug.datastructures import FileStorage
from werkzeug.test import encode_multipart

from engine.people import imports as csv_import
from engine.store.models import appointments, audit_log, messages
from engine.tenants.orgs import create_user
from tests.admin.conftest import csrf, login
from tests.test_imports import BAD_LINES, HEADER, big_csv

URL = "/admin/appointments/import/"


def upload(client, body: bytes | str, *, token: str | None = "from-page", name: str = "agenda.csv"):
    if token == "from-page":
        token = csrf(client.get(URL).text)
    fields: dict[str, object] = {} if token is None else {"csrf_token": token}
    fields["file"] = FileStorage(io.BytesIO(body.encode() if isinstance(body, str) else body), filename=name)
    # Encoded in memory: given the form, the test client spools a body over 500 KB to a temporary file
    # it never closes (a ResourceWarning, an error in this suite).
    boundary, encoded = encode_multipart(fields)
    return client.post(URL, data=encoded, content_type=f"multipart/form-data; boundary={boundary}",
                       follow_redirects=True)


def appointment_count(rt, org_id: int) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(appointments)
                            .where(appointments.c.org_id == org_id)).scalar_one()


def test_ten_thousand_rows_with_three_bad_ones_through_the_console(owner, tenants, rt, clock, capsys):
    a, _ = tenants
    before = appointment_count(rt, a.world.org_id)
    listing = owner.get("/admin/appointments/")
    assert "Importar CSV" in listing.text and URL in listing.text
    page = owner.get(URL)
    assert "contact_external_id" in page.text and "whatsapp|email" in page.text  # columns and example line
    body = big_csv(clock).encode("utf-8-sig")
    assert len(body) > 1024 * 1024  # above the app's general 1 MB limit
    t0 = time.perf_counter()
    response = upload(owner, body)
    elapsed = time.perf_counter() - t0
    assert response.status_code == 200, response.text[:500]
    assert "9997 agendamentos criados" in response.text and "3 linhas com erro" in response.text
    table = response.text.split('id="import-errors"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr><td>(\d+)</td><td>([^<]+)</td></tr>", table)
    assert [int(line) for line, _ in rows] == sorted(BAD_LINES)
    assert "starts_at inválido" in rows[0][1] and "contact_external_id em branco" in rows[1][1]
    assert "telefone inválido" in rows[2][1] and "12345" not in table
    assert appointment_count(rt, a.world.org_id) == before + 9_997
    with rt.db.connect() as conn:
        queued = conn.execute(select(func.count()).select_from(messages).where(
            messages.c.org_id == a.world.org_id, messages.c.appointment_id.is_not(None))).scalar_one()
        audit = conn.execute(select(audit_log).where(audit_log.c.org_id == a.world.org_id,
                                                     audit_log.c.action == "import")).one()
    assert queued > 1000  # reminders populated for the imported appointments
    assert audit.entity == "appointments" and audit.user_id is not None
    assert audit.changes["created"] == 9_997 and audit.changes["errors"] == 3
    assert all(isinstance(v, int) for v in audit.changes.values())  # counts only, nothing from the file
    with capsys.disabled():
        print(f"\n[console import timing] {rt.db.dialect}: 10,000 rows uploaded and imported in {elapsed:.1f}s")


def test_agent_gets_403_and_sees_no_button(agent, tenants, rt):
    a, _ = tenants
    assert "Importar CSV" not in agent.get("/admin/appointments/").text
    assert agent.get(URL).status_code == 403
    token = csrf(agent.get("/admin/appointments/").text)  # a valid token of the agent's own session
    body = f"{HEADER}\nAG-X;PAC-X;Ana;16999887766;;03/12/2026 14:00;;;;;whatsapp"
    response = agent.post(URL, data={"csrf_token": token, "file": (io.BytesIO(body.encode()), "a.csv")},
                          content_type="multipart/form-data")
    assert response.status_code == 403
    assert appointment_count(rt, a.world.org_id) == 1


def test_post_without_csrf_token_is_refused(owner, tenants, rt):
    a, _ = tenants
    body = f"{HEADER}\nAG-X;PAC-X;Ana;16999887766;;03/12/2026 14:00;;;;;whatsapp"
    assert upload(owner, body, token=None).status_code == 400
    assert upload(owner, body, token="forjado").status_code == 400
    assert appointment_count(rt, a.world.org_id) == 1


def test_another_orgs_user_creates_separate_rows_and_never_touches_org_a(app, owner, tenants, rt):
    a, b = tenants
    rows = [HEADER, "AG-1;PAC-1;Ana;16999887766;;03/12/2026 14:00;Dra. A;;;;whatsapp",
            "AG-2;PAC-2;Bia;16999887755;;03/12/2026 15:00;Dra. A;;;;whatsapp"]
    assert "2 agendamentos criados" in upload(owner, "\n".join(rows)).text
    with rt.db.begin() as conn:
        create_user(conn, org_id=b.world.org_id, email="owner@b.com.br", role="owner", password="senha-forte-b")
    other = login(app.test_client(), "owner@b.com.br", "senha-forte-b")
    moved = "\n".join(rows).replace("03/12/2026", "05/12/2026").replace("Dra. A", "Dr. B")
    response = upload(other, moved)
    assert "2 agendamentos criados, 0 atualizados" in response.text
    with rt.db.connect() as conn:
        mine = conn.execute(select(appointments.c.professional, appointments.c.starts_at).where(
            appointments.c.org_id == a.world.org_id, appointments.c.external_id.in_(["AG-1", "AG-2"]))).all()
        theirs = conn.execute(select(appointments.c.id).where(
            appointments.c.org_id == b.world.org_id, appointments.c.external_id.in_(["AG-1", "AG-2"]))).all()
        audits = conn.execute(select(audit_log.c.org_id).where(audit_log.c.action == "import")).scalars().all()
    assert [m.professional for m in mine] == ["Dra. A", "Dra. A"] and len(theirs) == 2
    assert sorted(audits) == sorted([a.world.org_id, b.world.org_id])
    # org B's list does not show org A's imported rows
    assert "Dra. A" not in other.get("/admin/appointments/").text


def test_file_refusals_are_clear_and_values_are_never_echoed_unescaped(owner, tenants, rt, monkeypatch):
    a, _ = tenants
    missing = upload(owner, "external_id;phone\nA;16999887766")
    assert "Faltam colunas" in missing.text
    assert "Escolha um arquivo CSV" in upload(owner, "", name="").text
    monkeypatch.setattr(csv_import, "MAX_BYTES", 2000)
    too_big = upload(owner, HEADER + "\n" + "x" * 3000)
    assert "Arquivo grande demais" in too_big.text
    way_too_big = upload(owner, HEADER + "\n" + "x" * (400 * 1024))  # over the raised request limit: 413
    assert way_too_big.status_code == 200 and "Arquivo grande demais" in way_too_big.text
    monkeypatch.undo()
    formula = 'AG-F;PAC-F;=HYPERLINK("http://evil.invalid");16999887766;;03/12/2026 14:00;<script>alert(1)</script>'
    body = "\n".join([HEADER, formula + ";;;;whatsapp", "AG-G;PAC-G;<b>Oi</b>;16999887755;;<i>amanhã</i>;;;;;"])
    response = upload(owner, body)
    assert "1 agendamento criado" in response.text and "<script>alert(1)" not in response.text
    assert "<b>Oi</b>" not in response.text and "<i>amanhã</i>" not in response.text
    listing = owner.get("/admin/appointments/?search=AG-F").text
    assert "<script>alert(1)</script>" not in listing and "&lt;script&gt;alert(1)&lt;/script&gt;" in listing
    assert appointment_count(rt, a.world.org_id) == 2


def test_the_import_report_speaks_the_readers_language(owner, tenants, rt, clock):
    from engine.store.models import users

    with rt.db.begin() as conn:
        conn.execute(users.update().where(users.c.email == "owner@a.com.br").values(locale="en"))
    bad = (HEADER + "\nAG-1;PAC-1;Ana;(16) 12345;;03/12/2026 14:30;;;;;\n"
           "AG-2;;Bia;;;03/12/2026 15:00;;;;;\n")
    table = upload(owner, bad).text.split('id="import-errors"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr><td>(\d+)</td><td>([^<]+)</td></tr>", table)
    assert [line for line, _ in rows] == ["2", "3"]
    assert "invalid phone number" in rows[0][1] and "telefone" not in rows[0][1]
    assert "contact_external_id is blank" in rows[1][1] and "patient ID" in rows[1][1]
    refused = upload(owner, "external_id;starts_at\nAG-1;03/12/2026 14:30\n")
    assert "Missing header columns: contact_external_id, contact_name" in refused.text
