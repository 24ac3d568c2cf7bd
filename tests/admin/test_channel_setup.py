"""Channel setup as a product (issue "The console a receptionist would choose", finding 7): the form shows
the chosen provider's declared fields with their help, validates them server-side for that provider only,
"Testar conexão" asks the provider, the channel page gives the webhook URL, Evolution's instance is created
from the page, and a test send to "123" is refused instead of "Teste enviado"."""

from __future__ import annotations

import html
import re
from typing import Any

from sqlalchemy import func, select

from engine.tenants.channels import create_channel
from engine.store.models import audit_log, channels
from tests.admin.conftest import csrf
from tests.fakes import evolution as evo

API_KEY = "global-api-key"


def count(rt: Any) -> int:
    with rt.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(channels)).scalar_one())


def evolution_channel(rt: Any, org_id: int, base_url: str, instance: str = "nova") -> int:
    with rt.db.begin() as conn:
        return create_channel(conn, rt.keyring, org_id=org_id, kind="whatsapp", provider="evolution", name="Zap",
                              credentials={"base_url": base_url, "api_key": API_KEY, "instance": instance,
                                           "webhook_secret": "segredo-do-webhook-123"}, is_default=False)


def enabled_fieldsets(page: str) -> list[str]:
    return re.findall(r'<fieldset class="lembra-provider[^"]*" data-provider="(\w+)" data-kinds="[^"]*"\s*>', page)


def test_the_new_channel_page_shows_only_the_chosen_providers_fields_with_help(owner, tenants):
    page = owner.get("/admin/channels/new/?provider=meta").text
    assert enabled_fieldsets(page) == ["meta"]  # every other provider's fieldset is disabled and hidden
    text = html.unescape(page)
    assert "Identificação do número de telefone" in text and "developers.facebook.com" in text
    assert re.search(r'<fieldset[^>]*data-provider="smtp"[^>]*disabled hidden', page)
    assert 'nonce="' in page  # the toggle runs under the strict CSP


def test_a_blank_new_channel_form_says_nothing_is_missing_before_anything_is_typed(owner, tenants):
    # The checks ran on every GET: each required field greeted the clinic with "Preencha este campo.".
    for provider in ("meta", "smtp", "evolution"):
        text = html.unescape(owner.get(f"/admin/channels/new/?provider={provider}").text)
        assert "Preencha este campo." not in text and "is-invalid" not in text, provider
    smtp = html.unescape(owner.get("/admin/channels/new/?provider=smtp").text)
    # The security choices are said in words; the stored values stay the codes.
    assert "STARTTLS (porta 587, o mais comum)" in smtp and '<option value="starttls"' in smtp
    assert ">starttls<" not in smtp and ">none<" not in smtp


def test_a_malformed_or_missing_credential_is_a_form_error_and_nothing_is_saved(owner, tenants, rt):
    page = owner.get("/admin/channels/new/?provider=twilio")
    before = count(rt)
    response = owner.post("/admin/channels/new/", data={
        "csrf_token": csrf(page.text), "name": "SMS", "kind": "sms", "provider": "twilio", "status": "active",
        "cred_account_sid": "123", "cred_auth_token": ""})
    text = html.unescape(response.text)
    assert response.status_code == 200 and count(rt) == before
    assert "Formato inválido. Exemplo: AC0123456789abcdef0123456789abcdef" in text
    assert text.count("Preencha este campo.") == 2  # the token, and a sender (number or messaging service)


def test_a_provider_that_does_not_send_that_kind_is_refused(owner, tenants, rt):
    page = owner.get("/admin/channels/new/")
    before = count(rt)
    response = owner.post("/admin/channels/new/", data={
        "csrf_token": csrf(page.text), "name": "X", "kind": "email", "provider": "zenvia", "status": "active",
        "cred_api_token": "zenvia-token-123", "cred_from": "clinica"})
    assert response.status_code == 200 and count(rt) == before
    assert "Este provedor não envia por este tipo de canal" in html.unescape(response.text)


def test_only_the_chosen_providers_fields_are_read_and_checked(owner, tenants, rt):
    a, _ = tenants
    page = owner.get("/admin/channels/new/?provider=sandbox")
    # An SMTP host inside the network, posted with a sandbox channel: not the sandbox's field, so ignored.
    response = owner.post("/admin/channels/new/", data={
        "csrf_token": csrf(page.text), "name": "Teste", "kind": "sms", "provider": "sandbox", "status": "active",
        "cred_host": "10.0.0.1", "cred_api_key": "re_ignorada_1234"})
    assert response.status_code == 302
    with rt.db.connect() as conn:
        row = conn.execute(select(channels).where(channels.c.org_id == a.world.org_id, channels.c.name == "Teste")).one()
    opened = rt.keyring.open(row.credentials, key_version=row.key_version, table="channels", org_id=row.org_id,
                             row_id=row.id)
    assert set(opened) == {"webhook_secret"}  # generated; nothing of another provider stored


