"""Webhooks (Configuração): endpoints saved through the engine (the egress guard on the URL, events
from the engine's list), the secret shown once, deliveries said in words, "Reenviar" queueing the
event again; another org's ids a 404, CSRF and the role checked."""

from __future__ import annotations

from sqlalchemy import func, select, update

from engine.store.models import audit_log, webhook_deliveries, webhook_endpoints
from engine.tenants.webhooks import endpoints, events
from tests.admin.conftest import csrf

URL = "/admin/settings/webhooks/"
#: A public address (no DNS needed); the test runtime allows only 127.0.0.0/8 inside the network.
PUBLIC = "https://93.184.216.34/lembra/webhooks"


def _endpoint(rt, org_id: int, active: bool = True) -> int:
    with rt.db.begin() as conn:
        return endpoints.create_endpoint(conn, rt.keyring, org_id, url=PUBLIC, event_types=["appointment.confirmed"],
                                         active=active, egress=None).endpoint_id


def _delivery(rt, org_id: int, endpoint_id: int, **values) -> int:
    with rt.db.begin() as conn:
        [delivery_id] = events.enqueue(conn, org_id, [endpoint_id], events.APPOINTMENT_CONFIRMED,
                                       events.envelope(events.APPOINTMENT_CONFIRMED, {"appointment_id": 7}))
        if values:
            conn.execute(update(webhook_deliveries).where(webhook_deliveries.c.id == delivery_id).values(**values))
    return delivery_id


def _count(rt, table, org_id: int) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(table.c.org_id == org_id)).scalar_one()


def _token(client) -> str:
    return csrf(client.get(URL + "new/").text)


def test_create_shows_the_secret_once_and_never_again(rt, owner, tenants):
    a, _ = tenants
    form = owner.get(URL + "new/").text
    assert "Agendamento confirmado pelo paciente" in form
    page = owner.post(URL + "new/", data={"csrf_token": _token(owner), "url": PUBLIC, "active": "y",
                                          "event_types": ["appointment.confirmed", "appointment.cancelled"]})
    assert page.status_code == 200 and page.headers["Cache-Control"] == "no-store"
    secret = page.text.split('id="lembra-webhook-secret"')[1].split('value="')[1].split('"')[0]
    assert secret.startswith("whsec_")
    with rt.db.connect() as conn:
        row = conn.execute(select(webhook_endpoints).where(webhook_endpoints.c.org_id == a.world.org_id)).one()
        assert endpoints.endpoint_secret(rt.keyring, row) == secret
        changes = conn.execute(select(audit_log.c.changes).where(
            audit_log.c.entity == "webhook_endpoints", audit_log.c.entity_id == row.id)).scalar_one()
    assert list(row.event_types) == ["appointment.confirmed", "appointment.cancelled"]
    assert secret not in str(changes) and PUBLIC not in str(changes)
    for path in (URL, f"{URL}{row.id}/edit/", f"{URL}{row.id}/deliveries/"):
        shown = owner.get(path)
        assert shown.status_code == 200 and secret not in shown.text and "whsec_" not in shown.text, path


def test_an_internal_url_or_no_event_is_refused_and_nothing_is_written(rt, owner, tenants):
    a, _ = tenants
    internal = owner.post(URL + "new/", data={"csrf_token": _token(owner), "url": "http://169.254.169.254/latest",
                                              "event_types": ["appointment.confirmed"]})
    assert internal.status_code == 200 and "whsec_" not in internal.text and "is-invalid" in internal.text
    none = owner.post(URL + "new/", data={"csrf_token": _token(owner), "url": PUBLIC})
    assert "Escolha pelo menos um destes eventos" in none.text
    credentials = owner.post(URL + "new/", data={"csrf_token": _token(owner), "url": "https://u:p@93.184.216.34/",
                                                 "event_types": ["appointment.confirmed"]})
    assert "whsec_" not in credentials.text
    assert _count(rt, webhook_endpoints, a.world.org_id) == 0
    endpoint_id = _endpoint(rt, a.world.org_id)
    owner.post(f"{URL}{endpoint_id}/edit/", data={"csrf_token": _token(owner), "url": "http://10.0.0.1/x",
                                                  "event_types": ["appointment.booked"], "active": "y"})
    with rt.db.connect() as conn:
        row = conn.execute(select(webhook_endpoints).where(webhook_endpoints.c.id == endpoint_id)).one()
    assert (row.url, list(row.event_types)) == (PUBLIC, ["appointment.confirmed"])


