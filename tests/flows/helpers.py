"""Builders for follow-up flow tests: flows published through the engine's own functions, the
scheduler's claim and the actor's body run in-process, replies through the sandbox webhook."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from typing import Any, Callable, Iterable, Mapping

from sqlalchemy import insert, select, update

from engine.core import clock
from engine.messaging import dispatch
from engine.flows import runtime, triggers, versions
from engine.flows.ai.base import AI
from engine.messaging.inbound import process_inbound, receive
from engine.store.models import agents, enrollment_events, enrollments, messages
from gateway.contract import WebhookRequest
from tests.factories import World, sandbox_headers

_ids = itertools.count(1)


def node(node_id: str, node_type: str, **config: Any) -> dict[str, Any]:
    return {"id": node_id, "type": node_type, "config": config}


def edge(source: str, target: str, kind: str = "always", value: Any = None) -> dict[str, Any]:
    condition: dict[str, Any] = {"type": kind}
    if value is not None:
        condition["value"] = value
    return {"source": source, "target": target, "condition": condition}


class Flows:
    """A tenant's flows, agent and enrollments, and a hand on the runtime."""

    def __init__(self, world: World, *, ai: Callable[[Any], AI] | None = None) -> None:
        self.world = world
        self.rt = world.rt
        self.org_id = world.org_id
        self.ai = ai
        self.agent_id: int | None = None

    def flow(self, graph: Mapping[str, Any], *, trigger: Mapping[str, Any] | None = None, name: str | None = None,
             publish: bool = True, agent: bool = True, **settings: Any) -> int:
        """Create (and publish) a flow; with `agent`, an enabled agent may start it."""
        with self.rt.db.begin() as conn:
            pointer_id = versions.create_flow(conn, self.org_id, name=name or f"Fluxo {next(_ids)}",
                                              draft_graph=graph, trigger_config=trigger or {"kind": "manual"},
                                              **settings)
            if publish:
                versions.publish(conn, self.org_id, pointer_id)
        if agent:
            self.enable(pointer_id)
        return pointer_id

    def enable(self, pointer_id: int, **llm: Any) -> int:
        """An enabled agent (created once per tenant) that may start this flow."""
        now = clock.now()
        with self.rt.db.begin() as conn:
            if self.agent_id is None:
                self.agent_id = int(conn.execute(insert(agents).values(
                    org_id=self.org_id, name="Assistente", handoff_policy="pause", followup_enabled=True,
                    flow_pointer_ids=[pointer_id], created_at=now, updated_at=now, **llm,
                ).returning(agents.c.id)).scalar_one())
            else:
                ids = conn.execute(select(agents.c.flow_pointer_ids).where(agents.c.id == self.agent_id)).scalar()
                conn.execute(update(agents).where(agents.c.id == self.agent_id)
                             .values(flow_pointer_ids=sorted(set(ids) | {pointer_id}), **llm))
        return self.agent_id

    def enroll(self, pointer_id: int, contact_id: int, *, key: str | None = None) -> int:
        with self.rt.db.begin() as conn:
            result = triggers.enroll(conn, self.org_id, pointer_id, contact_id, trigger_kind="manual",
                                     trigger_key=f"manual:{key or next(_ids)}", caller_key=key, automatic=False)
        assert result.enrollment_id is not None, result.reason
        return result.enrollment_id

    def tick(self) -> int:
        """One scheduler pass over enrollments, run in-process: sweep, claim, advance."""
        runtime.sweep_lost(self.rt)
        pairs = runtime.claim_due(self.rt, limit=1000)
        return runtime.advance_claimed(self.rt, pairs, ai=self.ai)

    def run(self, *, send: bool = True, rounds: int = 5) -> None:
        """Tick until nothing is due now, sending what the outbox has due too."""
        for _ in range(rounds):
            steps = self.tick()
            sent = self.send() if send else 0
            if not steps and not sent:
                return

    def send(self) -> int:
        """Send every due outbox row through the sandbox."""
        ids = dispatch.claim_due(self.rt, limit=1000)
        for message_id in ids:
            dispatch.send_one(self.rt, message_id)
        return len(ids)

    def enrollment(self, enrollment_id: int) -> Any:
        with self.rt.db.connect() as conn:
            return conn.execute(select(enrollments).where(enrollments.c.org_id == self.org_id,
                                                          enrollments.c.id == enrollment_id)).one()

    def steps(self, enrollment_id: int) -> list[dict[str, Any]]:
        """The `step` events of a run: node, status, reason, next (its timeline)."""
        with self.rt.db.connect() as conn:
            rows = conn.execute(select(enrollment_events).where(
                enrollment_events.c.org_id == self.org_id, enrollment_events.c.enrollment_id == enrollment_id,
                enrollment_events.c.event_type == "step").order_by(enrollment_events.c.id)).all()
        return [{"node": row.node_id, **(row.payload or {})} for row in rows]

    def events(self, enrollment_id: int) -> list[str]:
        with self.rt.db.connect() as conn:
            return list(conn.execute(select(enrollment_events.c.event_type).where(
                enrollment_events.c.org_id == self.org_id, enrollment_events.c.enrollment_id == enrollment_id)
                .order_by(enrollment_events.c.id)).scalars())

    def followups(self, enrollment_id: int | None = None) -> list[Any]:
        query = select(messages).where(messages.c.org_id == self.org_id, messages.c.purpose == "followup")
        if enrollment_id is not None:
            query = query.where(messages.c.enrollment_id == enrollment_id)
        with self.rt.db.connect() as conn:
            return list(conn.execute(query.order_by(messages.c.id)))

    def reply(self, text: str, *, sender: str = "+5516999887766", kind: str = "whatsapp") -> list[str | None]:
        """The patient writes on the sandbox channel; the inbound is processed at once."""
        payload = {"type": "message", "id": f"in-{next(_ids)}", "from": sender, "text": text,
                   "timestamp": clock.now().timestamp()}
        channel_id = self.world.channels[kind]
        request = WebhookRequest(method="POST", url="/webhooks/sandbox", headers=sandbox_headers(self.rt, channel_id),
                                 body=json.dumps(payload).encode())
        received = receive(self.rt, "sandbox", channel_id, request)
        return [process_inbound(self.rt, inbound_id) for inbound_id in received.inbound_ids]


#: Past the org's default reply debounce (8 s): the fragments sent before it are read as one turn.
DEBOUNCE = timedelta(seconds=9)


def turn(flows: Flows, clock: Any, *texts: str, sender: str = "+5516999887766") -> None:
    """The patient sends `texts`, two seconds apart, as one turn; the engine reads it once the
    debounce has passed and answers."""
    for text in texts:
        flows.reply(text, sender=sender)
        clock.advance(timedelta(seconds=2))
    clock.advance(DEBOUNCE)
    flows.run()


def conversation_fields(rt: Any, org_id: int, *fields: Mapping[str, Any]) -> None:
    """Declare the org's conversation fields (engine/flows/conversation/fields.py)."""
    from engine.flows.conversation.fields import create_field

    with rt.db.begin() as conn:
        for spec in fields:
            create_field(conn, org_id, dict(spec))


def linear(*nodes_: dict[str, Any]) -> dict[str, Any]:
    """A graph whose nodes follow one another with `always` edges."""
    return {"nodes": list(nodes_),
            "edges": [edge(a["id"], b["id"]) for a, b in zip(nodes_, nodes_[1:])]}


def statuses(steps: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    return [(s["node"], s["status"], s["reason"]) for s in steps]