def test_the_sandbox_receipts_delay_is_set_on_its_form_checked_and_shown_on_edit(owner, tenants, rt):
    a, _ = tenants
    page = owner.get("/admin/channels/new/?provider=sandbox").text
    assert "Confirmações de entrega e leitura (segundos)" in html.unescape(page)
    posted = {"csrf_token": csrf(page), "name": "Demo", "kind": "whatsapp", "provider": "sandbox", "status": "active"}
    before = count(rt)
    for bad in ("601", "-1", "3.5", "dez"):
        refused = owner.post("/admin/channels/new/", data={**posted, "receipts_seconds": bad})
        assert refused.status_code == 200 and "Informe um número inteiro de 0 a 600 segundos." in html.unescape(
            refused.text), bad
    assert count(rt) == before
    assert owner.post("/admin/channels/new/", data={**posted, "receipts_seconds": "5"}).status_code == 302
    # Another provider's form does not read it.
    evo_page = owner.get("/admin/channels/new/?provider=evolution").text
    assert owner.post("/admin/channels/new/", data={
        "csrf_token": csrf(evo_page), "name": "Zap", "kind": "whatsapp", "provider": "evolution", "status": "active",
        "cred_base_url": "https://evolution.clinica.example", "cred_api_key": "k", "cred_instance": "c",
        "receipts_seconds": "9999"}).status_code == 302
    with rt.db.connect() as conn:
        demo = conn.execute(select(channels).where(channels.c.org_id == a.world.org_id, channels.c.name == "Demo")).one()
        zap = conn.execute(select(channels).where(channels.c.org_id == a.world.org_id, channels.c.name == "Zap")).one()
    assert demo.settings.get("receipts_seconds") == 5 and "receipts_seconds" not in (zap.settings or {})
    url = f"/admin/channels/edit/?id={demo.id}"
    edit = owner.get(url).text
    assert re.search(r'id="setting-sandbox-receipts_seconds"[^>]*value="5"', edit) or \
        re.search(r'value="5"[^>]*id="setting-sandbox-receipts_seconds"', edit)
    assert owner.post(url, data={"csrf_token": csrf(edit), "name": "Demo", "status": "active",
                                 "receipts_seconds": ""}).status_code == 302
    with rt.db.connect() as conn:
        assert "receipts_seconds" not in conn.execute(select(channels.c.settings).where(
            channels.c.id == demo.id)).scalar_one()
    assert owner.get(f"/admin/channels/edit/?id={demo.id + 10**6}").status_code in (302, 404)


def test_after_saving_a_real_provider_the_channel_page_shows_the_next_steps(owner, tenants, rt):
    a, _ = tenants
    page = owner.get("/admin/channels/new/?provider=evolution")
    response = owner.post("/admin/channels/new/", data={
        "csrf_token": csrf(page.text), "name": "Zap", "kind": "whatsapp", "provider": "evolution",
        "status": "active", "cred_base_url": "https://evolution.clinica.example", "cred_api_key": "k",
        "cred_instance": "clinica-centro"})
    assert response.status_code == 302
    with rt.db.connect() as conn:
        row = conn.execute(select(channels).where(channels.c.org_id == a.world.org_id, channels.c.name == "Zap")).one()
    assert response.headers["Location"].endswith(f"/admin/channels/details/?id={row.id}")
    opened = rt.keyring.open(row.credentials, key_version=row.key_version, table="channels", org_id=row.org_id,
                             row_id=row.id)
    assert len(opened["webhook_secret"]) >= 32  # left blank: generated, registered with the instance later
    details = html.unescape(owner.get(response.headers["Location"]).text)
    assert f"/webhooks/evolution/{row.id}" in details and "Criar instância e conectar" in details


def test_an_edit_shows_settings_but_never_secrets_and_a_blank_secret_keeps_it(owner, tenants, rt):
    a, _ = tenants
    cid = evolution_channel(rt, a.world.org_id, "https://evolution.clinica.example")
    url = f"/admin/channels/edit/?id={cid}"
    page = owner.get(url).text
    assert "https://evolution.clinica.example" in page and API_KEY not in page
    assert "segredo-do-webhook-123" not in page and enabled_fieldsets(page) == ["evolution"]
    assert "Guardado (oculto)" in html.unescape(page)
    response = owner.post(url, data={"csrf_token": csrf(page), "name": "Zap 2", "status": "active",
                                     "cred_base_url": "https://evolution.clinica.example", "cred_api_key": "",
                                     "cred_instance": "nova", "cred_webhook_secret": ""})
    assert response.status_code == 302
    with rt.db.connect() as conn:
        row = conn.execute(select(channels).where(channels.c.id == cid)).one()
    opened = rt.keyring.open(row.credentials, key_version=row.key_version, table="channels", org_id=row.org_id,
                             row_id=row.id)
    assert opened["api_key"] == API_KEY and opened["webhook_secret"] == "segredo-do-webhook-123"


