"""Modelos with a clinic on Meta's official API (issue 30, point 1): the Meta mapping of each
template (approved template's name, language, variables in order, quick-reply buttons), an override
that keeps its default's mapping until changed, the WABA's templates to pick from, the JSON Meta will
receive, and every mapping that cannot work at Meta refused at save with a sentence, nothing written.

The WABA is the loopback Graph fake's (tests/fakes/meta.py: the fixtures' two pages of
`GET /{waba_id}/message_templates`)."""

from __future__ import annotations

import json
import re
from html import unescape
from typing import Any, Iterator

import pytest
from sqlalchemy import insert, select

from engine.core import clock
from engine.tenants.channels import create_channel
from engine.store.models import audit_log, templates
from engine.tenants.orgs import create_user
from tests.admin.conftest import csrf, login
from tests.factories import World
from tests.fakes.meta import FakeGraph
from tests.fakes.server import Reply

WABA = "102290129340398"


@pytest.fixture(scope="module")
def graph() -> Iterator[FakeGraph]:
    with FakeGraph() as server:
        yield server


@pytest.fixture
def fake(graph: FakeGraph) -> FakeGraph:
    return graph.reset()


def meta_clinic(rt: Any, graph: FakeGraph, slug: str, *, waba: str | None = WABA) -> World:
    world = World(rt, slug=slug)
    credentials = {"phone_number_id": "1122334455667", "access_token": "EAAG-token-da-clinica",
                   "app_secret": "0123456789abcdef0123456789abcdef", "verify_token": "verifique-o-webhook-1",
                   "base_url": graph.url}
    if waba:
        credentials["waba_id"] = waba
    with rt.db.begin() as conn:
        world.channels["whatsapp"] = create_channel(conn, rt.keyring, org_id=world.org_id, kind="whatsapp",
                                                    provider="meta", name="WhatsApp oficial", credentials=credentials)
        create_user(conn, org_id=world.org_id, email=f"dona@{slug}.com.br", role="owner", password="senha-forte-a")
    return world


@pytest.fixture
def clinic(rt, clock, fake) -> World:
    return meta_clinic(rt, fake, "sorriso")


@pytest.fixture
def owner(app, clinic):
    return login(app.test_client(), "dona@sorriso.com.br")


def default_id(rt: Any, key: str = "session_reminder", kind: str = "whatsapp") -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(templates.c.id).where(templates.c.org_id.is_(None), templates.c.key == key,
                                                         templates.c.channel_kind == kind,
                                                         templates.c.locale == "pt_BR")).scalar_one()


def own_rows(rt: Any, org_id: int) -> list[Any]:
    with rt.db.connect() as conn:
        return conn.execute(select(templates).where(templates.c.org_id == org_id)).all()


def form(page: str, **fields: str) -> dict[str, str]:
    """The create form as the browser posts it, from the page's own values, with `fields` changed."""
    data = {"csrf_token": csrf(page)}
    for name in ("subject", "meta_name", "meta_lang", "meta_params"):
        match = re.search(rf'name="{name}"[^>]*value="([^"]*)"', page) or \
            re.search(rf'value="([^"]*)"[^>]*name="{name}"', page)
        data[name] = unescape(match.group(1)) if match else ""
    body = re.search(r'<textarea[^>]*name="body"[^>]*>(.*?)</textarea>', page, re.S)
    data["body"] = unescape(body.group(1)).lstrip("\n") if body else ""
    for name in ("key", "channel_kind", "locale", "meta_button_layout"):
        select_ = re.search(rf'<select[^>]*name="{name}"[^>]*>(.*?)</select>', page, re.S)
        chosen = re.search(r'<option[^>]*selected[^>]*value="([^"]*)"|<option[^>]*value="([^"]*)"[^>]*selected',
                           select_.group(1)) if select_ else None
        data[name] = next(v for v in chosen.groups() if v is not None) if chosen else ""
    data.update(fields)
    return data


def meta_preview(page: str) -> dict[str, Any]:
    match = re.search(r'<pre id="lembra-meta-preview"[^>]*>(.*?)</pre>', page, re.S)
    assert match, "no Meta preview on the page"
    return json.loads(unescape(match.group(1)))


def field_errors(page: str) -> str:
    return " ".join(unescape(m) for m in re.findall(r'class="[^"]*invalid-feedback[^"]*"[^>]*>(.*?)</', page, re.S))


