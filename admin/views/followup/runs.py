"""Execuções (endpoint `followup_runs`): a run's timeline — every event of the enrollment, oldest
first, with what happened, why (the catalogue's sentence), when (in the org's time zone), where
it went next and the LLM calls it made — and a contact's runs. Reached from the follow-up queue,
the contact page and Pendências (a run that failed for good).

The timeline is `engine.flows.queries.run_steps`, the same the REST API serves: codes, node ids,
counters and instants, never a patient's text. Beside it a run's page shows the patient's replies
the run took (their text, what the step made of each and the fields it took from it) and, once
the run ended, its last step and outcome in words. A reply's text is personal data: it is shown
here, to the staff of the run's org (every query is scoped by it), and never logged. Every role
reads it; Cancelar (owners and managers) posts to the queue's cancel, the one cancel path of the
console.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Mapping

from flask import abort, request, url_for
from flask_admin import expose
from sqlalchemy import select
from sqlalchemy.engine import Connection

from admin.i18n import _l, translate
from admin.ids import valid_id
from admin.views.base import TenantPageView, db_session, is_editor, local_dt, org_id
from admin.views.followup.exits import class_label, exit_label, last_class_label
from admin.views.followup.queue import (
    ENROLLMENT_STATUS_COLORS,
    ENROLLMENT_STATUS_LABELS,
    contact_name,
    contact_names,
    enrollment_badge,
    flow_names,
    next_run,
    node_label,
    reason_text,
    reason_params,
    run_reason,
)
from engine.flows import lifecycle, queries
from engine.flows.graph import GraphIndex
from engine.flows.versions import FlowNotFound, graph_of
from engine.flows.conversation.fields import fields_by_slug
from engine.store.models import contacts, enrollment_events, enrollments, inbound_messages
from engine.words.catalogue import describe

#: What each event of a run is, in the receptionist's words.
EVENT_LABELS = {
    "enrolled": _l("Entrou no fluxo"), "step": _l("Etapa executada"), "reply": _l("O paciente respondeu"),
    "paused": _l("Pausado"), "resumed": _l("Retomado"), "ended": _l("Encerrado"),
    "handoff_allowed": _l("Atendimento humano (o fluxo segue)"), "requeued": _l("Devolvido à fila"),
}
#: How a step went (lifecycle.STEP_STATUSES).
STEP_STATUS_LABELS = {
    "ok": _l("Feito"), "skipped": _l("Pulado"), "failed": _l("Falhou"), "waiting": _l("Aguardando"),
    "deferred": _l("Adiado: nova tentativa"), "stale": _l("Ignorado"),
}
STEP_STATUS_COLORS = {"ok": "success", "skipped": "secondary", "failed": "danger", "waiting": "warning",
                      "deferred": "warning", "stale": "light"}
#: Runs listed on a contact's (or the org's) page, the latest ones.
LIST_ROWS = 100


@dataclass(frozen=True)
class Line:
    """One line of the timeline, ready to show."""

    at: str
    event: str
    node: str
    status: str | None
    status_color: str
    reason: str | None
    next: str | None
    until: str | None
    llm_calls: int
    #: The exit the step left its node by, in the canvas's words (as the engine recorded it).
    exit: str | None = None


def timeline(conn: Connection, oid: int, run: Any) -> list[Line]:
    """The run's events as the page shows them (labels, sentences, local instants)."""
    lines = []
    try:
        graph: GraphIndex | None = graph_of(conn, oid, int(run.version_id))
    except FlowNotFound:
        graph = None
    for step in queries.run_steps(conn, oid, run.id):
        status_code = step.status
        if status_code in STEP_STATUS_LABELS:
            status, color = str(STEP_STATUS_LABELS[status_code]), STEP_STATUS_COLORS[status_code]
        elif status_code in ENROLLMENT_STATUS_LABELS:  # an `ended` event carries the run's final status
            status, color = str(ENROLLMENT_STATUS_LABELS[status_code]), ENROLLMENT_STATUS_COLORS[status_code]
        else:
            status, color = None, ""
        params = _named_class(conn, oid, int(run.version_id), step.node_id, step.reason, step.params)
        reason = reason_text(step.reason, params) if step.reason else reason_text(step.event)
        lines.append(Line(
            at=local_dt(step.at, seconds=True), event=str(EVENT_LABELS.get(step.event, step.event)),
            node=node_label(conn, oid, int(run.version_id), step.node_id), status=status, status_color=color,
            reason=reason, next=node_label(conn, oid, int(run.version_id), step.next) if step.next else None,
            until=local_dt(step.until) if step.until else None, llm_calls=step.llm_calls,
            exit=exit_label(step.exit, graph, step.node_id) if graph is not None and step.next else None,
        ))
    return lines