def test_the_channel_page_gives_the_webhook_url_and_says_public_url_is_not_set(owner, tenants, rt):
    a, _ = tenants
    cid = evolution_channel(rt, a.world.org_id, "https://evolution.clinica.example")
    page = html.unescape(owner.get(f"/admin/channels/details/?id={cid}").text)
    assert f"{rt.settings.public_url}/webhooks/evolution/{cid}" in page
    if rt.settings.public_url == "http://127.0.0.1:8000":
        assert "LEMBRA_PUBLIC_URL não está configurado" in page


def test_a_test_send_to_123_is_refused_and_never_says_sent(owner, tenants):
    a, _ = tenants
    token = csrf(owner.get(f"/admin/channels/details/?id={a.channel_id}").text)
    before = len(a.world.sandbox())
    page = owner.post(f"/admin/channels/test/{a.channel_id}/", data={"csrf_token": token, "to": "123"},
                      follow_redirects=True)
    text = html.unescape(page.text)
    assert "Número inválido" in text and "Teste enviado" not in text
    assert len(a.world.sandbox()) == before  # nothing recorded as sent
    ok = owner.post(f"/admin/channels/test/{a.channel_id}/", data={"csrf_token": token, "to": "16 99988-7766"},
                    follow_redirects=True)
    assert "Teste enviado" in html.unescape(ok.text)
    assert a.world.sandbox()[-1].to_address == "+5516999887766"  # normalised to E.164


def test_testar_conexao_asks_the_provider_and_says_what_it_answered(owner, tenants, rt, serve):
    a, b = tenants
    with serve(evo.EvolutionFake(state="close")) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url, instance="clinica")
        token = csrf(owner.get(f"/admin/channels/details/?id={cid}").text)
        page = html.unescape(owner.post(f"/admin/channels/check/{cid}/", data={"csrf_token": token},
                                        follow_redirects=True).text)
        assert "aceitou a chave, mas o WhatsApp da clínica não está conectado" in page
        assert API_KEY not in page and not any(r.path.startswith("/message") for r in server.requests)
    with serve(evo.EvolutionFake(api_key="outra-chave")) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url, instance="clinica")
        page = html.unescape(owner.post(f"/admin/channels/check/{cid}/", data={"csrf_token": token},
                                        follow_redirects=True).text)
        # A code the console knows is said in words only: a person never reads "unauthorized".
        assert "A conexão falhou" in page and "O Evolution recusou a chave de API do canal" in page
        assert "unauthorized" not in page and "código:" not in page
    sandbox = html.unescape(owner.post(f"/admin/channels/check/{a.channel_id}/", data={"csrf_token": token},
                                       follow_redirects=True).text)
    assert "o canal está pronto para testes" in sandbox
    # CSRF, and another org's channel.
    assert owner.post(f"/admin/channels/check/{a.channel_id}/", data={}).status_code == 400
    assert owner.post(f"/admin/channels/check/{b.channel_id}/", data={"csrf_token": token}).status_code == 404
    with rt.db.connect() as conn:
        results = conn.execute(select(audit_log.c.changes).where(audit_log.c.action == "check")).scalars().all()
    assert {"result": "ok"} in results


def test_testar_conexao_refuses_an_internal_address(owner, tenants, rt):
    a, _ = tenants
    cid = evolution_channel(rt, a.world.org_id, "http://169.254.169.254")
    token = csrf(owner.get(f"/admin/channels/details/?id={cid}").text)
    page = html.unescape(owner.post(f"/admin/channels/check/{cid}/", data={"csrf_token": token},
                                    follow_redirects=True).text)
    assert "Endereço não permitido" in page


def test_evolution_instance_is_created_from_the_page_then_the_qr_code(owner, tenants, rt, serve):
    a, b = tenants
    fake = evo.EvolutionFake(state="close")
    with serve(fake) as server:
        cid = evolution_channel(rt, a.world.org_id, server.url, instance="nova")
        details = owner.get(f"/admin/channels/details/?id={cid}").text
        assert f"/admin/channels/instance/{cid}/" in details
        token = csrf(details)
        response = owner.post(f"/admin/channels/instance/{cid}/", data={"csrf_token": token})
        assert response.status_code == 302 and response.headers["Location"].endswith(f"/admin/channels/connect/{cid}/")
        created = [r for r in server.requests if r.path == "/instance/create"]
        assert len(created) == 1
        # An instance that exists already gets this channel's webhook instead.
        existing = evolution_channel(rt, a.world.org_id, server.url, instance="clinica")
        again = owner.post(f"/admin/channels/instance/{existing}/", data={"csrf_token": token}, follow_redirects=True)
        assert "o webhook dela agora aponta para este canal" in html.unescape(again.text)
        assert fake.webhook is not None and fake.webhook["url"].endswith(f"/webhooks/evolution/{existing}")
        assert owner.post(f"/admin/channels/instance/{cid}/", data={}).status_code == 400
        assert owner.post(f"/admin/channels/instance/{b.channel_id}/", data={"csrf_token": token}).status_code == 404
        # A sandbox channel has no instance to create.
        assert owner.post(f"/admin/channels/instance/{a.channel_id}/", data={"csrf_token": token}).status_code == 404
