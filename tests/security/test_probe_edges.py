"""The probe's other areas (issue 9, acceptance): SSRF under the production egress policy, template
bombs, sign-in and sessions, webhooks of every provider, and the address opt-out.

The world (tests/security/conftest.py) has no `LEMBRA_PROVIDER_ALLOW`: the probes below hold with
the policy a production install has, not with the suite's loopback allowance.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import re
import socket
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import jwt
import pytest
from sqlalchemy import select

from engine.core import clock
from engine.messaging import dispatch
from engine.tenants.channels import create_channel
from engine.core.errors import DomainError
from engine.flows.agents import create_agent
from engine.store.models import channels, contacts, messages
from tests.security.conftest import PASSWORD, PHONE, Probe, csrf, diff
from tests.security.routes import classify
from tests.security.walk import filled, main_form

REFUSED = "Endereço não permitido"
#: Addresses inside the network, in the spellings that have slipped past URL checks elsewhere.
INTERNAL_URLS = (
    "http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080", "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.1", "http://192.168.0.10", "http://172.16.0.1", "http://100.64.0.1", "http://0.0.0.0:8080",
    "http://[::ffff:127.0.0.1]", "http://[fe80::1]", "http://2130706433", "http://0x7f000001", "http://127.1",
    "http://017700000001", "http://user:pw@127.0.0.1:8080", "http://example.com@127.0.0.1",
    "http://127.0.0.1#@example.com", "HTTP://LOCALHOST", "http://[::]:80", "http://[0:0:0:0:0:ffff:a9fe:a9fe]",
)
INTERNAL_HOSTS = ("127.0.0.1", "localhost", "::1", "169.254.169.254", "10.1.2.3", "192.168.1.1", "0.0.0.0",
                  "2130706433", "127.1", "LOCALHOST.")
NESTED_LOOPS = "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
DOUBLING = "{% set a = 'x' * 100000 %}" + "{% set a = a ~ a %}" * 8 + "{{ a|length }}"
HEAVY = "Modelo pesado demais"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "providers"
#: Every bomb is refused well within this (the suite never waits for a runaway render).
GUARD = pytest.mark.timeout(30)


@contextmanager
def listener() -> Iterator[tuple[int, Any]]:
    """A loopback port that counts connections: under the strict policy nothing may reach it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)

    def connections() -> int:
        count = 0
        while True:
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    try:
        yield sock.getsockname()[1], connections
    finally:
        sock.close()


def _count(probe: Probe, table: Any, org_id: int) -> int:
    with probe.rt.db.connect() as conn:
        return len(conn.execute(select(table.c.id).where(table.c.org_id == org_id)).all())


# --- SSRF -------------------------------------------------------------------------------------------------

def _channel_form(owner: Any, provider: str, kind: str, **fields: str) -> dict[str, str]:
    page = owner.get("/admin/channels/new/")
    data, kinds = main_form(page.text)
    data = {k: v for k, v in data.items() if not k.startswith("cred_")}
    # Well-formed values (the form checks each provider's formats): only the address under test is refused.
    creds = {"cred_base_url": "https://provider.example.com", "cred_api_key": "re_probe_api_key_1",
             "cred_instance": "clinica", "cred_webhook_secret": "whsec_cHJvYmUtd2ViaG9vay1zZWNyZXQ=",
             "cred_host": "smtp.example.com", "cred_port": "587", "cred_security": "starttls",
             "cred_from_email": "agenda@clinica.example.com", "cred_phone_number_id": "106540352242922",
             "cred_access_token": "EAAGprobeaccesstoken1234567890", "cred_app_secret": "0" * 32,
             "cred_verify_token": "probe-verify-token-1", "cred_account_sid": "AC" + "0" * 32,
             "cred_auth_token": "0" * 32, "cred_api_token": "zenvia-probe-token", "cred_from": "+15005550006"}
    data.pop("is_default", None)  # the org's sandbox stays its default channel (the sends below use it)
    return {**data, **creds, "name": "Probe SSRF", "provider": provider, "kind": kind, **fields,
            "csrf_token": csrf(page.text)}


