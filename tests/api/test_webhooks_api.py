"""`/api/v1/webhook-endpoints` and `lembra webhooks`: endpoints per org, the secret shown once, the
delivery log in the catalogue's words, and another org's ids answering 404 (issue 32, acceptance 5)."""

from __future__ import annotations

import json
import logging
import subprocess
from datetime import timedelta

from sqlalchemy import select
from standardwebhooks import Webhook

from engine.store.models import audit_log, webhook_deliveries
from engine.tenants.webhooks import delivery
from engine.words.catalogue import describe
from tests.fakes.server import FakeServer, Reply
from tests.processes import LEMBRA, lembra_env


def _create(api, url: str, events: list[str] | None = None, **more):
    return api.post("/webhook-endpoints", {"url": url, "event_types": events or ["appointment.cancelled"], **more})


def _deliver(rt) -> dict[int, str]:
    return delivery.deliver_claimed(rt, delivery.claim_due(rt, limit=100))


def test_an_endpoint_is_created_with_its_secret_once_and_never_shown_again(rt, clock, api, caplog):
    caplog.set_level(logging.DEBUG)
    created = _create(api, "https://hooks.example.com/lembra", ["appointment.cancelled", "appointment.confirmed"],
                      description="Agenda")
    assert created.status_code == 201, created.get_json()
    body = created.get_json()
    secret = body.pop("secret")
    assert secret.startswith("whsec_")
    assert body == {"id": body["id"], "url": "https://hooks.example.com/lembra", "description": "Agenda",
                    "event_types": ["appointment.confirmed", "appointment.cancelled"], "active": True,
                    "created_at": clock.now().isoformat(), "updated_at": clock.now().isoformat()}
    endpoint_id = body["id"]
    for response in (api.get("/webhook-endpoints"), api.get(f"/webhook-endpoints/{endpoint_id}"),
                     api.patch(f"/webhook-endpoints/{endpoint_id}", {"active": False}),
                     api.get(f"/webhook-endpoints/{endpoint_id}/deliveries")):
        assert response.status_code == 200 and secret not in response.get_data(as_text=True)
    assert api.get("/webhook-endpoints").get_json()["data"][0]["active"] is False
    rotated = api.post(f"/webhook-endpoints/{endpoint_id}/rotate-secret").get_json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != secret
    with rt.db.connect() as conn:
        trail = json.dumps([row.changes for row in conn.execute(select(audit_log))])
    for shown in (secret, rotated["secret"]):
        assert shown not in trail and shown not in caplog.text


def test_an_internal_url_or_an_unknown_event_is_a_422_in_the_catalogues_words(rt, clock, api):
    refused = _create(api, "http://10.0.0.7/hook")
    assert refused.status_code == 422
    [detail] = refused.get_json()["details"]
    assert (detail["code"], detail["field"]) == ("egress_refused", "url")
    assert detail["message"] == str(describe("egress_refused")) and "internal network" in detail["message_en"]
    unknown = _create(api, "https://hooks.example.com/x", ["appointment.exploded"])
    assert unknown.status_code == 422 and "event_types" in unknown.get_json()["details"]
    [made] = [_create(api, "https://hooks.example.com/x").get_json()]
    moved = api.patch(f"/webhook-endpoints/{made['id']}", {"url": "http://169.254.169.254/latest"})
    assert moved.status_code == 422 and moved.get_json()["details"][0]["code"] == "egress_refused"
    assert api.get(f"/webhook-endpoints/{made['id']}").get_json()["url"] == "https://hooks.example.com/x"


def test_the_delivery_log_says_status_attempts_code_and_sentence_without_the_payload(rt, clock, api):
    answers = [200, 400]
    with FakeServer(lambda request: Reply(answers.pop(0))) as server:
        made = _create(api, server.url + "/hooks").get_json()
        first = api.post(f"/webhook-endpoints/{made['id']}/test")
        assert first.status_code == 202
        assert _deliver(rt) == {first.get_json()["delivery_id"]: "delivered"}
        ping = server.requests[0]
        body = Webhook(made["secret"]).verify(ping.body, ping.headers)
        assert body["type"] == "ping" and body["data"] == {"endpoint_id": made["id"]}
        api.post(f"/webhook-endpoints/{made['id']}/test")
        _deliver(rt)
    log = api.get(f"/webhook-endpoints/{made['id']}/deliveries").get_json()
    assert [(d["event_type"], d["status"], d["attempts"], d["last_status_code"], d["last_error"]) for d in log["data"]] \
        == [("ping", "delivered", 1, 200, None), ("ping", "dead", 1, 400, "webhook_refused")]
    assert log["data"][1]["last_error_message"] == str(describe("webhook_refused"))
    assert log["data"][1]["last_error_message_en"].startswith("The clinic's system refused the notice")
    assert log["data"][0]["webhook_id"] == first.get_json()["webhook_id"]
    assert "payload" not in log["data"][0] and log["next_cursor"] is None
    dead = api.get(f"/webhook-endpoints/{made['id']}/deliveries?status=dead&limit=1").get_json()
    assert [d["status"] for d in dead["data"]] == ["dead"]


