"""How a node starts: the status and clock of a run arriving at it. Every wait is anchored on the
instant it is entered (`entry`), so after downtime a run goes on from now instead of firing every
missed step at once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Mapping

from engine.flows.ai.base import SmartWait, clamp
from engine.flows.graph import GraphIndex


@dataclass(frozen=True)
class Entry:
    """How a node starts: the enrollment's status and clock when it arrives there."""

    status: str
    next_eval_at: datetime | None
    outcome: str | None = None
    reason: str = "entered"


def entry(graph: GraphIndex, node_id: str, now: datetime, timing_plan: Mapping[str, Any] | None) -> Entry:
    """Enter `node_id` at `now`. Every wait is anchored on the instant it is entered, so after
    downtime the enrollment goes on from now instead of firing every missed step at once."""
    node_type = graph.type(node_id)
    config = graph.config(node_id)
    if node_type == "wait":
        return Entry("active", now + timedelta(minutes=wait_minutes(node_id, config, timing_plan)))
    if node_type == "ai_classify":
        return Entry("waiting_reply", now + timedelta(minutes=config["grace_minutes"]))
    if node_type == "end":
        return Entry("completed", None, outcome=config.get("outcome", "custom"), reason="ended")
    return Entry("active", now)


def wait_minutes(node_id: str, config: Mapping[str, Any], timing_plan: Mapping[str, Any] | None) -> int:
    """A wait's duration: fixed, or the plan's (clamped again here: the node's bounds rule where
    the number is used), or the maximum when there is no readable plan for it."""
    if config.get("mode") != "smart":
        return int(config["minutes"])
    bounds = SmartWait(node_id, config["min_minutes"], config["max_minutes"])
    planned = (timing_plan or {}).get(node_id) if isinstance(timing_plan, Mapping) else None
    minutes = planned.get("minutes") if isinstance(planned, Mapping) else None
    if not isinstance(minutes, int) or isinstance(minutes, bool):
        return bounds.max_minutes
    return clamp(minutes, bounds)