@pytest.mark.parametrize("provider, kind, field, values", [
    ("evolution", "whatsapp", "cred_base_url", INTERNAL_URLS),
    ("meta", "whatsapp", "cred_base_url", INTERNAL_URLS[:6]),
    ("resend", "email", "cred_base_url", INTERNAL_URLS[:6]),
    ("twilio", "sms", "cred_base_url", INTERNAL_URLS[:6]),
    ("zenvia", "sms", "cred_base_url", INTERNAL_URLS[:6]),
    ("smtp", "email", "cred_host", INTERNAL_HOSTS),
])
def test_a_channel_address_inside_the_network_is_refused_when_saved(probe: Probe, provider: str, kind: str,
                                                                    field: str, values: tuple[str, ...]) -> None:
    owner = probe.a.clients["owner"]
    saved = []
    before = _count(probe, channels, probe.a.org_id)
    for value in values:
        response = owner.post("/admin/channels/new/", data=_channel_form(owner, provider, kind, **{field: value}))
        if response.status_code != 200 or REFUSED not in html.unescape(response.text):
            saved.append(f"{value}: {response.status_code}")
    assert not saved, f"{provider} {field} not refused: {saved}"
    assert _count(probe, channels, probe.a.org_id) == before
    # the control: a public address saves with the same form
    ok = owner.post("/admin/channels/new/", data=_channel_form(owner, provider, kind))
    assert ok.status_code == 302, html.unescape(ok.text)[-800:]


def test_every_console_form_field_that_takes_an_address_refuses_internal_ones(probe: Probe) -> None:
    """Any create or edit form of the console (today: channels, agents) with a field named like an
    address (`url`, `host`): the form saves with a public value (the control), and with an internal
    one it is refused and nothing changes."""
    owner = probe.a.clients["owner"]
    routes, _errors = classify(probe.app)
    checked, problems = [], []
    for route in routes:
        if route.kind not in ("create", "qid") or "POST" not in route.methods:
            continue
        url = route.rule if route.kind == "create" else f"{route.rule}?id={probe.a.ids[route.table]}"
        page = owner.get(url)
        if page.status_code != 200:
            continue
        fields, kinds = main_form(page.text)
        fields.pop("is_default", None)  # the org's sandbox stays its default channel (the sends below use it)
        for name in [n for n in fields if ("url" in n.lower() or "host" in n.lower()) and n != "url"]:
            public = "https://public.example.com/v1" if "url" in name.lower() else "smtp.example.com"
            internal = ("http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:6379") \
                if "url" in name.lower() else ("10.0.0.1", "127.0.0.1")
            form = {**filled(fields, kinds), name: public}
            before = probe.snapshot(probe.a.org_id)
            saved = owner.post(url, data={**form, "csrf_token": csrf(owner.get(url).text)})
            if not diff(before, probe.snapshot(probe.a.org_id)):
                problems.append(f"{url} {name}: the control with {public!r} did not save ({saved.status_code})")
                continue
            for value in internal:
                before = probe.snapshot(probe.a.org_id)
                response = owner.post(url, data={**form, name: value, "csrf_token": csrf(owner.get(url).text)})
                changed = diff(before, probe.snapshot(probe.a.org_id))
                if changed or "não permitido" not in html.unescape(response.text):
                    problems.append(f"POST {url} {name}={value!r}: {response.status_code}, changed {changed}")
            checked.append(f"{route.endpoint}:{name}")
    assert not problems, problems
    assert any(c.startswith("channels.") for c in checked), checked
    if "followup_agents" in {r.endpoint.split(".")[0] for r in routes}:
        assert any(c.startswith("followup_agents.") for c in checked), checked


