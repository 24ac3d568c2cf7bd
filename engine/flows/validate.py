"""The publish rules of docs/flows.md over a whole graph: one trigger, every node reachable,
every path ends, each node's edges, classes with edges, the 24 h rule, cycles through a wait,
`max_steps`, and templates that exist. `validate_for_publish` returns every broken rule as a
`FlowIssue` on the node it belongs to; an empty list means the draft may be published.

The structural rules read only the edges the runtime can take ("usable" edges): an edge to an
unknown node, of a type its source cannot have, for an undeclared class, or a second edge with
the same condition is reported once and then left out, so it cannot hide or cause another issue.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.flows.graph import edge_key
from engine.flows.issues import FlowIssue, bounded, sort_issues
from engine.flows.schema import (
    MIN_GRACE_MINUTES,
    MIN_WAIT_MINUTES,
    ConfigError,
    Problem,
    check_draft,
    load_trigger_config,
    node_ids,
    normalize_node_config,
)

MAX_STEPS_RANGE = (1, 200)
#: The 24 h rule: past this much waiting an AI-written message needs a fallback template
#: (WhatsApp only accepts approved templates once its 24 h conversation window has closed).
AI_WINDOW_MINUTES = 24 * 60
#: Trigger kinds that fire a given time after something: that time counts as waiting.
WAITING_TRIGGERS = ("silence", "reminder_no_reply")

#: The condition types each node type may have on its out edges.
ALLOWED_EDGES: Mapping[str, frozenset[str]] = {
    "trigger": frozenset({"always"}),
    "wait": frozenset({"always", "replied"}),
    "condition": frozenset({"cond_result"}),
    "ai_classify": frozenset({"class_match", "no_reply", "always"}),
    "ask": frozenset({"complete", "gave_up", "no_reply"}),
    "action": frozenset({"always"}),
    "do": frozenset({"ok", "failed", "unavailable", "no_reply"}),
    "end": frozenset(),
}
#: The exits a `do` node must have, by action (the others may not be drawn).
DO_EXITS: Mapping[str, tuple[str, ...]] = {
    "confirm": ("ok", "failed"), "cancel": ("ok", "failed"), "move": ("ok", "failed", "unavailable"),
    "book": ("ok", "failed", "unavailable"), "offer_slots": ("ok", "failed", "unavailable", "no_reply"),
    "notify_staff": ("ok",), "handoff": ("ok",), "set_stage": ("ok",), "start_flow": ("ok", "failed"),
    "notify_clinic": ("ok",),
}
_ALWAYS = edge_key("always")
_CONDITION_RESULTS = ((edge_key("cond_result", True), "true"), (edge_key("cond_result", False), "false"))

#: Every code `validate_for_publish` can return (check_draft's included).
CODES = (
    "invalid_graph", "invalid_node", "invalid_edge", "duplicate_node_id",
    "invalid_config", "invalid_trigger", "invalid_max_steps",
    "trigger_count", "unreachable", "no_path_to_end", "dead_end", "edge_unknown_node", "edge_not_allowed",
    "missing_edge", "duplicate_edge", "class_without_edge", "unknown_class", "missing_no_reply",
    "missing_fallback", "grace_too_short", "ai_after_24h", "ai_after_24h_cycle", "cycle_without_wait",
    "too_many_steps", "unknown_template", "unknown_field", "more_issues",
)

EdgeKey = tuple[str, Any]


@dataclass
class _Flow:
    """The graph as the rules read it (built once, after check_draft passed)."""

    order: tuple[str, ...]
    types: dict[str, str]
    #: Normalized configs; None for a node whose config is invalid (already an issue).
    configs: dict[str, dict[str, Any] | None]
    trigger: dict[str, Any] | None
    #: source → condition key → target, for the usable edges only.
    usable: dict[str, dict[EdgeKey, str]]
    issues: list[FlowIssue] = field(default_factory=list)

    def successors(self, node_id: str) -> Iterable[str]:
        return self.usable[node_id].values()

    def of_type(self, node_type: str) -> list[str]:
        return [node_id for node_id in self.order if self.types[node_id] == node_type]


def validate_for_publish(graph: Any, *, trigger_config: Any, max_steps: int,
                         template_exists: Callable[[str], bool] | None = None,
                         field_exists: Callable[[str], bool] | None = None) -> list[FlowIssue]:
    """Every rule the draft `graph` breaks to be published with this trigger config and
    `max_steps` (1..200), sorted by node order then code; [] when it may be published.

    The draft's shape comes first (check_draft): when it is broken, only those issues (and a bad
    `max_steps`) are returned, since the other rules need well-formed nodes and edges. When
    `template_exists` is given, every template an action names must exist; when `field_exists` is,
    every conversation field an `ask` collects.

    The list is bounded (`issues.bounded`): the first MAX_ISSUES, then one `more_issues`."""
    steps = _max_steps_issues(max_steps)
    draft = check_draft(graph)
    if draft:
        return bounded(sort_issues(steps + draft, node_ids(graph)))
    flow = _build(graph, trigger_config)
    issues = steps + flow.issues + (_too_many_steps(flow, max_steps) if not steps else [])
    for rule in _RULES:
        issues += rule(flow)
    issues += _unknown_templates(flow, template_exists)
    issues += _unknown_fields(flow, field_exists)
    return bounded(sort_issues(issues, flow.order))


# --- building the flow: configs, trigger, usable edges --------------------------------------------

def _build(graph: Mapping[str, Any], trigger_config: Any) -> _Flow:
    nodes = graph["nodes"]
    flow = _Flow(order=tuple(node["id"] for node in nodes), types={node["id"]: node["type"] for node in nodes},
                 configs={}, trigger=None, usable={node["id"]: {} for node in nodes})
    for node in nodes:
        flow.configs[node["id"]] = _node_config(flow, node)
    flow.trigger = _trigger_config(flow, trigger_config)
    _sort_edges(flow, graph["edges"])
    return flow


def _node_config(flow: _Flow, node: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        return normalize_node_config(node["type"], node["config"])
    except ConfigError as error:
        flow.issues += [_config_issue(node, problem) for problem in error.problems]
        return None


def _config_issue(node: Mapping[str, Any], problem: Problem) -> FlowIssue:
    grace = node["config"].get("grace_minutes")
    if (node["type"] == "ai_classify" and problem.path == ("grace_minutes",) and isinstance(grace, int)
            and not isinstance(grace, bool) and grace < MIN_GRACE_MINUTES):
        # The schema's lower bound, reported with its own code: it is a decision the clinic
        # makes (how long to wait for an answer), not a malformed field.
        return FlowIssue(node["id"], "grace_too_short", {"minutes": grace, "min": MIN_GRACE_MINUTES})
    return FlowIssue(node["id"], "invalid_config", {"field": problem.field("config"), "detail": problem.detail})


def _trigger_config(flow: _Flow, trigger_config: Any) -> dict[str, Any] | None:
    try:
        return load_trigger_config(trigger_config)
    except ConfigError as error:
        triggers = flow.of_type("trigger")
        node_id = triggers[0] if triggers else None
        flow.issues += [FlowIssue(node_id, "invalid_trigger", {"field": p.field("trigger_config"), "detail": p.detail})
                        for p in error.problems]
        return None


def _which(key: EdgeKey) -> str:
    """The edge's name in a message: its condition type, class, or true/false."""
    condition_type, value = key
    if condition_type in ("class_match", "cond_result") and isinstance(value, str):
        return value
    return condition_type