def test_deliveries_read_as_sentences_and_a_given_up_one_is_sent_again(rt, owner, tenants):
    a, _ = tenants
    endpoint_id = _endpoint(rt, a.world.org_id)
    dead = _delivery(rt, a.world.org_id, endpoint_id, status="dead", attempts=1, last_status_code=410,
                     last_error="webhook_refused")
    _delivery(rt, a.world.org_id, endpoint_id, status="delivered", attempts=1, last_status_code=200)
    page = owner.get(f"{URL}{endpoint_id}/deliveries/").text
    assert "Não entregue: o Lembra parou de tentar." in page and "HTTP 410" in page
    assert "O sistema da clínica recusou o aviso" in page
    assert "Entregue: o sistema da clínica confirmou o recebimento." in page
    assert "webhook_refused" not in page and ">dead<" not in page and "appointment_id" not in page
    response = owner.post(f"{URL}{endpoint_id}/resend/", data={"csrf_token": _token(owner), "delivery": dead})
    assert response.status_code == 302
    with rt.db.connect() as conn:
        rows = conn.execute(select(webhook_deliveries).where(webhook_deliveries.c.endpoint_id == endpoint_id)
                            .order_by(webhook_deliveries.c.id)).all()
        audited = conn.execute(select(audit_log.c.changes).where(audit_log.c.action == "resend")).scalar_one()
    assert len(rows) == 3
    new, old = rows[-1], rows[0]
    assert (new.status, new.attempts, new.event_type, new.payload) == ("pending", 0, old.event_type, old.payload)
    assert audited == {"endpoint_id": endpoint_id, "from": dead}
    # A delivery still queued is not queued twice.
    owner.post(f"{URL}{endpoint_id}/resend/", data={"csrf_token": _token(owner), "delivery": new.id})
    assert _count(rt, webhook_deliveries, a.world.org_id) == 3


def test_another_orgs_endpoint_and_delivery_answer_404(rt, owner, tenants):
    a, b = tenants
    theirs = _endpoint(rt, b.world.org_id)
    their_delivery = _delivery(rt, b.world.org_id, theirs, status="dead")
    mine = _endpoint(rt, a.world.org_id)
    token = _token(owner)
    assert owner.get(f"{URL}{theirs}/edit/").status_code == 404
    assert owner.get(f"{URL}{theirs}/deliveries/").status_code == 404
    assert owner.post(f"{URL}{theirs}/edit/", data={"csrf_token": token, "url": PUBLIC,
                                                    "event_types": ["appointment.booked"]}).status_code == 404
    assert owner.post(f"{URL}{theirs}/resend/", data={"csrf_token": token, "delivery": their_delivery}).status_code == 404
    # Their delivery through my endpoint: still not mine.
    assert owner.post(f"{URL}{mine}/resend/", data={"csrf_token": token, "delivery": their_delivery}).status_code == 404
    assert owner.post(f"{URL}{mine}/resend/", data={"csrf_token": token, "delivery": "abc"}).status_code == 404
    assert owner.get(f"{URL}99999999999999999999/deliveries/").status_code == 404
    assert _count(rt, webhook_deliveries, b.world.org_id) == 1


def test_posts_without_csrf_are_refused(rt, owner, tenants):
    a, _ = tenants
    assert owner.post(URL + "new/", data={"url": PUBLIC, "event_types": ["appointment.booked"]}).status_code == 400
    endpoint_id = _endpoint(rt, a.world.org_id)
    dead = _delivery(rt, a.world.org_id, endpoint_id, status="dead")
    assert owner.post(f"{URL}{endpoint_id}/resend/", data={"delivery": dead}).status_code == 400
    assert _count(rt, webhook_endpoints, a.world.org_id) == 1 and _count(rt, webhook_deliveries, a.world.org_id) == 1


def test_agents_get_403(rt, agent, tenants):
    a, _ = tenants
    endpoint_id = _endpoint(rt, a.world.org_id)
    dead = _delivery(rt, a.world.org_id, endpoint_id, status="dead")
    for path in (URL, URL + "new/", f"{URL}{endpoint_id}/deliveries/"):
        assert agent.get(path).status_code == 403, path
    token = csrf(agent.get("/admin/queue/").text)
    assert agent.post(f"{URL}{endpoint_id}/resend/", data={"csrf_token": token, "delivery": dead}).status_code == 403
    assert URL not in agent.get("/admin/").text
    assert _count(rt, webhook_deliveries, a.world.org_id) == 1