def _evolution_like(probe: Probe, provider: str, port: int) -> int:
    creds = {
        "evolution": {"base_url": f"http://127.0.0.1:{port}", "api_key": "k", "instance": "i", "webhook_secret": "s"},
        "meta": {"base_url": f"http://127.0.0.1:{port}", "phone_number_id": "1", "access_token": "t",
                 "app_secret": "a", "verify_token": "v"},
        "resend": {"base_url": f"http://127.0.0.1:{port}", "api_key": "k", "from_email": "a@b.example.com",
                   "webhook_secret": "whsec_c2VjcmV0"},
        "twilio": {"base_url": f"http://127.0.0.1:{port}", "account_sid": "AC1", "auth_token": "t",
                   "from": "+15005550006"},
        "zenvia": {"base_url": f"http://127.0.0.1:{port}", "api_token": "t", "from": "clinica"},
        "smtp": {"host": "127.0.0.1", "port": str(port), "security": "none", "from_email": "a@b.example.com"},
    }[provider]
    kind = {"evolution": "whatsapp", "meta": "whatsapp", "resend": "email", "smtp": "email", "twilio": "sms",
            "zenvia": "sms"}[provider]
    with probe.rt.db.begin() as conn:
        # Stored without the form (as a row from before the guard, or one ops allowed and then removed).
        return create_channel(conn, probe.rt.keyring, org_id=probe.a.org_id, kind=kind, provider=provider,
                              name=f"Interno {provider}", credentials=creds, is_default=False)


@pytest.mark.parametrize("provider", ["evolution", "meta", "resend", "twilio", "zenvia", "smtp"])
def test_test_send_connect_and_real_sends_never_reach_an_internal_address(probe: Probe, provider: str) -> None:
    owner = probe.a.clients["owner"]
    with listener() as (port, connections):
        channel_id = _evolution_like(probe, provider, port)
        token = csrf(owner.get(f"/admin/channels/details/?id={channel_id}").text)
        to = "paciente@example.com" if provider in ("resend", "smtp") else PHONE
        page = owner.post(f"/admin/channels/test/{channel_id}/", data={"csrf_token": token, "to": to},
                          follow_redirects=True)
        text = html.unescape(page.text)
        # Meta refuses a free-text test before any call (its Cloud API needs an approved template).
        assert REFUSED in text or provider == "meta" and "template_required" in text, provider
        if provider == "evolution":
            for method in ("GET", "POST"):
                answer = owner.open(f"/admin/channels/connect/{channel_id}/", method=method,
                                    data={"csrf_token": token})
                assert answer.status_code == 200 and REFUSED in html.unescape(answer.text)
            state = owner.get(f"/admin/channels/connect/{channel_id}/state").get_json()
            assert state["state"] == "error" and REFUSED in state["error"]
        # The worker's send of a real message on that channel: refused too, the message not re-tried forever.
        with probe.rt.db.connect() as conn:
            kind = conn.execute(select(channels.c.kind).where(channels.c.id == channel_id)).scalar_one()
        response = probe.client().post("/api/v1/messages", json={
            "contact_id": probe.a.ids["contacts"], "channel_kind": kind, "text": "oi", "send_now": True},
            headers={"Authorization": f"Bearer {probe.a.api_key}", "Idempotency-Key": f"ssrf-{provider}"})
        assert response.status_code == 201, response.text
        message_id = response.get_json()["id"]
        with probe.rt.db.begin() as conn:
            conn.execute(messages.update().where(messages.c.id == message_id).values(channel_id=channel_id))
        dispatch.send_one(probe.rt, message_id)
        assert connections() == 0, f"{provider}: something connected to the internal address"
        row = probe.a.world.message(message_id)
        assert row.status not in ("sent", "delivered"), row.status


def test_an_agents_llm_address_inside_the_network_is_refused(probe: Probe) -> None:
    with probe.rt.db.begin() as conn:
        for url in INTERNAL_URLS[:8]:
            with pytest.raises(DomainError):
                create_agent(conn, probe.rt.keyring, probe.a.org_id, name="IA", llm_base_url=url, llm_model="m",
                             egress=probe.rt.settings.egress)
    routes, _ = classify(probe.app)
    test_route = next((r for r in routes if r.endpoint == "followup_agents.test_view"), None)
    if test_route is None:
        return  # the agents console (admin/views/followup/agents.py) is not there yet
    owner = probe.a.clients["owner"]
    with listener() as (port, connections):
        with probe.rt.db.begin() as conn:
            # stored without the check (the worker's and the console's connect-time guard must still hold)
            agent_id = create_agent(conn, probe.rt.keyring, probe.a.org_id, name="IA interna",
                                    llm_base_url=f"http://127.0.0.1:{port}/v1", llm_model="m", llm_api_key="k")
        details = next(r for r in routes if r.endpoint == "followup_agents.details_view")
        token = csrf(owner.get(f"{details.rule}?id={agent_id}").text)
        page = owner.post(test_route.url(id=agent_id), data={"csrf_token": token}, follow_redirects=True)
        assert page.status_code == 200
        assert "não permitido" in html.unescape(page.text)
        assert connections() == 0