def _sort_edges(flow: _Flow, edges: Sequence[Mapping[str, Any]]) -> None:
    """Keep the usable edges in `flow.usable`; report each edge the runtime could never take."""
    duplicates: dict[tuple[str, EdgeKey], None] = {}
    for edge in edges:
        source, target = edge["source"], edge["target"]
        condition_type, value = edge["condition"]["type"], edge["condition"].get("value")
        if source not in flow.types or target not in flow.types:
            known = source in flow.types
            flow.issues.append(FlowIssue(source if known else None, "edge_unknown_node",
                                         {"node": target if known else source}))
            continue
        if condition_type not in ALLOWED_EDGES[flow.types[source]]:
            flow.issues.append(FlowIssue(source, "edge_not_allowed", {"condition": condition_type}))
            continue
        config = flow.configs[source]
        if flow.types[source] == "do" and config is not None and condition_type not in DO_EXITS[config["action"]]:
            flow.issues.append(FlowIssue(source, "edge_not_allowed", {"condition": condition_type}))
            continue
        if condition_type == "class_match" and config is not None and value not in config["classes"]:
            flow.issues.append(FlowIssue(source, "unknown_class", {"class": value}))
            continue
        key = edge_key(condition_type, value)
        if key in flow.usable[source]:
            duplicates.setdefault((source, key), None)  # GraphIndex.target takes the first one
            continue
        flow.usable[source][key] = target
    flow.issues += [FlowIssue(source, "duplicate_edge", {"which": _which(key)}) for source, key in duplicates]


