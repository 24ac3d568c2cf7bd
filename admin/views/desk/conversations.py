"""Conversas: the patient replies no keyword handled ("Oi, posso remarcar para sexta?"), for a
person to read, answer and mark handled (engine/messaging/conversations.py holds the queries and the reply).
A reply a follow-up flow took says what the flow made of it and did; it waits for a person only
when the flow left it to one.

Every role acts here: answering patients is the front desk's job. An answer is an outbox message
(it goes once, through the channel kind the patient wrote on); outside Meta's 24 h window the page
says why free text cannot go and offers the approved template instead. The menu item carries the
number of replies still waiting. Every query is scoped to the signed-in user's org; another org's
id answers 404, and the app's CSRFProtect refuses any POST without the session's token.
"""

from __future__ import annotations

import uuid
from typing import Any

from flask import Response, abort, flash, redirect, request, url_for
from flask_admin import expose
from flask_login import current_user

from admin.i18n import _, _l, ngettext, translate
from admin.ids import parse_id
from admin.views.base import (
    KIND_LABELS,
    PURPOSE_LABELS,
    CountedMenu,
    TenantPageView,
    badge,
    db_session,
    ids_of,
    local_dt,
    org_id,
    write_audit,
)
from admin.live import POLL
from admin.views.followup.handoff import handoff_state
from admin.views.followup.queue import flow_names, node_label
from admin.views.followup.runs import run_url
from admin.views.messages.sandbox import BUTTON_TITLES
from admin.views.words import reply_outcome_text
from engine.core import clock
from engine.messaging import conversations as convs
from engine.words.catalogue import describe
from engine.flows.queries import sentence as step_sentence
from engine.flows.versions import FlowNotFound, graph_of

PAGE_SIZE = 50
#: The list's tabs, in the receptionist's words.
STATE_LABELS = {"open": _l("Para responder"), "handled": _l("Resolvidas"), "all": _l("Todas")}
#: One reply's situation (convs.Item.state): its badge's words and colour.
ITEM_STATES = {"open": (_l("Para responder"), "warning"), "flow": (_l("Com o fluxo"), "info"),
               "flow_handled": (_l("Resolvida pelo fluxo"), "success"), "handled": (_l("Resolvida"), "success")}
AUDIT_ENTITY = "inbound_messages"


def unread_count() -> int:
    """Replies of the signed-in user's org waiting for a person."""
    session = db_session()
    return convs.unhandled_count(session.connection(), org_id())


def sentence(code: str, **params: Any) -> str:
    """A catalogue code in the reader's language (never the raw code)."""
    return translate(describe(code, **params))


def message_text(text: str | None, button_payload: str | None) -> str:
    """What the patient wrote, a tapped button in words, or a note that retention removed it."""
    if text:
        return text
    if button_payload:
        title = BUTTON_TITLES.get(button_payload.partition(":")[0], button_payload)
        return _("Tocou no botão “%(botao)s”", botao=title)
    return _("(texto removido pela retenção de dados)")


def outcome_text(outcome: str | None) -> str:
    """Why the reply is here: what the engine could not do with it."""
    return reply_outcome_text(outcome) if outcome else ""


def _ends(conn: Any, oid: int, version_id: int, node_id: str) -> bool:
    try:
        return graph_of(conn, oid, version_id).type(node_id) == "end"
    except (FlowNotFound, KeyError):
        return False


def flow_text(conn: Any, oid: int, reading: convs.FlowReading, names: dict[int, str]) -> str:
    """What the flow made of a reply and did with it, in the reader's language: reading it now,
    understood it as a class (or as a reply to a wait) and went on to a step or ended, did not
    understand it, has not managed to read it yet, or never got to read it."""
    params: dict[str, Any] = {"flow": names.get(reading.pointer_id, f"#{reading.pointer_id}")}
    if reading.state == "reading":
        return sentence("flow_reply_reading", **params)
    if reading.state == "late":
        return sentence("flow_reply_late", **params)
    if reading.state == "dropped":
        return sentence("flow_reply_dropped", **params)
    ends = reading.next is not None and _ends(conn, oid, reading.version_id, reading.next)
    params["step"] = node_label(conn, oid, reading.version_id, reading.next) if reading.next else "—"
    if reading.state == "understood":
        if reading.reason == "classified":
            params["class"] = reading.label or "—"
            return sentence("flow_reply_understood_ended" if ends else "flow_reply_understood", **params)
        return sentence("flow_reply_replied_ended" if ends else "flow_reply_replied", **params)
    if reading.reason == "not_classified" and reading.next is not None:
        return sentence("flow_reply_not_understood", **params)
    why = step_sentence(reading.reason)
    return sentence("flow_reply_stopped", why=translate(why) if why is not None else "", **params)


