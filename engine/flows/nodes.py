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
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import select
from sqlalchemy.engine import Connection


from engine.flows import conditions, facts, triggers
from engine.flows.ai.base import AI, AIContext, AIError, SmartWait, clamp
from engine.flows.ai.builtin import BuiltinAI
from engine.flows.conversation import floor
from engine.flows.conversation.ask import AskState, TurnResult, take_turn
from engine.flows.conversation.fields import fields_by_slug
from engine.flows.graph import GraphIndex
from engine.flows.actions import node as do_node
from engine.flows.step import Ask, Decision, Send, Snapshot, via
from engine.flows.turns import DEFAULT_KINDS, ai_context, opted_out_in_words, turn_fragments, usable_kind
from engine.people.appointments import GOING
from engine.queue.conversation_window import conversation_open
from engine.store.models import messages
from engine.tenants.orgs import reply_reading
from engine.words.understanding import Context

#: An AI-written message is plain text: control characters out, at most this long.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


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
    way = via(snap.graph, snap.node_id, "always")
    after = way["next_node"]
    # The message that started the run (an intent trigger) is the first reply of a node that reads one.
    decision = Decision("ok", "trigger_fired", **way,
                        keep_reply=snap.reply is not None and after is not None and reads_first_reply(snap.graph, after))
    waits = [SmartWait(node_id, snap.graph.config(node_id)["min_minutes"], snap.graph.config(node_id)["max_minutes"],
                       snap.graph.config(node_id).get("guidance"))
             for node_id in snap.graph.smart_waits()]
    if not waits or snap.enrollment.timing_plan is not None:
        return decision
    planner = BuiltinAI() if snap.human else ai
    context = ai_context(conn, snap)

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


def reads_first_reply(graph: GraphIndex, node_id: str) -> bool:
    """Whether the node, entered with a reply in hand, reads it as its first answer."""
    return graph.type(node_id) in ("ask", "ai_classify")


def _wait(conn: Connection, snap: Snapshot, ai: AI) -> Decision:
    way = via(snap.graph, snap.node_id, "replied")
    replied = way["next_node"]
    if snap.reply is not None and replied is not None:
        # An `ask` after the wait reads the reply itself ("segunda de tarde" answers its question).
        passed_on = reads_first_reply(snap.graph, replied)
        return Decision("ok", "wait_replied", **way, consumed_reply=not passed_on, keep_reply=passed_on)
    return Decision("ok", "wait_elapsed", **via(snap.graph, snap.node_id, "always"))


def _condition(conn: Connection, snap: Snapshot, ai: AI) -> Decision:
    config = snap.graph.config(snap.node_id)
    known = facts.gather(conn, snap.org.id, contact=snap.contact, appointment=snap.appointment,
                         enrollment=snap.enrollment)
    result = conditions.evaluate(config["checks"], config.get("combinator", "all"), known, snap.now)
    return Decision("ok", "condition_true" if result else "condition_false",
                    **via(snap.graph, snap.node_id, "cond_result", result))


def _classify(conn: Connection, snap: Snapshot, ai: AI) -> Decision | Ask:
    node = snap.node_id
    if snap.reply is None:
        return Decision("ok", "no_reply", **via(snap.graph, node, "no_reply"),
                        values={"last_class": "no_reply"})
    config = snap.graph.config(node)
    text = snap.reply.text or snap.reply.button_payload or ""
    classifier = BuiltinAI() if snap.human else ai
    context = ai_context(conn, snap)

    def classify() -> Decision:
        try:
            result = classifier.classify(text=text, classes=config["classes"], keywords=config.get("keywords") or {},
                                         hint=config.get("hint"), context=context,
                                         labels=config.get("labels") or {})
        except AIError as exc:
            return _ai_error(exc)
        if result.label is not None and result.label in config["classes"]:
            return Decision("ok", "classified", **via(snap.graph, node, "class_match", result.label),
                            consumed_reply=True, llm_calls=result.llm_calls, values={"last_class": result.label},
                            params={"class": result.label, "why": result.reason})
        return Decision("ok", "not_classified", **via(snap.graph, node, "always"), consumed_reply=True,
                        llm_calls=result.llm_calls, values={"last_class": None}, params={"why": result.reason})

    return Ask(classify)


def _action(conn: Connection, snap: Snapshot, ai: AI) -> Decision | Ask:
    node = snap.node_id
    config = snap.graph.config(node)
    after = via(snap.graph, node, "always")
    usable = usable_kind(conn, snap, tuple(config.get("channel_kinds") or DEFAULT_KINDS))
    if usable is None:
        return Decision("skipped", "no_usable_channel", **after)
    kind, channel = usable
    if config["mode"] == "template":
        if _already_told(conn, snap, config["template"]):
            return Decision("skipped", "message_already_queued", **after)
        return Decision("ok", "message_queued", **after, send=Send(kind, config["template"]))
    fallback = config.get("fallback_template")
    closed = channel.provider == "meta" and not conversation_open(
        conn, snap.org.id, channel.id, snap.contact.id, snap.now)
    if closed:
        # Outside Meta's 24 h window only an approved template may go out.
        if fallback:
            return Decision("ok", "window_closed_template", **after, send=Send(kind, fallback))
        return Decision("failed", "window_closed", failed=True)
    if snap.human:
        if fallback:
            return Decision("ok", "human_holds_template", **after, send=Send(kind, fallback))
        return Decision("skipped", "human_holds", **after)
    context = ai_context(conn, snap)

    def write() -> Decision:
        try:
            written = ai.write(prompt_hint=config.get("prompt_hint") or "", max_chars=config.get("max_chars", 600),
                               context=context)
        except AIError as exc:
            return _ai_error(exc)
        text = clean_text(written.text, config.get("max_chars", 600)) if written.text else None
        if text:
            return Decision("ok", "ai_message_queued", **after, send=Send(kind, fallback, text),
                            llm_calls=written.llm_calls)
        if fallback:
            return Decision("ok", "ai_fallback_template", **after, send=Send(kind, fallback),
                            llm_calls=written.llm_calls, params={"why": written.reason})
        return Decision("failed", "ai_no_text", failed=True, llm_calls=written.llm_calls,
                        params={"why": written.reason})

    return Ask(write)


