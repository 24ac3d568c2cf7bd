"""Enrolling contacts: by hand (API, CLI, console), on appointment and contact events, and on
silence found by a scan. Every path goes through `enroll`, which applies the flow's repeat policy
through the claims ledger (a unique index decides, not a SELECT) and the one-live-enrollment
index, so two concurrent triggers for the same contact and flow start one enrollment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping

from marshmallow import ValidationError
from sqlalchemy import and_, exists, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.flows import conditions, facts, lifecycle
from engine.flows.schema import load_trigger_config
from engine.flows.versions import graph_of
from engine.people.appointments import appointment_event
from engine.store.models import (
    CHANNEL_KINDS,
    agents,
    appointments,
    contacts,
    enrollments,
    flow_claims,
    flow_pointers,
    flow_versions,
    inbound_messages,
    messages,
    preferences,
)
from engine.queue import address_optouts as addresses
from engine.tenants.orgs import reply_reading
from engine.words.understanding import Context, understand

log = logging.getLogger(__name__)

APPOINTMENT_EVENTS = ("created", "confirmed", "cancelled", "completed", "no_show")
SCANNED_KINDS = ("silence", "reminder_no_reply")
#: At most this many enrollments start per flow and scan, so a first scan over a large history
#: is spread over several passes instead of one long transaction.
SCAN_BATCH = 500


@dataclass(frozen=True)
class Enrolled:
    """What `enroll` did: the enrollment (new or the caller's earlier one), or why not."""

    enrollment_id: int | None
    created: bool
    reason: str


def _insert_ignoring(conn: Connection, table: Any) -> Any:
    module = postgresql if conn.dialect.name == "postgresql" else sqlite
    return module.insert(table)


def enabled_by_agent(conn: Connection, org_id: int, pointer_id: int) -> int | None:
    """The id of an enabled agent that may start this flow, else None."""
    rows = conn.execute(select(agents.c.id, agents.c.flow_pointer_ids).where(
        agents.c.org_id == org_id, agents.c.followup_enabled.is_(True)).order_by(agents.c.id)).all()
    for row in rows:
        ids = row.flow_pointer_ids if isinstance(row.flow_pointer_ids, list) else []
        if pointer_id in {int(i) for i in ids if isinstance(i, (int, str)) and str(i).isdigit()}:
            return int(row.id)
    return None


def _dedupe_key(repeat: str, contact_id: int, trigger_key: str, caller_key: str | None) -> str:
    if caller_key is not None:
        return f"manual:{caller_key}"
    if repeat == "always":
        return f"contact:{contact_id}:trigger:{trigger_key}"
    return f"contact:{contact_id}"


def _take_claim(conn: Connection, org_id: int, pointer: Any, contact_id: int, key: str, cooldown: timedelta | None,
                now: datetime) -> bool:
    """Write the claim; a cooldown claim older than the cooldown is taken over."""
    inserted = conn.execute(
        _insert_ignoring(conn, flow_claims).values(
            org_id=org_id, pointer_id=pointer.id, contact_id=contact_id, dedupe_key=key, claimed_at=now,
        ).on_conflict_do_nothing().returning(flow_claims.c.id)
    ).first()
    if inserted is not None:
        return True
    if cooldown is None:
        return False
    return conn.execute(
        update(flow_claims).where(flow_claims.c.pointer_id == pointer.id, flow_claims.c.dedupe_key == key,
                                  flow_claims.c.claimed_at <= now - cooldown)
        .values(claimed_at=now, enrollment_id=None)
    ).rowcount == 1


def _usable(conn: Connection, org_id: int, contact: Any) -> str | None:
    """Why this contact cannot be followed up at all, or None."""
    if contact is None or contact.erased_at is not None:
        return "contact_not_found"
    refused = conn.execute(select(preferences.c.kind).where(
        preferences.c.org_id == org_id, preferences.c.contact_id == contact.id,
        preferences.c.opted_out_at.is_not(None))).scalars().all()
    if set(refused) >= set(CHANNEL_KINDS):
        return "contact_opted_out"
    if set(refused) | addresses.refused_kinds(conn, org_id, contact) >= set(CHANNEL_KINDS):
        return "address_opted_out"  # another contact on the same phone or e-mail refused everything
    return None


def enroll(
    conn: Connection, org_id: int, pointer_id: int, contact_id: int, *, trigger_kind: str, trigger_key: str,
    caller_key: str | None = None, payload: Mapping[str, Any] | None = None, appointment_id: int | None = None,
    automatic: bool = True,
) -> Enrolled:
    """Start the flow's active version for the contact, unless a rule says no (see `Enrolled.reason`).

    Manual enrolment (`automatic=False`) needs no agent and ignores the repeat policy, but a
    `caller_key` makes it idempotent: the same key answers the same enrollment."""
    now = clock.now()
    pointer = conn.execute(select(flow_pointers).where(flow_pointers.c.org_id == org_id,
                                                       flow_pointers.c.id == pointer_id)).first()
    if pointer is None:
        return Enrolled(None, False, "flow_not_found")
    if caller_key is not None:
        earlier = conn.execute(select(flow_claims.c.enrollment_id).where(
            flow_claims.c.pointer_id == pointer_id, flow_claims.c.dedupe_key == f"manual:{caller_key}")).first()
        if earlier is not None:
            return Enrolled(earlier.enrollment_id, False, "already_enrolled_with_key")
    if pointer.status != "active" or pointer.active_version_id is None:
        return Enrolled(None, False, "flow_not_active")
    contact = conn.execute(select(contacts).where(contacts.c.org_id == org_id, contacts.c.id == contact_id)).first()
    refusal = _usable(conn, org_id, contact)
    if refusal:
        return Enrolled(None, False, refusal)
    try:
        trigger = load_trigger_config(pointer.trigger_config or {"kind": "manual"})
    except ValidationError:
        return Enrolled(None, False, "flow_not_active")
    agent_id = enabled_by_agent(conn, org_id, pointer_id)
    if automatic and agent_id is None:
        return Enrolled(None, False, "no_agent_enables_flow")
    appointment = None
    if appointment_id is not None:
        appointment = conn.execute(select(appointments).where(appointments.c.org_id == org_id,
                                                              appointments.c.id == appointment_id)).first()
    if automatic and trigger.get("conditions"):
        known = facts.gather(conn, org_id, contact=contact, appointment=appointment)
        if not conditions.evaluate(trigger["conditions"], "all", known, now):
            return Enrolled(None, False, "trigger_conditions_not_met")
    graph = graph_of(conn, org_id, pointer.active_version_id)
    repeat = trigger.get("repeat", "once")
    cooldown = timedelta(minutes=trigger["cooldown_minutes"]) if repeat == "cooldown" else None
    key = _dedupe_key(repeat, contact_id, trigger_key, caller_key if not automatic else None)
    with conn.begin_nested() as savepoint:
        if (automatic or caller_key is not None) and not _take_claim(conn, org_id, pointer, contact_id, key,
                                                                      cooldown, now):
            savepoint.rollback()
            if not automatic:  # a concurrent request with the same key won: answer its enrollment
                winner = conn.execute(select(flow_claims.c.enrollment_id).where(
                    flow_claims.c.pointer_id == pointer_id, flow_claims.c.dedupe_key == key)).scalar()
                return Enrolled(winner, False, "already_enrolled_with_key")
            return Enrolled(None, False, "repeat_policy")
        row = conn.execute(
            _insert_ignoring(conn, enrollments).values(
                org_id=org_id, pointer_id=pointer_id, version_id=pointer.active_version_id, contact_id=contact_id,
                appointment_id=appointment_id, current_node_id=graph.trigger_id, status="active",
                next_eval_at=now, node_entered_at=now, agent_id=agent_id, trigger_kind=trigger_kind,
                trigger_key=trigger_key, trigger_payload=dict(payload) if payload else None,
                created_at=now, updated_at=now,
            ).on_conflict_do_nothing().returning(enrollments.c.id)
        ).first()
        if row is None:
            savepoint.rollback()
            return Enrolled(None, False, "already_live")
        enrollment_id = int(row.id)
        if automatic or caller_key is not None:
            conn.execute(update(flow_claims).where(flow_claims.c.pointer_id == pointer_id,
                                                   flow_claims.c.dedupe_key == key)
                         .values(enrollment_id=enrollment_id))
        lifecycle.record_event(conn, org_id, enrollment_id, "enrolled", "enrolled", node_id=graph.trigger_id,
                               payload={"trigger": trigger_kind, "manual": not automatic}, at=now)
    return Enrolled(enrollment_id, True, "enrolled")


def _active_flows(conn: Connection, org_id: int | None, kinds: Iterable[str]) -> list[tuple[Any, dict[str, Any]]]:
    """Active flows (of one org, or all) whose trigger kind is one of `kinds`, with their trigger."""
    query = select(flow_pointers).where(flow_pointers.c.status == "active",
                                        flow_pointers.c.active_version_id.is_not(None))
    if org_id is not None:
        query = query.where(flow_pointers.c.org_id == org_id)
    wanted = set(kinds)
    found = []
    for pointer in conn.execute(query.order_by(flow_pointers.c.id)):
        try:
            trigger = load_trigger_config(pointer.trigger_config or {})
        except ValidationError:
            continue
        if trigger["kind"] in wanted:
            found.append((pointer, trigger))
    return found


@appointment_event.connect
def on_appointment_event(conn: Connection, org_id: int, appointment_id: int, event: str) -> list[Enrolled]:
    """An appointment was created, confirmed, cancelled, completed or missed: start the flows
    that wait for that, in the caller's transaction."""
    results = []
    row = None
    for pointer, trigger in _active_flows(conn, org_id, ("appointment",)):
        if trigger.get("appointment_event") != event:
            continue
        if row is None:
            row = conn.execute(select(appointments.c.contact_id).where(
                appointments.c.org_id == org_id, appointments.c.id == appointment_id)).first()
            if row is None:
                return results
        results.append(enroll(conn, org_id, pointer.id, row.contact_id, trigger_kind="appointment",
                              trigger_key=f"appointment:{appointment_id}:{event}", appointment_id=appointment_id,
                              payload={"event": event}))
    return results


def on_contact_event(conn: Connection, org_id: int, contact_id: int, event_type: str,
                     payload: Mapping[str, Any] | None, event_id: int) -> list[Enrolled]:
    """A contact event (stage change, hand-off end) arrived: start the flows that wait for it."""
    results = []
    for pointer, trigger in _active_flows(conn, org_id, ("event", "handoff_ended")):
        if trigger["kind"] == "handoff_ended":
            if event_type != "handoff_ended":
                continue
        elif trigger.get("event") != event_type or (
                trigger.get("stage") and (payload or {}).get("stage") != trigger.get("stage")):
            continue
        results.append(enroll(conn, org_id, pointer.id, contact_id, trigger_kind=trigger["kind"],
                              trigger_key=f"event:{event_id}", payload={"event": event_type}))
    return results


def scan(conn: Connection, *, now: datetime | None = None) -> int:
    """Find silences and unanswered reminders that have lasted long enough, for every active
    flow of every org that waits for one, and enroll those contacts. Returns enrollments started."""
    now = now or clock.now()
    started = 0
    for pointer, trigger in _active_flows(conn, None, SCANNED_KINDS):
        if enabled_by_agent(conn, pointer.org_id, pointer.id) is None:
            continue
        for anchor in _silent_since(conn, pointer, trigger, now):
            kind = trigger["kind"]
            result = enroll(conn, pointer.org_id, pointer.id, anchor.contact_id, trigger_kind=kind,
                            trigger_key=f"{kind}:{anchor.id}", appointment_id=anchor.appointment_id,
                            payload={"anchor_message_id": anchor.id, "anchor_at": anchor.sent_at.isoformat()})
            started += int(result.created)
    return started


def _silent_since(conn: Connection, pointer: Any, trigger: Mapping[str, Any], now: datetime) -> list[Any]:
    """Outbound messages after which the contact has been silent for the trigger's minutes.

    Only messages sent since the active version was published count, so publishing a silence
    flow does not reach into the whole history; a contact already claimed for this episode (or
    for good, with `once`), or already in the flow, is left out so each pass does new work only."""
    org_id = pointer.org_id
    since = conn.execute(select(flow_versions.c.created_at).where(
        flow_versions.c.id == pointer.active_version_id)).scalar_one()
    m = messages.alias("m")
    later = messages.alias("later")
    inbound = inbound_messages
    claims = flow_claims
    live = enrollments
    conditions_sql = [
        m.c.org_id == org_id, m.c.sent_at.is_not(None), m.c.sent_at <= now - timedelta(minutes=trigger["minutes"]),
        m.c.sent_at >= since,
        ~exists().where(inbound.c.org_id == org_id, inbound.c.contact_id == m.c.contact_id,
                        inbound.c.received_at > m.c.sent_at),
        ~exists().where(live.c.org_id == org_id, live.c.pointer_id == pointer.id,
                        live.c.contact_id == m.c.contact_id, live.c.status.in_(lifecycle.LIVE)),
    ]
    if trigger["kind"] == "silence":
        conditions_sql.append(~exists().where(later.c.org_id == org_id, later.c.contact_id == m.c.contact_id,
                                              later.c.sent_at > m.c.sent_at))
    else:
        conditions_sql.append(m.c.rule_id.is_not(None))
    repeat = trigger.get("repeat", "once")
    claimed = [claims.c.pointer_id == pointer.id, claims.c.contact_id == m.c.contact_id]
    if repeat == "once":
        conditions_sql.append(~exists().where(*claimed))
    elif repeat == "cooldown":
        conditions_sql.append(~exists().where(*claimed, claims.c.claimed_at > now - timedelta(
            minutes=trigger["cooldown_minutes"])))
        conditions_sql.append(~exists().where(*claimed, claims.c.claimed_at >= m.c.sent_at))
    else:
        conditions_sql.append(~exists().where(*claimed, claims.c.claimed_at >= m.c.sent_at))
    return conn.execute(
        select(m.c.id, m.c.contact_id, m.c.appointment_id, m.c.sent_at).where(and_(*conditions_sql))
        .order_by(m.c.sent_at).limit(SCAN_BATCH)
    ).all()


def premise_holds(conn: Connection, enrollment: Any) -> bool:
    """For a silence or unanswered-reminder enrollment: is the contact still silent since the
    anchor message (no reply; for silence, no later message from us either)?"""
    payload = enrollment.trigger_payload or {}
    if enrollment.trigger_kind not in SCANNED_KINDS or "anchor_at" not in payload:
        return True
    anchor_at = datetime.fromisoformat(payload["anchor_at"])
    org_id = enrollment.org_id
    replied = conn.execute(select(inbound_messages.c.id).where(
        inbound_messages.c.org_id == org_id, inbound_messages.c.contact_id == enrollment.contact_id,
        inbound_messages.c.received_at > anchor_at).limit(1)).first()
    if replied is not None:
        return False
    if enrollment.trigger_kind == "silence":
        newer = conn.execute(select(messages.c.id).where(
            messages.c.org_id == org_id, messages.c.contact_id == enrollment.contact_id,
            messages.c.sent_at > anchor_at, messages.c.enrollment_id.is_distinct_from(enrollment.id)).limit(1)).first()
        return newer is None
    return True



def on_free_text(conn: Connection, org: Any, contact_id: int, inbound: Any, appointment_id: int | None) -> list[Enrolled]:
    """A contact wrote free text no run took (no run is talking with them, no person holds the
    conversation): start the org's flows
    bound to what it means (an `intent` trigger), read by the built-in reader (no model call on the
    inbound path). The run reads this message as its first reply: "posso remarcar para sexta de
    manhã?" already says the day and the period its `ask` would ask for. One message starts one
    conversation: when several flows are bound to the same intent, the oldest one takes it."""
    bound = _active_flows(conn, org.id, ("intent",))
    if not bound or facts.humans_holding(conn, [(org.id, contact_id)]):
        return []  # a person holding the conversation answers it, not a new run
    zone, keywords = reply_reading(org)
    appointment_at = None
    if appointment_id is not None:
        appointment_at = conn.execute(select(appointments.c.starts_at).where(
            appointments.c.org_id == org.id, appointments.c.id == appointment_id)).scalar()
    reading = understand(inbound.text or "", Context(now=clock.now(), timezone=zone, appointment_at=appointment_at,
                                                     keywords=keywords or None))
    started = []
    for pointer, trigger in bound:
        if trigger["intent"] != reading.intent:
            continue
        result = enroll(conn, org.id, pointer.id, contact_id, trigger_kind="intent",
                        trigger_key=f"intent:{inbound.id}", payload={"intent": reading.intent},
                        appointment_id=appointment_id)
        if result.created and result.enrollment_id is not None:
            take_first_reply(conn, org.id, result.enrollment_id, inbound.id)
        started.append(result)
        break  # two runs answering one message would talk over each other
    return started


def take_first_reply(conn: Connection, org_id: int, enrollment_id: int, inbound_id: int) -> None:
    """The run just started reads the message that started it as its first reply (its trigger
    hands it on to the first `ask` or classifier); the reply is the run's in Conversas."""
    conn.execute(update(enrollments).where(enrollments.c.org_id == org_id, enrollments.c.id == enrollment_id)
                 .values(pending_inbound_id=inbound_id))
    conn.execute(update(inbound_messages).where(
        inbound_messages.c.org_id == org_id, inbound_messages.c.id == inbound_id,
        inbound_messages.c.flow_enrollment_id.is_(None)).values(flow_enrollment_id=enrollment_id))
    lifecycle.record_event(conn, org_id, enrollment_id, "reply", f"reply:{inbound_id}",
                           payload={"inbound_id": inbound_id, "taken": True})
