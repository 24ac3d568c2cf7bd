"""Property-based run (schemathesis) against the served `/api/v1/openapi.json`: for valid and
invalid generated requests alike, no 5xx, and every answer matches its documented status code,
media type and schema. One test per documented operation and generation mode."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis import checks as st_checks

import admin.api  # noqa: F401  (registers the operations)
from admin.api.openapi import OPERATIONS
from engine.flows.agents import create_agent
from tests.api.conftest import api_for
from tests.factories import sandbox_headers
from tests.flows.helpers import linear, node

CHECKS = [
    st_checks.not_a_server_error,
    st_checks.status_code_conformance,
    st_checks.content_type_conformance,
    st_checks.response_schema_conformance,
    st_checks.response_headers_conformance,
    st_checks.negative_data_rejection,
]
ROUTES = [(op.method, "/api/v1" + op.path) for op in OPERATIONS]


@pytest.fixture
def served(rt, app, client, clinic):
    """The org's key and a few rows, so that generated ids sometimes hit real ones."""
    key = api_for(rt, client, clinic)
    contact = key.post("/contacts", {"external_id": "pac-1", "phone": "+5516999887766",
                                     "consent": ["whatsapp"]}).get_json()
    key.post("/appointments", {"external_id": "ag-1", "contact_external_id": "pac-1",
                               "starts_at": "2026-12-03T14:30:00-03:00"})
    key.post("/messages", {"contact_id": contact["id"], "channel_kind": "whatsapp", "text": "oi"},
             headers={"Idempotency-Key": "seed"})
    graph = linear(node("inicio", "trigger"), node("espera", "wait", mode="fixed", minutes=60),
                   node("fim", "end", outcome="exhausted"))
    flow = key.post("/flows", {"name": "Retorno", "draft_graph": graph}).get_json()
    key.post(f"/flows/{flow['id']}/publish")
    key.post("/enrollments", {"flow_id": flow["id"], "contact_id": contact["id"]},
             headers={"Idempotency-Key": "seed"})
    key.post("/professionals", {"name": "Dra. Beatriz Costa", "hours": [
        {"weekday": 2, "starts": "08:00", "ends": "12:00"}, {"weekday": 2, "starts": "13:00", "ends": "18:00"}]})
    with rt.db.begin() as conn:  # an agent (with a model key) and a reply waiting for a person
        create_agent(conn, rt.keyring, clinic.org_id, name="Assistente", llm_api_key="sk-x", flow_ids=[flow["id"]])
    channel_id = clinic.channels["whatsapp"]
    client.post(f"/webhooks/sandbox/{channel_id}", data=json.dumps({
        "type": "message", "id": "wamid-seed", "from": "+5516999887766", "text": "Posso remarcar?"}),
        headers={"Content-Type": "application/json", **sandbox_headers(rt, channel_id)})
    return key


def _unsent_query(query: dict | None, url: str) -> bool:
    """Whether a generated query parameter is missing from the URL actually requested."""
    sent = parse_qs(urlsplit(url).query, keep_blank_values=True)
    return bool(query) and any(name not in sent for name in query)


def test_every_route_is_documented(app):
    served = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint.startswith("api.") and rule.rule != "/api/v1/openapi.json":
            path = rule.rule.replace("<int:", "{").replace(">", "}")
            served |= {(method.lower(), path) for method in rule.methods - {"HEAD", "OPTIONS"}}
    assert served == set(ROUTES) and len(ROUTES) == 57


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
@pytest.mark.parametrize("method, path", ROUTES)
def test_api_conforms_to_its_openapi_document(app, served, method, path, mode):
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)  # the served document
    operation = schema[path][method]
    auth = {"Authorization": f"Bearer {served.key}"}

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    def run(case):
        response = case.call(headers=auth)
        if mode == GenerationMode.NEGATIVE and response.status_code == 413 and "413" in operation.definition.raw.get(
                "responses", {}):
            # An invalid body big enough to pass the size limit is refused before it is read: a
            # documented refusal, which the negative-data check does not count among its statuses.
            return
        if mode == GenerationMode.NEGATIVE and _unsent_query(case.query, response.request.url):
            # The invalid part was a query parameter the client left out of the URL (a null value
            # is not sent): the server never saw it, so there was nothing for it to refuse.
            return
        case.validate_response(response, checks=CHECKS)

    run()
