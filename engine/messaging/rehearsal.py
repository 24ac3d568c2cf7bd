"""A rehearsal of a flow: the builder's "Testar" panel plays the patient against the draft or the
published version and sees what the patient would read, what each reply was understood as and
which exit it took, and nothing of it stays. (It sits in `messaging`, above `flows`: it plays the
patient through the inbound path and shows the messages as the dispatcher renders them.)

There is no second implementation of the flow here. The whole conversation is replayed, from the
start, on every call, through the engine's own code: `versions.publish` (a draft), `triggers.enroll`,
`runtime.advance_claimed` (the nodes, the AI behind the run's agent, the `do` effects) and
`inbound.process_inbound` (the reply path a provider's webhook takes). All of it runs inside one
database transaction that is always rolled back: every "transaction" the engine opens is a
SAVEPOINT of it (`_Held`). So an offer lists the agenda's real free times and a move really moves,
but no outbox row, run, appointment, webhook delivery or Pendências item outlives the call, and
nothing is handed to the broker: the engine hands work to Dramatiq only from the scheduler and the
webhook receiver, neither of which a rehearsal calls (the claims are taken here, for this run alone).

The clock is this call's own (`clock.local`): it starts at the real now and jumps over waits, so
other requests and the workers of the process keep the real time.

The patient answers only when the run waits for a reply (an `ask`, a classifier, an offer): a
reply given at any other moment could fall differently on each replay. A flow started by what the
patient writes (an `intent` trigger) takes the first reply as the message that started it. `None` as a reply means
the patient stays silent: the node's grace runs out (its `no_reply` exit).

On SQLite the transaction holds the database's write lock for the length of the call (the model's
answers included, when the flow's agent has one): a rehearsal is bounded (`MAX_REPLIES`, each
reply `MAX_REPLY_CHARS`, `MAX_ROUNDS` steps), and the builder sends one at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from datetime import datetime, time, timedelta
from typing import Any, Callable, Iterator, Mapping, Sequence
from zoneinfo import ZoneInfo

from sqlalchemy import insert, or_, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError
from engine.flows import lifecycle, queries, runtime, triggers, versions
from engine.flows.ai.base import AI
from engine.flows.ai.factory import ai_for
from engine.flows.graph import GraphIndex
from engine.flows.versions import graph_of
from engine.messaging.inbound import process_inbound
from engine.messaging.templates import MissingAddress, render_message
from engine.messaging.render import TemplateError
from engine.people.contacts import create_contact, find_all_by_address
from engine.store.models import (appointments, channels, contacts, enrollment_events, enrollments, flow_pointers,
                                 inbound_messages, messages, orgs, professionals)
from engine.store.runtime import Runtime
from engine.words.catalogue import describe
from engine.words.texts import Text

#: Which version a rehearsal plays.
VERSIONS = ("draft", "published")
#: The most patient replies one rehearsal replays (each call replays them all).
MAX_REPLIES = 40
#: The longest reply, as the sandbox chat allows (a WhatsApp message is at most 4096 characters).
MAX_REPLY_CHARS = 1000
#: Steps driven at most, a guard on top of the flow's own `max_steps`.
MAX_ROUNDS = 200
#: The synthetic patient: a name and numbers of a range no real patient of the org has.
PATIENT_NAME = "Paciente de teste"
_PHONE_BASE = 5511987650000
_EMAIL = "paciente.teste@lembra.invalid"
#: The channel kinds the patient answers on (the first the org has a default channel for).
_REPLY_KINDS = ("whatsapp", "sms")


class RehearsalRefused(DomainError):
    """A rehearsal that cannot run: its catalogue code and sentence; `issues` lists a draft's
    broken publish rules (the builder shows them on their steps)."""

    def __init__(self, code: str, *, issues: Sequence[Any] = (), **params: Any) -> None:
        self.code = code
        self.params = params
        self.issues = list(issues)
        self.text: Text = describe(code, **params)
        super().__init__(str(self.text))


@dataclasses.dataclass
class Turn:
    """One line of the transcript: a message the patient would read (`bot`) or a reply (`patient`).
    A reply says what was understood (`intent`, the classifier's `label`, the `fields` taken) and
    the step that read it: its node, reason code, `exit` condition and the node it went to."""

    role: str
    text: str | None
    node: str | None = None
    intent: str | None = None
    label: str | None = None
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    reason: str | None = None
    exit: dict[str, Any] | None = None
    next_node: str | None = None
    #: The steps the run took after the reply, up to the next one: [{node, reason, exit, next}].
    path: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The JSON the builder reads."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Transcript:
    """A whole rehearsal: the turns in order and where the run stands (`status`, `node`,
    `outcome`); `waiting` says the run waits for the patient's next reply."""

    version: str
    turns: list[Turn]
    status: str
    node: str | None
    outcome: str | None
    waiting: bool
    #: The run's reason to stop (a cancel reason), a catalogue code.
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The JSON the builder reads."""
        return {"version": self.version, "turns": [t.as_json() for t in self.turns], "status": self.status,
                "node": self.node, "outcome": self.outcome, "waiting": self.waiting, "reason": self.reason}


def checked_replies(replies: Any) -> list[str | None]:
    """The replies as a rehearsal takes them: a list of at most MAX_REPLIES texts (or None for
    silence), each non-empty and at most MAX_REPLY_CHARS; RehearsalRefused otherwise."""
    if not isinstance(replies, list):
        raise RehearsalRefused("rehearsal_bad_replies")
    if len(replies) > MAX_REPLIES:
        raise RehearsalRefused("rehearsal_too_many_replies", max=MAX_REPLIES)
    out: list[str | None] = []
    for reply in replies:
        if reply is None:
            out.append(None)
            continue
        if not isinstance(reply, str) or not reply.strip():
            raise RehearsalRefused("rehearsal_bad_replies")
        if len(reply) > MAX_REPLY_CHARS:
            raise RehearsalRefused("rehearsal_reply_too_long", max=MAX_REPLY_CHARS)
        out.append(reply.strip())
    return out


def rehearse(rt: Runtime, org_id: int, pointer_id: int, *, version: str, replies: Any,
             ai: Callable[[Any], AI] | None = None) -> Transcript:
    """Replay a conversation with the org's flow `pointer_id` (its draft, or its published version)
    and return the transcript; nothing it does is kept (see the module). Raises
    `versions.FlowNotFound` for a flow that is not the org's, `versions.FlowRejected` for a draft
    that breaks a publish rule, RehearsalRefused for bad input or a flow that cannot run.
    `ai` builds the AI for the run's agent, as `runtime.advance` takes it (tests)."""
    if version not in VERSIONS:
        raise RehearsalRefused("rehearsal_bad_version")
    wanted = checked_replies(replies)
    with rt.db.engine.connect() as conn:
        conn.execution_options(lembra_write=True)  # SQLite: take the write lock up front, as db.begin does
        outer = conn.begin()
        try:
            own = clock.FrozenClock(clock.now())
            with clock.local(own):
                held = dataclasses.replace(rt, db=_Held(rt.db, conn))
                return _Play(held, conn, own, org_id, pointer_id, version, ai).run(wanted)
        finally:
            outer.rollback()  # always: a rehearsal leaves nothing


# --- one transaction, many savepoints -------------------------------------------------------------

class _Savepoint:
    """The connection the engine gets inside a rehearsal: the outer one, with its own savepoint
    standing for the transaction the engine thinks it has (commit releases it, rollback undoes it,
    and a new one begins, as a connection autobegins)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._savepoint = conn.begin_nested()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def commit(self) -> None:
        if self._savepoint.is_active:
            self._savepoint.commit()
        self._savepoint = self._conn.begin_nested()

    def rollback(self) -> None:
        if self._savepoint.is_active:
            self._savepoint.rollback()
        self._savepoint = self._conn.begin_nested()

    def begin(self) -> Any:
        return self._conn.begin_nested()

    def end(self, *, keep: bool) -> None:
        if self._savepoint.is_active:
            (self._savepoint.commit if keep else self._savepoint.rollback)()


class _Held:
    """A `Database` whose every transaction is a savepoint of the rehearsal's one transaction."""

    def __init__(self, db: Any, conn: Connection) -> None:
        self._db = db
        self._conn = conn

    #: What may be read of the real database: never its engine, whose connections would escape the
    #: transaction (a write there would stay).
    _SHARED = frozenset({"url", "dialect", "is_sqlite"})

    def __getattr__(self, name: str) -> Any:
        if name not in self._SHARED:
            raise AttributeError(f"a rehearsal's database has no {name!r}")
        return getattr(self._db, name)

    @contextlib.contextmanager
    def begin(self) -> Iterator[Any]:
        view = _Savepoint(self._conn)
        try:
            yield view
        except BaseException:
            view.end(keep=False)
            raise
        view.end(keep=True)

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        view = _Savepoint(self._conn)
        try:
            yield view
        finally:
            view.end(keep=False)  # like a connection closed without commit


# --- what the AI understood -----------------------------------------------------------------------

class _Listening:
    """The run's AI, as built for its agent, with what it understood noted down: the intent and
    fields of each reading (`understand`), the label of each classification."""

    def __init__(self, ai: AI, heard: list[dict[str, Any]]) -> None:
        self._ai = ai
        self._heard = heard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ai, name)

    def understand(self, text: str, context: Any) -> Any:
        reading = self._ai.understand(text, context)
        self._heard.append({"intent": reading.intent})
        return reading

    def classify(self, **kwargs: Any) -> Any:
        result = self._ai.classify(**kwargs)
        self._heard.append({"label": result.label})
        return result