def _named_class(conn: Connection, oid: int, version_id: int, node_id: str | None, reason: str | None,
                 params: Any) -> Any:
    """A classified reply's class under the name the builder gave it ("Não quer", kept in the node's
    `labels`), never its slug; anything else as it is."""
    if reason != "classified" or not isinstance(params, Mapping) or not node_id:
        return params
    try:
        named = class_label(graph_of(conn, oid, version_id), node_id, params.get("class"))
    except FlowNotFound:
        return params
    return {**params, "class": named}


def _last_class(conn: Connection, oid: int, row: Any) -> str | None:
    """The run's last class under its name in the version that ran (the slug when it has none)."""
    slug = getattr(row, "last_class", None)
    if not slug:
        return None
    try:
        return last_class_label(graph_of(conn, oid, int(row.version_id)), slug)
    except FlowNotFound:
        return str(slug)


def _summary(conn: Connection, oid: int, row: Any, flows: dict[int, str],
             reasons: Mapping[int, Mapping[str, Any]] | None = None,
             names: Mapping[int, str] | None = None) -> dict[str, Any]:
    return {
        "id": row.id, "flow": flows.get(int(row.pointer_id), f"#{row.pointer_id}"), "version": row.version_number,
        "contact_id": row.contact_id, "contact": names[int(row.contact_id)] if names is not None else contact_name(conn, oid, row.contact_id),
        "status": row.status, "badge": enrollment_badge(row.status), "live": row.status in lifecycle.LIVE,
        "node": node_label(conn, oid, int(row.version_id), row.current_node_id), "next_run": next_run(row.next_eval_at),
        "reason": run_reason(conn, oid, row, None if reasons is None else reasons.get(int(row.id), {})),
        "created_at": local_dt(row.created_at),
        "ended_at": local_dt(row.ended_at) if row.ended_at else None, "steps": row.steps, "llm_calls": row.llm_calls,
        "messages_sent": row.messages_sent, "replies": row.replies, "attempts": row.attempts,
    }


#: How a collected value reads, by field type (the rest as stored).
_PERIODS = {"morning": _l("de manhã"), "afternoon": _l("à tarde"), "evening": _l("à noite")}


def _shown(kind: str | None, value: Any) -> str:
    """One collected value in the org's words: a date as dd/mm/aaaa, a period in words, a yes/no as Sim/Não."""
    if kind == "date" and isinstance(value, str):
        try:
            return date.fromisoformat(value).strftime("%d/%m/%Y")
        except ValueError:
            return value
    if kind == "period":
        return str(_PERIODS.get(value, value))
    if kind == "boolean":
        return str(_l("Sim") if value else _l("Não"))
    return str(value)


def slot_text(slot: Mapping[str, Any]) -> str:
    """The offered time the patient picked (`data.slot`, offer_slots), in the org's words:
    "03/12/2026 09:30 (Dra. Beatriz Costa)"."""
    try:
        when = local_dt(datetime.fromisoformat(slot["starts_at"]))
    except ValueError:
        when = slot["starts_at"]
    return f"{when} ({slot['professional']})" if slot.get("professional") else when


