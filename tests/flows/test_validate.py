"""The publish rules (docs/flows.md, "Publish rules"): one minimal bad graph per rule, the docs'
examples, a realistic follow-up that publishes, cycles, and properties over random graphs."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from engine.words import catalogue
from engine.flows import schema, validate
from engine.flows.graph import GraphIndex
from engine.flows.issues import FlowIssue
from engine.flows.schema import check_draft, normalize_graph, normalize_node_config
from engine.flows.validate import validate_for_publish

MANUAL = {"kind": "manual"}
_NO_VALUE = object()


# --- builders (test_schema.py uses them too) ------------------------------------------------------

def node(node_id: str, node_type: str, **config: Any) -> dict[str, Any]:
    return {"id": node_id, "type": node_type, "config": config}


def edge(source: str, target: str, condition: str = "always", value: Any = _NO_VALUE) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": condition}
    if value is not _NO_VALUE:
        cond["value"] = value
    return {"source": source, "target": target, "condition": cond}


def graph(*items: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": [i for i in items if "type" in i and "source" not in i],
            "edges": [i for i in items if "source" in i]}


def trigger(node_id: str = "t") -> dict[str, Any]:
    return node(node_id, "trigger")


def wait(node_id: str, minutes: int = 60) -> dict[str, Any]:
    return node(node_id, "wait", mode="fixed", minutes=minutes)


def end(node_id: str = "fim", outcome: str = "converted") -> dict[str, Any]:
    return node(node_id, "end", outcome=outcome)


def ai_message(node_id: str, fallback: str | None = None) -> dict[str, Any]:
    return node(node_id, "action", mode="ai_message", prompt_hint="Pergunte se quer remarcar.",
                fallback_template=fallback)


def condition(node_id: str, minimum: int = 3) -> dict[str, Any]:
    return node(node_id, "condition", checks=[{"field": "enrollment.messages_sent", "op": "gte", "value": minimum}])


def classify(node_id: str, *classes: str, grace: int = 60) -> dict[str, Any]:
    return node(node_id, "ai_classify", classes=list(classes), grace_minutes=grace)


def issues_of(g: Any, *, trigger_config: Any = MANUAL, max_steps: Any = 30,
              template_exists: Callable[[str], bool] | None = None) -> list[FlowIssue]:
    found = validate_for_publish(g, trigger_config=trigger_config, max_steps=max_steps,
                                 template_exists=template_exists)
    for issue in found:  # every issue must read as a sentence with all its placeholders bound
        assert "%(" not in str(issue.message), issue
        json.dumps(issue.as_dict())
    return found


def codes(g: Any, **kwargs: Any) -> list[tuple[str | None, str]]:
    return [(issue.node_id, issue.code) for issue in issues_of(g, **kwargs)]


def minimal() -> dict[str, Any]:
    return graph(trigger(), end(), edge("t", "fim"))


def no_show() -> dict[str, Any]:
    """The no-show follow-up: a day after the missed appointment ask to rebook; on a "no" or no
    answer try once more three days later with an AI message (template fallback), then give up."""
    return graph(
        trigger("inicio"),
        wait("espera_1d", 1440),
        node("lembrete", "action", mode="template", template="falta_remarcar", channel_kinds=["whatsapp", "sms"]),
        node("pergunta", "ai_classify", classes=["rebook", "no"], grace_minutes=1440,
             hint="O paciente quer remarcar a consulta?", keywords={"rebook": ["quero", "remarcar"], "no": ["nao"]}),
        end("remarcou", "converted"),
        wait("espera_3d", 4320),
        node("nova_tentativa", "action", mode="ai_message", prompt_hint="Ofereça um novo horário com gentileza.",
             fallback_template="falta_ultima_chance", max_chars=400),
        end("desistiu", "exhausted"),
        edge("inicio", "espera_1d"),
        edge("espera_1d", "lembrete"),
        edge("lembrete", "pergunta"),
        edge("pergunta", "remarcou", "class_match", "rebook"),
        edge("pergunta", "espera_3d", "class_match", "no"),
        edge("pergunta", "espera_3d", "no_reply"),
        edge("pergunta", "desistiu"),
        edge("espera_3d", "nova_tentativa"),
        edge("nova_tentativa", "desistiu"),
    )


NO_SHOW_TRIGGER = {"kind": "appointment", "appointment_event": "no_show"}

#: docs/flows.md's graph, as printed there (not a publishable flow: it is cut short).
DOCS_GRAPH = {
    "nodes": [
        {"id": "inicio", "type": "trigger", "label": "Início", "position": {"x": 0, "y": 0}, "config": {}},
        {"id": "espera", "type": "wait", "config": {"mode": "fixed", "minutes": 180}},
        {"id": "pergunta", "type": "ai_classify",
         "config": {"classes": ["confirm", "reschedule"], "grace_minutes": 60}},
        {"id": "fim", "type": "end", "config": {"outcome": "converted"}},
    ],
    "edges": [
        {"source": "inicio", "target": "espera", "condition": {"type": "always"}},
        {"source": "pergunta", "target": "fim", "condition": {"type": "class_match", "value": "confirm"}},
    ],
}


# --- good graphs ----------------------------------------------------------------------------------

def test_minimal_graph_publishes() -> None:
    assert issues_of(minimal()) == []


def test_no_show_follow_up_publishes() -> None:
    assert issues_of(no_show(), trigger_config=NO_SHOW_TRIGGER, template_exists=lambda key: True) == []


def test_no_show_graph_index() -> None:
    index = GraphIndex(normalize_graph(no_show()))
    assert index.trigger_id == "inicio"
    assert index.target("pergunta", "class_match", "rebook") == "remarcou"
    assert index.target("pergunta", "class_match", "maybe") is None
    assert index.target("pergunta", "no_reply") == "espera_3d"
    assert index.target("pergunta", "always") == "desistiu"
    assert index.target("espera_1d", "replied") is None
    assert index.config("espera_3d") == {"mode": "fixed", "minutes": 4320}
    assert index.smart_waits() == []


# --- one minimal bad graph per rule ---------------------------------------------------------------

def test_trigger_count_none() -> None:
    found = issues_of(graph(end()))
    assert [(i.node_id, i.code, i.params) for i in found] == [(None, "trigger_count", {"count": 0})]


def test_trigger_count_two() -> None:
    found = issues_of(graph(trigger("t1"), trigger("t2"), end(), edge("t1", "fim"), edge("t2", "fim")))
    assert [(i.node_id, i.code, i.params) for i in found] == [(None, "trigger_count", {"count": 2})]


def test_unreachable() -> None:
    assert codes(graph(trigger(), end(), end("solta"), edge("t", "fim"))) == [("solta", "unreachable")]


def test_dead_end() -> None:
    assert codes(graph(trigger(), wait("w"), edge("t", "w"))) == [("w", "dead_end")]


def test_no_path_to_end_in_a_closed_loop() -> None:
    g = graph(trigger(), condition("c"), end(), wait("w1"), wait("w2"),
              edge("t", "c"), edge("c", "fim", "cond_result", True), edge("c", "w1", "cond_result", False),
              edge("w1", "w2"), edge("w2", "w1"))
    assert codes(g) == [("w1", "no_path_to_end"), ("w2", "no_path_to_end")]


def test_edge_unknown_node_target() -> None:
    g = graph(trigger(), wait("w"), end(), edge("t", "w"), edge("w", "fim"), edge("w", "fantasma", "replied"))
    found = issues_of(g)
    assert [(i.node_id, i.code, i.params) for i in found] == [("w", "edge_unknown_node", {"node": "fantasma"})]


def test_edge_unknown_node_source() -> None:
    found = issues_of(graph(trigger(), end(), edge("t", "fim"), edge("fantasma", "fim")))
    assert [(i.node_id, i.code, i.params) for i in found] == [(None, "edge_unknown_node", {"node": "fantasma"})]


def test_edge_not_allowed_for_the_source_type() -> None:
    g = graph(trigger(), end(), edge("t", "fim"), edge("t", "fim", "no_reply"))
    found = issues_of(g)
    assert [(i.node_id, i.code, i.params) for i in found] == [("t", "edge_not_allowed", {"condition": "no_reply"})]


def test_edge_out_of_an_end_is_not_allowed() -> None:
    assert codes(graph(trigger(), end(), end("outro"), edge("t", "fim"), edge("fim", "outro"))) == [
        ("fim", "edge_not_allowed"), ("outro", "unreachable")]


def test_missing_edge_always() -> None:
    g = graph(trigger(), wait("w"), end(), edge("t", "w"), edge("w", "fim", "replied"))
    found = issues_of(g)
    assert [(i.node_id, i.code, i.params) for i in found] == [("w", "missing_edge", {"which": "always"})]


def test_missing_edge_condition_false() -> None:
    g = graph(trigger(), condition("c"), end(), edge("t", "c"), edge("c", "fim", "cond_result", True))
    found = issues_of(g)
    assert [(i.node_id, i.code, i.params) for i in found] == [("c", "missing_edge", {"which": "false"})]


def test_duplicate_edge() -> None:
    found = issues_of(graph(trigger(), end(), edge("t", "fim"), edge("t", "fim")))
    assert [(i.node_id, i.code, i.params) for i in found] == [("t", "duplicate_edge", {"which": "always"})]


def test_duplicate_class_edge() -> None:
    g = graph(trigger(), classify("c", "sim"), end(), end("outro"), edge("t", "c"),
              edge("c", "fim", "class_match", "sim"), edge("c", "outro", "class_match", "sim"),
              edge("c", "fim", "no_reply"), edge("c", "fim"))
    assert [(i.node_id, i.code, i.params) for i in issues_of(g)] == [
        ("c", "duplicate_edge", {"which": "sim"}), ("outro", "unreachable", {})]


def classify_graph(*extra: dict[str, Any], classes: tuple[str, ...] = ("sim", "nao"), grace: int = 60,
                   no_reply: bool = True, fallback: bool = True) -> dict[str, Any]:
    edges = [edge("t", "c")] + [edge("c", "fim", "class_match", name) for name in classes]
    edges += [edge("c", "fim", "no_reply")] if no_reply else []
    edges += [edge("c", "fim")] if fallback else []
    return graph(trigger(), classify("c", *classes, grace=grace), end(), *edges, *extra)


def test_classify_graph_publishes() -> None:
    assert issues_of(classify_graph()) == []


def test_class_without_edge() -> None:
    g = classify_graph()
    g["nodes"][1]["config"]["classes"].append("talvez")
    found = issues_of(g)
    assert [(i.node_id, i.code, i.params) for i in found] == [("c", "class_without_edge", {"class": "talvez"})]


def test_unknown_class() -> None:
    found = issues_of(classify_graph(edge("c", "fim", "class_match", "talvez")))
    assert [(i.node_id, i.code, i.params) for i in found] == [("c", "unknown_class", {"class": "talvez"})]


def test_missing_no_reply() -> None:
    assert codes(classify_graph(no_reply=False)) == [("c", "missing_no_reply")]


def test_missing_fallback() -> None:
    assert codes(classify_graph(fallback=False)) == [("c", "missing_fallback")]


def test_grace_too_short() -> None:
    found = issues_of(classify_graph(grace=10))
    assert [(i.node_id, i.code, i.params) for i in found] == [("c", "grace_too_short", {"minutes": 10, "min": 15})]


def test_grace_at_the_minimum_is_fine() -> None:
    assert issues_of(classify_graph(grace=15)) == []


def ai_after(minutes: int, fallback: str | None = None) -> dict[str, Any]:
    return graph(trigger(), wait("w", minutes), ai_message("ai", fallback), end(),
                 edge("t", "w"), edge("w", "ai"), edge("ai", "fim"))


def test_ai_after_24h() -> None:
    found = issues_of(ai_after(1440))
    assert [(i.node_id, i.code, i.params) for i in found] == [("ai", "ai_after_24h", {"hours": 24})]


def test_ai_after_24h_hours_are_whole_hours_of_the_longest_path() -> None:
    g = graph(trigger(), condition("c"), wait("curta", 60), wait("longa", 2000), ai_message("ai"), end(),
              edge("t", "c"), edge("c", "curta", "cond_result", True), edge("c", "longa", "cond_result", False),
              edge("curta", "ai"), edge("longa", "ai"), edge("ai", "fim"))
    assert [(i.code, i.params) for i in issues_of(g)] == [("ai_after_24h", {"hours": 33})]


def test_ai_before_24h_needs_no_fallback() -> None:
    assert issues_of(ai_after(1439)) == []


def test_ai_after_24h_with_fallback_is_fine() -> None:
    assert issues_of(ai_after(1440, "volte_sempre")) == []


def test_ai_after_24h_counts_smart_wait_maximum_and_classify_grace() -> None:
    g = graph(trigger(), node("w", "wait", mode="smart", min_minutes=5, max_minutes=720),
              classify("c", "sim", grace=720), ai_message("ai"), end(),
              edge("t", "w"), edge("w", "c"), edge("c", "ai", "class_match", "sim"), edge("c", "fim", "no_reply"),
              edge("c", "fim"), edge("ai", "fim"))
    assert [(i.node_id, i.code, i.params) for i in issues_of(g)] == [("ai", "ai_after_24h", {"hours": 24})]


@pytest.mark.parametrize("kind", ["silence", "reminder_no_reply"])
def test_ai_after_24h_counts_the_trigger_minutes(kind: str) -> None:
    g = graph(trigger(), ai_message("ai"), end(), edge("t", "ai"), edge("ai", "fim"))
    assert codes(g, trigger_config={"kind": kind, "minutes": 1440}) == [("ai", "ai_after_24h")]
    assert codes(g, trigger_config={"kind": kind, "minutes": 1439}) == []


def test_cycle_without_wait() -> None:
    g = graph(trigger(), condition("c"), end(), edge("t", "c"), edge("c", "fim", "cond_result", True),
              edge("c", "c", "cond_result", False))
    found = issues_of(g)
    assert [(i.node_id, i.code, i.params) for i in found] == [("c", "cycle_without_wait", {"minutes": 5})]


def test_cycle_without_wait_is_reported_once_on_the_lowest_id() -> None:
    # Two cycles share c1: c1 → w → c1 has a wait, c1 → c0 → c1 does not.
    g = graph(trigger(), condition("c1"), wait("w"), condition("c0"), end(),
              edge("t", "c1"), edge("c1", "w", "cond_result", True), edge("w", "c1"),
              edge("c1", "c0", "cond_result", False), edge("c0", "c1", "cond_result", True),
              edge("c0", "fim", "cond_result", False))
    assert codes(g) == [("c0", "cycle_without_wait")]


def cyclic(fallback: str | None = None) -> dict[str, Any]:
    """Ask, wait a day, check how many were sent; ask again until three were."""
    return graph(trigger(), ai_message("pergunta", fallback), wait("espera", 1440), condition("quantas"), end(),
                 edge("t", "pergunta"), edge("pergunta", "espera"), edge("espera", "quantas"),
                 edge("quantas", "fim", "cond_result", True), edge("quantas", "pergunta", "cond_result", False))


def test_cycle_with_a_day_wait_passes_the_cycle_rule() -> None:
    assert issues_of(cyclic("volte_sempre")) == []


def test_ai_message_on_a_cycle_without_fallback() -> None:
    found = issues_of(cyclic())
    assert [(i.node_id, i.code, i.params) for i in found] == [("pergunta", "ai_after_24h_cycle", {})]
    message = str(found[0].message)
    assert "ciclo com espera" in message and "qualquer tempo" in message and "modelo reserva" in message


def test_ai_message_after_a_cycle_with_a_wait() -> None:
    g = cyclic("volte_sempre")
    g["nodes"].append(ai_message("depois"))
    g["edges"] = [e for e in g["edges"] if e["target"] != "fim"]
    g["edges"] += [edge("quantas", "depois", "cond_result", True), edge("depois", "fim")]
    assert codes(g) == [("depois", "ai_after_24h_cycle")]


def test_too_many_steps() -> None:
    found = issues_of(minimal(), max_steps=1)
    assert [(i.node_id, i.code, i.params) for i in found] == [(None, "too_many_steps", {"count": 2, "max_steps": 1})]


@pytest.mark.parametrize("max_steps", [0, 201, -1, True, "30", None, 2.0])
def test_invalid_max_steps(max_steps: Any) -> None:
    assert codes(minimal(), max_steps=max_steps) == [(None, "invalid_max_steps")]


@pytest.mark.parametrize("max_steps", [2, 200])
def test_max_steps_bounds(max_steps: int) -> None:
    assert issues_of(minimal(), max_steps=max_steps) == []


def test_unknown_template() -> None:
    g = graph(trigger(), node("a", "action", mode="template", template="sumiu"), ai_message("ai", "tambem_sumiu"),
              end(), edge("t", "a"), edge("a", "ai"), edge("ai", "fim"))
    found = issues_of(g, template_exists={"outro"}.__contains__)
    assert [(i.node_id, i.code, i.params) for i in found] == [
        ("a", "unknown_template", {"template": "sumiu", "field": "template"}),
        ("ai", "unknown_template", {"template": "tambem_sumiu", "field": "fallback_template"}),
    ]
    assert issues_of(g, template_exists={"sumiu", "tambem_sumiu"}.__contains__) == []
    assert issues_of(g) == []  # not checked without a template_exists


def test_invalid_config() -> None:
    g = graph(trigger(), wait("w", 3), end(), edge("t", "w"), edge("w", "fim"))
    found = issues_of(g)
    assert [(i.node_id, i.code, i.params["field"]) for i in found] == [("w", "invalid_config", "minutes")]
    assert str(found[0].params["detail"]) == "use um número inteiro de 5 a 129600"


def test_invalid_config_one_issue_per_field() -> None:
    g = graph(trigger(), node("w", "wait", mode="smart", min_minutes=1, max_minutes=200000, extra=True), end(),
              edge("t", "w"), edge("w", "fim"))
    found = issues_of(g)
    assert [(i.code, i.params["field"], str(i.params["detail"])) for i in found] == [  # by field, for stability
        ("invalid_config", "extra", "campo desconhecido; remova-o"),
        ("invalid_config", "max_minutes", "use um número inteiro de 5 a 129600"),
        ("invalid_config", "min_minutes", "use um número inteiro de 5 a 129600"),
    ]


def test_invalid_trigger_is_on_the_trigger_node() -> None:
    found = issues_of(minimal(), trigger_config={"kind": "silence"})
    assert [(i.node_id, i.code, i.params["field"], str(i.params["detail"])) for i in found] == [
        ("t", "invalid_trigger", "minutes", "campo obrigatório; preencha-o")]


@pytest.mark.parametrize("trigger_config", [None, {}, [], "manual", {"kind": "sometimes"}])
def test_invalid_trigger_kinds(trigger_config: Any) -> None:
    assert codes(minimal(), trigger_config=trigger_config) == [("t", "invalid_trigger")]


def test_a_broken_draft_returns_only_its_shape_issues() -> None:
    g = minimal()
    g["nodes"][1]["type"] = "finish"
    assert codes(g, max_steps=0) == [(None, "invalid_max_steps"), ("fim", "invalid_node")]


@pytest.mark.parametrize("bad", [None, [], "graph", {"nodes": []}, {"nodes": {}, "edges": []}])
def test_not_a_graph(bad: Any) -> None:
    assert {code for _, code in codes(bad)} == {"invalid_graph"}


def test_issues_are_sorted_by_node_order_then_code() -> None:
    g = graph(wait("w"), classify("c", "sim", grace=5), trigger(), edge("t", "fim"))
    found = issues_of(g)
    order = {node_id: index for index, node_id in enumerate(["w", "c", "t"])}
    keys = [(-1 if i.node_id is None else order[i.node_id], i.code) for i in found]
    assert keys == sorted(keys)
    assert ("t", "edge_unknown_node") in [(i.node_id, i.code) for i in found]


# --- docs/flows.md --------------------------------------------------------------------------------

def test_docs_graph_issues() -> None:
    assert check_draft(DOCS_GRAPH) == []
    found = issues_of(DOCS_GRAPH)
    assert [(i.node_id, i.code, i.params) for i in found] == [
        ("espera", "dead_end", {}),
        ("pergunta", "class_without_edge", {"class": "reschedule"}),
        ("pergunta", "missing_fallback", {}),
        ("pergunta", "missing_no_reply", {}),
        ("pergunta", "unreachable", {}),
        ("fim", "unreachable", {}),
    ]


def test_docs_graph_completed_publishes() -> None:
    g = copy.deepcopy(DOCS_GRAPH)
    g["nodes"].append({"id": "remarcar", "type": "end", "config": {"outcome": "custom", "note": "remarcar"}})
    g["edges"] += [
        {"source": "espera", "target": "pergunta", "condition": {"type": "always"}},
        {"source": "pergunta", "target": "remarcar", "condition": {"type": "class_match", "value": "reschedule"}},
        {"source": "pergunta", "target": "fim", "condition": {"type": "no_reply"}},
        {"source": "pergunta", "target": "fim", "condition": {"type": "always"}},
    ]
    assert issues_of(g) == []


# --- catalogue ------------------------------------------------------------------------------------

def test_every_code_is_in_the_catalogue() -> None:
    for code in (*validate.CODES, *schema.DETAIL_CODES):
        assert catalogue.known(code), code


def test_every_code_in_the_sources_is_listed_and_catalogued() -> None:
    # Grep the modules, so a code used in the code but missing from CODES is caught too (and a
    # code listed in CODES that nothing returns any more).
    root = Path(validate.__file__).parent
    source = (root / "validate.py").read_text() + (root / "schema.py").read_text() + (root / "issues.py").read_text()
    # The first string literal of each FlowIssue(...) call, skipping subscripts like node["id"].
    issued = set(re.findall(r'FlowIssue\((?:[^"\[]|\[[^\]]*\])*?"(\w+)"', source))
    described = set(re.findall(r'describe\("(\w+)"', source)) | set(re.findall(r'\("(detail_\w+)", \{', source))
    assert issued == set(validate.CODES)
    assert described == set(schema.DETAIL_CODES)
    for code in issued | described:
        assert catalogue.known(code), code


# --- properties over random graphs ----------------------------------------------------------------

_IDS = ["t", "a", "b", "c", "d", "e"]
_CONFIGS: dict[str, list[dict[str, Any]]] = {
    "trigger": [{}, {"x": 1}],
    "wait": [{"mode": "fixed", "minutes": 60}, {"mode": "fixed", "minutes": 2000},
             {"mode": "smart", "min_minutes": 5, "max_minutes": 3000}, {"mode": "fixed", "minutes": 1}, {}],
    "condition": [{"checks": [{"field": "enrollment.steps", "op": "gt", "value": 2}]}, {"checks": []}],
    "ai_classify": [{"classes": ["sim", "nao"], "grace_minutes": 60}, {"classes": ["sim"], "grace_minutes": 5},
                    {"classes": "sim"}],
    "action": [{"mode": "template", "template": "oi"}, {"mode": "ai_message"},
               {"mode": "ai_message", "fallback_template": "oi"}, {"mode": "sms"}],
    "end": [{"outcome": "converted"}, {"outcome": "won"}],
}


_EDGES_BY_TYPE = {node_type: sorted(allowed) for node_type, allowed in validate.ALLOWED_EDGES.items()}


def _rarely(draw: st.DrawFn) -> bool:
    return draw(st.integers(0, 9)) == 0


@st.composite
def random_graphs(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly well-formed graphs (so the structural rules run), now and then a malformed part."""
    ids = draw(st.lists(st.sampled_from(_IDS), unique=True, min_size=1, max_size=len(_IDS)))
    nodes = []
    for position, node_id in enumerate(ids):
        node_type = "trigger" if position == 0 and not _rarely(draw) else draw(st.sampled_from(list(_CONFIGS)))
        config = copy.deepcopy(draw(st.sampled_from(_CONFIGS[node_type])))
        item: dict[str, Any] = {"id": node_id, "type": node_type, "config": config}
        if draw(st.booleans()):
            item["position"] = {"x": draw(st.integers(-5, 5)), "y": draw(st.floats(-1, 1))}
        if draw(st.booleans()):
            item["label"] = draw(st.text(max_size=5))
        nodes.append(item)
    if _rarely(draw):
        nodes.append(draw(st.sampled_from([{"id": "bad id", "type": "end", "config": {}},
                                           {"id": "x", "type": "bogus", "config": {}},
                                           {"id": ids[0], "type": "end", "config": {"outcome": "custom"}}])))
    types = {item["id"]: item["type"] for item in nodes}
    edges = []
    for _ in range(draw(st.integers(0, 2 * len(ids) + 2))):
        source = draw(st.sampled_from([*ids, "zz"] if _rarely(draw) else ids))
        target = draw(st.sampled_from([*ids, "zz"] if _rarely(draw) else ids))
        allowed = _EDGES_BY_TYPE.get(types.get(source, ""), [])
        condition_type = draw(st.sampled_from(allowed)) if allowed and not _rarely(draw) else draw(
            st.sampled_from(schema.EDGE_CONDITIONS))
        cond: dict[str, Any] = {"type": condition_type}
        if condition_type == "class_match":
            cond["value"] = draw(st.sampled_from(["sim", "nao", "talvez"]))
        elif condition_type == "cond_result":
            cond["value"] = draw(st.booleans())
        if _rarely(draw):
            cond["value"] = 3
        edges.append({"source": source, "target": target, "condition": cond})
    return {"nodes": nodes, "edges": edges}