def test_personalizar_keeps_the_default_mapping_and_shows_the_waba_and_what_meta_receives(rt, owner, clinic, fake):
    page = owner.get(f"/admin/templates/new/?from={default_id(rt)}").text
    data = form(page)
    assert (data["meta_name"], data["meta_lang"]) == ("session_reminder_v1", "pt_BR")
    assert data["meta_params"] == "nome, profissional, data, hora, modalidade"
    assert data["meta_button_layout"] == "confirm,cancel"
    assert "Mapeamento do modelo padrão." in page
    # The WABA's templates, approved first, to pick from (a pending one is listed, without "Usar").
    waba = re.search(r'<table class="table table-sm small" id="lembra-waba">(.*?)</table>', page, re.S).group(1)
    assert waba.index("lembrete_sorriso") < waba.index("volte_a_sorrir")
    assert 'data-name="lembrete_sorriso" data-language="pt_BR"' in waba
    assert 'data-name="volte_a_sorrir"' not in waba and "em análise" in waba
    # Templates Lembra cannot fill are listed with why, and not offered.
    assert 'data-name="lembrete_com_foto"' not in waba and "tem um cabeçalho com imagem" in unescape(waba)
    assert 'data-name="aviso_com_nome"' not in waba and "usa variáveis com nome" in unescape(waba)
    # What Meta will receive: the template message with the sample data in the mapping's order.
    assert meta_preview(page) == {
        "name": "session_reminder_v1", "language": {"policy": "deterministic", "code": "pt_BR"},
        "components": [
            {"type": "body", "parameters": [{"type": "text", "text": t} for t in
                                            ("Ana", "Dra. Beatriz Costa", "21/03", "14:00", "Presencial")]},
            {"type": "button", "sub_type": "quick_reply", "index": "0",
             "parameters": [{"type": "payload", "payload": "confirm:123"}]},
            {"type": "button", "sub_type": "quick_reply", "index": "1",
             "parameters": [{"type": "payload", "payload": "cancel:123"}]}]}

    saved = owner.post("/admin/templates/new/", data=form(page, body="Oi {{ nome }}, até {{ data }}!"))
    assert saved.status_code == 302
    [row] = own_rows(rt, clinic.org_id)
    # Unchanged, the mapping stays the default's (NULL: it follows the default until changed).
    assert (row.body, row.meta_template_name, row.meta_buttons) == ("Oi {{ nome }}, até {{ data }}!", None, None)
    edit = owner.get(f"/admin/templates/edit/?id={row.id}").text
    assert form(edit)["meta_name"] == "session_reminder_v1" and "Mapeamento do modelo padrão." in edit
    # Modelos says, per template, which approved template it sends (and that it is the default's).
    listing = owner.get("/admin/templates/").text
    own_row = next(r for r in re.findall(r"<tr.*?</tr>", listing, re.S) if "Da clínica" in r)
    assert "<code>session_reminder_v1</code> · Português (Brasil)" in own_row and "do padrão" in own_row


def test_a_clinic_maps_its_own_approved_template(rt, owner, clinic, fake):
    page = owner.get(f"/admin/templates/new/?from={default_id(rt)}").text
    fake.reset()
    saved = owner.post("/admin/templates/new/", data=form(
        page, meta_name="lembrete_sorriso", meta_lang="pt_BR", meta_params="{{ nome }}, profissional, data,hora",
        meta_button_layout="confirm,cancel"))
    assert saved.status_code == 302
    [row] = own_rows(rt, clinic.org_id)
    assert (row.meta_template_name, row.meta_language) == ("lembrete_sorriso", "pt_BR")
    assert (row.meta_parameters, row.meta_buttons) == (["nome", "profissional", "data", "hora"], ["confirm", "cancel"])
    with rt.db.connect() as conn:
        audit = conn.execute(select(audit_log).where(audit_log.c.entity == "templates",
                                                     audit_log.c.entity_id == row.id)).one()
    assert audit.changes["meta_template_name"] == "lembrete_sorriso"
    listed = [r for r in fake.requests if r.path == f"/{WABA}/message_templates"]
    assert len(listed) == 2, "the save read the WABA's two pages once"

    # Editing it again: the session's transaction ends while Meta is asked, and the save still lands.
    edit = owner.get(f"/admin/templates/edit/?id={row.id}").text
    assert form(edit)["meta_params"] == "nome, profissional, data, hora"
    again = owner.post(f"/admin/templates/edit/?id={row.id}", data=form(
        edit, body="Lembrete da Sorriso, {{ nome }}.", meta_button_layout="cancel,confirm"))
    assert again.status_code == 302
    [row] = own_rows(rt, clinic.org_id)
    assert (row.body, row.meta_buttons) == ("Lembrete da Sorriso, {{ nome }}.", ["cancel", "confirm"])