# --- rules ----------------------------------------------------------------------------------------

def _max_steps_issues(max_steps: Any) -> list[FlowIssue]:
    low, high = MAX_STEPS_RANGE
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and low <= max_steps <= high:
        return []
    shown = max_steps if isinstance(max_steps, int) else str(max_steps)
    return [FlowIssue(None, "invalid_max_steps", {"max_steps": shown})]


def _too_many_steps(flow: _Flow, max_steps: int) -> list[FlowIssue]:
    if len(flow.order) <= max_steps:
        return []
    return [FlowIssue(None, "too_many_steps", {"count": len(flow.order), "max_steps": max_steps})]


def _trigger_count(flow: _Flow) -> list[FlowIssue]:
    count = len(flow.of_type("trigger"))
    return [] if count == 1 else [FlowIssue(None, "trigger_count", {"count": count})]


def _node_edges(flow: _Flow) -> list[FlowIssue]:
    """Each node has the out edges its type needs (docs/flows.md, "edges out")."""
    issues = []
    for node_id in flow.order:
        node_type, keys = flow.types[node_id], flow.usable[node_id]
        if node_type == "end":
            continue
        if not keys:
            issues.append(FlowIssue(node_id, "dead_end"))
            continue  # one issue says it all; the missing edges would only repeat it
        issues += _missing_edges(node_id, node_type, keys, flow.configs[node_id])
    return issues


def _missing_edges(node_id: str, node_type: str, keys: Mapping[EdgeKey, str],
                   config: Mapping[str, Any] | None) -> list[FlowIssue]:
    if node_type in ("trigger", "wait", "action"):
        return [] if _ALWAYS in keys else [FlowIssue(node_id, "missing_edge", {"which": "always"})]
    if node_type == "condition":
        return [FlowIssue(node_id, "missing_edge", {"which": which}) for key, which in _CONDITION_RESULTS
                if key not in keys]
    if node_type == "ask":
        return [FlowIssue(node_id, "missing_edge", {"which": which}) for which in ("complete", "gave_up", "no_reply")
                if edge_key(which) not in keys]
    if node_type == "do":
        exits = DO_EXITS.get(config["action"], ()) if config is not None else ()
        return [FlowIssue(node_id, "missing_edge", {"which": which}) for which in exits if edge_key(which) not in keys]
    issues = []  # ai_classify
    if edge_key("no_reply") not in keys:
        issues.append(FlowIssue(node_id, "missing_no_reply"))
    if _ALWAYS not in keys:
        issues.append(FlowIssue(node_id, "missing_fallback"))
    for name in config["classes"] if config is not None else ():
        if edge_key("class_match", name) not in keys:
            issues.append(FlowIssue(node_id, "class_without_edge", {"class": name}))
    return issues


def _paths(flow: _Flow) -> list[FlowIssue]:
    """`unreachable`, and `no_path_to_end` on the nodes trapped in a loop no end can be reached
    from (nodes that only lead into such a loop, or into a dead end, are not repeated)."""
    triggers = flow.of_type("trigger")
    if not triggers:
        return []  # trigger_count says it; every node "unreachable" would only add noise
    reached = _reach(triggers, flow.successors)
    issues = [FlowIssue(node_id, "unreachable") for node_id in flow.order if node_id not in reached]
    predecessors = _reverse(flow)
    ends = _reach(flow.of_type("end"), lambda node_id: predecessors[node_id])
    for component in _components(flow):
        members = set(component)
        closed = all(successor in members for node_id in component for successor in flow.successors(node_id))
        if closed and _is_cycle(flow, component) and not members & ends:
            issues += [FlowIssue(node_id, "no_path_to_end") for node_id in component if node_id in reached]
    return issues


