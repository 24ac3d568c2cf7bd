"""One turn of an `ask` node, decided: take what the patient's reply says about the node's
fields, then finish (every field known), give up (a field asked `max_asks` times) or ask for the
next field still unknown. Pure: the node (engine/flows/nodes.py) reads, understands and writes.

The node's place in its conversation (`AskState`) is kept on the run (`enrollments.ask_state`),
tagged with the visit it belongs to, so that coming back to the same node later starts afresh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from engine.flows.conversation.fields import Field
from engine.flows.conversation.values import HORIZON_DAYS, harvest
from engine.words.findings import Finding
from engine.words.understanding import Understanding


@dataclass(frozen=True)
class AskState:
    """The node visit (when it was entered), the field asked last, and how many times each
    field has been asked in this visit."""

    visit: str
    asked: str | None = None
    asks: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, stored: Any, visit: str) -> "AskState":
        """The stored state when it belongs to this visit, else a fresh one."""
        if not isinstance(stored, Mapping) or stored.get("visit") != visit:
            return cls(visit)
        asks = stored.get("asks")
        asked = stored.get("asked")
        return cls(visit, asked if isinstance(asked, str) else None,
                   {str(k): int(v) for k, v in asks.items() if isinstance(v, int)} if isinstance(asks, Mapping) else {})

    def as_json(self) -> dict[str, Any]:
        """The form stored on the run."""
        return {"visit": self.visit, "asked": self.asked, "asks": dict(self.asks)}


@dataclass(frozen=True)
class TurnResult:
    """What the node does now. `outcome`: `complete`, `gave_up` or `ask` (then `ask_for` is the
    field to ask and `refusal`, when set, why the value the patient gave for it was refused)."""

    outcome: str
    data: dict[str, Any]
    state: AskState
    ask_for: Field | None = None
    refusal: Finding | None = None
    taken: tuple[str, ...] = ()


def take_turn(specs: Sequence[Field], data: Mapping[str, Any], state: AskState, *, text: str | None,
              reading: Understanding | None, max_asks: int, today: date,
              horizon_days: int = HORIZON_DAYS) -> TurnResult:
    """Decide the node's turn.

    :param specs: the node's fields, in the order it asks them.
    :param data: the values the run holds (any field already known is not asked).
    :param text: the patient's reply (its fragments joined), or None when the node just started.
    :param reading: how `text` was understood (None with no text).
    """
    values = dict(data)
    refused: dict[str, Finding] = {}
    taken: tuple[str, ...] = ()
    if text is not None and reading is not None:
        found = harvest(specs, text, reading, asked=state.asked, today=today, horizon_days=horizon_days)
        values.update(found.values)
        refused = found.refused
        taken = tuple(sorted(found.values))
    pending = [spec for spec in specs if spec.slug not in values]
    if not pending:
        return TurnResult("complete", values, state, taken=taken)
    # The field just asked keeps the floor while it is unanswered; else the first one unknown.
    nxt = next((spec for spec in pending if spec.slug == state.asked), pending[0])
    asked_before = state.asks.get(nxt.slug, 0)
    if asked_before >= max_asks:
        return TurnResult("gave_up", values, state, ask_for=nxt, taken=taken)
    asks = {**state.asks, nxt.slug: asked_before + 1}
    return TurnResult("ask", values, AskState(state.visit, nxt.slug, asks), ask_for=nxt,
                      refusal=refused.get(nxt.slug), taken=taken)