REFUSALS = [
    # (mapping typed, sentence said on the form)
    ({"meta_name": "volte_a_sorrir", "meta_params": "nome", "meta_button_layout": ""},
     "O modelo volte_a_sorrir (pt_BR) está em análise na Meta, e só modelos aprovados podem ser enviados."),
    ({"meta_name": "lembrete_sorriso", "meta_params": "nome, data, hora"},
     "O modelo lembrete_sorriso na Meta tem 4 variáveis no texto, e o mapeamento lista 3."),
    ({"meta_name": "lembrete_sorriso", "meta_params": "nome, profissional, data, hora", "meta_button_layout": ""},
     "O modelo lembrete_sorriso na Meta tem 2 botões de resposta rápida, e o mapeamento indica 0."),
    ({"meta_name": "lembrete_inexistente"},
     "A conta do WhatsApp da clínica (WABA) não tem o modelo lembrete_inexistente em pt_BR."),
    ({"meta_name": "session_reminder_v1", "meta_lang": "es"},
     "O modelo session_reminder_v1 existe na Meta em en_US, pt_BR, mas não em es."),
    ({"meta_name": "aviso_com_nome", "meta_params": "nome", "meta_button_layout": ""},
     "O modelo aviso_com_nome usa variáveis com nome ({{nome}})"),
    ({"meta_name": "lembrete_com_foto", "meta_params": "nome, data", "meta_button_layout": ""},
     "O modelo lembrete_com_foto tem um cabeçalho com imagem, documento ou variável"),
    ({"meta_name": "Lembrete Sorriso"}, "O nome de um modelo da Meta tem só letras minúsculas"),
    ({"meta_params": "nome, telefone, data, hora, modalidade"}, "A variável telefone não existe."),
    ({"meta_lang": "português"}, "O idioma de um modelo da Meta é um código como pt_BR"),
]


@pytest.mark.parametrize("typed, sentence", REFUSALS, ids=[r[0].get("meta_name", "format") for r in REFUSALS])
def test_a_mapping_that_cannot_work_at_meta_is_refused_at_save(rt, owner, clinic, fake, typed, sentence):
    page = owner.get(f"/admin/templates/new/?from={default_id(rt)}").text
    refused = owner.post("/admin/templates/new/", data=form(page, **typed))
    assert refused.status_code == 200
    assert sentence in field_errors(refused.text)
    assert own_rows(rt, clinic.org_id) == [], "nothing written"


def test_an_unmapped_template_is_refused_at_save_even_when_meta_is_down(rt, owner, clinic, fake):
    # No Spanish default to take a mapping from: a Spanish reminder needs its own approved template.
    page = owner.get("/admin/templates/new/").text
    data = form(page, key="session_reminder", channel_kind="whatsapp", locale="es",
                body="Hola {{ nome }}, su sesión es el {{ data }}.", meta_name="", meta_lang="", meta_params="")
    refused = owner.post("/admin/templates/new/", data=data)
    assert "Pelo WhatsApp oficial (Meta), esta mensagem também sai fora da janela de 24 horas" in \
        field_errors(refused.text)
    fake.reset(*[Reply(503, b"")] * 4)
    assert "Pelo WhatsApp oficial (Meta)" in field_errors(owner.post("/admin/templates/new/", data=data).text)
    assert own_rows(rt, clinic.org_id) == []
    # A reply inside the window (confirm_ack) needs no approved template.
    ok = owner.post("/admin/templates/new/", data={**data, "key": "confirm_ack", "body": "¡Gracias, {{ nome }}!"})
    assert ok.status_code == 302


