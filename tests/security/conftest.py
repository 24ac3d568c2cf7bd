"""The attacker's world (issue 9, acceptance): two clinics with a row of every kind, each signed in as
every role, built once per test module.

Why once per module: the probes walk every route of the app (hundreds of requests), and what they
assert is that nothing changes where nothing may change, so sharing the world is safe exactly as
long as the app is right; when it is not, the probe that changed it fails. The world has its own
database (a copy of the session's migrated SQLite file, or the session's PostgreSQL database,
emptied afterwards), its own frozen clock and the production egress policy: no
`LEMBRA_PROVIDER_ALLOW`, so every tenant-set address must be public (the suite's own conftest
allows 127.0.0.0/8 for its fakes; the probes must not).

Org A's free-text fields hold XSS and CSV-formula payloads typed by the clinic (channel, template,
rule, flow, agent, API key, appointment) or by a patient (contact name via the API, an inbound
reply via the webhook). Org B's hold markers that must never show to A.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator

import pytest
from flask.testing import FlaskClient
from sqlalchemy import insert, select

from admin.app import create_app
from engine.core import clock as engine_clock
from engine.messaging import dispatch
from engine.tenants.apikeys import create_key
from engine.tenants.channels import create_channel
from engine.core.config import Settings
from engine.people.contacts import opt_out
from engine.flows.agents import create_agent
from engine.queue.inbox import open_inbox_item
from engine.flows.contact_events import record_contact_event
from engine.store.models import Base, audit_log, meta_template_states, templates
from engine.tenants.orgs import create_user
from engine.store.runtime import Runtime, install
from tests.conftest import BROKER_URL, IS_POSTGRES, T0, TEST_KEY, empty_postgres
from tests.factories import World, sandbox_headers

#: Stored XSS, in every free-text field a tenant or a patient controls. Each part is unique, so its
#: raw presence in a page means a field was rendered unescaped (escaped, `<` becomes `&lt;` and
#: `'` becomes `&#39;`).
XSS = "<script>alert('lx1')</script>\"><img src=x onerror=alert('lx2')>' onmouseover='alert(3)"
XSS_RAW = ("<script>alert('lx1')", "<img src=x onerror=alert('lx2')>", "' onmouseover='alert(3)")
#: A CSV cell that a spreadsheet would evaluate (CWE-1236).
FORMULA = "=cmd|' /C calc'!A0"
#: What org B's rows say, so a page of A that shows one of them is caught.
B_MARKERS = ("Paciente-Da-B-7f3", "Canal-B-7f3", "Modelo-B-7f3", "Regra-B-7f3", "Fluxo-B-7f3",
             "Agente-B-7f3", "Chave-B-7f3", "Resposta-B-7f3", "Pendencia-B-7f3", "Dra-B-7f3", "Mensagem-B-7f3",
             "@clinica-b.example.com")
#: The phone both clinics' main contact has: an opt-out in A must not block it in B.
PHONE = "+5516999887766"
PASSWORD = "senha-muito-forte-123"
ROLES = ("owner", "manager", "agent")
#: Credentials of one channel per provider (the probe signs webhooks with them).
CREDENTIALS: dict[str, dict[str, str]] = {
    "sandbox": {"webhook_secret": "sandbox-secret-{org}"},
    "evolution": {"base_url": "https://evolution.example.com", "api_key": "evo-key-{org}", "instance": "clinica",
                  "webhook_secret": "evolution-secret-{org}-0123456789abcdef"},
    "meta": {"phone_number_id": "1000{org}", "access_token": "meta-token-{org}", "app_secret": "meta-secret-{org}",
             "verify_token": "meta-verify-{org}"},
    "smtp": {"host": "smtp.example.com", "port": "587", "security": "starttls", "from_email": "agenda@{org}.example.com"},
    "resend": {"api_key": "re_{org}", "from_email": "agenda@{org}.example.com",
               "webhook_secret": "whsec_" + "cmVzZW5kLXNlY3JldC0xMjM0NTY3ODkwYWJjZGVm"},
    "twilio": {"account_sid": "AC{org}", "auth_token": "twilio-token-{org}", "from": "+15005550006"},
    "zenvia": {"api_token": "zenvia-{org}", "from": "clinica", "webhook_secret": "zenvia-secret-{org}"},
}
KIND_OF = {"sandbox": "whatsapp", "evolution": "whatsapp", "meta": "whatsapp", "smtp": "email",
           "resend": "email", "twilio": "sms", "zenvia": "sms"}


def csrf(html: str) -> str:
    match = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', html) or \
        re.search(r'value="([^"]+)"[^>]*name="csrf_token"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


class ProbeClient(FlaskClient):
    """A test client that keeps every response it got, with what was asked, for the header and
    500 checks that run over all of them."""

    seen: list[tuple[str, str, Any]]

    def open(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        response = super().open(*args, **kwargs)
        method = kwargs.get("method") or "GET"
        path = args[0] if args and isinstance(args[0], str) else kwargs.get("path", "?")
        self.seen.append((method, str(path), response))
        return response


@dataclass
class Org:
    """One clinic of the probe world: its ids per table and its signed-in clients."""

    slug: str
    world: World
    ids: dict[str, int] = field(default_factory=dict)  # table -> one row id of this org
    channels: dict[str, int] = field(default_factory=dict)  # provider -> channel id
    credentials: dict[str, dict[str, str]] = field(default_factory=dict)
    api_key: str = ""
    clients: dict[str, ProbeClient] = field(default_factory=dict)
    contact_ids: list[int] = field(default_factory=list)

    @property
    def org_id(self) -> int:
        return self.world.org_id


@dataclass
class Probe:
    rt: Runtime
    app: Any
    a: Org
    b: Org

    def client(self) -> ProbeClient:
        client = self.app.test_client()
        client.seen = []
        return client

    def login(self, email: str, password: str = PASSWORD) -> ProbeClient:
        client = self.client()
        page = client.get("/login")
        response = client.post("/login", data={"email": email, "password": password, "csrf_token": csrf(page.text)})
        assert response.status_code == 302, response.text
        return client

    def snapshot(self, org_id: int) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of the org, table by table (what "no state change" is checked against); the
        columns that a read legitimately touches (last use, last sign-in) are left out."""
        volatile = {"last_used_at", "last_login_at"}
        out: dict[str, list[tuple[Any, ...]]] = {}
        with self.rt.db.connect() as conn:
            for table in Base.metadata.sorted_tables:
                if "org_id" not in table.c:
                    continue
                cols = [c for c in table.c if c.name not in volatile]
                order = [table.c.id] if "id" in table.c else cols[:1]
                rows = conn.execute(select(*cols).where(table.c.org_id == org_id).order_by(*order)).all()
                out[table.name] = [tuple(r) for r in rows]
        return out

    def snapshot_all(self) -> dict[str, Any]:
        return {"a": self.snapshot(self.a.org_id), "b": self.snapshot(self.b.org_id)}


