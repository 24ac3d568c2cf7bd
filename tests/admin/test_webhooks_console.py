"""Webhooks (Configuração): endpoints saved through the engine (the egress guard on the URL, events
from the engine's list), the secret shown once, deliveries said in words with the receiver's answer
on each one's page, "Reenviar" sending the same delivery again; another org's ids a 404, CSRF and
the role checked."""

from __future__ import annotations

import re

from sqlalchemy import func, select, update

from engine.store.models import audit_log, users, webhook_deliveries, webhook_endpoints
from engine.tenants.webhooks import delivery, endpoints, events
from tests.admin.conftest import csrf
from tests.fakes.server import FakeServer, Reply

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


def _status(rt, delivery_id: int) -> str:
    with rt.db.connect() as conn:
        return conn.execute(select(webhook_deliveries.c.status)
                            .where(webhook_deliveries.c.id == delivery_id)).scalar_one()


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
    assert "mesmo identificador (webhook-id)" in page  # what Reenviar does, said before it is pressed
    with rt.db.connect() as conn:
        before = conn.execute(select(webhook_deliveries).where(webhook_deliveries.c.id == dead)).one()
    response = owner.post(f"{URL}{endpoint_id}/resend/", data={"csrf_token": _token(owner), "delivery": dead})
    assert response.status_code == 302 and response.headers["Location"].endswith(f"{URL}{endpoint_id}/deliveries/")
    with rt.db.connect() as conn:
        again = conn.execute(select(webhook_deliveries).where(webhook_deliveries.c.id == dead)).one()
        audited = conn.execute(select(audit_log.c.changes, audit_log.c.entity_id)
                               .where(audit_log.c.action == "resend")).one()
    # The same delivery, the same webhook-id, one more attempt to come: no new row.
    assert _count(rt, webhook_deliveries, a.world.org_id) == 2
    assert (again.status, again.webhook_id, again.payload, again.resend_base) == \
        ("pending", before.webhook_id, before.payload, 1)
    assert tuple(audited) == ({"endpoint_id": endpoint_id, "status": "dead", "attempts": 1}, dead)
    assert "mais uma tentativa" in owner.get(f"{URL}{endpoint_id}/deliveries/").text
    # A delivery still queued is not queued twice.
    twice = owner.post(f"{URL}{endpoint_id}/resend/", data={"csrf_token": _token(owner), "delivery": dead},
                       follow_redirects=True)
    assert "ainda está na fila" in twice.text
    assert _count(rt, webhook_deliveries, a.world.org_id) == 2


def test_a_deliverys_page_shows_what_the_receiver_answered_as_text(rt, owner, tenants):
    a, _ = tenants
    answer = '<script>alert(1)</script> {"error_code": "agenda_fora_do_ar"}'
    with FakeServer(lambda request: Reply(503, answer, {"Content-Type": "text/plain"})) as server:
        with rt.db.begin() as conn:
            endpoint_id = endpoints.create_endpoint(conn, rt.keyring, a.world.org_id, url=server.url,
                                                    event_types=["appointment.confirmed"],
                                                    egress=rt.settings.egress).endpoint_id
        delivery_id = _delivery(rt, a.world.org_id, endpoint_id)
        assert delivery.deliver_claimed(rt, delivery.claim_due(rt, limit=10)) == {delivery_id: "retry"}
    listed = owner.get(f"{URL}{endpoint_id}/deliveries/").text
    assert f"{URL}{endpoint_id}/deliveries/{delivery_id}/" in listed and "agenda_fora_do_ar" not in listed
    page = owner.get(f"{URL}{endpoint_id}/deliveries/{delivery_id}/")
    assert page.status_code == 200 and page.headers["Cache-Control"] == "no-store"
    body = page.text.split('id="lembra-delivery-body"')[1].split("</pre>")[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>alert" not in page.text
    assert "HTTP 503" in page.text and "<samp>Service Unavailable</samp>" in page.text
    assert "O sistema da clínica respondeu com um erro dele." in page.text and " ms<" in page.text
    # The page's own words: no raw code outside the receiver's text and the webhook-id.
    words = re.sub(r"(?s)<(pre|code|samp|script)\b.*?</\1>|<[^>]+>", " ", page.text)
    assert not re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", words)
    with rt.db.begin() as conn:
        conn.execute(update(users).where(users.c.email == "owner@a.com.br").values(locale="en"))
    english = owner.get(f"{URL}{endpoint_id}/deliveries/{delivery_id}/").text
    assert "Answer to the last attempt" in english and "Resposta à última tentativa" not in english


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
    assert owner.get(f"{URL}{theirs}/deliveries/{their_delivery}/").status_code == 404
    assert owner.get(f"{URL}{mine}/deliveries/{their_delivery}/").status_code == 404
    # Their delivery through my endpoint: still not mine.
    assert owner.post(f"{URL}{mine}/resend/", data={"csrf_token": token, "delivery": their_delivery}).status_code == 404
    assert owner.post(f"{URL}{mine}/resend/", data={"csrf_token": token, "delivery": "abc"}).status_code == 404
    assert owner.get(f"{URL}99999999999999999999/deliveries/").status_code == 404
    assert owner.get(f"{URL}{mine}/deliveries/99999999999999999999/").status_code == 404
    assert _count(rt, webhook_deliveries, b.world.org_id) == 1 and _status(rt, their_delivery) == "dead"


def test_posts_without_csrf_are_refused(rt, owner, tenants):
    a, _ = tenants
    assert owner.post(URL + "new/", data={"url": PUBLIC, "event_types": ["appointment.booked"]}).status_code == 400
    endpoint_id = _endpoint(rt, a.world.org_id)
    dead = _delivery(rt, a.world.org_id, endpoint_id, status="dead")
    assert owner.post(f"{URL}{endpoint_id}/resend/", data={"delivery": dead}).status_code == 400
    assert _count(rt, webhook_endpoints, a.world.org_id) == 1 and _count(rt, webhook_deliveries, a.world.org_id) == 1
    assert _status(rt, dead) == "dead"


def test_agents_get_403(rt, agent, tenants):
    a, _ = tenants
    endpoint_id = _endpoint(rt, a.world.org_id)
    dead = _delivery(rt, a.world.org_id, endpoint_id, status="dead")
    for path in (URL, URL + "new/", f"{URL}{endpoint_id}/deliveries/", f"{URL}{endpoint_id}/deliveries/{dead}/"):
        assert agent.get(path).status_code == 403, path
    token = csrf(agent.get("/admin/queue/").text)
    assert agent.post(f"{URL}{endpoint_id}/resend/", data={"csrf_token": token, "delivery": dead}).status_code == 403
    assert URL not in agent.get("/admin/").text
    assert _count(rt, webhook_deliveries, a.world.org_id) == 1 and _status(rt, dead) == "dead"
