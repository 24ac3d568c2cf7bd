"""The `do` node: one action, with the exits `ok`, `failed` and, where it applies, `unavailable`
(and `no_reply` for `offer_slots`, which waits for the patient's pick).

- `confirm`, `cancel`: the run's appointment (appointment.py).
- `move`, `book`: to the time the patient picked from an `offer_slots` list (`data.slot`), or to
  the date and time the run collected (`date_field`, `time_field`), checked free first.
- `offer_slots`: up to `limit` free times matching what the run collected, sent as a numbered
  list; the patient's next reply picks one (offer.py), which becomes `data.slot`.
- `notify_staff`: a Pendências item with the node's note; `handoff`: the conversation goes to a
  person (the flow's hand-off policy), as when the patient asks for one.
- `set_stage`: the contact moves to a stage of the clinic's funnel (flows waiting for it start);
  `start_flow`: another of the org's flows starts for the contact (its repeat policy holds);
  `notify_clinic`: the clinic's system gets a `run.notified` webhook event with the node's signal.

Each effect is idempotent on `enrollment:<id>:node:<node>:visit:<step>`: it runs in the step's
transaction, after the runtime holds the run for its claim (a second actor finds a stale wake).
"""

from __future__ import annotations

from datetime import date, datetime, time
from typing import Any, Callable, Mapping
from zoneinfo import ZoneInfo

from sqlalchemy.engine import Connection

from engine.flows.actions import appointment as effects
from engine.flows.actions.offer import OfferState, offer_text, pick, query_for, slot_of
from engine.flows.ai.base import AI
from engine.flows.ai.builtin import BuiltinAI
from engine.flows.contact_events import record_contact_event
from engine.flows.conversation import floor
from engine.flows.conversation.fields import fields_by_slug
from engine.flows.step import Ask, Decision, Send, Snapshot, via
from engine.flows.triggers import enroll
from engine.flows.turns import DEFAULT_KINDS, opted_out_in_words, turn_fragments, usable_kind
from engine.people.agenda import AgendaError, AvailabilityUnavailable, Slot, SlotQuery, free_slots
from engine.queue.conversation_window import conversation_open
from engine.queue.inbox import open_inbox_item
from engine.tenants.orgs import reply_reading
from engine.tenants.webhooks import events as webhooks
from engine.words.understanding import Context


def decide(conn: Connection, snap: Snapshot, ai: AI) -> Decision | Ask:
    """The `do` node's step (see the module)."""
    config = snap.graph.config(snap.node_id)
    return _ACTIONS[config["action"]](conn, snap, ai, config)


def _leave(snap: Snapshot) -> Callable[..., Decision]:
    """A function that ends the step by one of the node's exits."""
    def leave(which: str, reason: str, *, params: Mapping[str, Any] | None = None,
              values: Mapping[str, Any] | None = None, **extra: Any) -> Decision:
        return Decision("ok" if which == "ok" else "skipped", reason, **via(snap.graph, snap.node_id, which),
                        params=dict(params or {}), values=dict(values or {}), **extra)
    return leave


def _key(snap: Snapshot) -> str:
    return f"enrollment:{snap.enrollment.id}:node:{snap.node_id}:visit:{snap.enrollment.steps}"


def _on_appointment(effect: Callable[[Connection, Snapshot, Callable[..., Decision]], Decision]
                    ) -> Callable[[Connection, Snapshot, AI, Mapping[str, Any]], Decision]:
    def run(conn: Connection, snap: Snapshot, ai: AI, config: Mapping[str, Any]) -> Decision:
        leave = _leave(snap)
        if snap.appointment is None:
            return leave("failed", "do_no_appointment")
        return Decision("ok", "do", act=lambda write: effect(write, snap, leave))
    return run


def _wanted(snap: Snapshot, config: Mapping[str, Any]) -> tuple[Slot | None, bool]:
    """The time to move to or book: the slot picked from an offer (True: it was offered), else the
    collected date and time, with the appointment's professional."""
    data = snap.enrollment.data or {}
    picked = data.get("slot")
    if isinstance(picked, Mapping):
        try:
            return slot_of(picked), True
        except (KeyError, TypeError, ValueError):
            return None, False
    day, hour = data.get(config.get("date_field") or ""), data.get(config.get("time_field") or "")
    try:
        local = datetime.combine(date.fromisoformat(day), time.fromisoformat(hour), ZoneInfo(snap.org.timezone))
    except (TypeError, ValueError):
        return None, False
    appointment = snap.appointment
    return Slot(local, local, appointment.professional if appointment is not None else None,
                appointment.professional_id if appointment is not None else None), False