#: An AI-phrased question is at most this long.
QUESTION_CHARS = 300


def _already_told(conn: Connection, snap: Snapshot, template_key: str) -> bool:
    """Whether this template about the appointment's current time is already going out (a reminder
    rule confirming a time the flow just moved the appointment to): the patient hears it once."""
    appointment = snap.appointment
    if appointment is None:
        return False
    return conn.execute(select(messages.c.id).where(
        messages.c.org_id == snap.org.id, messages.c.appointment_id == appointment.id,
        messages.c.template_key == template_key, messages.c.appointment_starts_at == appointment.starts_at,
        messages.c.status.in_(GOING)).limit(1)).first() is not None


def clean_text(text: str, max_chars: int) -> str | None:
    """AI text as it may be sent: plain, without control characters, within the node's length."""
    cleaned = _CONTROL.sub("", text).strip()
    cleaned = re.sub(r"\n{3,}", "\n\n", cleaned)
    if not cleaned or len(cleaned) > max_chars:
        return None
    return cleaned


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
    usable = usable_kind(conn, snap, tuple(config.get("channel_kinds") or DEFAULT_KINDS))
    window_closed = usable is not None and usable[1].provider == "meta" and not conversation_open(
        conn, snap.org.id, usable[1].id, snap.contact.id, snap.now)
    phrase = config.get("phrasing") == "ai" and not snap.human
    phrasing_context = ai_context(conn, snap) if phrase else None
    if snap.reply is None:
        if snap.enrollment.status == "waiting_reply":
            return Decision("ok", "no_reply", **via(snap.graph, node, "no_reply"), values={"ask_state": None})
        if floor.taken_by_other(conn, snap.org.id, snap.contact.id, snap.enrollment.id) is not None:
            return Decision("waiting", "floor_busy", wait_floor=True)
        first = take_turn(specs, data, state, text=None, reading=None, max_asks=config["max_asks"], today=today)
        if not phrase or first.outcome != "ask":
            return _ask_decision(snap, first, usable, window_closed, None, None, llm_calls=0, read=())
        return Ask(lambda: _ask_decision(snap, first, usable, window_closed, ai, phrasing_context, llm_calls=0, read=()))
    fragments = turn_fragments(conn, snap)
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
                            llm_calls=calls, also_read=read,
                            then=opted_out_in_words(snap, usable[0] if usable is not None else None))
        if reading.intent == "human":
            return Decision("ok", "ask_wants_person", stay=True, handoff=True, consumed_reply=True, llm_calls=calls,
                            also_read=read, values={"ask_state": state.as_json()})
        result = take_turn(specs, data, state, text=text, reading=reading, max_asks=config["max_asks"], today=today)
        return _ask_decision(snap, result, usable, window_closed, ai if phrase else None, phrasing_context,
                             llm_calls=calls, read=read)

    return Ask(turn)


def _ask_decision(snap: Snapshot, turn: TurnResult, usable: tuple[str, Any] | None, window_closed: bool,
                  phraser: AI | None, phrasing_context: AIContext | None, *, llm_calls: int,
                  read: tuple[int, ...]) -> Decision:
    """The step of an `ask` turn: its exit, or the question to send (phrased by the AI when asked to)."""
    node, replied = snap.node_id, snap.reply is not None
    data = {"data": turn.data}
    params: dict[str, Any] = {"taken": list(turn.taken)} if turn.taken else {}
    if turn.outcome in ("complete", "gave_up"):
        if turn.outcome == "gave_up":
            params["field"] = turn.ask_for.slug if turn.ask_for is not None else None
        return Decision("ok", f"ask_{turn.outcome}", **via(snap.graph, node, turn.outcome),
                        consumed_reply=replied, llm_calls=llm_calls, also_read=read,
                        values={**data, "ask_state": None}, params=params)
    spec = turn.ask_for
    assert spec is not None
    params.update(field=spec.slug, ask=turn.state.asks[spec.slug])
    if usable is None:  # no way to ask the patient anything: the conversation cannot go on
        return Decision("skipped", "no_usable_channel", **via(snap.graph, node, "gave_up"),
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
    if phraser is not None and phrasing_context is not None:
        try:
            written = phraser.write(prompt_hint=f"Pergunte ao paciente, numa frase curta e cordial: {question}",
                                    max_chars=QUESTION_CHARS, context=phrasing_context)
            llm_calls += written.llm_calls
            question = (clean_text(written.text, QUESTION_CHARS) if written.text else None) or question
        except AIError as exc:  # the plain question still goes out
            llm_calls += 0 if exc.code in ("llm_key_unreadable", "egress_refused") else 1
    return Decision("ok", reason, stay=True, send=Send(kind, spec.template_key, question), consumed_reply=replied,
                    llm_calls=llm_calls, also_read=read, values=values, params=params)


def _end(conn: Connection, snap: Snapshot, ai: AI) -> Decision:
    return Decision("ok", "ended", end=("completed", snap.graph.config(snap.node_id).get("outcome", "custom")))


_HANDLERS = {"trigger": _trigger, "wait": _wait, "condition": _condition, "ai_classify": _classify,
             "ask": _ask, "action": _action, "do": do_node.decide, "end": _end}
