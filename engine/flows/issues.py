"""`FlowIssue`: one broken rule of a flow, on the node it belongs to (or on the whole flow).

It lives apart from `schema.py` and `validate.py` because both produce issues and `validate.py`
imports `schema.py`; keeping the type here avoids an import cycle.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.words.catalogue import describe
from engine.words.texts import Text

#: How many issues a refusal lists; the rest are counted in one last `more_issues` issue (a
#: request with thousands of unknown keys got an answer of 15 MB when each had its own issue).
MAX_ISSUES = 50
#: The longest text an issue repeats from what it was given (a key, a class or node name).
MAX_PARAM_CHARS = 80
MORE_ISSUES = "more_issues"


@dataclass(frozen=True)
class FlowIssue:
    """A rule the flow breaks: `code` is a catalogue code, `params` its placeholders.

    `node_id` is the node the builder should highlight (for an edge, its source node), or None
    for an issue of the whole flow (e.g. `trigger_count`)."""

    node_id: str | None
    code: str
    # Params may hold dicts and Texts, which are unhashable: the issue hashes on node and code.
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def message(self) -> Text:
        """The sentence a person reads (pt-BR msgid; the console translates it)."""
        return describe(self.code, **self.params)

    def as_dict(self) -> dict[str, Any]:
        """The issue as JSON-ready data; Text params (e.g. `detail`) become their pt-BR sentence."""
        params = {key: str(value) if isinstance(value, Text) else value for key, value in self.params.items()}
        return {"node_id": self.node_id, "code": self.code, "params": params}


def sort_issues(issues: Iterable[FlowIssue], node_order: Sequence[Any]) -> list[FlowIssue]:
    """Issues in a stable order: whole-flow issues first, then by the node's position in the
    graph, then by code, then by params (so two runs over one graph always agree)."""
    position: dict[Any, int] = {}
    for index, node_id in enumerate(node_order):
        if isinstance(node_id, str):  # a node's id may be anything in a broken draft, an object too
            position.setdefault(node_id, index)

    def key(issue: FlowIssue) -> tuple[int, str, str]:
        where = -1 if issue.node_id is None else position.get(str(issue.node_id), len(position))
        # Params in the order the issue was built with (field before detail), not alphabetical.
        return where, issue.code, json.dumps(issue.params, default=str)

    return sorted(issues, key=key)


def bounded(issues: Iterable[FlowIssue]) -> list[FlowIssue]:
    """`issues` as a refusal lists them: the first MAX_ISSUES, then one `more_issues` issue counting
    the rest, each text parameter cut to MAX_PARAM_CHARS. Bounding twice changes nothing (a
    `more_issues` among `issues` adds its count to the new one)."""
    shown: list[FlowIssue] = []
    hidden = 0
    for issue in issues:
        if issue.code == MORE_ISSUES:
            hidden += int(issue.params.get("count", 0))
        elif len(shown) < MAX_ISSUES:
            shown.append(_shortened(issue))
        else:
            hidden += 1
    if hidden:
        shown.append(FlowIssue(None, "more_issues", {"count": hidden}))
    return shown


def _shortened(issue: FlowIssue) -> FlowIssue:
    long = [key for key, value in issue.params.items() if isinstance(value, str) and len(value) > MAX_PARAM_CHARS]
    if not long:
        return issue
    params = {key: value[:MAX_PARAM_CHARS - 1] + "…" if key in long else value for key, value in issue.params.items()}
    return FlowIssue(issue.node_id, issue.code, params)
