"""Two tenants and their follow-up flows: a key of org A never sees, changes, publishes, enrolls
into or cancels org B's flows and runs. B's ids answer exactly like ids that do not exist: 404
in a path, the same 422 when a body names them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from engine.store.models import audit_log, enrollments, flow_pointers, flow_versions
from tests.flows.helpers import linear, node

MISSING = 10**9


def _graph() -> dict[str, Any]:
    return linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                  node("fim", "end", outcome="exhausted"))


def _seed(api) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A published flow (the same name in both orgs), a contact and its run."""
    contact = api.post("/contacts", {"external_id": "shared-ext", "consent": ["whatsapp"]}).get_json()
    flow = api.post("/flows", {"name": "Retorno", "draft_graph": _graph()}).get_json()
    assert api.post(f"/flows/{flow['id']}/publish").status_code == 200
    run = api.post("/enrollments", {"flow_id": flow["id"], "contact_id": contact["id"]},
                   headers={"Idempotency-Key": "same-key"}).get_json()
    return contact, flow, run


def _send(api, method: str, path: str, body: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {api.key}"}
    return api.client.open(f"/api/v1{path}", method=method, json=body, headers=headers)


def test_flows_and_runs_are_scoped_to_the_keys_org(rt, api, other):
    a_contact, a_flow, a_run = _seed(api)
    b_contact, b_flow, b_run = _seed(other)
    assert a_flow["id"] != b_flow["id"] and a_run["id"] != b_run["id"]

    with rt.db.connect() as conn:
        before = {table.name: conn.execute(select(table).order_by(table.c.id)).all()
                  for table in (flow_pointers, flow_versions, enrollments)}

    requests = [
        ("GET", "/flows/{flow}", None), ("PATCH", "/flows/{flow}", {"name": "Tomado"}),
        ("POST", "/flows/{flow}/publish", None), ("POST", "/flows/{flow}/disable", {"live": "cancel"}),
        ("POST", "/flows/{flow}/rollback", {"version": 1}), ("GET", "/flows/{flow}/versions", None),
        ("GET", "/enrollments/{run}", None), ("POST", "/enrollments/{run}/cancel", None),
    ]
    for method, template, body in requests:
        theirs = _send(api, method, template.format(flow=b_flow["id"], run=b_run["id"]), body)
        nobodys = _send(api, method, template.format(flow=MISSING, run=MISSING), body)
        assert theirs.status_code == 404, (method, template)
        assert theirs.get_json() == nobodys.get_json(), (method, template)

    lists = {
        "/flows": [a_flow["id"]],
        "/enrollments": [a_run["id"]],
        f"/enrollments?flow_id={b_flow['id']}": [],
        f"/enrollments?contact_id={b_contact['id']}": [],
    }
    for path, ids in lists.items():
        assert [row["id"] for row in api.get(path).get_json()["data"]] == ids, path
    assert api.get("/flows").get_json()["data"][0]["live_enrollments"] == 1

    # Bodies that name B's flow or contact: refused like unknown ids, and nothing is written.
    for field, value in (("flow_id", b_flow["id"]), ("contact_id", b_contact["id"])):
        body = {"flow_id": a_flow["id"], "contact_id": a_contact["id"], field: value}
        theirs = api.post("/enrollments", body, headers={"Idempotency-Key": f"cross-{field}"})
        nobodys = api.post("/enrollments", {**body, field: MISSING}, headers={"Idempotency-Key": f"none-{field}"})
        assert theirs.status_code == 422 and set(theirs.get_json()["details"]) == {field}
        assert theirs.get_json() == nobodys.get_json()
    # A's key reused against A's own flow answers A's run, never B's.
    same = api.post("/enrollments", {"flow_id": a_flow["id"], "contact_id": a_contact["id"]},
                    headers={"Idempotency-Key": "same-key"})
    assert same.status_code == 200 and same.get_json()["id"] == a_run["id"]

    with rt.db.connect() as conn:
        after = {table.name: conn.execute(select(table).order_by(table.c.id)).all()
                 for table in (flow_pointers, flow_versions, enrollments)}
        by_org = dict(conn.execute(select(audit_log.c.api_key_id, audit_log.c.org_id).distinct()).all())
    assert after == before
    assert by_org == {api.key_id: api.world.org_id, other.key_id: other.world.org_id}
    assert other.get(f"/enrollments/{b_run['id']}").get_json()["status"] == "active"