def test_another_orgs_endpoints_and_deliveries_answer_404(rt, clock, api, other):
    mine = _create(api, "https://hooks.example.com/a").get_json()
    theirs = _create(other, "https://hooks.example.com/b").get_json()
    api.post(f"/webhook-endpoints/{mine['id']}/test")
    for path in (f"/webhook-endpoints/{mine['id']}", f"/webhook-endpoints/{mine['id']}/deliveries"):
        assert other.get(path).status_code == 404
    assert other.patch(f"/webhook-endpoints/{mine['id']}", {"active": False}).status_code == 404
    assert other.post(f"/webhook-endpoints/{mine['id']}/test").status_code == 404
    assert other.post(f"/webhook-endpoints/{mine['id']}/rotate-secret").status_code == 404
    assert other.client.delete(f"/api/v1/webhook-endpoints/{mine['id']}",
                               headers={"Authorization": f"Bearer {other.key}"}).status_code == 404
    assert [e["id"] for e in other.get("/webhook-endpoints").get_json()["data"]] == [theirs["id"]]
    assert other.get(f"/webhook-endpoints/{theirs['id']}/deliveries").get_json()["data"] == []
    assert api.get(f"/webhook-endpoints/{mine['id']}").get_json()["active"] is True  # untouched
    with rt.db.connect() as conn:
        assert conn.execute(select(webhook_deliveries.c.org_id)).scalars().all() == [api.world.org_id]
    # Deleted: its log goes with it, and it answers 404 after.
    deleted = api.client.delete(f"/api/v1/webhook-endpoints/{mine['id']}",
                                headers={"Authorization": f"Bearer {api.key}"})
    assert deleted.status_code == 200 and deleted.get_json() == {"id": mine["id"], "deliveries_deleted": 1}
    assert api.get(f"/webhook-endpoints/{mine['id']}").status_code == 404


def test_an_appointment_cancelled_through_the_api_reaches_the_clinics_system(rt, clock, api):
    with FakeServer(lambda request: Reply(204)) as server:
        made = _create(api, server.url).get_json()
        api.post("/contacts", {"external_id": "pac-1", "phone": "+5516999887766", "consent": ["whatsapp"]})
        created = api.post("/appointments", {"external_id": "ag-1", "contact_external_id": "pac-1",
                                             "starts_at": "2026-12-03T14:30:00-03:00"}).get_json()
        api.post("/appointments", {"external_id": "ag-1", "contact_external_id": "pac-1",
                                   "starts_at": "2026-12-03T14:30:00-03:00", "status": "cancelled"})
        clock.advance(timedelta(seconds=1))
        _deliver(rt)
    [sent] = server.requests
    data = Webhook(made["secret"]).verify(sent.body, sent.headers)["data"]
    assert data == {"appointment_id": created["id"], "appointment_external_id": "ag-1",
                    "contact_id": created["contact_id"], "contact_external_id": "pac-1",
                    "starts_at": "2026-12-03T14:30:00-03:00", "status": "cancelled", "cancel_source": "clinic"}


def test_the_cli_adds_lists_shows_deliveries_and_removes(rt, clock, api, database_url):
    env = lembra_env(database_url)
    slug = "clinica-a"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([LEMBRA, "webhooks", *args], env=env, capture_output=True, text=True, timeout=60)

    added = run("add", "--org", slug, "--url", "https://hooks.example.com/cli", "--event", "run.ended",
                "--event", "contact.opted_out")
    assert added.returncode == 0, added.stderr
    secret = added.stdout.strip().splitlines()[-1]
    assert secret.startswith("whsec_") and secret not in added.stderr
    listed = run("list", "--org", slug, "--json")
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["event_types"] == ["contact.opted_out", "run.ended"] and secret not in listed.stdout
    api.post(f"/webhook-endpoints/{row['id']}/test")
    log = run("deliveries", "--org", slug)
    assert log.returncode == 0 and "\tping\tpending\t0\t" in log.stdout
    refused = run("add", "--org", slug, "--url", "http://127.0.0.1.nip.invalid@10.0.0.1/")
    assert refused.returncode == 2 and "url:" in refused.stderr and "whsec_" not in refused.stdout
    assert run("list", "--org", "clinica-b").returncode == 2  # no such org
    assert run("remove", "--org", slug, "--id", str(row["id"])).returncode == 0
    gone = run("remove", "--org", slug, "--id", str(row["id"]))
    assert gone.returncode == 2 and "no webhook endpoint" in gone.stderr


def test_the_list_filters_by_active_and_refuses_any_other_filter(rt, clock, api):
    on = _create(api, "https://hooks.example.com/on").get_json()
    off = _create(api, "https://hooks.example.com/off", active=False).get_json()
    assert [e["id"] for e in api.get("/webhook-endpoints?active=true").get_json()["data"]] == [on["id"]]
    assert [e["id"] for e in api.get("/webhook-endpoints?active=false").get_json()["data"]] == [off["id"]]
    assert api.get(f"/webhook-endpoints?contact_id={on['id']}").status_code == 422
