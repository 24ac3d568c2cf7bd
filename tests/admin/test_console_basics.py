"""Issue 11, finding 11 (small things a product does): an export Excel opens in Portuguese, a
filtered list that is empty says so, and a form that does not validate says what to do."""

from __future__ import annotations

import csv
import io

from tests.admin.conftest import csrf


def test_the_excel_export_is_semicolon_separated_utf8_with_a_bom(owner, tenants):
    a, _ = tenants
    a.world.contact(name="João Conceição", phone="+5516999001122")
    a.world.contact(name='=HYPERLINK("http://evil.invalid")', phone="+5516999001133")
    response = owner.get("/admin/contacts/export/excel/")
    assert response.status_code == 200
    assert response.headers["Content-Disposition"].endswith(".csv")
    raw = response.get_data()
    assert raw.startswith("\ufeff".encode())
    rows = list(csv.reader(io.StringIO(raw.decode("utf-8-sig")), delimiter=";"))
    names = [row[0] for row in rows[1:]]
    assert rows[0][0] == "Nome" and "João Conceição" in names
    assert "'=HYPERLINK(\"http://evil.invalid\")" in names, "formulas are escaped as in the plain CSV"
    assert "Paciente Só Da B" not in raw.decode("utf-8-sig")
    plain = owner.get("/admin/contacts/export/csv/").get_data(as_text=True)
    assert not plain.startswith("\ufeff") and "," in plain.splitlines()[0]
    listing = owner.get("/admin/contacts/").text
    assert "/admin/contacts/export/excel/" in listing


def test_an_empty_search_says_nothing_matched_not_that_nothing_exists(owner, tenants):
    page = owner.get("/admin/logs/?search=ninguem-com-este-nome").text
    assert "Nada encontrado com estes filtros" in page
    assert "Nenhuma mensagem enviada ainda" not in page


def test_a_form_that_does_not_validate_says_what_to_do_in_portuguese(owner, tenants):
    page = owner.get("/admin/contacts/new/").text
    response = owner.post("/admin/contacts/new/", data={"csrf_token": csrf(page), "name": ""})
    assert response.status_code == 200
    assert "corrija os campos marcados em vermelho" in response.text
    assert "Failed to create record" not in response.text and "Falha ao criar o registro" not in response.text