# --- templates ----------------------------------------------------------------------------------------------

@GUARD
def test_template_bombs_are_bounded_in_every_field_of_the_edit_form_and_the_preview(probe: Probe) -> None:
    owner, agent = probe.a.clients["owner"], probe.a.clients["agent"]
    with probe.rt.db.connect() as conn:
        from engine.store.models import templates
        own = conn.execute(select(templates.c.id).where(templates.c.org_id == probe.a.org_id)).scalar_one()
    url = f"/admin/templates/edit/?id={own}"
    page = owner.get(url)
    fields, _kinds = main_form(page.text)
    for bomb in (NESTED_LOOPS, DOUBLING):
        for field in ("body", "subject", "body_html"):
            before = probe.snapshot(probe.a.org_id)
            response = owner.post(url, data={**fields, field: bomb, "csrf_token": csrf(page.text)})
            assert response.status_code == 200 and HEAVY in html.unescape(response.text), (field, bomb[:30])
            assert not diff(before, probe.snapshot(probe.a.org_id))
        for browser in (owner, agent):
            token = csrf(browser.get("/admin/").text)
            answer = browser.post("/admin/templates/preview/", data={"body": bomb}, headers={"X-CSRFToken": token})
            assert answer.get_json()["error"].startswith(HEAVY)


def test_a_patients_name_is_data_never_template_source(probe: Probe) -> None:
    """SSTI: a contact named like a template is printed as typed in what is sent to them."""
    api = {"Authorization": f"Bearer {probe.a.api_key}"}
    client = probe.client()
    name = "{{7*7}}{%for(i)in(range(10**9))%}x{%endfor%} Silva"  # no space: `nome` is the first name
    contact = client.post("/api/v1/contacts", json={"external_id": "ssti", "name": name, "phone": "+5516955554444",
                                                    "consent": ["whatsapp"]}, headers=api).get_json()
    starts = clock.now() + timedelta(minutes=120)  # the 120-minute rule is due now
    client.post("/api/v1/appointments", json={"external_id": "ssti-apt", "contact_external_id": "ssti",
                                              "starts_at": starts.isoformat()}, headers=api)
    for message_id in dispatch.claim_due(probe.rt, limit=100):
        dispatch.send_one(probe.rt, message_id)
    sent = [m for m in probe.a.world.sandbox() if m.to_address == "+5516955554444"]
    assert sent, [(m.status, m.skip_reason, m.error_code) for m in probe.a.world.messages(contact_id=contact["id"])]
    assert all("49" not in m.body and "{{7*7}}{%for(i)in" in m.body for m in sent), [m.body[-120:] for m in sent]
    assert contact["name"] == name


# --- sign-in, sessions ---------------------------------------------------------------------------------------

OFF_SITE = ("//evil.example/x", "/\\evil.example", "/%09/evil.example", "/%2F%2Fevil.example", "https://evil.example",
            "javascript:alert(1)", "/%5Cevil.example", "\\\\evil.example", "http:evil.example", "/ /evil.example",
            "%2F%2Fevil.example", "/admin/%0d%0aSet-Cookie:x=1", "///evil.example", "/.//evil.example",
            "/%252F%252Fevil.example", "\t//evil.example", "//evil.example%2F@localhost/", "/admin/?x=//evil")


def _lands_here(location: str) -> bool:
    parts = urlsplit(location)
    return not parts.scheme and not parts.netloc and location.startswith("/") and not location.startswith("//") \
        and "\\" not in location and not any(ord(c) < 0x21 for c in location)


