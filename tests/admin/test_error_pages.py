"""Issue 11, finding 6: the 404/500 pages speak the reader's language and say what to do;
programs (the API, webhooks) keep their own answers."""

from __future__ import annotations

import pytest

from admin.app import create_app


@pytest.fixture
def anonymous(rt):
    app = create_app(rt)
    return app


@pytest.mark.parametrize(("language", "title", "hint"), [
    ("pt-BR", "Página não encontrada", "Volte ao Painel"),
    ("en", "Page not found", "Back to the dashboard"),
])
def test_an_unknown_console_address_is_a_page_in_the_readers_language(anonymous, language, title, hint):
    response = anonymous.test_client().get("/admin/nada-aqui", headers={"Accept-Language": language})
    assert response.status_code == 404
    assert title in response.text and hint in response.text
    assert "The requested URL was not found" not in response.text
    assert f'lang="{language}"' in response.text


def test_a_signed_in_user_reads_the_404_in_their_language(owner):
    response = owner.get("/admin/contacts/details/?id=999999")
    assert response.status_code == 404
    assert "Página não encontrada" in response.text and "Not Found" not in response.text


def test_a_crash_is_a_page_that_says_nothing_was_saved_and_shows_no_internals(anonymous):
    def boom():
        raise RuntimeError("segredo interno: +5516999887766")

    anonymous.add_url_rule("/admin/boom-for-test", "boom", boom)
    anonymous.config["PROPAGATE_EXCEPTIONS"] = False
    response = anonymous.test_client().get("/admin/boom-for-test")
    assert response.status_code == 500
    assert "Algo deu errado" in response.text and "nada foi salvo" in response.text
    assert "segredo" not in response.text and "RuntimeError" not in response.text


def test_a_wrong_method_is_405_with_a_page_and_keeps_its_allow_header(anonymous):
    response = anonymous.test_client().delete("/login")
    assert response.status_code == 405
    assert "Ação não permitida" in response.text and "GET" in response.headers["Allow"]


def test_the_api_and_the_webhooks_keep_their_machine_answers(anonymous):
    client = anonymous.test_client()
    api = client.get("/api/v1/nada-aqui")
    assert api.status_code in (401, 404) and "Página não encontrada" not in api.text
    hook = client.post("/webhooks/sandbox/999999", data=b"{}")
    assert hook.status_code == 404 and "Página não encontrada" not in hook.text