def collected(conn: Any, oid: int, row: Any) -> list[tuple[str, str]]:
    """What the run has collected (its `data`), each value under its field's label, in the org's
    words: a date as dd/mm/aaaa, a period in words, a yes/no as Sim/Não, the picked time as a time."""
    data = getattr(row, "data", None) or {}
    if not data:
        return []
    specs = fields_by_slug(conn, oid, sorted(data))
    out = []
    for slug, value in data.items():
        if slug == "slot" and isinstance(value, Mapping) and isinstance(value.get("starts_at"), str):
            out.append((str(_l("horário")), slot_text(value)))
            continue
        spec = specs.get(slug)
        out.append((spec.label if spec is not None else slug, _shown(spec.type if spec is not None else None, value)))
    return out


#: How a run ended (`enrollments.outcome`: an end step's, or why it was ended), in words.
OUTCOME_LABELS = {
    "converted": _l("Convertido"), "exhausted": _l("Esgotado (sem sucesso)"), "custom": _l("Outro"),
    "opted_out": _l("O paciente pediu para não receber mais mensagens"), "replied": _l("O paciente respondeu"),
    "handoff": _l("Passou para uma pessoa da equipe"),
}


@dataclass(frozen=True)
class Reply:
    """A patient's message the run took, ready to show (its text is personal data: page only)."""

    at: str
    text: str
    reading: str | None
    fields: list[tuple[str, str]]
    #: Set when the text is a voice note's transcript: the catalogue's "Transcrito de um áudio.".
    transcribed: str | None = None


def replies(conn: Connection, oid: int, row: Any) -> list[Reply]:
    """The patient's messages this run took, oldest first: the text, what the step that read it
    made of it (the catalogue's sentence) and the fields that step took, with their values (a
    field a later reply corrected says so). Three queries: the replies, the run's events, the
    fields' labels."""
    inbound = conn.execute(
        select(inbound_messages.c.id, inbound_messages.c.received_at, inbound_messages.c.text, inbound_messages.c.button_payload,
               inbound_messages.c.flow_result, inbound_messages.c.voice_state)
        .where(inbound_messages.c.org_id == oid, inbound_messages.c.flow_enrollment_id == row.id)
        .order_by(inbound_messages.c.received_at, inbound_messages.c.id)).all()
    if not inbound:
        return []
    events = conn.execute(
        select(enrollment_events.c.event_type, enrollment_events.c.node_id, enrollment_events.c.payload)
        .where(enrollment_events.c.org_id == oid, enrollment_events.c.enrollment_id == row.id)
        .order_by(enrollment_events.c.id)).all()
    data = getattr(row, "data", None) or {}
    taken_by_reply: list[list[str]] = []
    readings: list[str | None] = []
    for message in inbound:
        result = message.flow_result if isinstance(message.flow_result, Mapping) else {}
        params = _named_class(conn, oid, int(row.version_id), result.get("node"), result.get("reason"),
                              _reading_params(events, message.id, result))
        taken = params.get("taken")
        slugs = [slug for slug in taken if isinstance(slug, str)] if isinstance(taken, list) else []
        if result.get("reason") == "do_slot_picked":
            slugs.append("slot")  # the offered time the reply picked is what it gave the run
        taken_by_reply.append(slugs)
        readings.append(reason_text(result["reason"], params) if isinstance(result.get("reason"), str) else None)
    specs = fields_by_slug(conn, oid, sorted({slug for slugs in taken_by_reply for slug in slugs}))
    out = []
    later: set[str] = set()  # a field a later reply took again: its value now is that reply's
    for message, slugs, reading in reversed(list(zip(inbound, taken_by_reply, readings))):
        text = message.text if message.text is not None else message.button_payload
        fields = []
        for slug in slugs:
            spec = specs.get(slug)
            if slug in later or slug not in data:
                shown = str(_l("corrigido depois"))
            elif slug == "slot" and isinstance(data[slug], Mapping) and isinstance(data[slug].get("starts_at"), str):
                fields.append((str(_l("horário")), slot_text(data[slug])))
                continue
            else:
                shown = _shown(spec.type if spec is not None else None, data[slug])
            fields.append((str(_l("horário")) if slug == "slot" else spec.label if spec is not None else slug, shown))
        later.update(slugs)
        out.append(Reply(at=local_dt(message.received_at, seconds=True), text=text or "—",
                         reading=reading, fields=fields,
                         transcribed=translate(describe("voice_transcribed"))
                         if message.voice_state == "transcribed" else None))
    return out[::-1]