_TRIGGERS = st.sampled_from([MANUAL, {"kind": "silence", "minutes": 2000}, {"kind": "silence"}, {}])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=random_graphs(), trigger_config=_TRIGGERS, max_steps=st.sampled_from([0, 3, 30]))
def test_validate_never_raises_and_is_deterministic(g: dict[str, Any], trigger_config: Any, max_steps: int) -> None:
    first = issues_of(g, trigger_config=trigger_config, max_steps=max_steps, template_exists=lambda key: key == "oi")
    again = validate_for_publish(copy.deepcopy(g), trigger_config=trigger_config, max_steps=max_steps,
                                 template_exists=lambda key: key == "oi")
    assert first == again
    assert {issue.code for issue in first} <= set(validate.CODES)
    ids = [n["id"] for n in g["nodes"]]
    assert all(issue.node_id is None or issue.node_id in ids for issue in first)
    if not first:
        index = GraphIndex(normalize_graph(g))
        assert index.trigger_id is not None


def _configs_valid(g: dict[str, Any]) -> bool:
    try:
        for item in g["nodes"]:
            normalize_node_config(item["type"], item["config"])
    except ValidationError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(g=random_graphs())
def test_check_draft_and_normalize_graph_agree(g: dict[str, Any]) -> None:
    given_copy = copy.deepcopy(g)
    draft = check_draft(g)
    if draft or not _configs_valid(g):
        with pytest.raises(ValidationError):
            normalize_graph(g)
        return
    normalized = normalize_graph(g)
    assert g == given_copy  # the input is not touched
    assert normalized["edges"] == g["edges"]
    for before, after in zip(g["nodes"], normalized["nodes"], strict=True):
        assert {k: v for k, v in after.items() if k != "config"} == {k: v for k, v in before.items() if k != "config"}
        assert after["config"] == normalize_node_config(before["type"], before["config"])
    assert check_draft(normalized) == []
    assert normalize_graph(normalized) == normalized  # normalizing twice changes nothing


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=15)