def _take(book: bool) -> Callable[[Connection, Snapshot, AI, Mapping[str, Any]], Decision | Ask]:
    def run(conn: Connection, snap: Snapshot, ai: AI, config: Mapping[str, Any]) -> Decision | Ask:
        leave, key = _leave(snap), _key(snap)
        if not book and snap.appointment is None:
            return leave("failed", "do_no_appointment")
        slot, offered = _wanted(snap, config)
        if slot is None:
            return leave("failed", "do_no_time")
        effect = effects.book if book else effects.move

        def act(found: Slot) -> Decision:
            return Decision("ok", "do", act=lambda write: effect(write, snap, found, leave, key))

        if offered or not snap.org.availability_url:
            return act(slot)
        # A time the patient named, not one offered: the clinic's own agenda says if it is free,
        # asked with no transaction open.
        local = slot.starts_at.astimezone(ZoneInfo(snap.org.timezone))
        # The webhook is asked by the professional's name (no connection is held during the call).
        query = SlotQuery(date_from=local.date(), date_to=local.date(), time=local.strftime("%H:%M"),
                          professional=slot.professional, limit=20, lead_minutes=0)
        org, now, egress = snap.org, snap.now, snap.egress

        def ask_clinic() -> Decision:
            try:
                answer = free_slots(None, org, query, now, **({"egress": egress} if egress is not None else {}))
            except AvailabilityUnavailable:
                return leave("failed", "do_agenda_unreachable")
            same = [s for s in answer if s.starts_at == slot.starts_at]
            return act(same[0]) if same else leave("unavailable", "do_slot_taken",
                                                    params={"starts_at": slot.starts_at.isoformat()})

        return Ask(ask_clinic)
    return run


def _notify(conn: Connection, snap: Snapshot, ai: AI, config: Mapping[str, Any]) -> Decision:
    def act(write: Connection) -> Decision:
        open_inbox_item(write, snap.org.id, "flow_notification", _key(snap), enrollment_id=snap.enrollment.id,
                        appointment_id=snap.appointment.id if snap.appointment is not None else None,
                        detail=config["note"])
        return _leave(snap)("ok", "do_staff_notified")
    return Decision("ok", "do", act=act)


def _handoff(conn: Connection, snap: Snapshot, ai: AI, config: Mapping[str, Any]) -> Decision:
    return _leave(snap)("ok", "do_handed_off", handoff=True)


def _set_stage(conn: Connection, snap: Snapshot, ai: AI, config: Mapping[str, Any]) -> Decision:
    def act(write: Connection) -> Decision:
        record_contact_event(write, org_id=snap.org.id, contact_id=snap.contact.id, type="stage_changed",
                             stage=config["stage"])
        return _leave(snap)("ok", "do_stage_set", params={"stage": config["stage"]})
    return Decision("ok", "do", act=act)


def _start_flow(conn: Connection, snap: Snapshot, ai: AI, config: Mapping[str, Any]) -> Decision:
    def act(write: Connection) -> Decision:
        started = enroll(write, snap.org.id, config["flow_id"], snap.contact.id, trigger_kind="flow",
                         trigger_key=_key(snap), payload={"from_run": snap.enrollment.id},
                         appointment_id=snap.appointment.id if snap.appointment is not None else None)
        if started.created:
            return _leave(snap)("ok", "do_flow_started", params={"flow_id": config["flow_id"],
                                                                 "run_id": started.enrollment_id})
        return _leave(snap)("failed", "do_flow_not_started", params={"flow_id": config["flow_id"],
                                                                     "why": started.reason})
    return Decision("ok", "do", act=act)


#: The field types whose values may travel to the clinic's system: no free text, phone or e-mail.
_SHAREABLE = ("date", "time", "period", "choice", "number", "boolean")