def test_when_meta_cannot_be_asked_the_save_goes_through_with_a_warning(rt, owner, clinic, fake):
    page = owner.get(f"/admin/templates/new/?from={default_id(rt)}").text
    fake.reset(*[Reply(503, b"")] * 4)
    saved = owner.post("/admin/templates/new/", data=form(
        page, meta_name="lembrete_sorriso", meta_params="nome, profissional, data, hora"), follow_redirects=True)
    assert "A Meta não respondeu agora à consulta dos modelos da conta do WhatsApp" in unescape(saved.text)
    [row] = own_rows(rt, clinic.org_id)
    assert row.meta_template_name == "lembrete_sorriso"
    # Format is still checked without Meta.
    fake.reset(*[Reply(503, b"")] * 4)
    edit = owner.get(f"/admin/templates/edit/?id={row.id}").text
    assert "A Meta não respondeu agora" in unescape(edit)  # the WABA panel says why it is empty
    fake.reset(*[Reply(503, b"")] * 4)
    bad = owner.post(f"/admin/templates/edit/?id={row.id}", data=form(edit, meta_params="nome, cpf"))
    assert "A variável cpf não existe." in field_errors(bad.text)


def test_a_channel_without_its_waba_id_says_so(rt, app, clock, fake):
    world = meta_clinic(rt, fake, "semwaba", waba=None)
    client = login(app.test_client(), "dona@semwaba.com.br")
    page = client.get(f"/admin/templates/new/?from={default_id(rt)}").text
    assert "não tem a identificação da conta do WhatsApp Business (WABA)" in unescape(page)
    saved = client.post("/admin/templates/new/", data=form(page), follow_redirects=True)
    assert "não tem a identificação da conta do WhatsApp Business (WABA)" in unescape(saved.text)
    assert len(own_rows(rt, world.org_id)) == 1
    assert fake.requests == [], "nothing asked of Meta without a WABA id"


def test_the_live_preview_shows_what_meta_receives_for_the_typed_mapping(rt, owner, clinic, fake):
    token = csrf(owner.get("/admin/templates/new/").text)
    fake.reset()
    answer = owner.post("/admin/templates/preview/", headers={"X-CSRFToken": token}, data={
        "body": "Oi {{ nome }}", "key": "session_reminder", "channel_kind": "whatsapp", "locale": "pt_BR",
        "meta_name": "lembrete_sorriso", "meta_lang": "pt_BR", "meta_params": "hora, nome",
        "meta_button_layout": "cancel,confirm"}).get_json()
    meta = json.loads(answer["meta"])
    assert [p["text"] for p in meta["components"][0]["parameters"]] == ["14:00", "Ana"]
    assert [c["parameters"][0]["payload"] for c in meta["components"][1:]] == ["cancel:123", "confirm:123"]
    blank = owner.post("/admin/templates/preview/", headers={"X-CSRFToken": token}, data={
        "body": "x", "key": "session_reminder", "channel_kind": "whatsapp", "locale": "pt_BR"}).get_json()
    assert json.loads(blank["meta"])["name"] == "session_reminder_v1"  # blank: the default's
    bad = owner.post("/admin/templates/preview/", headers={"X-CSRFToken": token}, data={
        "body": "x", "key": "session_reminder", "channel_kind": "whatsapp", "locale": "pt_BR",
        "meta_name": "lembrete_sorriso", "meta_lang": "pt_BR", "meta_params": "senha"}).get_json()
    assert bad["meta"] is None and "A variável senha não existe." in bad["meta_error"]
    assert fake.requests == [], "the preview never asks Meta"


def test_another_clinic_cannot_read_or_change_an_override(rt, app, owner, clinic, fake):
    other = meta_clinic(rt, fake, "outra")
    with rt.db.begin() as conn:
        theirs = conn.execute(insert(templates).values(
            org_id=other.org_id, key="session_reminder", channel_kind="whatsapp", locale="pt_BR", body="Deles",
            meta_template_name="lembrete_deles", meta_language="pt_BR", meta_parameters=["nome"], meta_buttons=[],
            updated_at=clock.now()).returning(templates.c.id)).scalar_one()
    for path in (f"/admin/templates/edit/?id={theirs}", f"/admin/templates/details/?id={theirs}"):
        assert owner.get(path).status_code == 404
    page = owner.get(f"/admin/templates/new/?from={theirs}").text  # not a template to copy: an empty form
    assert "lembrete_deles" not in page and "Deles" not in page
    assert owner.post(f"/admin/templates/edit/?id={theirs}", data=form(page, body="Mudei")).status_code == 404
    with rt.db.connect() as conn:
        assert conn.execute(select(templates.c.body).where(templates.c.id == theirs)).scalar_one() == "Deles"
