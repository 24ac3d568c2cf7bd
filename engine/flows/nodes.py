"""What each node type does. `decide` runs the enrollment's current node and says what happens
next (a `Decision`); `entry` says how the next node starts (its status and clock). Neither
writes anything: `runtime.advance` applies both in one transaction, or nothing at all.

A node that needs the AI does its reads in `decide` and hands back an `Ask`: the AI call, with
everything it needs already read, which the runtime makes once it has released its connection,
so that no database transaction is open while a model answers. A human holding the conversation
means zero LLM calls (the deterministic built-in answers instead).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping
from zoneinfo import ZoneInfo

from sqlalchemy.engine import Connection

from sqlalchemy import select

from engine.flows import conditions, facts, triggers
from engine.flows.ai.base import AI, AIContext, AIError, SmartWait, Turn, clamp
from engine.flows.ai.builtin import BuiltinAI
from engine.flows.conversation.ask import AskState, TurnResult, take_turn
from engine.flows.conversation.fields import fields_by_slug
from engine.flows.graph import GraphIndex
from engine.queue import address_optouts as addresses
from engine.queue.conversation_window import conversation_open
from engine.store.models import inbound_messages, preferences
from engine.tenants.channels import default_channel
from engine.tenants.orgs import reply_reading
from engine.words.keywords import parse_keywords
from engine.words.understanding import Context

#: The kinds tried, in order, when a node does not say.
DEFAULT_KINDS = ("whatsapp", "sms", "email")
#: An AI-written message is plain text: control characters out, at most this long.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


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
    #: Replies read besides `Snapshot.reply`: the fragments of one turn.
    also_read: tuple[int, ...] = ()


@dataclass(frozen=True)
class Ask:
    """A node that needs the AI, its reads done: `run()` makes the call and says the `Decision`.
    It touches no database, so the runtime runs it with no connection (nor transaction) held."""

    run: Callable[[], Decision]


def _context(conn: Connection, snap: Snapshot) -> AIContext:
    org = snap.org
    first = (snap.contact.name or "").split()
    history = tuple(Turn(role, text, at) for role, text, at in
                    facts.conversation(conn, org.id, snap.contact.id) if text)
    return AIContext(
        org_name=org.name, persona=getattr(snap.agent, "persona", None), contact_first_name=first[0] if first else None,
        locale=snap.contact.locale or org.locale, timezone=org.timezone, now=snap.now, history=history,
        org_keywords={"confirm": parse_keywords(org.confirm_keywords), "cancel": parse_keywords(org.cancel_keywords)},
    )


def _ai_error(exc: AIError) -> Decision:
    # A key that does not decrypt or a refused address fails before any request; else one call.
    calls = 0 if exc.code in ("llm_key_unreadable", "egress_refused") else 1
    return Decision("failed", "ai_unavailable", failed=True, llm_calls=calls, params={"code": exc.code})


def decide(conn: Connection, snap: Snapshot, ai: AI) -> Decision | Ask:
    """Run the enrollment's current node: its `Decision`, or, for a node that needs the AI, the
    `Ask` that makes the call (every read is done here; `Ask.run` reads nothing)."""
    handler = _HANDLERS[snap.graph.type(snap.node_id)]
    return handler(conn, snap, ai)


def _trigger(conn: Connection, snap: Snapshot, ai: AI) -> Decision | Ask:
    if not triggers.premise_holds(conn, snap.enrollment):
        return Decision("skipped", "silence_broken", end=("cancelled", None))
    decision = Decision("ok", "trigger_fired", next_node=snap.graph.target(snap.node_id, "always"))
    waits = [SmartWait(node_id, snap.graph.config(node_id)["min_minutes"], snap.graph.config(node_id)["max_minutes"],
                       snap.graph.config(node_id).get("guidance"))
             for node_id in snap.graph.smart_waits()]
    if not waits or snap.enrollment.timing_plan is not None:
        return decision
    planner = BuiltinAI() if snap.human else ai
    context = _context(conn, snap)

    def plan_waits() -> Decision:
        try:
            plan = planner.plan(waits=waits, context=context)
        except AIError as exc:
            return _ai_error(exc)
        stored = {}
        for wait in waits:
            proposed = plan.waits.get(wait.node_id)
            minutes = proposed.proposed_minutes if proposed else wait.max_minutes
            stored[wait.node_id] = {
                "proposed_minutes": minutes, "minutes": clamp(minutes, wait),
                "reason": proposed.reason if proposed else "Sem plano da IA: usa o tempo máximo.",
            }
        decision.values["timing_plan"] = stored
        decision.llm_calls = plan.llm_calls
        return decision

    return Ask(plan_waits)


def _wait(conn: Connection, snap: Snapshot, ai: AI) -> Decision:
    replied = snap.graph.target(snap.node_id, "replied")
    if snap.reply is not None and replied is not None:
        return Decision("ok", "wait_replied", next_node=replied, consumed_reply=True)
    return Decision("ok", "wait_elapsed", next_node=snap.graph.target(snap.node_id, "always"))


def _condition(conn: Connection, snap: Snapshot, ai: AI) -> Decision:
    config = snap.graph.config(snap.node_id)
    known = facts.gather(conn, snap.org.id, contact=snap.contact, appointment=snap.appointment,
                         enrollment=snap.enrollment)
    result = conditions.evaluate(config["checks"], config.get("combinator", "all"), known, snap.now)
    return Decision("ok", "condition_true" if result else "condition_false",
                    next_node=snap.graph.target(snap.node_id, "cond_result", result))


def _classify(conn: Connection, snap: Snapshot, ai: AI) -> Decision | Ask:
    node = snap.node_id
    if snap.reply is None:
        return Decision("ok", "no_reply", next_node=snap.graph.target(node, "no_reply"),
                        values={"last_class": "no_reply"})
    config = snap.graph.config(node)
    text = snap.reply.text or snap.reply.button_payload or ""
    classifier = BuiltinAI() if snap.human else ai
    context = _context(conn, snap)

    def classify() -> Decision:
        try:
            result = classifier.classify(text=text, classes=config["classes"], keywords=config.get("keywords") or {},
                                         hint=config.get("hint"), context=context)
        except AIError as exc:
            return _ai_error(exc)
        if result.label is not None and result.label in config["classes"]:
            return Decision("ok", "classified", next_node=snap.graph.target(node, "class_match", result.label),
                            consumed_reply=True, llm_calls=result.llm_calls, values={"last_class": result.label},
                            params={"class": result.label, "why": result.reason})
        return Decision("ok", "not_classified", next_node=snap.graph.target(node, "always"), consumed_reply=True,
                        llm_calls=result.llm_calls, values={"last_class": None}, params={"why": result.reason})

    return Ask(classify)


def _usable_kind(conn: Connection, snap: Snapshot, kinds: tuple[str, ...]) -> tuple[str, Any] | None:
    """The first kind the contact consented to, has an address for and the org can send on."""
    org_id = snap.org.id
    consented = {row.kind for row in conn.execute(select(preferences.c.kind).where(
        preferences.c.org_id == org_id, preferences.c.contact_id == snap.contact.id,
        preferences.c.opted_in.is_(True), preferences.c.opted_out_at.is_(None)))}
    consented -= addresses.refused_kinds(conn, org_id, snap.contact)  # refusals follow the address
    for kind in kinds:
        address = snap.contact.email if kind == "email" else snap.contact.phone
        if kind not in consented or not address:
            continue
        channel = default_channel(conn, org_id, kind)
        if channel is not None:
            return kind, channel
    return None


def _action(conn: Connection, snap: Snapshot, ai: AI) -> Decision | Ask:
    node = snap.node_id
    config = snap.graph.config(node)
    after = snap.graph.target(node, "always")
    usable = _usable_kind(conn, snap, tuple(config.get("channel_kinds") or DEFAULT_KINDS))
    if usable is None:
        return Decision("skipped", "no_usable_channel", next_node=after)
    kind, channel = usable
    if config["mode"] == "template":
        return Decision("ok", "message_queued", next_node=after, send=Send(kind, config["template"]))
    fallback = config.get("fallback_template")
    closed = channel.provider == "meta" and not conversation_open(
        conn, snap.org.id, channel.id, snap.contact.id, snap.now)
    if closed:
        # Outside Meta's 24 h window only an approved template may go out.
        if fallback:
            return Decision("ok", "window_closed_template", next_node=after, send=Send(kind, fallback))
        return Decision("failed", "window_closed", failed=True)
    if snap.human:
        if fallback:
            return Decision("ok", "human_holds_template", next_node=after, send=Send(kind, fallback))
        return Decision("skipped", "human_holds", next_node=after)
    context = _context(conn, snap)

    def write() -> Decision:
        try:
            written = ai.write(prompt_hint=config.get("prompt_hint") or "", max_chars=config.get("max_chars", 600),
                               context=context)
        except AIError as exc:
            return _ai_error(exc)
        text = clean_text(written.text, config.get("max_chars", 600)) if written.text else None
        if text:
            return Decision("ok", "ai_message_queued", next_node=after, send=Send(kind, fallback, text),
                            llm_calls=written.llm_calls)
        if fallback:
            return Decision("ok", "ai_fallback_template", next_node=after, send=Send(kind, fallback),
                            llm_calls=written.llm_calls, params={"why": written.reason})
        return Decision("failed", "ai_no_text", failed=True, llm_calls=written.llm_calls,
                        params={"why": written.reason})

    return Ask(write)


def clean_text(text: str, max_chars: int) -> str | None:
    """AI text as it may be sent: plain, without control characters, within the node's length."""
    cleaned = _CONTROL.sub("", text).strip()
    cleaned = re.sub(r"\n{3,}", "\n\n", cleaned)
    if not cleaned or len(cleaned) > max_chars:
        return None
    return cleaned