def flow_texts(conn: Any, oid: int, readings: dict[int, convs.FlowReading]) -> dict[int, str]:
    """`flow_text` for each reply of a page (or a thread), by inbound id."""
    if not readings:
        return {}
    names = flow_names(conn, oid)
    return {inbound_id: flow_text(conn, oid, reading, names) for inbound_id, reading in readings.items()}


def purpose_label(purpose: str | None) -> str:
    if not purpose:
        return ""
    return str(PURPOSE_LABELS.get(purpose) or _("Mensagem"))


def sender_name(item: convs.Item) -> str:
    if item.contact_id is not None:
        return item.contact_name or _("Contato %(id)s", id=item.contact_id)
    return item.from_address or "—"


class ConversationsView(CountedMenu, TenantPageView):
    """Conversas (endpoint `conversations`, /admin/conversations/): read, answer, mark handled."""

    def menu_count(self) -> int:
        return unread_count()

    def _item(self, raw: Any) -> convs.Item:
        """The org's waiting (or handled) reply with that id; 404 for anything else."""
        pk = parse_id(str(raw))
        if pk is None:
            abort(404)
        item = convs.find_item(db_session().connection(), org_id(), pk)
        if item is None:
            abort(404)
        return item

    def _list_context(self) -> dict[str, Any]:
        """The list's rows for the tab and page the URL asks (read only)."""
        state = request.args.get("state", "open")
        if state not in convs.STATES:
            state = "open"
        page = parse_id(request.args.get("page", "") or "") or 0
        session = db_session()
        conn = session.connection()
        items, total = convs.list_items(conn, org_id(), state=state, page=min(page, 10**6), page_size=PAGE_SIZE)
        notes = flow_texts(conn, org_id(), {item.id: item.flow for item in items if item.flow is not None})
        session.rollback()  # read only; the scoped session is reused by the next request
        return dict(items=items, total=total, state=state, page=page, pages=(total + PAGE_SIZE - 1) // PAGE_SIZE,
                    state_labels=STATE_LABELS, local_dt=local_dt, kind_labels=KIND_LABELS, badge=badge,
                    message_text=message_text, outcome_text=outcome_text, sender_name=sender_name,
                    item_states=ITEM_STATES, notes=notes, poll=POLL)

    @expose("/")
    def index(self) -> Any:
        """The replies waiting for a person (or the handled ones, or all), newest first."""
        return self.render("admin/conversations/list.html", **self._list_context())

    @expose("/rows/")
    def rows(self) -> Any:
        """The list alone (its live poll): the same rows as `index` for the same tab and page."""
        return self.render("admin/conversations/_rows.html", **self._list_context())

    def _thread_context(self, item: convs.Item) -> dict[str, Any]:
        """The thread with the reply's sender and what the flows made of each reply (read only)."""
        conn = db_session().connection()
        entries = convs.thread(conn, org_id(), item)
        readings = {e.row_id: e.flow for e in entries if not e.outgoing and e.flow is not None}
        if item.flow is not None:
            readings[item.id] = item.flow
        return dict(item=item, entries=entries, notes=flow_texts(conn, org_id(), readings), local_dt=local_dt,
                    badge=badge, message_text=message_text, outcome_text=outcome_text, purpose_label=purpose_label,
                    poll=POLL, sentence=sentence)

    @expose("/<inbound_id>/")
    def details(self, inbound_id: str) -> Any:
        """One reply: who wrote, about which appointment, on which channel, the thread with them,
        and the answer form (or why only the approved template may go)."""
        item = self._item(inbound_id)
        session = db_session()
        conn = session.connection()
        context = self._thread_context(item)
        options = convs.reply_options(conn, org_id(), item)
        flow_name = flow_names(conn, org_id()).get(item.flow.pointer_id) if item.flow is not None else None
        # Whether a person holds the conversation (its hand-off button posts to the contact's page).
        handoff = handoff_state(conn, org_id(), item.contact_id) if item.contact_id is not None else None
        session.rollback()
        return self.render(
            "admin/conversations/details.html", options=options,
            reason=sentence(options.reason) if options.reason else None, form_key=uuid.uuid4().hex,
            max_reply=convs.MAX_REPLY, kind_labels=KIND_LABELS, sender_name=sender_name, item_states=ITEM_STATES,
            flow_name=flow_name, run_url=run_url, handoff=handoff, **context,
        )

    @expose("/<inbound_id>/thread/")
    def thread_rows(self, inbound_id: str) -> Any:
        """The thread alone (the conversation page's live poll); another org's id answers 404."""
        item = self._item(inbound_id)
        context = self._thread_context(item)
        db_session().rollback()
        return self.render("admin/conversations/_thread.html", **context)

    @expose("/<inbound_id>/audio/")
    def voice_audio(self, inbound_id: str) -> Any:
        """A voice note's audio for the thread's player: the org's own only (another org's id, or
        audio retention removed, answers 404), never cached by a shared cache."""
        parsed = parse_id(inbound_id)
        if parsed is None:
            abort(404)
        found = convs.voice_audio(db_session().connection(), org_id(), parsed)
        db_session().rollback()
        if found is None:
            abort(404)
        content, mime = found
        response = Response(content, mimetype=mime.split(";", 1)[0].strip() or "audio/ogg")
        response.headers["Cache-Control"] = "private, no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @expose("/<inbound_id>/reply/", methods=("POST",))
    def reply(self, inbound_id: str) -> Any:
        """Queue the typed answer (or, with `template=1`, the approved template) for the patient."""
        item = self._item(inbound_id)
        key = request.form.get("key", "")
        if not convs.FORM_KEY.match(key):
            abort(400)  # the page always sends one; anything else is not our form
        conn = db_session().connection()
        result = convs.send_reply(conn, org_id(), item, int(current_user.id), key,
                                  text=request.form.get("text"), use_template=request.form.get("template") == "1")
        if result.message_id is not None:
            write_audit(conn, "reply", AUDIT_ENTITY, item.id, {"message_id": result.message_id,
                                                               "template": request.form.get("template") == "1"})
        db_session().commit()
        params = {"max": convs.MAX_REPLY} if result.code == "conversation_text_too_long" else {}
        category = "success" if result.message_id is not None else \
            "info" if result.code == "conversation_already_sent" else "error"
        flash(sentence(result.code, **params), category)
        return redirect(url_for(".details", inbound_id=item.id))

    def _mark(self, ids: list[int]) -> int:
        conn = db_session().connection()
        done = convs.mark_handled(conn, org_id(), ids, int(current_user.id))
        now = clock.now()
        for inbound_id in done:
            write_audit(conn, "handle", AUDIT_ENTITY, inbound_id, {"handled_at": now})
        db_session().commit()
        if done:
            flash(ngettext("%(num)d conversa marcada como resolvida.", "%(num)d conversas marcadas como resolvidas.",
                           len(done)), "success")
        else:
            flash(_("Nenhuma das selecionadas estava esperando resposta."), "warning")
        return len(done)

    @expose("/handled/", methods=("POST",))
    def handled(self) -> Any:
        """The list's bulk action: mark the selected replies handled (other orgs' ids change nothing)."""
        self._mark(ids_of(request.form.getlist("ids")))
        return redirect(url_for(".index"))

    @expose("/<inbound_id>/handled/", methods=("POST",))
    def handled_one(self, inbound_id: str) -> Any:
        """The details page's button: mark this reply handled."""
        item = self._item(inbound_id)  # another org's reply: 404
        self._mark([item.id])
        return redirect(url_for(".details", inbound_id=item.id))
