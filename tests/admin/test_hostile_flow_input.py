"""Hostile input to the flow builder's JSON endpoints and to the flows REST API (issue 30, point 6).

Each input that answered a 500 or a 15 MB refusal — NaN, Infinity, 1e999, `\\u0000`, lone
surrogates, a node id that is an object, a config nested 600 deep, 200,000 `[`, rollback versions
past 2**31 and 2**63, thousands of unknown keys, a body past the size limit — is sent as the
builder sends it (the console's session and its CSRF token) and as a clinic's software sends it
(the API key). Each answer is a 4xx with the catalogue's sentence (the builder's `error` in the
reader's language; the API's `details` in pt-BR and English), a bounded size, and nothing saved:
the draft unchanged, no version, no audit row. Then hypothesis throws arbitrary JSON at the
validator and both endpoints: never a 5xx, and every example within its deadline.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, update

from engine.flows import versions
from engine.flows.schema import NODE_TYPES
from engine.flows.validate import validate_for_publish
from engine.store.models import audit_log, flow_pointers, flow_versions, users
from tests.admin.conftest import csrf, login
from tests.admin.test_flow_builder import GOOD_GRAPH, _token, _url
from tests.api.conftest import api_for

#: No refusal may be bigger than this (one was 15 MB).
MAX_ANSWER_BYTES = 64 * 1024
#: A refusal lists this many issues (engine.flows.issues.MAX_ISSUES, the issue's "first 50"), then a count.
MAX_ISSUES = 50

NODE = '{"id": "t", "type": "trigger", "config": %s}'
GRAPH = '{"draft_graph": {"nodes": [%s], "edges": []}}'
UNKNOWN_KEYS = ", ".join(f'"campo_{i}": 1' for i in range(45_000))  # about 770 kB, as in the issue


def _graph_with_config(config: str) -> str:
    return GRAPH % (NODE % config)


#: name → (body, status, code): the code is the catalogue's (`body_*`) or, for a refused draft, one of
#: its issues'. The same body goes to the builder's draft and to the API's PATCH.
DRAFT_CASES: dict[str, tuple[str, int, str]] = {
    "nan": ('{"max_steps": NaN}', 422, "body_invalid_value"),
    "infinity": ('{"draft_graph": {"nodes": [{"id": "t", "type": "trigger", "position": {"x": Infinity, "y": 0}, '
                 '"config": {}}], "edges": []}}', 422, "body_invalid_value"),
    "minus_infinity": ('{"resume_grace_minutes": -Infinity}', 422, "body_invalid_value"),
    "1e999": ('{"resume_grace_minutes": 1e999}', 422, "body_invalid_value"),
    "int_past_64_bits": ('{"max_steps": 18446744073709551616}', 422, "body_invalid_value"),
    "nul_in_name": ('{"name": "Retorno\\u0000"}', 422, "body_invalid_value"),
    "nul_in_config": (_graph_with_config('{"note": "a\\u0000b"}'), 422, "body_invalid_value"),
    "nul_in_key": (_graph_with_config('{"\\u0000": 1}'), 422, "body_invalid_value"),
    "lone_surrogate": ('{"name": "Retorno \\ud800"}', 422, "body_invalid_value"),
    "lone_surrogate_in_config": (_graph_with_config('{"hint": "\\udfff"}'), 422, "body_invalid_value"),
    "lone_surrogate_in_key": ('{"trigger_config": {"kind": "manual", "\\ud83d": 1}}', 422, "body_invalid_value"),
    "node_id_object": ('{"draft_graph": {"nodes": [{"id": {"$ne": null}, "type": "trigger", "config": {}}], '
                       '"edges": [{"source": {"$ne": null}, "target": "t", "condition": {"type": "always"}}]}}',
                       422, "invalid_node"),
    "node_id_list": ('{"draft_graph": {"nodes": [{"id": ["t"], "type": "trigger", "config": {}}], "edges": []}}',
                     422, "invalid_node"),
    "config_600_deep": (_graph_with_config('{"k": ' + "[" * 600 + "]" * 600 + "}"), 400, "body_too_deep"),
    "trigger_600_deep": ('{"trigger_config": {"kind": "manual", "conditions": ' + "[" * 600 + "]" * 600 + "}}",
                         400, "body_too_deep"),
    "200000_brackets": ("[" * 200_000, 400, "body_too_deep"),
    "200000_brackets_closed": ("[" * 200_000 + "]" * 200_000, 400, "body_too_deep"),
    "not_json": ('{"name": ', 400, "body_not_json"),
    "unknown_keys_in_a_node": (GRAPH % ('{"id": "t", "type": "trigger", "config": {}, ' + UNKNOWN_KEYS + "}"),
                               422, "invalid_node"),
    "unknown_keys_in_the_trigger": ('{"trigger_config": {"kind": "manual", ' + UNKNOWN_KEYS + "}}",
                                    422, "invalid_trigger"),
    "too_large": ('{"name": "' + "x" * (1024 * 1024 + 1) + '"}', 413, "body_too_large"),
}


@pytest.fixture
def setup(rt, app, tenants):
    """Tenant A's flow with one published version, the owner in the builder, and A's API key."""
    a, _ = tenants
    with rt.db.begin() as conn:
        flow_id = versions.create_flow(conn, a.world.org_id, name="Pós-consulta", draft_graph=GOOD_GRAPH)
        versions.publish(conn, a.world.org_id, flow_id)
    owner = login(app.test_client(), "owner@a.com.br")
    return {"flow_id": flow_id, "owner": owner, "token": _token(owner, flow_id),
            "api": api_for(rt, app.test_client(), a.world), "org_id": a.world.org_id}


def _builder(setup: dict[str, Any], action: str, raw: str | bytes, flow_id: Any = None) -> Any:
    headers = {"X-CSRFToken": setup["token"], "Content-Type": "application/json"}
    return _call(setup["owner"].post, _url(setup["flow_id"] if flow_id is None else flow_id, action), raw, headers)


def _api(setup: dict[str, Any], method: str, path: str, raw: str | bytes) -> Any:
    api = setup["api"]
    headers = {"Authorization": f"Bearer {api.key}", "Content-Type": "application/json"}
    return _call(getattr(api.client, method), f"/api/v1{path}", raw, headers)


class _Crashed:
    """What a request that raised looks like here (TESTING propagates what production answers 500)."""

    def __init__(self, exc: BaseException) -> None:
        self.status_code, self.data, self.exc = 500, repr(exc).encode(), exc

    def get_json(self) -> None:
        return None


def _call(send: Any, url: str, raw: str | bytes, headers: dict[str, str]) -> Any:
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    try:
        return send(url, data=data, headers=headers)
    except Exception as exc:  # noqa: BLE001 - a crash is the defect under test, reported as its 500
        return _Crashed(exc)


def _snapshot(rt: Any, org_id: int) -> dict[str, Any]:
    with rt.db.connect() as conn:
        pointers = [dict(row._mapping) for row in conn.execute(
            select(flow_pointers).where(flow_pointers.c.org_id == org_id).order_by(flow_pointers.c.id))]
        count = lambda table: conn.execute(select(func.count()).select_from(table)  # noqa: E731
                                           .where(table.c.org_id == org_id)).scalar()
        return {"pointers": pointers, "versions": count(flow_versions), "audit": count(audit_log)}


def _assert_readable_builder(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, (response.status_code, response.data[:300])
    assert len(response.data) <= MAX_ANSWER_BYTES, len(response.data)
    answer = response.get_json()
    assert isinstance(answer["error"], str) and answer["error"][0].isupper() and answer["error"].endswith(".")
    if code.startswith("body_"):
        assert answer["code"] == code
        first_words = {"body_invalid_value": "O pedido não foi aceito (", "body_too_deep": "O JSON do pedido aninha",
                       "body_not_json": "O pedido não é um JSON", "body_too_large": "O pedido passa do limite"}
        assert answer["error"].startswith(first_words[code]), answer["error"]
    else:
        assert answer["error"] == "O rascunho não foi salvo: corrija os problemas apontados."
        assert code in {issue["code"] for issue in answer["issues"]}
        assert all(" " in issue["message"] for issue in answer["issues"])  # sentences, not codes
        assert len(answer["issues"]) <= MAX_ISSUES + 1


def _assert_readable_api(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, (response.status_code, response.data[:300])
    assert len(response.data) <= MAX_ANSWER_BYTES, len(response.data)
    answer = response.get_json()
    assert set(answer) == {"error", "details"} and answer["error"]
    details = answer["details"]
    problems = [details] if code.startswith("body_") else details
    assert code in {problem["code"] for problem in problems}
    if not code.startswith("body_"):
        assert len(problems) <= MAX_ISSUES + 1
    for problem in problems:
        assert " " in problem["message"] and " " in problem["message_en"]
        assert problem["message"] != problem["message_en"]  # pt-BR and English


@pytest.mark.parametrize("case", list(DRAFT_CASES))
def test_a_hostile_draft_is_a_readable_4xx_and_nothing_is_saved(rt, setup, case):
    raw, status, code = DRAFT_CASES[case]
    before = _snapshot(rt, setup["org_id"])

    builder = _builder(setup, "draft", raw)
    _assert_readable_builder(builder, status, code)
    api = _api(setup, "patch", f"/flows/{setup['flow_id']}", raw)
    _assert_readable_api(api, status, code)
    if code.startswith("body_"):  # the same sentence through both doors
        assert builder.get_json()["error"] == api.get_json()["details"]["message"]
    created = _api(setup, "post", "/flows", raw)
    assert 400 <= created.status_code < 500 and len(created.data) <= MAX_ANSWER_BYTES, created.status_code

    assert _snapshot(rt, setup["org_id"]) == before


def test_the_many_issues_of_a_huge_refusal_end_with_a_count_of_the_rest(setup):
    raw, _, _ = DRAFT_CASES["unknown_keys_in_a_node"]
    issues = _builder(setup, "draft", raw).get_json()["issues"]
    assert len(issues) == MAX_ISSUES + 1 and issues[-1]["code"] == "more_issues"
    assert issues[-1]["message"] == f"E mais {45_000 - MAX_ISSUES} problemas, mostrados depois que estes forem corrigidos."
    details = _api(setup, "patch", f"/flows/{setup['flow_id']}", raw).get_json()["details"]
    assert details[-1]["message_en"] == f"And {45_000 - MAX_ISSUES} more problems, shown once these are fixed."
    # The API's own field errors are bounded too: 45,000 unknown top-level keys.
    fields = _api(setup, "patch", f"/flows/{setup['flow_id']}", "{" + UNKNOWN_KEYS + "}")
    assert fields.status_code == 422 and len(fields.data) <= MAX_ANSWER_BYTES
    more = fields.get_json()["details"]["_more"]
    assert more["count"] == 45_000 - 50 and more["message_en"].startswith("And 44950 more problems")


def test_a_builder_reader_in_english_reads_the_refusal_in_english(rt, setup):
    with rt.db.begin() as conn:
        conn.execute(update(users).where(users.c.email == "owner@a.com.br").values(locale="en"))
    answer = _builder(setup, "draft", '{"max_steps": NaN}').get_json()
    assert answer["error"] == "The request was not accepted (max_steps: use a finite number; NaN and Infinity do " \
                              "not exist in JSON)."
    deep = _builder(setup, "draft", "[" * 200_000).get_json()
    assert deep["error"] == "The request's JSON nests more than 32 levels deep. Send a simpler document."


@pytest.mark.parametrize("version", [2**31, 2**31 + 1, 2**32, 2**63 - 1])
def test_a_rollback_to_a_version_no_column_holds_is_a_4xx_not_a_database_error(rt, setup, version):
    before = _snapshot(rt, setup["org_id"])
    raw = json.dumps({"version": version})
    builder = _builder(setup, "rollback", raw)
    assert builder.status_code == 404 and builder.get_json() == {"error": "Versão não encontrada."}
    api = _api(setup, "post", f"/flows/{setup['flow_id']}/rollback", raw)
    assert api.status_code == 422 and "version" in api.get_json()["details"]
    assert _snapshot(rt, setup["org_id"]) == before


@pytest.mark.parametrize("version", [2**63, 2**64, -(2**63) - 1, 10**30])
def test_a_rollback_to_a_version_past_64_bits_is_refused_when_read(rt, setup, version):
    before = _snapshot(rt, setup["org_id"])
    raw = '{"version": %d}' % version
    _assert_readable_builder(_builder(setup, "rollback", raw), 422, "body_invalid_value")
    _assert_readable_api(_api(setup, "post", f"/flows/{setup['flow_id']}/rollback", raw), 422, "body_invalid_value")
    assert _snapshot(rt, setup["org_id"]) == before


@pytest.mark.parametrize("flow_id", [2**31, 2**31 - 1 + 2**31, 2**63 - 1, 2**63, 2**64, 10**30])
def test_a_flow_id_no_row_has_is_a_json_404_on_both(rt, setup, flow_id):
    before = _snapshot(rt, setup["org_id"])
    for action, raw in (("draft", '{"name": "x"}'), ("publish", "{}"), ("rollback", '{"version": 1}'),
                        ("disable", '{"live": "cancel"}')):
        builder = _builder(setup, action, raw, flow_id=flow_id)
        assert builder.status_code == 404 and builder.get_json() == {"error": "Fluxo não encontrado."}, action
    assert setup["owner"].get(_url(flow_id, "data")).status_code == 404
    for method, path, raw in (("patch", "", '{"name": "x"}'), ("post", "/publish", ""),
                              ("post", "/rollback", '{"version": 1}'), ("post", "/disable", "{}"), ("get", "", "")):
        api = _api(setup, method, f"/flows/{flow_id}{path}", raw)
        assert api.status_code == 404 and api.get_json() == {"error": "not found", "details": None}, path
    assert _snapshot(rt, setup["org_id"]) == before


def test_ids_in_bodies_past_the_columns_range_are_4xx(rt, setup):
    # The API's enrollments take a flow and a contact id.
    api = setup["api"]
    headers = {"Idempotency-Key": "hostil-1"}
    for flow_id in (2**31, 2**63 - 1):
        response = api.post("/enrollments", {"flow_id": flow_id, "contact_id": 2**31}, headers=headers)
        assert 400 <= response.status_code < 500, response.status_code
    raw = b'{"flow_id": 99999999999999999999, "contact_id": 1}'
    response = api.client.post("/api/v1/enrollments", data=raw, headers={
        "Authorization": f"Bearer {api.key}", "Content-Type": "application/json", **headers})
    _assert_readable_api(response, 422, "body_invalid_value")


def test_the_other_json_endpoints_of_the_api_read_bodies_the_same_strict_way(setup):
    # contacts and appointments upserts, events and messages share the one parser.
    for path in ("/contacts", "/appointments", "/events", "/messages", "/enrollments"):
        for raw, status, code in (('{"external_id": NaN}', 422, "body_invalid_value"),
                                  ('{"external_id": "a\\ud800"}', 422, "body_invalid_value"),
                                  ("[" * 200_000, 400, "body_too_deep")):
            response = _api(setup, "post", path, raw)
            _assert_readable_api(response, status, code)


def test_a_new_flows_name_with_a_nul_is_refused_by_the_list_form(rt, setup):
    owner = setup["owner"]
    page = owner.get("/admin/followup/flows/").text
    before = _snapshot(rt, setup["org_id"])
    refused = owner.post("/admin/followup/flows/new/", data={"name": "Retorno\x00", "csrf_token": csrf(page)},
                         follow_redirects=True)
    assert refused.status_code == 200 and "Dê ao fluxo um nome de 1 a 120 caracteres." in refused.text
    assert _snapshot(rt, setup["org_id"]) == before


# --- arbitrary JSON: never a 5xx, each example within its deadline ------------------------------------

_text = st.text(alphabet=st.one_of(st.characters(codec=None, exclude_categories=()),
                                   st.sampled_from(["\x00", "\ud800", "\udfff", "\ud83d"])), max_size=6)
_KEYS = ("id", "type", "config", "nodes", "edges", "source", "target", "condition", "position", "x", "y", "mode",
         "minutes", "kind", "classes", "checks", "value", "field", "op", "template", "outcome", "label")
#: The values this issue is about, drawn as often as all the others together.
_hostile = st.sampled_from([float("nan"), float("inf"), float("-inf"), 2**31, 2**63, -(2**63) - 1, 10**30, 1e308,
                            "\x00", "a\ud800", "\udfff", {"$ne": None}, ["t"], [[[[[[]]]]]]])
_scalar = _hostile | st.none() | st.booleans() | st.floats() | st.integers() | _text
_json = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_text | st.sampled_from(_KEYS), inner, max_size=4), max_leaves=20)
_node = st.fixed_dictionaries(
    {"id": st.sampled_from(["t", "a", "b"]) | _hostile | _json, "type": st.sampled_from(NODE_TYPES) | _json,
     "config": _json | st.just({}) | st.just({"mode": "fixed", "minutes": 60})},
    optional={"position": st.fixed_dictionaries({"x": _scalar, "y": _scalar}) | _json, "label": _json})
_edge = st.fixed_dictionaries(
    {"source": st.sampled_from(["t", "a", "b"]) | _json, "target": st.sampled_from(["t", "a", "b"]) | _json,
     "condition": st.fixed_dictionaries({"type": st.sampled_from(["always", "no_reply", "class_match"]) | _json},
                                        optional={"value": _json})})
_graph = st.fixed_dictionaries({"nodes": st.lists(_node, max_size=4) | _json, "edges": st.lists(_edge, max_size=3)})
_body = st.one_of(
    _json,
    st.fixed_dictionaries({}, optional={
        "name": _text | _json, "draft_graph": _graph | _json,
        "trigger_config": st.fixed_dictionaries({"kind": st.sampled_from(["manual", "silence"]) | _json},
                                                optional={"minutes": _scalar, "conditions": _json}) | _json,
        "handoff_policy": st.sampled_from(["pause", "cancel"]) | _json, "cancel_on_reply": _scalar,
        "max_steps": _scalar, "resume_grace_minutes": _scalar}))


@settings(max_examples=40, deadline=timedelta(seconds=5),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(body=_body)
# What answered 500 before (issue 30): always tried, whatever else is drawn.
@example(body={"name": "Retorno \ud800"})
@example(body={"draft_graph": {"nodes": [{"id": ["t"], "type": "trigger", "config": {}}], "edges": []}})
@example(body={"draft_graph": {"nodes": [{"id": "t", "type": "trigger", "config": {"k": "\x00"}}], "edges": []}})
def test_arbitrary_json_is_a_2xx_or_a_4xx_never_a_5xx(setup, body):
    if isinstance(body, dict):  # the validator itself, on whatever the body would make a graph of
        graph, trigger = body.get("draft_graph", GOOD_GRAPH), body.get("trigger_config", {"kind": "manual"})
        issues = validate_for_publish(graph, trigger_config=trigger, max_steps=body.get("max_steps", 30))
        assert len(issues) <= MAX_ISSUES + 1
    raw = json.dumps(body)  # NaN and Infinity as Python writes them; lone surrogates as \\udXXX escapes
    answers = [_builder(setup, "draft", raw), _api(setup, "patch", f"/flows/{setup['flow_id']}", raw),
               _api(setup, "post", "/flows", raw)]
    if any(answer.status_code == 200 for answer in answers[:2]):  # a saved draft must publish or say why
        answers += [_builder(setup, "publish", "{}"), _api(setup, "post", f"/flows/{setup['flow_id']}/publish", "")]
    event(f"builder draft {answers[0].status_code}, API patch {answers[1].status_code}")
    for answer in answers:
        assert 200 <= answer.status_code < 300 or 400 <= answer.status_code < 500, \
            (answer.status_code, answer.data[:500], raw[:500])
        assert len(answer.data) <= MAX_ANSWER_BYTES