#: The fragments of one turn read at most (a patient who sends twenty lines in a row is still read).
MAX_FRAGMENTS = 10
#: An AI-phrased question is at most this long.
QUESTION_CHARS = 300


def _fragments(conn: Connection, snap: Snapshot) -> list[tuple[int, str]]:
    """The turn's messages: the reply the run holds and what the patient wrote after it, in order."""
    rows = conn.execute(select(inbound_messages.c.id, inbound_messages.c.text, inbound_messages.c.button_payload)
                        .where(inbound_messages.c.org_id == snap.org.id,
                               inbound_messages.c.contact_id == snap.contact.id,
                               inbound_messages.c.id >= snap.reply.id)
                        .order_by(inbound_messages.c.id).limit(MAX_FRAGMENTS)).all()
    return [(row.id, row.text or row.button_payload or "") for row in rows] or [(snap.reply.id, snap.reply.text or "")]


def _ask(conn: Connection, snap: Snapshot, ai: AI) -> Decision | Ask:
    """Collect the node's fields: read the patient's turn, then finish, give up or ask again
    (engine/flows/conversation/ask.py decides; this reads, understands and phrases)."""
    node, config = snap.node_id, snap.graph.config(snap.node_id)
    found = fields_by_slug(conn, snap.org.id, config["fields"])
    missing = [slug for slug in config["fields"] if slug not in found]
    if missing:  # deleted after the flow was published
        return Decision("failed", "ask_unknown_field", failed=True, params={"field": missing[0]})
    specs = [found[slug] for slug in config["fields"]]
    visit = (snap.enrollment.node_entered_at or snap.now).isoformat()
    state = AskState.of(snap.enrollment.ask_state, visit)
    data = dict(snap.enrollment.data or {})
    zone, keywords = reply_reading(snap.org)
    today = snap.now.astimezone(ZoneInfo(zone)).date()
    usable = _usable_kind(conn, snap, tuple(config.get("channel_kinds") or DEFAULT_KINDS))
    window_closed = usable is not None and usable[1].provider == "meta" and not conversation_open(
        conn, snap.org.id, usable[1].id, snap.contact.id, snap.now)
    phrase = config.get("phrasing") == "ai" and not snap.human
    ai_context = _context(conn, snap) if phrase else None
    if snap.reply is None:
        if snap.enrollment.status == "waiting_reply":
            return Decision("ok", "no_reply", next_node=snap.graph.target(node, "no_reply"), values={"ask_state": None})
        first = take_turn(specs, data, state, text=None, reading=None, max_asks=config["max_asks"], today=today)
        if not phrase or first.outcome != "ask":
            return _ask_decision(snap, first, usable, window_closed, None, None, llm_calls=0, read=())
        return Ask(lambda: _ask_decision(snap, first, usable, window_closed, ai, ai_context, llm_calls=0, read=()))
    fragments = _fragments(conn, snap)
    text = "\n".join(t for _, t in fragments if t)
    read = tuple(i for i, _ in fragments if i != snap.reply.id)
    asked = found.get(state.asked) if state.asked else None
    appointment_at = snap.appointment.starts_at if snap.appointment is not None else None
    reading_context = Context(now=snap.now, timezone=zone, appointment_at=appointment_at,
                              pending=("choice",) if asked is not None and asked.type == "choice" else (),
                              keywords=keywords or None)
    reader = BuiltinAI() if snap.human else ai

    def turn() -> Decision:
        reading = reader.understand(text, reading_context)
        calls = reading.llm_calls
        if reading.intent == "opt_out":
            return Decision("ok", "ask_opted_out", end=("cancelled", "opted_out"), consumed_reply=True,
                            llm_calls=calls, also_read=read)
        if reading.intent == "human":
            return Decision("ok", "ask_wants_person", stay=True, handoff=True, consumed_reply=True, llm_calls=calls,
                            also_read=read, values={"ask_state": state.as_json()})
        result = take_turn(specs, data, state, text=text, reading=reading, max_asks=config["max_asks"], today=today)
        return _ask_decision(snap, result, usable, window_closed, ai if phrase else None, ai_context,
                             llm_calls=calls, read=read)

    return Ask(turn)