@settings(max_examples=200, deadline=None)
@given(g=st.one_of(_json, st.fixed_dictionaries({"nodes": st.lists(_json, max_size=3),
                                                 "edges": st.lists(_json, max_size=3)})))
def test_garbage_never_raises(g: Any) -> None:
    assert all(isinstance(issue, FlowIssue) for issue in check_draft(g))
    issues_of(g)


_GOOD_CONFIGS: dict[str, list[dict[str, Any]]] = {
    "wait": [{"mode": "fixed", "minutes": 5}, {"mode": "fixed", "minutes": 4320},
             {"mode": "smart", "min_minutes": 60, "max_minutes": 2880, "guidance": "de manhã"}],
    "condition": [{"checks": [{"field": "contact.stage", "op": "in", "value": ["lead"]}], "combinator": "any"}],
    "ai_classify": [{"classes": ["sim", "nao"], "grace_minutes": 1440}, {"classes": ["talvez"], "grace_minutes": 15}],
    "action": [{"mode": "template", "template": "oi"}, {"mode": "ai_message", "fallback_template": "oi"}],
}


def _needed_edges(node_type: str, config: dict[str, Any]) -> list[tuple[str, Any]]:
    if node_type == "condition":
        return [("cond_result", True), ("cond_result", False)]
    if node_type == "ai_classify":
        return [("class_match", name) for name in config["classes"]] + [("no_reply", _NO_VALUE), ("always", _NO_VALUE)]
    return [("always", _NO_VALUE)]