# --- the replay -----------------------------------------------------------------------------------

class _Play:
    """One rehearsal's state: the run, the synthetic patient, and the transcript so far."""

    def __init__(self, rt: Runtime, conn: Connection, own: clock.FrozenClock, org_id: int, pointer_id: int,
                 version: str, ai: Callable[[Any], AI] | None) -> None:
        self.rt, self.conn, self.clock = rt, conn, own
        self.org_id, self.pointer_id, self.version = org_id, pointer_id, version
        make = ai or (lambda agent: ai_for(agent, rt.keyring, egress=rt.settings.egress))
        self.heard: list[dict[str, Any]] = []
        heard = self.heard
        self.make_ai: Callable[[Any], AI] = lambda agent: _Listening(make(agent), heard)  # type: ignore[return-value]
        self.turns: list[Turn] = []
        self.shown: set[int] = set()
        self.last_event = 0

    def run(self, replies: list[str | None]) -> Transcript:
        run_id = self._start()
        graph = graph_of(self.conn, self.org_id, self._row(run_id).version_id)
        pending = list(replies)
        reading: tuple[Turn, dict[str, Any], int] | None = None
        if self.opens_with_reply and pending and pending[0] is not None:
            # An intent flow starts with the patient's message, which its run reads as the first
            # reply (triggers.on_free_text): "posso remarcar pra sexta?" already answers the `ask`.
            row = self._row(run_id)
            text = pending.pop(0)
            turn = Turn("patient", text, node=row.current_node_id)
            self.turns.append(turn)
            self.last_event = self._last_event(run_id)
            triggers.take_first_reply(self.conn, self.org_id, run_id, self._store(text, processed=True))
            reading = (turn, dict(row.data or {}), row.revision)
        for _ in range(MAX_ROUNDS):
            self._show_messages(run_id)
            row = self._row(run_id)
            if reading is not None and row.revision != reading[2]:
                self._explain(graph, run_id, reading[0], reading[1])
            now = clock.now()
            if row.status not in lifecycle.CLOCKED or row.next_eval_at is None:
                break
            if row.next_eval_at <= now:
                revision = self._claim(run_id)
                if revision is None:
                    break
                runtime.advance_claimed(self.rt, [(run_id, revision)], ai=self.make_ai)
                continue
            if row.status == "waiting_reply":
                if not pending:
                    break
                text = pending.pop(0)
                turn = Turn("patient", text, node=row.current_node_id)
                self.turns.append(turn)
                self.heard.clear()
                self.last_event = self._last_event(run_id)
                if text is None:  # the patient stays silent: the node's grace runs out
                    self.clock.set(row.next_eval_at)
                else:
                    self._reply(row, text)
                    self.clock.advance(self._debounce() + timedelta(seconds=1))
                reading = (turn, dict(row.data or {}), self._row(run_id).revision)
                continue
            self.clock.set(row.next_eval_at)  # a wait: jump to its end
        self._show_messages(run_id)
        row = self._row(run_id)
        return Transcript(version=self.version, turns=self.turns, status=row.status, node=row.current_node_id,
                          outcome=row.outcome, waiting=row.status == "waiting_reply",
                          reason=row.cancel_reason or row.last_error)

    # --- setting the stage ---------------------------------------------------------------------
    def _start(self) -> int:
        """The version to play, the synthetic patient and appointment, and the run."""
        conn, org_id, pointer_id = self.conn, self.org_id, self.pointer_id
        pointer = versions.get_flow(conn, org_id, pointer_id)  # FlowNotFound: not this org's
        if self.version == "draft":
            versions.publish(conn, org_id, pointer_id)  # FlowRejected lists what to fix first
        elif pointer.active_version_id is None:
            raise RehearsalRefused("rehearsal_not_published")
        # A disabled flow is still rehearsed: only this transaction sees it active again.
        conn.execute(update(flow_pointers).where(flow_pointers.c.org_id == org_id, flow_pointers.c.id == pointer_id)
                     .values(status="active"))
        self.channel = self._channel()
        contact_id = create_contact(conn, org_id=org_id, name=PATIENT_NAME, phone=self._free_phone(),
                                    email=_EMAIL, consent=("whatsapp", "sms", "email"))
        appointment_id = self._appointment(contact_id)
        result = triggers.enroll(conn, org_id, pointer_id, contact_id, trigger_kind="manual",
                                 trigger_key=f"rehearsal:{uuid.uuid4().hex}", appointment_id=appointment_id,
                                 automatic=False)
        if result.enrollment_id is None:
            raise RehearsalRefused("rehearsal_not_started", reason=result.reason)  # the code, for the JSON
        self.contact_id = contact_id
        self.opens_with_reply = (pointer.trigger_config or {}).get("kind") == "intent"
        return result.enrollment_id

    def _channel(self) -> Any:
        """The org's channel the patient answers on: its default WhatsApp, else SMS, channel."""
        for kind in _REPLY_KINDS:
            row = self.conn.execute(select(channels).where(channels.c.org_id == self.org_id, channels.c.kind == kind)
                                    .order_by(channels.c.is_default.desc(), channels.c.id).limit(1)).first()
            if row is not None:
                return row
        raise RehearsalRefused("rehearsal_no_channel")

    def _free_phone(self) -> str:
        """A number none of the org's contacts has: the replies reach the synthetic patient alone."""
        for offset in range(100):
            phone = f"+{_PHONE_BASE + offset}"
            if not find_all_by_address(self.conn, self.org_id, phone):
                return phone
        raise RehearsalRefused("rehearsal_no_channel")

    def _appointment(self, contact_id: int) -> int:
        """A booked appointment two days ahead at 10:00 (the org's time), with its first active
        professional. Inserted as a fixture, without the `created` hook: no other flow starts for
        the synthetic patient, and no reminder is planned."""
        org = self.conn.execute(select(orgs).where(orgs.c.id == self.org_id)).one()
        zone = ZoneInfo(org.timezone)
        day = (clock.now().astimezone(zone) + timedelta(days=2)).date()
        starts_at = datetime.combine(day, time(10, 0), zone)
        professional = self.conn.execute(select(professionals).where(
            professionals.c.org_id == self.org_id, professionals.c.active.is_(True))
            .order_by(professionals.c.id).limit(1)).first()
        now = clock.now()
        return int(self.conn.execute(insert(appointments).values(
            org_id=self.org_id, contact_id=contact_id, starts_at=starts_at, timezone=org.timezone,
            professional=professional.name if professional is not None else None,
            professional_id=professional.id if professional is not None else None,
            status="scheduled", created_at=now, updated_at=now).returning(appointments.c.id)).scalar_one())

    # --- driving the run -----------------------------------------------------------------------
    def _row(self, run_id: int) -> Any:
        return self.conn.execute(select(enrollments).where(enrollments.c.org_id == self.org_id,
                                                           enrollments.c.id == run_id)).one()

    def _claim(self, run_id: int) -> int | None:
        """The scheduler's claim (`runtime.claim_due`), of this run alone: a lease, the revision bumped."""
        now = clock.now()
        return self.conn.execute(
            update(enrollments)
            .where(enrollments.c.org_id == self.org_id, enrollments.c.id == run_id,
                   enrollments.c.status.in_(lifecycle.CLOCKED), enrollments.c.next_eval_at <= now,
                   enrollments.c.lease_until.is_(None))
            .values(lease_until=now + self.rt.settings.lease, revision=enrollments.c.revision + 1,
                    claim_started_at=None)
            .returning(enrollments.c.revision)).scalar()

    def _debounce(self) -> timedelta:
        seconds = self.conn.execute(select(orgs.c.reply_debounce_seconds).where(orgs.c.id == self.org_id)).scalar()
        return timedelta(seconds=int(seconds or 0))

    def _reply(self, row: Any, text: str) -> None:
        """The patient writes: stored as the provider's webhook stores it, then the inbound path."""
        process_inbound(self.rt, self._store(text))

    def _store(self, text: str, *, processed: bool = False) -> int:
        """The patient's message as the webhook stores it (`processed`: as the inbound path leaves
        free text that started a flow)."""
        now = clock.now()
        contact = self.conn.execute(select(contacts.c.phone).where(contacts.c.org_id == self.org_id,
                                                                   contacts.c.id == self.contact_id)).one()
        done = {"processed_at": now, "outcome": "free_text", "contact_id": self.contact_id} if processed else {}
        stored = self.conn.execute(insert(inbound_messages).values(
            org_id=self.org_id, channel_id=self.channel.id, provider_message_id=f"rehearsal-{uuid.uuid4().hex}",
            from_address=contact.phone, text=text, received_at=now, **done).returning(inbound_messages.c.id))
        return int(stored.scalar_one())

    def _last_event(self, run_id: int) -> int:
        return int(self.conn.execute(select(enrollment_events.c.id).where(
            enrollment_events.c.org_id == self.org_id, enrollment_events.c.enrollment_id == run_id)
            .order_by(enrollment_events.c.id.desc()).limit(1)).scalar() or 0)

    # --- what the transcript says --------------------------------------------------------------
    def _explain(self, graph: GraphIndex, run_id: int, turn: Turn, data_before: Mapping[str, Any]) -> None:
        """What the run made of the reply: the step that read it (the first `step` after it), what
        it understood and took, and every step the run went on with until it waits again."""
        steps = self.conn.execute(select(enrollment_events).where(
            enrollment_events.c.org_id == self.org_id, enrollment_events.c.enrollment_id == run_id,
            enrollment_events.c.event_type == "step", enrollment_events.c.id > self.last_event)
            .order_by(enrollment_events.c.id)).all()
        taken = []
        for step in steps:
            payload = step.payload or {}
            if payload.get("status") == "stale" or step.node_id is None:
                continue
            params = payload.get("params") or {}
            target = payload.get("next")
            way = queries.exit_of(payload)  # as the engine recorded it
            taken.append({"node": step.node_id, "reason": payload.get("reason"), "exit": way, "next": target,
                          "params": params, "kind": payload.get("kind")})
        turn.path = [{key: value for key, value in step.items() if key not in ("params", "kind")} for step in taken]
        # The step that read the reply: a trigger only hands the message that started the run on.
        first = next((step for step in taken if step["kind"] != "trigger"), None)
        if first is None:
            return
        turn.node, turn.reason, turn.next_node, turn.exit = first["node"], first["reason"], first["next"], first["exit"]
        turn.label = first["params"].get("class")
        for heard in self.heard:
            turn.intent = turn.intent or heard.get("intent")
            turn.label = turn.label or heard.get("label")
        data = dict(self._row(run_id).data or {})
        turn.fields = {slug: value for slug, value in data.items() if data_before.get(slug) != value}

    def _show_messages(self, run_id: int) -> None:
        """The messages the patient would have read, as the dispatcher renders them, in order."""
        rows = self.conn.execute(select(messages).where(
            messages.c.org_id == self.org_id, messages.c.contact_id == self.contact_id,
            or_(messages.c.enrollment_id == run_id, messages.c.rule_id.is_(None)))
            .order_by(messages.c.id)).all()
        new = [row for row in rows if row.id not in self.shown]
        if not new:
            return
        org = self.conn.execute(select(orgs).where(orgs.c.id == self.org_id)).one()
        contact = self.conn.execute(select(contacts).where(contacts.c.org_id == self.org_id,
                                                           contacts.c.id == self.contact_id)).one()
        for row in new:
            self.shown.add(row.id)
            appointment = None
            if row.appointment_id is not None:
                appointment = self.conn.execute(select(appointments).where(
                    appointments.c.org_id == self.org_id, appointments.c.id == row.appointment_id)).first()
            try:
                text = render_message(self.conn, org=org, contact=contact, appointment=appointment, message=row,
                                      conversation_open=True).outbound.text
            except (TemplateError, MissingAddress):
                text = None  # the builder says the message could not be written
            node = None
            if row.enrollment_id == run_id and row.idempotency_key:
                node = row.idempotency_key.split(":node:", 1)[-1].split(":attempt:", 1)[0]
            self.turns.append(Turn("bot", text, node=node))