def test_sign_in_and_the_language_switch_never_redirect_off_site(probe: Probe) -> None:
    bad = []
    for target in OFF_SITE:
        client = probe.client()
        page = client.get("/login")
        response = client.post(f"/login?next={target}", data={
            "email": "manager@clinica-a.example.com", "password": PASSWORD, "csrf_token": csrf(page.text)})
        if response.status_code != 302 or not _lands_here(response.headers["Location"]):
            bad.append(f"login next={target!r}: {response.status_code} {response.headers.get('Location')}")
        token = csrf(client.get("/admin/").text)
        switched = client.post("/account/locale", data={"locale": "pt_BR", "next": target, "csrf_token": token})
        if switched.status_code != 302 or not _lands_here(switched.headers["Location"]):
            bad.append(f"locale next={target!r}: {switched.status_code} {switched.headers.get('Location')}")
    assert not bad, bad


def _copy(probe: Probe, client: Any) -> Any:
    cookie = client.get_cookie("session")
    twin = probe.client()
    twin.set_cookie("session", cookie.value)
    return twin


def test_a_copied_session_is_dead_on_every_page_after_sign_out_and_password_change(probe: Probe) -> None:
    routes, _ = classify(probe.app)
    pages = [r.rule for r in routes if r.kind in ("list", "custom", "create") and "GET" in r.methods]
    assert len(pages) > 15
    # sign out
    client = probe.login("manager@clinica-a.example.com")
    twin = _copy(probe, client)
    assert twin.get("/admin/contacts/").status_code == 200
    token = csrf(client.get("/admin/").text)
    assert client.post("/logout", data={"csrf_token": token}).status_code == 302
    alive = [url for url in pages if twin.get(url).status_code == 200]
    assert not alive, f"a copied cookie still opens {alive}"
    # a password change by the owner
    victim = probe.login("agent@clinica-a.example.com")
    twin = _copy(probe, victim)
    owner = probe.a.clients["owner"]
    with probe.rt.db.connect() as conn:
        from engine.store.models import users
        agent_id = conn.execute(select(users.c.id).where(users.c.email == "agent@clinica-a.example.com")).scalar_one()
    edit = owner.get(f"/admin/users/edit/?id={agent_id}")
    fields, _kinds = main_form(edit.text)
    assert owner.post(f"/admin/users/edit/?id={agent_id}", data={
        **fields, "new_password": "outra-senha-bem-forte", "csrf_token": csrf(edit.text)}).status_code == 302
    alive = [url for url in pages if twin.get(url).status_code == 200]
    assert not alive, f"a cookie from before the password change still opens {alive}"
    assert probe.a.clients["agent"].get("/admin/").status_code == 302  # the walker's agent session ended too
    probe.a.clients["agent"] = probe.login("agent@clinica-a.example.com", "outra-senha-bem-forte")


# --- webhooks -----------------------------------------------------------------------------------------------

def _svix(secret: str, body: bytes, msg_id: str = "msg_probe", at: int | None = None) -> dict[str, str]:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    ts = int(at if at is not None else clock.now().timestamp())
    digest = base64.b64encode(hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()).decode()
    return {"svix-id": msg_id, "svix-timestamp": str(ts), "svix-signature": f"v1,{digest}"}


