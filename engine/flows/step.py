"""One step of a run, as the nodes decide it and the runtime writes it: what a node reads
(`Snapshot`), what it decided (`Decision`, with the message to `Send` and the effect to `act`
in the step's own transaction), and the AI call a node hands back to be made with no
connection held (`Ask`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from sqlalchemy.engine import Connection

from engine.flows.graph import GraphIndex


@dataclass
class Snapshot:
    """Everything a node reads, loaded once per step."""

    enrollment: Any
    graph: GraphIndex
    pointer: Any
    org: Any
    contact: Any
    appointment: Any
    reply: Any
    agent: Any
    now: datetime
    human: bool
    #: Where a tenant-set address may lead (the clinic's availability webhook); None: public only.
    egress: Any = None
    #: How the claim's contacts can be reached (`engine.flows.reach.Reach`), read once per claim;
    #: None: read for this contact alone.
    reach: Any = None

    @property
    def node_id(self) -> str:
        return str(self.enrollment.current_node_id)


@dataclass(frozen=True)
class Send:
    """A follow-up to put in the outbox: a template, or AI text with an optional template
    (the approved one Meta sends when its 24 h window has closed by send time)."""

    channel_kind: str
    template_key: str | None
    text: str | None = None


@dataclass
class Decision:
    """The outcome of one step, as the run timeline shows it, and what to write."""

    status: str
    reason: str
    next_node: str | None = None
    #: The exit `next_node` was reached by: the edge condition (type, value), as the step's event
    #: records it, so no reader has to guess it from the reason (two exits may share a target).
    exit: tuple[str, Any] | None = None
    end: tuple[str, str | None] | None = None
    send: Send | None = None
    failed: bool = False
    consumed_reply: bool = False
    llm_calls: int = 0
    values: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    #: The run stays on its node and waits for the next reply (an `ask` that asked again).
    stay: bool = False
    #: The patient asked for a person: the conversation goes to staff (the flow's hand-off policy).
    handoff: bool = False
    #: Another run of the contact is asking them something: this one stays on its node and looks
    #: again later (engine/flows/conversation/floor.py), without counting a step.
    wait_floor: bool = False
    #: The reply the run holds goes on to the next node (a trigger passes on the message that
    #: started the run, for its first `ask` to read).
    keep_reply: bool = False
    #: Replies read besides `Snapshot.reply`: the fragments of one turn.
    also_read: tuple[int, ...] = ()
    #: An effect on the clinic's records (a `do` node: confirm, move, book…), run in the step's
    #: transaction once the run is held for this claim; it says the step's final `Decision`
    #: (its exit may change: a time taken meanwhile is `unavailable`). Run at most once per claim.
    act: Callable[[Connection], "Decision"] | None = None
    #: What follows the step in its transaction once it is written (the patient's opt-out in words:
    #: recorded for the contact, which ends their other runs too).
    then: Callable[[Connection], None] | None = None


def via(graph: GraphIndex, node_id: str, condition_type: str, value: Any = None) -> dict[str, Any]:
    """A `Decision`'s `next_node` and `exit` for leaving `node_id` by this edge condition."""
    return {"next_node": graph.target(node_id, condition_type, value), "exit": (condition_type, value)}


@dataclass(frozen=True)
class Ask:
    """A node that needs the AI, its reads done: `run()` makes the call and says the `Decision`.
    It touches no database, so the runtime runs it with no connection (nor transaction) held."""

    run: Callable[[], Decision]