def _notify_clinic(conn: Connection, snap: Snapshot, ai: AI, config: Mapping[str, Any]) -> Decision:
    data = snap.enrollment.data or {}
    types = {slug: spec.type for slug, spec in fields_by_slug(conn, snap.org.id, sorted(data)).items()}
    collected = {slug: value for slug, value in data.items() if types.get(slug) in _SHAREABLE}

    def act(write: Connection) -> Decision:
        sent = webhooks.run_notified(write, snap.org.id, snap.enrollment.id, node_id=snap.node_id,
                                     signal=config["signal"], collected=collected)
        return _leave(snap)("ok", "do_clinic_notified", params={"signal": config["signal"], "deliveries": len(sent)})
    return Decision("ok", "do", act=act)


# --- offer_slots --------------------------------------------------------------------------------

def _offer(conn: Connection, snap: Snapshot, ai: AI, config: Mapping[str, Any]) -> Decision | Ask:
    leave = _leave(snap)
    visit = (snap.enrollment.node_entered_at or snap.now).isoformat()
    state = OfferState.of(snap.enrollment.ask_state, visit)
    data = dict(snap.enrollment.data or {})
    if snap.reply is None and snap.enrollment.status == "waiting_reply":
        return leave("no_reply", "no_reply", values={"ask_state": None})
    usable = usable_kind(conn, snap, tuple(config.get("channel_kinds") or DEFAULT_KINDS))
    if usable is None:
        return leave("failed", "no_usable_channel", values={"ask_state": None}, consumed_reply=snap.reply is not None)
    if usable[1].provider == "meta" and not conversation_open(conn, snap.org.id, usable[1].id, snap.contact.id,
                                                              snap.now):
        # Outside Meta's 24 h window only an approved template may go out, and a list is free text.
        return leave("failed", "window_closed", values={"ask_state": None}, consumed_reply=snap.reply is not None)
    appointment = snap.appointment
    professional_id = appointment.professional_id if config["same_professional"] and appointment is not None else None
    search = _Search(conn, snap, config, usable[0], leave)
    if snap.reply is None:
        if floor.taken_by_other(conn, snap.org.id, snap.contact.id, snap.enrollment.id) is not None:
            return Decision("waiting", "floor_busy", wait_floor=True)
        return search.offer(search.prepare(query_for(config, data, professional_id=professional_id)), state,
                            llm_calls=0, read=())
    fragments = turn_fragments(conn, snap)
    text = "\n".join(t for _, t in fragments if t)
    read = tuple(i for i, _ in fragments if i != snap.reply.id)
    zone, keywords = reply_reading(snap.org)
    context = Context(now=snap.now, timezone=zone, appointment_at=appointment.starts_at if appointment else None,
                      pending=("choice",), keywords=keywords or None)
    # Another search the patient asks for ("tem na quinta?") is looked up now, while connected, with
    # what the built-in reader finds: the built-in agenda needs the connection (a clinic's webhook is
    # called later, with none held).
    builtin = BuiltinAI().understand(text, context)
    prepared = None
    if pick(builtin, state.offered, timezone=zone).search_again:
        prepared = search.prepare(query_for(config, data, professional_id=professional_id, reading=builtin))
    reader = BuiltinAI() if snap.human else ai

    def turn() -> Decision:
        reading = builtin if isinstance(reader, BuiltinAI) else reader.understand(text, context)
        calls = reading.llm_calls
        if reading.intent == "opt_out":
            return Decision("ok", "ask_opted_out", end=("cancelled", "opted_out"), consumed_reply=True,
                            llm_calls=calls, also_read=read, then=opted_out_in_words(snap, usable[0]))
        if reading.intent == "human":
            return Decision("ok", "ask_wants_person", stay=True, handoff=True, consumed_reply=True, llm_calls=calls,
                            also_read=read, values={"ask_state": state.as_json()})
        chosen = pick(reading, state.offered, timezone=zone)
        if chosen.slot is not None:
            return leave("ok", "do_slot_picked", values={"data": {**data, "slot": dict(chosen.slot)}, "ask_state": None},
                         params={"starts_at": chosen.slot["starts_at"]}, consumed_reply=True, llm_calls=calls,
                         also_read=read)
        if state.asks >= config["max_asks"]:
            return leave("failed", "do_no_pick", values={"ask_state": None}, consumed_reply=True, llm_calls=calls,
                         also_read=read)
        if chosen.search_again and prepared is not None:
            return search.offer(prepared, state, llm_calls=calls, read=read)
        return search.again(state, llm_calls=calls, read=read)

    return Ask(turn)