def _refusals(probe: Probe, org: Any, other: Any) -> list[tuple[str, str, bytes, dict[str, str], str]]:
    """(provider, label, body, headers, content type) of deliveries that must be refused on `org`'s
    channel: unsigned, signed wrong, or signed right for `other` org's channel."""
    creds, theirs = org.credentials, other.credentials
    sandbox = json.dumps({"type": "message", "id": "in-probe", "from": PHONE, "text": "SAIR",
                          "timestamp": clock.now().timestamp()}).encode()
    zenvia = (FIXTURES / "zenvia" / "webhook_message_in_sms.json").read_bytes()
    meta = (FIXTURES / "meta_whatsapp" / "webhook_inbound_text.json").read_bytes()
    resend = (FIXTURES / "resend" / "webhook_email_delivered.json").read_bytes()
    evolution = json.dumps({"event": "messages.upsert", "instance": "clinica", "data": {
        "key": {"remoteJid": "5516999887766@s.whatsapp.net", "fromMe": False, "id": "EVO1"},
        "message": {"conversation": "SAIR"}, "messageTimestamp": int(clock.now().timestamp())}}).encode()
    twilio = b"MessageSid=SM1&From=%2B5516999887766&To=%2B15005550006&Body=SAIR"
    now = int(clock.now().timestamp())
    real_now = int(time.time())  # PyJWT checks `exp` against the machine's clock, not the engine's

    def meta_sig(secret: str) -> dict[str, str]:
        return {"X-Hub-Signature-256": "sha256=" + hmac.new(secret.encode(), meta, hashlib.sha256).hexdigest()}

    def evo_jwt(secret: str, **claims: Any) -> dict[str, str]:
        payload = {"iat": real_now, "exp": real_now + 300, **claims}
        return {"Authorization": "Bearer " + jwt.encode({k: v for k, v in payload.items() if v is not None},
                                                        secret, algorithm="HS256")}

    none_alg = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode() + "." + \
        base64.urlsafe_b64encode(json.dumps({"iat": real_now, "exp": real_now + 300}).encode()).rstrip(b"=").decode() \
        + "."
    J, F = "application/json", "application/x-www-form-urlencoded"
    return [
        ("sandbox", "unsigned", sandbox, {}, J),
        ("sandbox", "wrong secret", sandbox, {"X-Sandbox-Secret": "nope"}, J),
        ("sandbox", "other org's secret", sandbox, {"X-Sandbox-Secret": theirs["sandbox"]["webhook_secret"]}, J),
        ("zenvia", "unsigned", zenvia, {}, J),
        ("zenvia", "other org's secret", zenvia, {"X-Lembra-Webhook-Secret": theirs["zenvia"]["webhook_secret"]}, J),
        ("meta", "unsigned", meta, {}, J),
        ("meta", "wrong signature", meta, {"X-Hub-Signature-256": "sha256=" + "0" * 64}, J),
        ("meta", "other org's app secret", meta, meta_sig(theirs["meta"]["app_secret"]), J),
        ("meta", "sha1 form", meta, {"X-Hub-Signature": "sha1=" + "0" * 40}, J),
        ("evolution", "unsigned", evolution, {}, J),
        ("evolution", "alg none", evolution, {"Authorization": f"Bearer {none_alg}"}, J),
        ("evolution", "other org's secret", evolution, evo_jwt(theirs["evolution"]["webhook_secret"]), J),
        ("evolution", "expired", evolution, evo_jwt(creds["evolution"]["webhook_secret"], iat=real_now - 7200,
                                                    exp=real_now - 3600), J),
        ("evolution", "no exp", evolution, evo_jwt(creds["evolution"]["webhook_secret"], exp=None), J),
        ("resend", "unsigned", resend, {}, J),
        ("resend", "wrong key", resend, _svix("whsec_" + base64.b64encode(b"x" * 24).decode(), resend), J),
        ("resend", "replayed an hour later", resend, _svix(creds["resend"]["webhook_secret"], resend,
                                                            at=now - 3600), J),
        ("twilio", "unsigned", twilio, {}, F),
        ("twilio", "wrong signature", twilio, {"X-Twilio-Signature": base64.b64encode(b"0" * 20).decode()}, F),
        ("smtp", "anything", sandbox, {}, J),
    ]


