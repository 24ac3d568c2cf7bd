"""The shape of a flow: node configs, the trigger config, check_draft, normalize_graph, and the
JSON Schema, which must accept and refuse what the marshmallow schemas do."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from engine.words import catalogue
from engine.flows import conditions
from engine.flows.schema import (
    NODE_CONFIGS,
    ConfigError,
    check_draft,
    json_schema,
    load_trigger_config,
    normalize_graph,
    normalize_node_config,
)
from engine.words.texts import Text
from tests.flows.test_validate import DOCS_GRAPH, edge, graph, no_show, node

SCHEMA = json_schema()


def validator(definition: str) -> Any:
    return jsonschema_rs.validator_for({"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"],
                                        "$ref": f"#/$defs/{definition}"})


CONFIG_VALIDATORS = {node_type: validator(f"config_{node_type}") for node_type in NODE_CONFIGS}
TRIGGER_VALIDATOR = validator("trigger_config")
GRAPH_VALIDATOR = jsonschema_rs.validator_for(SCHEMA)


def marshmallow_accepts(node_type: str, config: Any) -> bool:
    try:
        normalize_node_config(node_type, config)
    except ValidationError:
        return False
    return True


def trigger_accepted(data: Any) -> bool:
    try:
        load_trigger_config(data)
    except ValidationError:
        return False
    return True


def catalogued(detail: Text) -> bool:
    return isinstance(detail, Text) and detail.msgid in {entry.msgid for entry in catalogue.CATALOGUE.values()}


# --- examples: valid under both, invalid under both -----------------------------------------------

GOOD_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    # docs/flows.md's examples first.
    ("trigger", {}),
    ("wait", {"mode": "fixed", "minutes": 180}),
    ("wait", {"mode": "smart", "min_minutes": 5, "max_minutes": 129600, "guidance": "…"}),
    ("ai_classify", {"classes": ["confirm", "reschedule"], "grace_minutes": 60}),
    ("ai_classify", {"classes": ["confirm"], "grace_minutes": 15, "hint": "…", "keywords": {"confirm": ["…"]}}),
    ("condition", {"checks": [{"field": "contact.stage", "op": "eq", "value": "lead"}], "combinator": "all"}),
    ("action", {"mode": "template", "template": "key", "channel_kinds": ["whatsapp"]}),
    ("action", {"mode": "ai_message", "prompt_hint": "…", "fallback_template": "key", "max_chars": 1000,
                "channel_kinds": ["whatsapp", "sms", "email"]}),
    ("action", {"mode": "ai_message", "fallback_template": None, "max_chars": 1}),
    ("end", {"outcome": "converted"}),
    ("end", {"outcome": "custom", "note": "x" * 200}),
    # limits
    ("wait", {"mode": "fixed", "minutes": 5}),
    ("wait", {"mode": "fixed", "minutes": 129600}),
    ("wait", {"mode": "smart", "min_minutes": 60, "max_minutes": 60}),
    ("ai_classify", {"classes": [f"c{i}" for i in range(10)], "grace_minutes": 129600, "hint": "x" * 500,
                     "keywords": {"c0": ["x" * 60] * 20}}),
    ("ai_classify", {"classes": ["a" + "b" * 39], "grace_minutes": 15}),
    ("condition", {"checks": [{"field": "enrollment.steps", "op": "gt", "value": 1.5}] * 20, "combinator": "any"}),
    ("condition", {"checks": [{"field": "appointment.starts_at", "op": "before_now"},
                              {"field": "appointment.starts_at", "op": "after_now", "value": None},
                              {"field": "appointment.starts_at", "op": "within_next_minutes", "value": 60},
                              {"field": "enrollment.last_reply_at", "op": "newer_than_minutes", "value": 1},
                              {"field": "contact.email", "op": "not_in", "value": ["a@b.c"] * 50}]}),
    ("action", {"mode": "template", "template": "a" + "b" * 63}),
    ("action", {"mode": "ai_message", "prompt_hint": "x" * 1000}),
]

BAD_CONFIGS: list[tuple[str, Any]] = [
    ("trigger", {"kind": "manual"}),
    ("trigger", []),
    ("wait", {}),
    ("wait", {"mode": "sometimes", "minutes": 60}),
    ("wait", {"mode": "fixed"}),
    ("wait", {"mode": "fixed", "minutes": 4}),
    ("wait", {"mode": "fixed", "minutes": 129601}),
    ("wait", {"mode": "fixed", "minutes": "60"}),
    ("wait", {"mode": "fixed", "minutes": True}),
    ("wait", {"mode": "fixed", "minutes": 60.5}),
    ("wait", {"mode": "fixed", "minutes": 60, "extra": 1}),
    ("wait", {"mode": "fixed", "minutes": 60, "guidance": "só no modo smart"}),
    ("wait", {"mode": "smart", "min_minutes": 4, "max_minutes": 60}),
    ("wait", {"mode": "smart", "min_minutes": 5, "max_minutes": 129601}),
    ("wait", {"mode": "smart", "min_minutes": 5}),
    ("wait", {"mode": "smart", "min_minutes": 5, "max_minutes": 60, "guidance": "x" * 501}),
    ("condition", {}),
    ("condition", {"checks": []}),
    ("condition", {"checks": [{"field": "enrollment.steps", "op": "gt", "value": 1}] * 21}),
    ("condition", {"checks": [{"field": "enrollment.steps", "op": "gt", "value": 1}], "combinator": "most"}),
    ("condition", {"checks": [{"field": "contact.age", "op": "eq", "value": "x"}]}),
    ("condition", {"checks": [{"field": "contact.stage", "op": "gt", "value": "x"}]}),
    ("condition", {"checks": [{"field": "contact.stage", "op": "eq"}]}),
    ("condition", {"checks": [{"field": "contact.stage", "op": "eq", "value": 1}]}),
    ("condition", {"checks": [{"field": "contact.stage", "op": "in", "value": []}]}),
    ("condition", {"checks": [{"field": "contact.stage", "op": "in", "value": ["x"] * 51}]}),
    ("condition", {"checks": [{"field": "contact.stage", "op": "exists", "value": "x"}]}),
    ("condition", {"checks": [{"field": "enrollment.steps", "op": "eq", "value": "1"}]}),
    ("condition", {"checks": [{"field": "enrollment.steps", "op": "eq", "value": False}]}),
    ("condition", {"checks": [{"field": "enrollment.created_at", "op": "older_than_minutes", "value": 0}]}),
    ("condition", {"checks": [{"field": "enrollment.created_at", "op": "before_now"}]}),
    ("condition", {"checks": [{"field": "contact.stage", "op": "eq", "value": "x", "extra": 1}]}),
    ("ai_classify", {"grace_minutes": 60}),
    ("ai_classify", {"classes": ["sim"]}),
    ("ai_classify", {"classes": [], "grace_minutes": 60}),
    ("ai_classify", {"classes": [f"c{i}" for i in range(11)], "grace_minutes": 60}),
    ("ai_classify", {"classes": ["sim", "sim"], "grace_minutes": 60}),
    ("ai_classify", {"classes": ["no_reply"], "grace_minutes": 60}),
    ("ai_classify", {"classes": ["Sim"], "grace_minutes": 60}),
    ("ai_classify", {"classes": ["1sim"], "grace_minutes": 60}),
    ("ai_classify", {"classes": ["sim\n"], "grace_minutes": 60}),
    ("ai_classify", {"classes": ["a" * 41], "grace_minutes": 60}),
    ("ai_classify", {"classes": ["sim"], "grace_minutes": 14}),
    ("ai_classify", {"classes": ["sim"], "grace_minutes": 129601}),
    ("ai_classify", {"classes": ["sim"], "grace_minutes": 60, "hint": "x" * 501}),
    ("ai_classify", {"classes": ["sim"], "grace_minutes": 60, "keywords": {"sim": ["x"] * 21}}),
    ("ai_classify", {"classes": ["sim"], "grace_minutes": 60, "keywords": {"sim": ["x" * 61]}}),
    ("ai_classify", {"classes": ["sim"], "grace_minutes": 60, "keywords": {"sim": [""]}}),
    ("ai_classify", {"classes": ["sim"], "grace_minutes": 60, "keywords": {"sim": "quero"}}),
    ("action", {}),
    ("action", {"mode": "template"}),
    ("action", {"mode": "template", "template": "Com Espaço"}),
    ("action", {"mode": "template", "template": "a" * 65}),
    ("action", {"mode": "template", "template": "oi", "channel_kinds": []}),
    ("action", {"mode": "template", "template": "oi", "channel_kinds": ["fax"]}),
    ("action", {"mode": "template", "template": "oi", "channel_kinds": ["sms", "sms"]}),
    ("action", {"mode": "template", "template": "oi", "prompt_hint": "só no modo ai_message"}),
    ("action", {"mode": "ai_message", "max_chars": 0}),
    ("action", {"mode": "ai_message", "max_chars": 1001}),
    ("action", {"mode": "ai_message", "prompt_hint": "x" * 1001}),
    ("action", {"mode": "ai_message", "fallback_template": "Oi"}),
    ("end", {}),
    ("end", {"outcome": "won"}),
    ("end", {"outcome": "converted", "note": "x" * 201}),
]

#: What marshmallow refuses and the JSON Schema cannot say (json_schema()'s docstring lists them).
MARSHMALLOW_ONLY: list[tuple[str, dict[str, Any]]] = [
    ("wait", {"mode": "smart", "min_minutes": 61, "max_minutes": 60}),
    ("ai_classify", {"classes": ["sim"], "grace_minutes": 60, "keywords": {"nao": ["x"]}}),
    ("end", {"outcome": "custom", "note": "com \x00 NUL"}),
    ("wait", {"mode": "fixed", "minutes": 60.0}),  # JSON Schema counts 60.0 as an integer
]


@pytest.mark.parametrize(("node_type", "config"), GOOD_CONFIGS)
def test_good_configs_pass_both(node_type: str, config: dict[str, Any]) -> None:
    normalized = normalize_node_config(node_type, config)
    assert CONFIG_VALIDATORS[node_type].is_valid(config)
    assert CONFIG_VALIDATORS[node_type].is_valid(normalized)


@pytest.mark.parametrize(("node_type", "config"), BAD_CONFIGS)
def test_bad_configs_fail_both(node_type: str, config: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        normalize_node_config(node_type, config)
    assert caught.value.problems and all(catalogued(problem.detail) for problem in caught.value.problems)
    assert not CONFIG_VALIDATORS[node_type].is_valid(config)


@pytest.mark.parametrize(("node_type", "config"), MARSHMALLOW_ONLY)
def test_rules_only_marshmallow_knows(node_type: str, config: dict[str, Any]) -> None:
    assert not marshmallow_accepts(node_type, config)
    assert CONFIG_VALIDATORS[node_type].is_valid(config)


def test_unknown_node_type_is_a_bug() -> None:
    with pytest.raises(ValueError):
        normalize_node_config("sleep", {})


# --- defaults ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("node_type", "config", "expected"), [
    ("wait", {"mode": "smart", "min_minutes": 5, "max_minutes": 60},
     {"mode": "smart", "min_minutes": 5, "max_minutes": 60, "guidance": ""}),
    ("condition", {"checks": [{"field": "contact.email", "op": "exists"}]},
     {"checks": [{"field": "contact.email", "op": "exists", "value": None}], "combinator": "all"}),
    ("ai_classify", {"classes": ["sim"], "grace_minutes": 60},
     {"classes": ["sim"], "grace_minutes": 60, "hint": "", "keywords": {}}),
    ("action", {"mode": "template", "template": "oi"},
     {"mode": "template", "template": "oi", "channel_kinds": ["whatsapp", "sms", "email"]}),
    ("action", {"mode": "ai_message"},
     {"mode": "ai_message", "prompt_hint": "", "fallback_template": None, "max_chars": 600,
      "channel_kinds": ["whatsapp", "sms", "email"]}),
    ("end", {"outcome": "exhausted"}, {"outcome": "exhausted", "note": ""}),
])
def test_defaults_are_filled(node_type: str, config: dict[str, Any], expected: dict[str, Any]) -> None:
    assert normalize_node_config(node_type, config) == expected


def test_json_schema_defaults_are_marshmallow_defaults() -> None:
    ai_message = SCHEMA["$defs"]["config_action"]["oneOf"][1]["properties"]
    normalized = normalize_node_config("action", {"mode": "ai_message"})
    assert {key: prop["default"] for key, prop in ai_message.items() if "default" in prop} == {
        key: value for key, value in normalized.items() if key != "mode"}


def test_normalized_config_does_not_share_the_callers_lists() -> None:
    config = {"checks": [{"field": "contact.stage", "op": "in", "value": ["lead"]}]}
    normalized = normalize_node_config("condition", config)
    normalized["checks"][0]["value"].append("outro")
    assert config["checks"][0]["value"] == ["lead"]


# --- what a person reads ------------------------------------------------------------------------------

def problems(node_type: str, config: Any) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        normalize_node_config(node_type, config)
    return [(problem.field("config"), str(problem.detail)) for problem in caught.value.problems]


def test_details_say_what_the_field_accepts() -> None:
    assert problems("wait", {"mode": "fixed", "minutes": "sessenta"}) == [
        ("minutes", "use um número inteiro de 5 a 129600")]
    assert problems("wait", {"mode": "fixed"}) == [("minutes", "campo obrigatório; preencha-o")]
    assert problems("wait", {"minutes": 60}) == [("mode", "campo obrigatório; preencha-o")]
    assert problems("wait", {"mode": "x"}) == [("mode", "use um destes valores: fixed, smart")]
    assert problems("wait", "fixed") == [("config", "deve ser um objeto com campos; refaça-o no editor")]
    assert problems("wait", {"mode": "smart", "min_minutes": 90, "max_minutes": 60}) == [
        ("max_minutes", "o tempo mínimo não pode passar do máximo; ajuste os dois")]
    assert problems("end", {"outcome": "converted", "nota": "x"}) == [("nota", "campo desconhecido; remova-o")]
    assert problems("end", {"outcome": "converted", "note": "x" * 201}) == [
        ("note", "use um texto de até 200 caracteres")]
    assert problems("action", {"mode": "template", "template": "oi", "channel_kinds": ["sms", "sms"]}) == [
        ("channel_kinds", "há itens repetidos; deixe cada um uma vez só")]
    assert problems("action", {"mode": "template", "template": "oi", "channel_kinds": ["fax"]}) == [
        ("channel_kinds.0", "use um destes valores: whatsapp, sms, email")]


def test_details_of_classify_configs() -> None:
    assert problems("ai_classify", {"classes": ["ok", "no_reply", "Não"], "grace_minutes": 60}) == [
        ("classes.1", "no_reply é reservado para a saída sem resposta; use outro nome"),
        ("classes.2", "use de 1 a 40 letras minúsculas sem acento, números ou _, começando por uma letra")]
    assert problems("ai_classify", {"classes": ["sim"], "grace_minutes": 60, "keywords": {"nao": ["x"]}}) == [
        ("keywords", "informe palavras-chave só para classes da lista de classes")]
    keywords = {"sim": ["ok", "x" * 61]}
    assert problems("ai_classify", {"classes": ["sim"], "grace_minutes": 60, "keywords": keywords}) == [
        ("keywords.sim.1", "use um texto de 1 a 60 caracteres")]



def test_classes_keep_the_names_the_clinic_gave_them_by_slug() -> None:
    named = {"classes": ["nao_quer", "sim"], "grace_minutes": 60, "labels": {"nao_quer": "Não quer"}}
    assert normalize_node_config("ai_classify", named)["labels"] == {"nao_quer": "Não quer"}
    assert "labels" not in normalize_node_config("ai_classify", {"classes": ["sim"], "grace_minutes": 60})
    assert problems("ai_classify", {**named, "labels": {"outra": "Outra"}}) == [
        ("labels", "dê nomes só às classes da lista de classes")]
    assert problems("ai_classify", {**named, "labels": {"nao_quer": "x" * 61}}) == [
        ("labels.nao_quer", "use um texto de 1 a 60 caracteres")]


def test_details_of_checks() -> None:
    def check(**item: Any) -> list[tuple[str, str]]:
        return problems("condition", {"checks": [item]})

    assert check(field="contact.stage", op="gt", value=1) == [
        ("checks.0.op", "use um destes valores: eq, ne, in, not_in, exists, not_exists")]
    assert check(field="contact.stage", op="in", value="lead") == [("checks.0.value", "use uma lista de 1 a 50 itens")]
    assert check(field="contact.stage", op="exists", value="x") == [
        ("checks.0.value", "esta operação não usa valor; deixe-o vazio")]
    assert check(field="enrollment.steps", op="eq", value="1") == [("checks.0.value", "use um número")]
    assert check(field="enrollment.created_at", op="older_than_minutes", value=0) == [
        ("checks.0.value", "use um número inteiro a partir de 1")]
    assert check(field="contact.idade", op="eq", value="x")[0][0] == "checks.0.field"


# --- trigger config ----------------------------------------------------------------------------------

GOOD_TRIGGERS: list[dict[str, Any]] = [
    {"kind": "manual"},
    {"kind": "appointment", "appointment_event": "created"},
    {"kind": "appointment", "appointment_event": "no_show", "repeat": "always"},
    {"kind": "event", "event": "stage_changed", "stage": "orcamento"},
    {"kind": "event", "event": "stage_changed"},
    {"kind": "silence", "minutes": 2880, "repeat": "cooldown", "cooldown_minutes": 10080},
    {"kind": "reminder_no_reply", "minutes": 5},
    {"kind": "handoff_ended", "repeat": "once", "cooldown_minutes": None},
    {"kind": "manual", "conditions": [{"field": "contact.stage", "op": "eq", "value": "lead"}]},
    {"kind": "manual", "conditions": [{"field": "contact.stage", "op": "exists"}] * 20},
]

BAD_TRIGGERS: list[Any] = [
    None, [], {}, {"kind": "sometimes"}, {"kind": "manual", "extra": 1},
    {"kind": "manual", "minutes": 60},  # another kind's param
    {"kind": "appointment"}, {"kind": "appointment", "appointment_event": "moved"},
    {"kind": "event"}, {"kind": "event", "event": "handoff_started"},
    {"kind": "event", "event": "stage_changed", "stage": ""},
    {"kind": "silence"}, {"kind": "silence", "minutes": 4}, {"kind": "silence", "minutes": 129601},
    {"kind": "reminder_no_reply", "minutes": "60"},
    {"kind": "manual", "repeat": "daily"},
    {"kind": "manual", "repeat": "cooldown"},
    {"kind": "manual", "repeat": "cooldown", "cooldown_minutes": 4},
    {"kind": "manual", "cooldown_minutes": 60},
    {"kind": "manual", "repeat": "always", "cooldown_minutes": 60},
    {"kind": "manual", "conditions": [{"field": "contact.stage", "op": "exists"}] * 21},
    {"kind": "manual", "conditions": [{"field": "contact.stage", "op": "gt", "value": 1}]},
    {"kind": "manual", "conditions": {"field": "contact.stage", "op": "exists"}},
]


@pytest.mark.parametrize("data", GOOD_TRIGGERS)
def test_good_triggers_pass_both(data: dict[str, Any]) -> None:
    loaded = load_trigger_config(data)
    assert TRIGGER_VALIDATOR.is_valid(data) and TRIGGER_VALIDATOR.is_valid(loaded)


@pytest.mark.parametrize("data", BAD_TRIGGERS)
def test_bad_triggers_fail_both(data: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        load_trigger_config(data)
    assert all(catalogued(problem.detail) for problem in caught.value.problems)
    assert not TRIGGER_VALIDATOR.is_valid(data)


def test_trigger_defaults() -> None:
    assert load_trigger_config({"kind": "manual"}) == {
        "kind": "manual", "repeat": "once", "cooldown_minutes": None, "conditions": []}
    assert load_trigger_config({"kind": "event", "event": "stage_changed"})["stage"] is None


def test_trigger_cooldown_details() -> None:
    def details(data: dict[str, Any]) -> list[tuple[str, str]]:
        with pytest.raises(ConfigError) as caught:
            load_trigger_config(data)
        return [(p.field("trigger_config"), str(p.detail)) for p in caught.value.problems]

    assert details({"kind": "manual", "repeat": "cooldown"}) == [
        ("cooldown_minutes", "obrigatório quando a repetição é com intervalo (cooldown)")]
    assert details({"kind": "manual", "cooldown_minutes": 60}) == [
        ("cooldown_minutes", "só vale quando a repetição é com intervalo (cooldown); remova-o")]
    assert details({"kind": "manual", "minutes": 60}) == [("minutes", "campo desconhecido; remova-o")]
    assert details([]) == [("trigger_config", "deve ser um objeto com campos; refaça-o no editor")]


# --- check_draft ----------------------------------------------------------------------------------------

def draft_codes(g: Any) -> list[tuple[str | None, str, str]]:
    return [(issue.node_id, issue.code, issue.params.get("field", "")) for issue in check_draft(g)]


def test_check_draft_does_not_check_configs() -> None:
    g = graph(node("t", "trigger", anything=1), node("w", "wait", minutes=1), node("c", "ai_classify"))
    assert check_draft(g) == []


def test_docs_graph_and_no_show_are_valid_drafts() -> None:
    assert check_draft(DOCS_GRAPH) == [] and check_draft(no_show()) == []


@pytest.mark.parametrize(("bad_node", "field"), [
    ({"id": "a b", "type": "end", "config": {}}, "id"),
    ({"id": "a" * 65, "type": "end", "config": {}}, "id"),
    ({"id": "abc\n", "type": "end", "config": {}}, "id"),
    ({"id": 7, "type": "end", "config": {}}, "id"),
    ({"type": "end", "config": {}}, "id"),
    ({"id": "n", "type": "sleep", "config": {}}, "type"),
    ({"id": "n", "type": "end"}, "config"),
    ({"id": "n", "type": "end", "config": []}, "config"),
    ({"id": "n", "type": "end", "config": {}, "label": "x" * 121}, "label"),
    ({"id": "n", "type": "end", "config": {}, "label": None}, "label"),
    ({"id": "n", "type": "end", "config": {}, "position": {"x": 0}}, "position.y"),
    ({"id": "n", "type": "end", "config": {}, "position": {"x": True, "y": 0}}, "position.x"),
    ({"id": "n", "type": "end", "config": {}, "position": {"x": "1", "y": 0}}, "position.x"),
    ({"id": "n", "type": "end", "config": {}, "position": {"x": 1, "y": 0, "z": 0}}, "position.z"),
    ({"id": "n", "type": "end", "config": {}, "selected": True}, "selected"),
])
def test_bad_nodes(bad_node: dict[str, Any], field: str) -> None:
    found = draft_codes({"nodes": [{"id": "t", "type": "trigger", "config": {}}, bad_node], "edges": []})
    node_id = bad_node.get("id") if isinstance(bad_node.get("id"), str) and " " not in bad_node["id"] \
        and len(bad_node["id"]) <= 64 and "\n" not in bad_node["id"] else None
    assert found == [(node_id, "invalid_node", f"nodes.1.{field}")]
    assert not GRAPH_VALIDATOR.is_valid({"nodes": [bad_node], "edges": []})


@pytest.mark.parametrize(("bad_edge", "field"), [
    ({"source": "t", "target": "fim"}, "condition"),
    ({"source": "t", "condition": {"type": "always"}}, "target"),
    ({"source": "t", "target": 3, "condition": {"type": "always"}}, "target"),
    ({"source": "t", "target": "fim", "condition": {"type": "sometimes"}}, "condition.type"),
    ({"source": "t", "target": "fim", "condition": {"type": "always", "value": True}}, "condition.value"),
    ({"source": "t", "target": "fim", "condition": {"type": "class_match"}}, "condition.value"),
    ({"source": "t", "target": "fim", "condition": {"type": "class_match", "value": 1}}, "condition.value"),
    ({"source": "t", "target": "fim", "condition": {"type": "cond_result", "value": 1}}, "condition.value"),
    ({"source": "t", "target": "fim", "condition": {"type": "cond_result", "value": "true"}}, "condition.value"),
    ({"source": "t", "target": "fim", "condition": {"type": "always", "extra": 1}}, "condition.extra"),
    ({"source": "t", "target": "fim", "condition": {"type": "always"}, "id": "x" * 65}, "id"),
    ({"source": "t", "target": "fim", "condition": {"type": "always"}, "priority": "1"}, "priority"),
    ({"source": "t", "target": "fim", "condition": {"type": "always"}, "priority": True}, "priority"),
    ({"source": "t", "target": "fim", "condition": {"type": "always"}, "animated": True}, "animated"),
])
def test_bad_edges_are_on_their_source_node(bad_edge: dict[str, Any], field: str) -> None:
    g = graph(node("t", "trigger"), node("fim", "end", outcome="converted"), bad_edge)
    assert draft_codes(g) == [("t", "invalid_edge", f"edges.0.{field}")]
    assert not GRAPH_VALIDATOR.is_valid(g)


def test_bad_edge_from_an_unknown_source_is_on_no_node() -> None:
    g = graph(node("t", "trigger"), {"source": "fantasma", "target": "t", "condition": {"type": "x"}})
    assert draft_codes(g) == [(None, "invalid_edge", "edges.0.condition.type")]


def test_good_edges() -> None:
    g = graph(node("t", "trigger"), node("fim", "end", outcome="converted"),
              {"id": "e1", "source": "t", "target": "fim", "condition": {"type": "always", "value": None},
               "priority": 2},
              edge("t", "fim", "class_match", "sim"), edge("t", "fim", "cond_result", False),
              edge("t", "fim", "replied"))
    assert check_draft(g) == []
    assert GRAPH_VALIDATOR.is_valid(normalize_graph(g))


def test_duplicate_node_ids() -> None:
    g = graph(node("t", "trigger"), node("a", "end", outcome="converted"), node("a", "end", outcome="custom"))
    found = check_draft(g)
    assert [(i.node_id, i.code, i.params) for i in found] == [("a", "duplicate_node_id", {"count": 2})]


@pytest.mark.parametrize(("bad", "field"), [
    (None, "graph"), ([], "graph"), ({"nodes": []}, "edges"), ({"edges": []}, "nodes"),
    ({"nodes": {}, "edges": []}, "nodes"), ({"nodes": [], "edges": [], "viewport": {}}, "viewport"),
    ({"nodes": [{"id": f"n{i}", "type": "end", "config": {}} for i in range(201)], "edges": []}, "nodes"),
    ({"nodes": [], "edges": [edge("a", "b")] * 401}, "edges"),
])
def test_bad_graphs(bad: Any, field: str) -> None:
    assert draft_codes(bad) == [(None, "invalid_graph", field)]
    assert not GRAPH_VALIDATOR.is_valid(bad)


def test_draft_details_are_sentences() -> None:
    g = {"nodes": [{"id": "n", "type": "sleep", "config": {}}], "edges": []}
    issue = check_draft(g)[0]
    assert str(issue.message) == ("Uma etapa está malformada (nodes.0.type: use um destes valores: trigger, wait, "
                                  "condition, ai_classify, ask, action, do, end). Corrija a etapa ou apague-a e crie de novo.")
    assert issue.as_dict()["params"]["detail"].startswith("use um destes valores")


# --- normalize_graph ----------------------------------------------------------------------------------

def test_normalize_graph_keeps_builder_fields_and_fills_configs() -> None:
    normalized = normalize_graph(DOCS_GRAPH)
    first = normalized["nodes"][0]
    assert first["label"] == "Início" and first["position"] == {"x": 0, "y": 0}
    assert type(first["position"]["x"]) is int  # kept exactly as given, not turned into 0.0
    assert normalized["nodes"][2]["config"] == {"classes": ["confirm", "reschedule"], "grace_minutes": 60,
                                                "hint": "", "keywords": {}}
    assert normalized["edges"] == DOCS_GRAPH["edges"]
    assert "label" not in normalized["nodes"][1]
    assert GRAPH_VALIDATOR.is_valid(DOCS_GRAPH) and GRAPH_VALIDATOR.is_valid(normalized)


def test_normalize_graph_refuses_an_invalid_config() -> None:
    g = copy.deepcopy(DOCS_GRAPH)
    g["nodes"][1]["config"]["minutes"] = 1
    with pytest.raises(ValidationError) as caught:
        normalize_graph(g)
    assert caught.value.messages == {"nodes": {1: {"config": {"minutes": [
        "Must be greater than or equal to 5 and less than or equal to 129600."]}}}}
    assert not GRAPH_VALIDATOR.is_valid(g)


def test_normalize_graph_refuses_a_broken_draft() -> None:
    with pytest.raises(ValidationError):
        normalize_graph({"nodes": [{"id": "x y", "type": "end", "config": {}}], "edges": []})


def test_no_show_graph_passes_the_json_schema() -> None:
    assert GRAPH_VALIDATOR.is_valid(no_show()) and GRAPH_VALIDATOR.is_valid(normalize_graph(no_show()))


# --- the JSON Schema document -------------------------------------------------------------------------

def test_json_schema_document() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert jsonschema_rs.meta.is_valid(SCHEMA)
    defs = SCHEMA["$defs"]
    assert {f"config_{t}" for t in NODE_CONFIGS} | {"trigger_config", "edge_condition", "check", "node"} <= set(defs)
    assert [b["properties"]["mode"]["enum"] for b in defs["config_wait"]["oneOf"]] == [["fixed"], ["smart"]]
    assert [b["properties"]["mode"]["enum"] for b in defs["config_action"]["oneOf"]] == [["template"], ["ai_message"]]
    assert json_schema() == SCHEMA  # deterministic


def test_json_schema_lists_every_condition_field_and_op() -> None:
    pairs = {(field, op) for branch in SCHEMA["$defs"]["check"]["oneOf"]
             for field in branch["properties"]["field"]["enum"] for op in branch["properties"]["op"]["enum"]}
    assert pairs == {(field, op) for field, spec in conditions.FIELDS.items() for op in spec.ops}


# --- parity on random configs ---------------------------------------------------------------------------
# Each shape's keys, with good and bad values: a config draws mostly good ones, so both answers
# (accepted and refused) come up often, and the refusals are near misses.

_BAD_INTS = [4, 14, 0, 129601, -5, "60", True, None, 60.5, 1001]
_BAD_TEXTS = [3, None, "x" * 1001]
_BAD_SLUGS = ["no_reply", "Sim", "1a", "a" * 65, "ok\n", "", 3, None]
_GOOD_CHECKS = [
    {"field": "contact.stage", "op": "eq", "value": "lead"}, {"field": "contact.stage", "op": "in", "value": ["a"]},
    {"field": "enrollment.steps", "op": "lte", "value": 2}, {"field": "appointment.starts_at", "op": "after_now"},
    {"field": "enrollment.created_at", "op": "older_than_minutes", "value": 5},
    {"field": "contact.email", "op": "exists", "value": None},
]
_BAD_CHECKS = [
    {"field": "contact.stage", "op": "eq"}, {"field": "contact.stage", "op": "in", "value": []},
    {"field": "enrollment.steps", "op": "lte", "value": "2"},
    {"field": "appointment.starts_at", "op": "after_now", "value": 1},
    {"field": "enrollment.created_at", "op": "before_now"}, {"field": "nope", "op": "eq", "value": "x"},
    {"field": "contact.stage", "op": "eq", "value": "x", "extra": 1},
    {"field": "contact.stage", "op": "gt", "value": 1},
    "check",
]
_CHANNELS = ([["whatsapp"], ["sms", "email"], ["email", "whatsapp", "sms"]], [[], ["fax"], ["sms", "sms"], "sms", None])

Pool = tuple[list[Any], list[Any]]
_SHAPES: dict[str, list[dict[str, Pool]]] = {
    "wait": [
        {"mode": (["fixed"], ["smart", "other", None]), "minutes": ([5, 60, 129600], _BAD_INTS)},
        {"mode": (["smart"], ["fixed", None]), "min_minutes": ([5, 60], _BAD_INTS),
         "max_minutes": ([60, 129600], _BAD_INTS), "guidance": (["", "de manhã", "x" * 500], ["x" * 501, *_BAD_TEXTS])},
    ],
    "condition": [{
        "checks": ([[c] for c in _GOOD_CHECKS] + [_GOOD_CHECKS, [_GOOD_CHECKS[0]] * 20],
                   [[c] for c in _BAD_CHECKS] + [[], [_GOOD_CHECKS[0]] * 21, [_GOOD_CHECKS[0], _BAD_CHECKS[0]], "x"]),
        "combinator": (["all", "any"], ["most", None]),
    }],
    "ai_classify": [{
        "classes": ([["sim"], ["sim", "nao"], ["a" * 40], [f"c{i}" for i in range(10)]],
                    [[s] for s in _BAD_SLUGS] + [["sim", "sim"], [], "sim", [f"c{i}" for i in range(11)]]),
        "grace_minutes": ([15, 60, 129600], _BAD_INTS),
        "hint": (["", "x" * 500], ["x" * 501, *_BAD_TEXTS]),
        "keywords": ([{}, {"sim": ["quero", "x" * 60]}, {"sim": ["x"] * 20}],
                     [{"sim": ["x" * 61]}, {"sim": ["x"] * 21}, {"sim": [""]}, {"sim": "quero"}, {"sim": [3]}, [],
                      None]),
    }],
    "action": [
        {"mode": (["template"], ["ai_message", "sms", None]), "template": (["oi", "a" * 64], _BAD_SLUGS),
         "channel_kinds": _CHANNELS},
        {"mode": (["ai_message"], ["template", None]), "fallback_template": (["oi", None], _BAD_SLUGS[:-1]),
         "prompt_hint": (["", "x" * 1000], _BAD_TEXTS), "max_chars": ([1, 600, 1000], _BAD_INTS),
         "channel_kinds": _CHANNELS},
    ],
    "end": [{"outcome": (["converted", "exhausted", "custom"], ["won", None]),
             "note": (["", "x" * 200], ["x" * 201, *_BAD_TEXTS])}],
    "trigger": [{}],
}


@st.composite
def configs(draw: st.DrawFn, shapes: list[dict[str, Pool]]) -> dict[str, Any]:
    shape = draw(st.sampled_from(shapes))
    config = {}
    for key, (good, bad) in shape.items():
        if draw(st.integers(0, 9)) == 0:
            continue  # the key left out
        config[key] = copy.deepcopy(draw(st.sampled_from(bad if draw(st.integers(0, 7)) == 0 else good)))
    if draw(st.integers(0, 9)) == 0:
        config["extra"] = 1
    return config


def _marshmallow_only_rule(node_type: str, config: dict[str, Any]) -> bool:
    """Whether the config may break a rule only marshmallow checks (see MARSHMALLOW_ONLY)."""
    if node_type == "wait":
        low, high = config.get("min_minutes"), config.get("max_minutes")
        return all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) and low > high
    if node_type == "ai_classify":
        keywords, classes = config.get("keywords"), config.get("classes")
        return isinstance(keywords, dict) and isinstance(classes, list) and not set(keywords) <= set(map(str, classes))
    return False


@settings(max_examples=2000, deadline=None)
@given(data=st.data(), node_type=st.sampled_from(sorted(_SHAPES)))
def test_json_schema_and_marshmallow_agree_on_random_configs(data: st.DataObject, node_type: str) -> None:
    config = data.draw(configs(_SHAPES[node_type]))
    assume(not _marshmallow_only_rule(node_type, config))
    assert marshmallow_accepts(node_type, config) is CONFIG_VALIDATORS[node_type].is_valid(config), config


_BASE_TRIGGER: dict[str, Pool] = {
    "repeat": (["once", "always", "cooldown"], ["daily", None]),
    "cooldown_minutes": ([None, 5, 10080], [4, "60", True]),
    "conditions": ([[], [_GOOD_CHECKS[0]], _GOOD_CHECKS], [[_BAD_CHECKS[0]], [_GOOD_CHECKS[0]] * 21, None, "x"]),
}
_TRIGGER_SHAPES: list[dict[str, Pool]] = [
    {"kind": (["manual"], ["other", None]), **_BASE_TRIGGER},
    {"kind": (["appointment"], ["event"]), "appointment_event": (["created", "no_show"], ["moved", None]),
     **_BASE_TRIGGER},
    {"kind": (["event"], ["manual"]), "event": (["stage_changed"], ["handoff_started", None]),
     "stage": (["orcamento", None, "x" * 200], ["", 3, "x" * 201]), **_BASE_TRIGGER},
    {"kind": (["silence"], ["reminder"]), "minutes": ([5, 2880, 129600], _BAD_INTS), **_BASE_TRIGGER},
    {"kind": (["reminder_no_reply"], ["silence"]), "minutes": ([5, 2880], _BAD_INTS), **_BASE_TRIGGER},
    {"kind": (["handoff_ended"], ["handoff"]), **_BASE_TRIGGER},
]


@settings(max_examples=2000, deadline=None)
@given(data=configs(_TRIGGER_SHAPES))
def test_json_schema_and_marshmallow_agree_on_random_triggers(data: dict[str, Any]) -> None:
    assert trigger_accepted(data) is TRIGGER_VALIDATOR.is_valid(data), data
