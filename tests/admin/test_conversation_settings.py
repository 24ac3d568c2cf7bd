"""Atendimento (Configuração): the transcription server, the staff quiet minutes and the reply
debounce set in the console through the engine's setters (the CLI's); the key write-only, a
refusal writing nothing, the role and CSRF checked, the audit without the key."""

from __future__ import annotations

from sqlalchemy import select

from engine.flows.ai.transcribe import transcriber_for
from engine.store.models import audit_log, orgs
from tests.admin.conftest import csrf

URL = "/admin/settings/conversation/"
#: A public address (no DNS needed); the test runtime allows only 127.0.0.0/8 inside the network.
PUBLIC = "https://93.184.216.34/v1"
KEY = "sk-segredo-da-clinica-123"


def _key(rt, org) -> str | None:
    """The key the org's transcriber would send (the client the engine builds from the row)."""
    return transcriber_for(org, rt.keyring)._client.api_key


def _org(rt, org_id: int):
    with rt.db.connect() as conn:
        return conn.execute(select(orgs).where(orgs.c.id == org_id)).one()


def _post(client, **values):
    form = {"url": "", "model": "", "api_key": "", "quiet_minutes": "30", "debounce_seconds": "8", **values}
    return client.post(URL, data={"csrf_token": csrf(client.get(URL).text), **form})


def test_set_read_back_keep_the_key_and_clear(rt, owner, tenants):
    a, b = tenants
    saved = _post(owner, url=PUBLIC, model="whisper-1", api_key=KEY, quiet_minutes="45", debounce_seconds="0")
    assert saved.status_code == 302
    org = _org(rt, a.world.org_id)
    assert (org.transcription_base_url, org.transcription_model, org.staff_quiet_minutes,
            org.reply_debounce_seconds) == (PUBLIC, "whisper-1", 45, 0)
    assert _key(rt, org) == KEY
    page = owner.get(URL).text
    assert KEY not in page and "guardada" in page and PUBLIC in page and 'value="45"' in page
    # An empty key field keeps the key (same server); a new model is saved.
    assert _post(owner, url=PUBLIC, model="whisper-large", quiet_minutes="45", debounce_seconds="0").status_code == 302
    org = _org(rt, a.world.org_id)
    assert org.transcription_model == "whisper-large" and _key(rt, org) == KEY
    # Another server: the key is not sent there, it is dropped.
    moved = _post(owner, url="https://93.184.216.35/v1", model="whisper-1")
    assert moved.status_code == 302 and _org(rt, a.world.org_id).transcription_api_key is None
    with rt.db.connect() as conn:
        rows = conn.execute(select(audit_log.c.changes).where(audit_log.c.org_id == a.world.org_id,
                                                              audit_log.c.entity == "orgs").order_by(audit_log.c.id)).scalars().all()
    assert len(rows) == 3 and all(KEY not in str(r) and PUBLIC not in str(r) for r in rows)
    assert rows[0] == {"transcription_server": True, "model": "whisper-1", "api_key_set": True,
                       "staff_quiet_minutes": 45, "reply_debounce_seconds": 0}
    assert rows[1] == {"model": "whisper-large"} and rows[2]["api_key_set"] is False
    # Remover o servidor.
    token = csrf(owner.get(URL).text)
    assert owner.post(URL + "clear/", data={"csrf_token": token}).status_code == 302
    org = _org(rt, a.world.org_id)
    assert (org.transcription_base_url, org.transcription_model, org.transcription_api_key) == (None, None, None)
    assert "Remover o servidor" not in owner.get(URL).text
    assert _org(rt, b.world.org_id).staff_quiet_minutes == 30  # the other clinic untouched


def test_bad_input_shows_the_error_and_writes_nothing(rt, owner, tenants):
    a, _ = tenants
    internal = _post(owner, url="http://169.254.169.254/v1", model="whisper-1", api_key=KEY, quiet_minutes="60")
    assert internal.status_code == 200 and "endereço não permitido" in internal.text and "is-invalid" in internal.text
    for minutes in ("-5", "1441", "muito"):
        page = _post(owner, url=PUBLIC, model="whisper-1", quiet_minutes=minutes)
        assert page.status_code == 200 and "use um número inteiro de 0 a 1440" in page.text, minutes
    assert "de 0 a 120" in _post(owner, debounce_seconds="121").text
    assert "Informe o modelo do servidor de transcrição" in _post(owner, url=PUBLIC).text
    org = _org(rt, a.world.org_id)
    assert (org.transcription_base_url, org.transcription_api_key, org.staff_quiet_minutes,
            org.reply_debounce_seconds) == (None, None, 30, 8)
    with rt.db.connect() as conn:
        assert conn.execute(select(audit_log.c.id).where(audit_log.c.org_id == a.world.org_id,
                                                         audit_log.c.entity == "orgs")).first() is None


def test_agents_get_403_and_csrf_is_required(rt, owner, agent, tenants):
    a, _ = tenants
    assert agent.get(URL).status_code == 403
    token = csrf(agent.get("/admin/queue/").text)
    assert agent.post(URL, data={"csrf_token": token, "quiet_minutes": "5", "debounce_seconds": "8"}).status_code == 403
    assert agent.post(URL + "clear/", data={"csrf_token": token}).status_code == 403
    assert URL not in agent.get("/admin/").text
    assert owner.post(URL, data={"quiet_minutes": "5", "debounce_seconds": "8"}).status_code == 400
    assert _org(rt, a.world.org_id).staff_quiet_minutes == 30