#: What a search found: free slots, why it could not search (a query the agenda refuses, the
#: clinic's webhook not answering), or, for a webhook, the call that will find them.
Searched = list[Slot] | AgendaError | AvailabilityUnavailable
Found = Searched | Callable[[], list[Slot]]


class _Search:
    """The free times of one `offer_slots` step, and the list that offers them."""

    def __init__(self, conn: Connection, snap: Snapshot, config: Mapping[str, Any], kind: str,
                 leave: Callable[..., Decision]) -> None:
        self.conn, self.snap, self.config, self.kind, self.leave = conn, snap, config, kind, leave

    def prepare(self, query: SlotQuery) -> Found:
        """The search, done now on the built-in agenda (it needs the connection), or a call to make
        later for the clinic's webhook (no transaction may wait for it)."""
        snap = self.snap
        options = {"egress": snap.egress} if snap.egress is not None else {}
        try:
            if snap.org.availability_url:
                if query.professional_id is not None:  # the webhook is asked by name, read while connected
                    query = SlotQuery(**{**_fields(query), "professional_id": None,
                                         "professional": snap.appointment.professional if snap.appointment else None})
                return lambda: free_slots(None, snap.org, query, snap.now, **options)
            return free_slots(self.conn, snap.org, query, snap.now, **options)
        except AgendaError as exc:
            return exc

    def offer(self, found: Found, state: OfferState, *, llm_calls: int, read: tuple[int, ...]) -> Decision | Ask:
        """The list of what `prepare` found (for a webhook: the `Ask` that calls it first)."""
        if callable(found):
            lookup = found
            return Ask(lambda: self._offered(_safely(lookup), state, llm_calls=llm_calls, read=read))
        return self._offered(found, state, llm_calls=llm_calls, read=read)

    def _offered(self, found: Searched, state: OfferState, *, llm_calls: int, read: tuple[int, ...]) -> Decision:
        replied = self.snap.reply is not None
        if isinstance(found, AvailabilityUnavailable):
            return self.leave("failed", "do_agenda_unreachable", values={"ask_state": None}, consumed_reply=replied,
                              llm_calls=llm_calls, also_read=read)
        if isinstance(found, AgendaError) or not found:
            return self.leave("unavailable", "do_no_free_slots", values={"ask_state": None}, consumed_reply=replied,
                              llm_calls=llm_calls, also_read=read)
        offered = tuple(slot.as_json() for slot in found)
        text = offer_text(found, intro=self.config["intro"], outro=self.config["outro"],
                          timezone=self.snap.org.timezone, locale=self.snap.contact.locale or self.snap.org.locale)
        following = OfferState(state.visit, offered, state.asks + 1)
        return Decision("ok", "do_slots_offered", stay=True, send=Send(self.kind, None, text), consumed_reply=replied,
                        llm_calls=llm_calls, also_read=read, values={"ask_state": following.as_json()},
                        params={"offered": len(offered)})

    def again(self, state: OfferState, *, llm_calls: int, read: tuple[int, ...]) -> Decision:
        """The same list once more, after a reply that picked none of it."""
        found = [slot_of(stored) for stored in state.offered]
        return self._offered(found, state, llm_calls=llm_calls, read=read)


def _safely(lookup: Callable[[], list[Slot]]) -> Searched:
    try:
        return lookup()
    except (AvailabilityUnavailable, AgendaError) as exc:
        return exc


def _fields(query: SlotQuery) -> dict[str, Any]:
    return {name: getattr(query, name) for name in ("date_from", "date_to", "period", "time", "exclude_weekdays",
                                                     "professional_id", "professional", "limit", "lead_minutes",
                                                     "horizon_days")}


_ACTIONS: dict[str, Callable[[Connection, Snapshot, AI, Mapping[str, Any]], Decision | Ask]] = {
    "confirm": _on_appointment(effects.confirm),
    "cancel": _on_appointment(effects.cancel),
    "move": _take(book=False),
    "book": _take(book=True),
    "offer_slots": _offer,
    "notify_staff": _notify,
    "handoff": _handoff,
    "set_stage": _set_stage,
    "start_flow": _start_flow,
    "notify_clinic": _notify_clinic,
}

__all__ = ["decide"]