def _ask_decision(snap: Snapshot, turn: TurnResult, usable: tuple[str, Any] | None, window_closed: bool,
                  phraser: AI | None, ai_context: AIContext | None, *, llm_calls: int,
                  read: tuple[int, ...]) -> Decision:
    """The step of an `ask` turn: its exit, or the question to send (phrased by the AI when asked to)."""
    node, replied = snap.node_id, snap.reply is not None
    data = {"data": turn.data}
    params: dict[str, Any] = {"taken": list(turn.taken)} if turn.taken else {}
    if turn.outcome in ("complete", "gave_up"):
        if turn.outcome == "gave_up":
            params["field"] = turn.ask_for.slug if turn.ask_for is not None else None
        return Decision("ok", f"ask_{turn.outcome}", next_node=snap.graph.target(node, turn.outcome),
                        consumed_reply=replied, llm_calls=llm_calls, also_read=read,
                        values={**data, "ask_state": None}, params=params)
    spec = turn.ask_for
    assert spec is not None
    params.update(field=spec.slug, ask=turn.state.asks[spec.slug])
    if usable is None:  # no way to ask the patient anything: the conversation cannot go on
        return Decision("skipped", "no_usable_channel", next_node=snap.graph.target(node, "gave_up"),
                        consumed_reply=replied, llm_calls=llm_calls, also_read=read,
                        values={**data, "ask_state": None}, params=params)
    kind = usable[0]
    reason = "ask_value_refused" if turn.refusal is not None else "ask_question"
    if turn.refusal is not None:
        params["refused"] = turn.refusal.code
    values = {**data, "ask_state": turn.state.as_json()}
    if window_closed:
        # Outside Meta's 24 h window only an approved template may go out.
        if spec.template_key:
            return Decision("ok", reason, stay=True, send=Send(kind, spec.template_key), consumed_reply=replied,
                            llm_calls=llm_calls, also_read=read, values=values, params=params)
        return Decision("failed", "window_closed", failed=True, llm_calls=llm_calls)
    question = str(turn.refusal.text) if turn.refusal is not None else spec.question
    if phraser is not None and ai_context is not None:
        try:
            written = phraser.write(prompt_hint=f"Pergunte ao paciente, numa frase curta e cordial: {question}",
                                    max_chars=QUESTION_CHARS, context=ai_context)
            llm_calls += written.llm_calls
            question = (clean_text(written.text, QUESTION_CHARS) if written.text else None) or question
        except AIError as exc:  # the plain question still goes out
            llm_calls += 0 if exc.code in ("llm_key_unreadable", "egress_refused") else 1
    return Decision("ok", reason, stay=True, send=Send(kind, spec.template_key, question), consumed_reply=replied,
                    llm_calls=llm_calls, also_read=read, values=values, params=params)


def _end(conn: Connection, snap: Snapshot, ai: AI) -> Decision:
    return Decision("ok", "ended", end=("completed", snap.graph.config(snap.node_id).get("outcome", "custom")))


_HANDLERS = {"trigger": _trigger, "wait": _wait, "condition": _condition, "ai_classify": _classify,
             "ask": _ask, "action": _action, "end": _end}


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
