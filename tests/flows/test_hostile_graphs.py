"""The flow validator against hostile graphs (issue 30, point 6): an object for a node id, configs
nested hundreds of levels deep, NaN and NUL handed in by a Python caller, and thousands of unknown
keys. It answers issues, never an exception, and a refusal lists at most MAX_ISSUES of them and a
count of the rest."""

from __future__ import annotations

from typing import Any

import pytest

from engine.words.catalogue import known
from engine.flows import issues as flow_issues
from engine.flows.issues import FlowIssue
from engine.flows.schema import ConfigError, check_draft, load_trigger_config, normalize_node_config
from engine.flows.validate import validate_for_publish
from engine.flows.versions import FlowRejected

MANUAL = {"kind": "manual"}
#: The issue's bounds: 50 issues listed, then a count; texts cut; nesting up to 32 levels.
MAX_ISSUES, MAX_PARAM_CHARS, MAX_DEPTH = 50, 80, 32


def _graph(*nodes: dict[str, Any], edges: list[Any] | None = None) -> dict[str, Any]:
    return {"nodes": list(nodes), "edges": edges or []}


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def _codes(issues: list[FlowIssue]) -> list[tuple[Any, str]]:
    return [(issue.node_id, issue.code) for issue in issues]


@pytest.mark.parametrize("bad_id", [{"x": 1}, ["a"], [], {}])
def test_a_node_id_that_is_an_object_or_a_list_is_an_issue_not_a_crash(bad_id: Any) -> None:
    g = _graph({"id": bad_id, "type": "trigger", "config": {}},
               edges=[{"source": bad_id, "target": "b", "condition": {"type": "always"}}])
    issues = validate_for_publish(g, trigger_config=MANUAL, max_steps=30)
    assert (None, "invalid_node") in _codes(issues) and (None, "invalid_edge") in _codes(issues)
    assert _codes(check_draft(g)) == _codes(issues)


@pytest.mark.parametrize("levels", [MAX_DEPTH, 600, 5000])
def test_a_config_nested_deeper_than_the_bound_is_one_issue_on_its_node(levels: int) -> None:
    g = _graph({"id": "t", "type": "trigger", "config": {}},
               {"id": "c", "type": "condition", "config": {"checks": _deep(levels)}})
    for issues in (check_draft(g), validate_for_publish(g, trigger_config=MANUAL, max_steps=30)):
        assert _codes(issues) == [("c", "invalid_node")]
        assert issues[0].params["detail"].msgid.startswith("aninha mais de")


def test_a_trigger_or_node_config_nested_too_deep_is_a_config_error() -> None:
    for load in (lambda: load_trigger_config({"kind": "manual", "conditions": _deep(900)}),
                 lambda: normalize_node_config("condition", {"checks": _deep(900)})):
        with pytest.raises(ConfigError) as caught:
            load()
        assert [p.detail.msgid for p in caught.value.problems] == ["aninha mais de %(max)s níveis; simplifique-o"]


@pytest.mark.parametrize(("value", "detail"), [
    (float("nan"), "detail_not_finite"), (float("inf"), "detail_not_finite"), (2**64, "detail_number_range"),
    ("a\x00b", "detail_unstorable"), ("\ud800", "detail_unstorable"),
])
def test_what_a_database_cannot_store_is_refused_in_the_draft_too(value: Any, detail: str) -> None:
    # A Python caller (the CLI, a test, a future endpoint) does not go through the body's parser.
    g = _graph({"id": "t", "type": "trigger", "config": {"extra": {"k": value}}})
    [issue] = check_draft(g)
    assert (issue.node_id, issue.code, issue.params["field"]) == ("t", "invalid_node", "nodes.0.config.extra.k")
    assert known(detail)
    keyed = _graph({"id": "t", "type": "trigger", "config": {"a\x00": 1}})
    assert _codes(check_draft(keyed)) == [("t", "invalid_node")]


def test_thousands_of_unknown_keys_are_listed_fifty_at_a_time_with_a_count() -> None:
    node = {"id": "t", "type": "trigger", "config": {}, **{f"k{i}": 1 for i in range(5000)}}
    trigger = {"kind": "manual", **{f"x{i}": 1 for i in range(3000)}}
    for issues in (check_draft(_graph(node)), validate_for_publish(_graph(node), trigger_config=trigger, max_steps=30)):
        assert len(issues) == MAX_ISSUES + 1
        assert issues[-1] == FlowIssue(None, "more_issues", {"count": 5000 - MAX_ISSUES})
        assert str(issues[-1].message).startswith(f"E mais {5000 - MAX_ISSUES} problemas")


def test_a_refusal_combining_settings_trigger_and_draft_is_bounded_once() -> None:
    assert (flow_issues.MAX_ISSUES, flow_issues.MAX_PARAM_CHARS) == (MAX_ISSUES, MAX_PARAM_CHARS)
    many = [FlowIssue("n", "invalid_node", {"field": f"nodes.0.k{i}"}) for i in range(300)]
    rejected = FlowRejected([FlowIssue(None, "invalid_name"), *flow_issues.bounded(many), *flow_issues.bounded(many)])
    assert len(rejected.issues) == MAX_ISSUES + 1
    assert rejected.issues[0].code == "invalid_name"
    assert rejected.issues[-1].params == {"count": 1 + 2 * 300 - MAX_ISSUES}
    assert flow_issues.bounded(rejected.issues) == rejected.issues  # bounding twice changes nothing


def test_a_huge_text_an_issue_repeats_is_cut() -> None:
    g = _graph({"id": "t", "type": "trigger", "config": {}, "k" * 500_000: 1})
    [issue] = check_draft(g)
    assert len(issue.params["field"]) <= MAX_PARAM_CHARS and issue.params["field"].endswith("…")
    edge_to_nowhere = _graph({"id": "t", "type": "trigger", "config": {}},
                             edges=[{"source": "t", "target": "n" * 100_000, "condition": {"type": "always"}}])
    issues = validate_for_publish(edge_to_nowhere, trigger_config=MANUAL, max_steps=30)
    assert all(len(str(issue.message)) < 1000 for issue in issues)