def _reading_params(events: list[Any], inbound_id: int, result: Mapping[str, Any]) -> Mapping[str, Any]:
    """The params of the step that read reply `inbound_id`: the first step after the reply's
    event, at the node and with the reason the reply's reading names ({} when none is found)."""
    after = False
    for event in events:
        payload = event.payload if isinstance(event.payload, Mapping) else {}
        if event.event_type == "reply" and payload.get("inbound_id") == inbound_id:
            after = True
        elif (after and event.event_type == "step" and event.node_id == result.get("node")
              and payload.get("reason") == result.get("reason")):
            params = payload.get("params")
            return params if isinstance(params, Mapping) else {}
    return {}


def ending(conn: Connection, oid: int, row: Any) -> dict[str, str] | None:
    """An ended run's last step (as the builder names it) and its outcome in words; None while it lives."""
    if row.status in lifecycle.LIVE:
        return None
    outcome = OUTCOME_LABELS.get(row.outcome or "")
    return {"node": node_label(conn, oid, int(row.version_id), row.current_node_id),
            "outcome": str(outcome) if outcome is not None else str(ENROLLMENT_STATUS_LABELS.get(row.status, "—"))}


class RunsView(TenantPageView):
    """Execuções: `?enrollment=<id>` a run's timeline, `?contact=<id>` a contact's runs, neither
    the org's latest runs. Another org's id (or one that cannot be an id) answers 404."""

    @expose("/")
    def index(self) -> Any:
        """One run, one contact's runs, or the latest runs."""
        oid = org_id()
        session = db_session()
        conn = session.connection()
        flows = flow_names(conn, oid)
        raw_run, raw_contact = request.args.get("enrollment"), request.args.get("contact")
        if raw_run is not None:
            if not valid_id(raw_run):
                abort(404)
            row = queries.find_enrollment(conn, oid, int(raw_run))
            if row is None:
                abort(404)
            run = _summary(conn, oid, row, flows)
            run["collected"] = collected(conn, oid, row)
            run["ending"] = ending(conn, oid, row)
            run["last_class"] = _last_class(conn, oid, row)
            lines = timeline(conn, oid, row)
            taken = replies(conn, oid, row)
            session.rollback()  # read only; the scoped session is reused by the next request
            return self.render("admin/followup/run.html", run=run, lines=lines, replies=taken,
                               can_cancel=is_editor() and run["live"])
        contact = None
        query = queries.enrollments_query(oid)
        if raw_contact is not None:
            if not valid_id(raw_contact):
                abort(404)
            contact = conn.execute(select(contacts.c.id, contacts.c.name).where(
                contacts.c.org_id == oid, contacts.c.id == int(raw_contact), contacts.c.erased_at.is_(None))).first()
            if contact is None:
                abort(404)
            query = queries.enrollments_query(oid, contact_id=contact.id)
        rows = conn.execute(query.order_by(enrollments.c.id.desc()).limit(LIST_ROWS)).all()
        reasons = reason_params(conn, oid, rows)
        names = contact_names(conn, oid, [r.contact_id for r in rows])
        runs = [_summary(conn, oid, r, flows, reasons, names) for r in rows]
        contact_label = (contact.name or contact_name(conn, oid, contact.id)) if contact is not None else None
        session.rollback()
        return self.render("admin/followup/runs.html", runs=runs, contact=contact, contact_label=contact_label,
                           list_rows=LIST_ROWS)


def run_url(enrollment_id: int) -> str:
    """Where a run's timeline is."""
    return url_for("followup_runs.index", enrollment=enrollment_id)


__all__ = ["EVENT_LABELS", "Line", "RunsView", "run_url", "timeline"]