@st.composite
def good_graphs(draw: st.DrawFn) -> dict[str, Any]:
    """Publishable by construction: nodes in a row, each edge going forward (the first to the
    next node, so all are reachable) and ending at `fim`; waits may also have a `replied` edge
    back to any earlier node, a cycle through a wait; every AI message has its fallback."""
    middle = draw(st.lists(st.sampled_from(list(_GOOD_CONFIGS)), max_size=8))
    types = ["trigger", *middle, "end"]
    ids = [f"n{index}" for index in range(len(types) - 1)] + ["fim"]
    nodes, edges = [], []
    for index, (node_id, node_type) in enumerate(zip(ids, types, strict=True)):
        if node_type in ("trigger", "end"):
            config: dict[str, Any] = {"outcome": "exhausted"} if node_type == "end" else {}
        else:
            config = copy.deepcopy(draw(st.sampled_from(_GOOD_CONFIGS[node_type])))
        nodes.append({"id": node_id, "type": node_type, "config": config})
        if node_type == "end":
            break
        for number, (condition_type, value) in enumerate(_needed_edges(node_type, config)):
            target = ids[index + 1] if number == 0 else draw(st.sampled_from(ids[index + 1:]))
            edges.append(edge(node_id, target, condition_type, value))
        if node_type == "wait" and draw(st.booleans()):
            edges.append(edge(node_id, draw(st.sampled_from(ids[:index + 1])), "replied"))
    order = draw(st.permutations(range(len(nodes))))  # the rules must not depend on node order
    return {"nodes": [nodes[i] for i in order], "edges": draw(st.permutations(edges))}


@settings(max_examples=300, deadline=None)
@given(g=good_graphs())
def test_graphs_built_by_the_rules_publish(g: dict[str, Any]) -> None:
    assert issues_of(g, max_steps=200, template_exists=lambda key: True) == []
    index = GraphIndex(normalize_graph(g))
    for item in g["edges"]:
        cond = item["condition"]
        assert index.target(item["source"], cond["type"], cond.get("value")) == item["target"]


@settings(max_examples=300, deadline=None)
@given(g=good_graphs(), data=st.data())
def test_removing_an_edge_of_a_good_graph_is_always_reported(g: dict[str, Any], data: st.DataObject) -> None:
    required = [e for e in g["edges"] if e["condition"]["type"] != "replied"]
    if not required:
        return
    removed = data.draw(st.sampled_from(required))
    g["edges"].remove(removed)
    found = issues_of(g, max_steps=200)
    assert found
    assert any(issue.node_id in (removed["source"], removed["target"]) or issue.code == "unreachable"
               for issue in found)