def test_webhooks_refuse_unsigned_and_badly_signed_bodies_of_every_provider(probe: Probe) -> None:
    from engine.store.models import PROVIDERS

    client = probe.client()
    a, b = probe.a, probe.b
    before = probe.snapshot_all()
    accepted = []
    cases = _refusals(probe, a, b)
    assert {c[0] for c in cases} == set(PROVIDERS), "a provider without refusal probes"
    for provider, label, body, headers, content_type in cases:
        for target in (a.channels[provider],):
            response = client.post(f"/webhooks/{provider}/{target}", data=body,
                                   headers={**headers, "Content-Type": content_type})
            if response.status_code < 400 or response.status_code >= 500:
                accepted.append(f"{provider} [{label}]: {response.status_code} {response.text[:100]}")
    # a channel of another provider, ids no channel has, a provider that does not exist
    sandbox_body = cases[0][2]
    good = {"X-Sandbox-Secret": a.credentials["sandbox"]["webhook_secret"], "Content-Type": "application/json"}
    for url in (f"/webhooks/meta/{a.channels['sandbox']}", f"/webhooks/sandbox/{b.channels['sandbox']}",
                "/webhooks/sandbox/0", "/webhooks/sandbox/99999999999999999999", f"/webhooks/sandbox/{2**63}",
                f"/webhooks/nope/{a.channels['sandbox']}", "/webhooks/sandbox/-1", "/webhooks/sandbox/abc"):
        response = client.post(url, data=sandbox_body, headers=good)
        if response.status_code not in (401, 404):
            accepted.append(f"{url} with A's secret: {response.status_code}")
    # Meta's subscription handshake with a wrong token
    response = client.get(f"/webhooks/meta/{a.channels['meta']}?hub.mode=subscribe&hub.verify_token=nope"
                          "&hub.challenge=123")
    if response.status_code not in (401, 403) or "123" in response.text:
        accepted.append(f"meta handshake with a wrong token: {response.status_code}")
    assert not accepted, accepted
    after = probe.snapshot_all()
    assert not diff(before["a"], after["a"]) and not diff(before["b"], after["b"])
    # the controls: the same bodies, signed right, are taken
    response = client.post(f"/webhooks/sandbox/{a.channels['sandbox']}",
                           data=sandbox_body.replace(b"SAIR", b"oi"), headers=good)
    assert response.status_code == 200, response.text
    zenvia = [c for c in cases if c[0] == "zenvia"][0][2]
    response = client.post(f"/webhooks/zenvia/{a.channels['zenvia']}", data=zenvia, headers={
        "X-Lembra-Webhook-Secret": a.credentials["zenvia"]["webhook_secret"], "Content-Type": "application/json"})
    assert response.status_code == 200, response.text


# --- opt-out ------------------------------------------------------------------------------------------------