def _cycles_without_wait(flow: _Flow) -> list[FlowIssue]:
    """Every cycle must pass through a wait of at least 5 minutes: in each strongly connected
    component, take those waits out; if a cycle is left, some cycle avoids them all."""
    issues = []
    for component in _components(flow):
        if not _is_cycle(flow, component):
            continue
        rest = {node_id for node_id in component if not _pauses(flow, node_id)}
        if any(_is_cycle(flow, part, within=rest) for part in _components(flow, within=rest)):
            issues.append(FlowIssue(min(component), "cycle_without_wait", {"minutes": MIN_WAIT_MINUTES}))
    return issues


def _ai_after_24h(flow: _Flow) -> list[FlowIssue]:
    """The 24 h rule: an AI message without a fallback template must not be reachable after
    24 h of accumulated waiting (see `_longest_waits`)."""
    waited = _longest_waits(flow)
    issues = []
    for node_id in flow.of_type("action"):
        config = flow.configs[node_id]
        if config is None or config["mode"] != "ai_message" or config["fallback_template"] or node_id not in waited:
            continue
        minutes = waited[node_id]
        if math.isinf(minutes):
            issues.append(FlowIssue(node_id, "ai_after_24h_cycle"))
        elif minutes >= AI_WINDOW_MINUTES:
            issues.append(FlowIssue(node_id, "ai_after_24h", {"hours": int(minutes // 60)}))
    return issues


def _unknown_fields(flow: _Flow, field_exists: Callable[[str], bool] | None) -> list[FlowIssue]:
    if field_exists is None:
        return []
    issues = [FlowIssue(node_id, "unknown_field", {"field": slug}) for node_id in flow.of_type("ask")
              if flow.configs[node_id] is not None for slug in flow.configs[node_id]["fields"]
              if not field_exists(slug)]
    for node_id in flow.of_type("do"):  # the fields an action reads the patient's wishes from
        config = flow.configs[node_id] or {}
        issues += [FlowIssue(node_id, "unknown_field", {"field": config[key]})
                   for key in ("date_field", "period_field", "time_field") if config.get(key)
                   and not field_exists(config[key])]
    return issues


def _unknown_templates(flow: _Flow, template_exists: Callable[[str], bool] | None) -> list[FlowIssue]:
    if template_exists is None:
        return []
    issues = []
    for node_id in flow.of_type("action"):
        config = flow.configs[node_id]
        if config is None:
            continue
        where = "template" if config["mode"] == "template" else "fallback_template"
        key = config[where]
        if key is not None and not template_exists(key):
            issues.append(FlowIssue(node_id, "unknown_template", {"template": key, "field": where}))
    return issues


_RULES: tuple[Callable[[_Flow], list[FlowIssue]], ...] = (
    _trigger_count, _node_edges, _paths, _cycles_without_wait, _ai_after_24h,
)


# --- time along paths -----------------------------------------------------------------------------

def _pauses(flow: _Flow, node_id: str) -> bool:
    """Whether the node is a wait that holds an enrollment for at least 5 minutes (a wait whose
    config is invalid counts: it is reported already, and a second issue would only mislead)."""
    if flow.types[node_id] != "wait":
        return False
    config = flow.configs[node_id]
    if config is None:
        return True
    shortest = config["minutes"] if config["mode"] == "fixed" else config["min_minutes"]
    return shortest >= MIN_WAIT_MINUTES


def _weight(flow: _Flow, node_id: str) -> float:
    """The longest time an enrollment can spend in the node (minutes; 0 for an invalid config)."""
    node_type, config = flow.types[node_id], flow.configs[node_id]
    if node_type == "trigger":
        trigger = flow.trigger
        return trigger["minutes"] if trigger is not None and trigger["kind"] in WAITING_TRIGGERS else 0
    if config is None:
        return 0
    if node_type == "wait":
        return config["minutes"] if config["mode"] == "fixed" else config["max_minutes"]
    if node_type == "ask":  # every field asked its most times, each question waiting its grace
        return config["grace_minutes"] * config["max_asks"] * len(config["fields"])
    if node_type == "do":  # an offer waits for its pick, each list its grace
        return config["grace_minutes"] * config["max_asks"] if config["action"] == "offer_slots" else 0
    return config["grace_minutes"] if node_type == "ai_classify" else 0


def _longest_waits(flow: _Flow) -> dict[str, float]:
    """For each node reachable from the trigger, the longest waiting before it (minutes): the
    longest path from the trigger summing each wait's maximum, each classify's grace and a
    silence/reminder_no_reply trigger's minutes. A node on a cycle, or after a cycle that holds
    time (a wait or a classify), can be reached after any amount of waiting: math.inf.

    Computed over the graph of strongly connected components, which is acyclic."""
    components = _components(flow)  # Tarjan's order: a component after all it leads to
    component_of = {node_id: index for index, members in enumerate(components) for node_id in members}
    before: dict[int, float] = {component_of[node_id]: 0 for node_id in flow.of_type("trigger")}
    for index in reversed(range(len(components))):
        if index not in before:
            continue
        members = components[index]
        if _is_cycle(flow, members):
            timed = any(flow.types[n] in ("wait", "ai_classify", "ask") or _weight(flow, n) > 0 for n in members)
            spent = math.inf if timed else 0.0
        else:
            spent = _weight(flow, members[0])
        for node_id in members:
            for successor in flow.successors(node_id):
                target = component_of[successor]
                if target != index:
                    before[target] = max(before.get(target, 0), before[index] + spent)
    return {node_id: math.inf if _is_cycle(flow, members) else before[index]
            for index, members in enumerate(components) if index in before for node_id in members}


# --- graph helpers --------------------------------------------------------------------------------

def _reach(roots: Iterable[str], successors: Callable[[str], Iterable[str]]) -> set[str]:
    seen = set(roots)
    pending = list(seen)
    while pending:
        for successor in successors(pending.pop()):
            if successor not in seen:
                seen.add(successor)
                pending.append(successor)
    return seen


def _reverse(flow: _Flow) -> dict[str, list[str]]:
    predecessors: dict[str, list[str]] = {node_id: [] for node_id in flow.order}
    for node_id in flow.order:
        for successor in flow.successors(node_id):
            predecessors[successor].append(node_id)
    return predecessors


def _is_cycle(flow: _Flow, component: Sequence[str], within: set[str] | None = None) -> bool:
    """Whether a strongly connected component holds a cycle (two nodes or more, or a self-loop)."""
    if len(component) > 1:
        return True
    node_id = component[0]
    return node_id in flow.successors(node_id) and (within is None or node_id in within)


def _components(flow: _Flow, within: set[str] | None = None) -> list[list[str]]:
    """The strongly connected components of the usable edges (restricted to `within` when
    given), by Tarjan's algorithm without recursion (a graph may have 200 nodes in a row).
    A component comes after every component it leads to."""
    nodes = [node_id for node_id in flow.order if within is None or node_id in within]
    allowed = set(nodes)

    def successors(node_id: str) -> list[str]:
        return [s for s in flow.successors(node_id) if s in allowed]

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node_id: str) -> None:
        index[node_id] = low[node_id] = len(index)
        stack.append(node_id)
        on_stack.add(node_id)

    for root in nodes:
        if root in index:
            continue
        visit(root)
        work = [(root, iter(successors(root)))]
        while work:
            node_id, pending = work[-1]
            for successor in pending:
                if successor not in index:
                    visit(successor)
                    work.append((successor, iter(successors(successor))))
                    break
                if successor in on_stack:
                    low[node_id] = min(low[node_id], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node_id])
                if low[node_id] == index[node_id]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node_id:
                            break
                    components.append(component)
    return components