def diff(before: dict[str, list[Any]], after: dict[str, list[Any]]) -> list[str]:
    """Tables whose rows differ, with a count (never the rows: they hold patients' data)."""
    out = []
    for table in sorted(set(before) | set(after)):
        old, new = before.get(table, []), after.get(table, [])
        if old != new:
            out.append(f"{table}: {len(old)} -> {len(new)} rows, {sum(1 for x in new if x not in old)} new/changed")
    return out


def _db_url(session_db: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    if IS_POSTGRES:
        return session_db
    path = tmp_path_factory.mktemp("probe") / "lembra.db"
    shutil.copy(session_db, path)
    return f"sqlite:///{path}"


def _graph(label: str) -> dict[str, Any]:
    def node(node_id: str, node_type: str, **config: Any) -> dict[str, Any]:
        return {"id": node_id, "type": node_type, "label": label, "config": config}

    nodes = [node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
             node("fim", "end", outcome="exhausted")]
    return {"nodes": nodes, "edges": [{"source": a["id"], "target": b["id"], "condition": {"type": "always"}}
                                      for a, b in zip(nodes, nodes[1:])]}


def _api(client: ProbeClient, key: str, method: str, path: str, body: Any = None,
         headers: dict[str, str] | None = None) -> Any:
    response = client.open(f"/api/v1{path}", method=method, json=body,
                           headers={"Authorization": f"Bearer {key}", **(headers or {})})
    assert response.status_code in (200, 201), (path, response.status_code, response.text)
    return response.get_json()


def _seed(probe_rt: Runtime, app: Any, slug: str, text_of: Any) -> Org:
    """One clinic with a row of every kind; `text_of(field)` is what its free-text fields say."""
    rt = probe_rt
    world = World(rt, slug=slug)
    org = Org(slug=slug, world=world)
    oid = world.org_id
    now = engine_clock.now()
    with rt.db.begin() as conn:
        for provider, creds in CREDENTIALS.items():
            filled = {k: v.format(org=slug.replace("-", "")) for k, v in creds.items()}
            org.credentials[provider] = filled
            org.channels[provider] = create_channel(
                conn, rt.keyring, org_id=oid, kind=KIND_OF[provider], provider=provider,
                name=text_of("channel") + f" {provider}", credentials=filled, is_default=provider == "sandbox")
        world.channels["whatsapp"] = org.channels["sandbox"]
        for role in ROLES:
            create_user(conn, org_id=oid, email=f"{role}@{slug}.example.com", role=role, password=PASSWORD)
        new_key = create_key(conn, org_id=oid, name=text_of("apikey"))
        org.api_key = new_key.key
        conn.execute(insert(templates).values(
            org_id=oid, key="session_reminder", channel_kind="whatsapp", locale="pt_BR",
            subject=text_of("template"), body=text_of("template") + " {{ nome }}", updated_at=now))
        conn.execute(insert(audit_log).values(
            org_id=oid, action="update", entity="channels", entity_id=org.channels["sandbox"],
            changes={"name": text_of("audit")}, created_at=now))
        # What the clinic's WABA says of a template (its category and status, from Meta's webhooks).
        conn.execute(insert(meta_template_states).values(
            org_id=oid, channel_id=org.channels["meta"], name="session_reminder_v1", language="pt_BR",
            category="MARKETING", status="APPROVED", updated_at=now))
    world.rule(120)
    client = app.test_client()
    client.seen = []
    key = org.api_key
    # The patient-controlled fields arrive the way a clinic's system sends them: through the API.
    contact = _api(client, key, "POST", "/contacts", {
        "external_id": f"ext-{slug}", "name": text_of("contact"), "phone": PHONE,
        "email": f"paciente@{slug}.example.com", "consent": ["whatsapp", "email", "sms"]})
    other = _api(client, key, "POST", "/contacts", {
        "external_id": f"ext2-{slug}", "name": text_of("contact2"), "phone": "+5516988887777",
        "consent": ["whatsapp", "sms"]})
    org.contact_ids = [contact["id"], other["id"]]
    _api(client, key, "POST", "/appointments", {
        "external_id": f"apt-{slug}", "contact_external_id": f"ext-{slug}",
        "starts_at": (now + timedelta(hours=5)).isoformat(), "professional": text_of("professional"),
        "location": text_of("professional")})
    # The built-in agenda: a professional named like the appointment's, so its slots could leak it.
    _api(client, key, "POST", "/professionals", {"name": text_of("professional"), "hours": [
        {"weekday": d, "starts": "08:00", "ends": "12:00"} for d in range(7)]})
    _api(client, key, "POST", "/messages", {"contact_id": contact["id"], "channel_kind": "whatsapp",
                                            "text": text_of("message"), "send_now": True},
         headers={"Idempotency-Key": f"probe-{slug}"})
    for message_id in dispatch.claim_due(rt, limit=100):
        dispatch.send_one(rt, message_id)
    flow = _api(client, key, "POST", "/flows", {"name": text_of("flow"), "draft_graph": _graph(text_of("flow"))})
    _api(client, key, "POST", f"/flows/{flow['id']}/publish")
    _api(client, key, "POST", "/enrollments", {"flow_id": flow["id"], "contact_id": contact["id"]},
         headers={"Idempotency-Key": f"run-{slug}"})
    _api(client, key, "POST", "/events", {"contact_id": contact["id"], "type": "stage_changed", "stage": "lead"})
    _api(client, key, "POST", "/fields", {"slug": "motivo", "label": text_of("field")[:80], "type": "text",
                                          "question": text_of("field")})
    # The clinic's own system hears of everything from here on (the opt-out below makes a delivery).
    _api(client, key, "POST", "/webhook-endpoints", {"url": f"https://hooks.{slug}.example.com/lembra",
                                                     "event_types": ["contact.opted_out", "run.ended"],
                                                     "description": text_of("webhook")})
    with rt.db.begin() as conn:
        create_agent(conn, rt.keyring, oid, name=text_of("agent"), persona=text_of("agent"),
                     llm_base_url="https://llm.example.com/v1", llm_model="m", llm_api_key="sk-probe",
                     followup_enabled=True, flow_ids=[flow["id"]], egress=rt.settings.egress)
        open_inbox_item(conn, oid, "channel_broken", f"probe-{slug}", detail=text_of("inbox"),
                        channel_id=org.channels["sandbox"])
        record_contact_event(conn, org_id=oid, contact_id=contact["id"], type="handoff_started")
        # The second contact refused everything: an address opt-out row.
        opt_out(conn, oid, other["id"], source="console", evidence="probe")
    # A patient's free-text reply, through the public webhook with the channel's secret.
    reply = {"type": "message", "id": f"in-{slug}", "from": PHONE, "text": text_of("reply"),
             "timestamp": now.timestamp()}
    response = client.post(f"/webhooks/sandbox/{org.channels['sandbox']}", data=json.dumps(reply),
                           headers={**sandbox_headers(rt, org.channels["sandbox"]), "Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    # A status for a send not recorded (yet): it waits in early_statuses.
    early = {"type": "status", "id": f"early-{slug}", "status": "delivered", "timestamp": now.timestamp()}
    response = client.post(f"/webhooks/sandbox/{org.channels['sandbox']}", data=json.dumps(early),
                           headers={**sandbox_headers(rt, org.channels["sandbox"]), "Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    with rt.db.connect() as conn:
        for table in Base.metadata.sorted_tables:
            if "org_id" in table.c and "id" in table.c:
                found = conn.execute(select(table.c.id).where(table.c.org_id == oid).order_by(table.c.id)
                                     .limit(1)).scalar()
                if found is not None:
                    org.ids[table.name] = int(found)
    org.ids["contacts"] = contact["id"]
    org.ids["flow_pointers"] = flow["id"]
    return org


A_TEXT = {"contact": XSS, "contact2": FORMULA, "channel": XSS, "template": XSS, "apikey": FORMULA, "audit": XSS, "professional": XSS,
          "message": XSS, "flow": XSS, "agent": XSS, "inbox": XSS, "reply": XSS, "webhook": XSS, "field": XSS}
B_TEXT = {"contact": "Paciente-Da-B-7f3", "contact2": "Paciente-Da-B-7f3 2", "channel": "Canal-B-7f3", "template": "Modelo-B-7f3",
          "apikey": "Chave-B-7f3", "audit": "Regra-B-7f3", "professional": "Dra-B-7f3", "message": "Mensagem-B-7f3",
          "flow": "Fluxo-B-7f3", "agent": "Agente-B-7f3", "inbox": "Pendencia-B-7f3", "reply": "Resposta-B-7f3",
          "webhook": "Webhook-B-7f3",
          "field": "Campo-B-7f3"}


#: A public address (documentation says example.com is 93.184.216.34) the probe's public names
#: resolve to, so no probe waits on the machine's DNS; every other name resolves as usual.
PUBLIC_IP = "93.184.216.34"
_REAL_GETADDRINFO = socket.getaddrinfo


def _getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(host, str) and host.rstrip(".").lower().endswith("example.com"):
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (PUBLIC_IP, int(port or 0)))]
    return _REAL_GETADDRINFO(host, port, *args, **kwargs)


@pytest.fixture(scope="module")
def probe(_session_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probe]:
    patch = pytest.MonkeyPatch()
    patch.setattr(socket, "getaddrinfo", _getaddrinfo)
    try:
        yield from _probe(_session_db, tmp_path_factory)
    finally:
        patch.undo()


def _probe(_session_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probe]:
    url = _db_url(_session_db, tmp_path_factory)
    if IS_POSTGRES:
        empty_postgres(url)  # whatever a test before left (each test's own fixture empties it too)
    settings = Settings(database_url=url, broker_url=BROKER_URL, secret_keys=TEST_KEY)  # no provider_allow
    assert not settings.egress.allows_ip(ipaddress.ip_address("127.0.0.1")), "the probe needs the strict policy"
    frozen = engine_clock.FrozenClock(T0)
    previous_clock = engine_clock.use(frozen)
    rt = Runtime.build(settings)
    previous_rt = install(rt)
    app = create_app(rt)
    app.config["TESTING"] = True
    app.test_client_class = ProbeClient
    try:
        a = _seed(rt, app, "clinica-a", lambda f: A_TEXT[f])
        b = _seed(rt, app, "clinica-b", lambda f: B_TEXT[f])
        probe = Probe(rt, app, a, b)
        for org in (a, b):
            for role in ROLES:
                org.clients[role] = probe.login(f"{role}@{org.slug}.example.com")
        yield probe
    finally:
        install(previous_rt)
        rt.close()
        engine_clock.use(previous_clock)
        if IS_POSTGRES:
            empty_postgres(url)