def test_sair_blocks_the_phone_on_every_contact_row_of_the_org_and_only_that_org(probe: Probe) -> None:
    client = probe.client()
    a, b = probe.a, probe.b
    body = json.dumps({"type": "message", "id": "in-sair", "from": PHONE, "text": "SAIR",
                       "timestamp": clock.now().timestamp()}).encode()
    response = client.post(f"/webhooks/sandbox/{a.channels['sandbox']}", data=body, headers={
        "X-Sandbox-Secret": a.credentials["sandbox"]["webhook_secret"], "Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    starts = clock.now() + timedelta(minutes=120)  # the 120-minute rule is due now
    found = {}
    for org, external in ((a, "same-phone-a"), (b, "same-phone-b")):
        api = {"Authorization": f"Bearer {org.api_key}"}
        # the same phone, written another way, on a new contact row (another external id)
        new = client.post("/api/v1/contacts", json={"external_id": external, "name": "Mesma Pessoa",
                                                    "phone": "(16) 99988-7766", "consent": ["whatsapp", "sms"]},
                          headers=api)
        assert new.status_code == 201, new.text
        client.post("/api/v1/appointments", json={"external_id": f"apt-{external}", "contact_external_id": external,
                                                  "starts_at": starts.isoformat()}, headers=api)
        found[org.slug] = new.get_json()["id"]
    for message_id in dispatch.claim_due(probe.rt, limit=100):
        dispatch.send_one(probe.rt, message_id)
    with probe.rt.db.connect() as conn:
        def sent_to(org: Any) -> list[Any]:
            return conn.execute(select(messages.c.status).where(
                messages.c.org_id == org.org_id, messages.c.contact_id == found[org.slug],
                messages.c.status.in_(("sent", "delivered", "read")))).all()
        assert sent_to(a) == [], "org A wrote again to a phone that said SAIR"
        assert sent_to(b) != [], "org A's SAIR blocked org B's patient"
        assert conn.execute(select(contacts.c.phone).where(contacts.c.id == found[a.slug])).scalar() == PHONE
    details = a.clients["owner"].get(f"/admin/contacts/details/?id={found[a.slug]}")
    assert "recusou" in html.unescape(details.text)


# --- what the probe found ------------------------------------------------------------------------------------

def test_a_new_contact_with_an_external_id_the_org_already_has_is_a_form_error_not_a_500(probe: Probe) -> None:
    owner = probe.a.clients["owner"]
    page = owner.get("/admin/contacts/new/")
    fields, kinds = main_form(page.text)
    before = probe.snapshot(probe.a.org_id)
    # "ext-clinica-a" is the seeded contact's (it came through the API)
    response = owner.post("/admin/contacts/new/", data={**filled(fields, kinds), "external_id": "ext-clinica-a",
                                                        "phone": "", "email": ""})
    assert response.status_code == 200
    assert "outro contato desta clínica já usa este identificador externo" in html.unescape(response.text)
    assert not diff(before, probe.snapshot(probe.a.org_id))
    # another org's external id is no concern of this one: it saves
    response = owner.post("/admin/contacts/new/", data={**filled(fields, kinds), "external_id": "ext-clinica-b",
                                                        "phone": "", "email": "", "csrf_token": csrf(page.text)})
    assert response.status_code == 302


def test_editing_a_contact_to_an_external_id_the_org_already_has_is_not_a_500(probe: Probe) -> None:
    owner = probe.a.clients["owner"]
    url = f"/admin/contacts/edit/?id={probe.a.contact_ids[1]}"
    fields, _kinds = main_form(owner.get(url).text)
    before = probe.snapshot(probe.a.org_id)
    try:
        response = owner.post(url, data={**fields, "external_id": "ext-clinica-a"})
        status = response.status_code
    except Exception as exc:  # noqa: BLE001 - TESTING propagates what production answers as a 500
        status = type(exc).__name__
    assert status == 200, f"POST {url} external_id=<another contact's>: {status}"
    assert "outro contato desta clínica já usa este identificador externo" in response.text
    assert not diff(before, probe.snapshot(probe.a.org_id))


# --- hostile bodies and tokens ---------------------------------------------------------------------------

HOSTILE_BODIES = (b"NaN", b'{"x": NaN, "y": Infinity}', b"[]", b'"text"', b"null", b"[" * 50_000,
                  b'{"contact_id": 99999999999999999999, "flow_id": -1, "external_id": "\\u0000"}',
                  b'{"name": "\\ud800", "external_id": "a\\u0000b", "phone": "\\u0000"}', b"\xff\xfe\x00",
                  b'{"contact_id": "1", "channel_kind": "whatsapp", "text": "\\u0000", "send_now": "yes"}')


def test_every_api_write_answers_hostile_bodies_with_a_4xx(probe: Probe) -> None:
    routes, _ = classify(probe.app)
    client = probe.client()
    headers = {"Authorization": f"Bearer {probe.a.api_key}", "Content-Type": "application/json",
               "Idempotency-Key": "hostile"}
    before = probe.snapshot_all()
    bad = []
    # The endpoints that read a body, as the API's own document says (a bodiless publish ignores one).
    paths = client.get("/api/v1/openapi.json").get_json()["paths"]

    def takes_body(route: Any, method: str) -> bool:
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route.rule)
        return "requestBody" in paths.get(path, {}).get(method.lower(), {})

    writes = [(r, m) for r in routes if r.kind == "api" for m in r.methods if takes_body(r, m)]
    assert len(writes) >= 6, writes
    for route, method in writes:
        url = route.url(**{name: probe.a.ids[table] for name, table in route.args.items()})
        for body in HOSTILE_BODIES:
            try:
                response = client.open(url, method=method, data=body, headers=headers)
                status: Any = response.status_code
            except Exception as exc:  # noqa: BLE001 - TESTING propagates what production answers as a 500
                status = type(exc).__name__
            if not isinstance(status, int) or not 400 <= status < 500:
                bad.append(f"{method} {url} {body[:40]!r}: {status}")
    assert not bad, bad
    after = probe.snapshot_all()
    assert not diff(before["a"], after["a"]) and not diff(before["b"], after["b"])


def test_opt_out_links_that_are_not_ours_answer_404(probe: Probe) -> None:
    client = probe.client()
    for token in ("x", "a" * 5000, "%00", "..%2f..%2fetc", "eyJhbGciOiJub25lIn0.e30.", "%C2%B2", "1.2.3"):
        for method in ("GET", "POST"):
            response = client.open(f"/optout/{token}", method=method, data={"List-Unsubscribe": "One-Click"})
            assert response.status_code == 404, (method, token[:20], response.status_code)
