"""The follow-up actions of a contact, on Contatos (admin/views/desk/scheduling.py mixes this in):

- hand-off: a receptionist takes the conversation over (or hands it back) from the contact page
  or the sandbox chat. It is the same contact event the REST API records
  (`engine.flows.contact_events.record_contact_event`), so in the same transaction the engine applies each
  flow's policy (`replies.on_handoff_started` / `on_handoff_ended`: pause, cancel or allow, and
  the resume after the flow's grace) and starts flows triggered by a hand-off's end. Every role
  may do it: it is the front desk's job.
- enrolling by hand: one contact from its page (a published flow chosen), or the contacts
  selected on the list (a bulk action that asks for the flow), through `triggers.enroll` with a
  caller key written into the form when it is shown, so a double click (or a resubmitted form)
  enrolls once. A refusal (opted out, already in the flow, flow not published) is said as the
  catalogue's sentence. Owners and managers only.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from typing import Any

from flask import abort, flash, redirect, request, url_for
from flask_admin import expose
from sqlalchemy import select
from sqlalchemy.engine import Connection

from admin.i18n import _, ngettext
from admin.ids import valid_id
from admin.views.base import ids_of, is_editor, org_id, write_audit
from admin.views.followup.queue import (
    enrollment_badge,
    flow_names,
    next_run,
    node_label,
    reason_params,
    reason_text,
    run_reason,
)
from engine.flows.contact_events import record_contact_event
from engine.flows import facts, lifecycle, queries, triggers
from engine.store.models import Contact, enrollments, flow_pointers

#: The caller key the form carries: 32 hex characters made when the form is shown.
KEY_PATTERN = re.compile(r"^[0-9a-f]{32}$")
#: Where a hand-off button may send the receptionist back to (never a URL from the form).
BACK_TARGETS = ("contact", "sandbox", "conversation")
#: Contacts one bulk enrolment takes at most (a list page holds 50; this leaves room, bounded).
MAX_BULK = 500


def new_form_key() -> str:
    """A fresh caller key for one enrolment form."""
    return uuid.uuid4().hex


def published_flows(conn: Connection, oid: int) -> list[Any]:
    """The org's flows that can take a contact now (published and not disabled), by name."""
    return conn.execute(select(flow_pointers.c.id, flow_pointers.c.name).where(
        flow_pointers.c.org_id == oid, flow_pointers.c.status == "active",
        flow_pointers.c.active_version_id.is_not(None)).order_by(flow_pointers.c.name)).all()


def enroll_by_hand(conn: Connection, oid: int, flow_id: int, contact_id: int, key: str) -> triggers.Enrolled:
    """Start the flow for the contact by hand under the form's key (the API's way: a second
    request with the same key answers the first one's enrollment)."""

    def attempt() -> triggers.Enrolled:
        return triggers.enroll(conn, oid, flow_id, contact_id, trigger_kind="manual", trigger_key=f"console:{key}",
                               caller_key=f"console:{key}", automatic=False)

    result = attempt()
    if result.reason == "repeat_policy":
        # A concurrent request with the same key took the claim first; asking again answers its run.
        result = attempt()
    return result


def handoff_state(conn: Connection, oid: int, contact_id: int) -> bool:
    """Whether a person holds the conversation now (a hand-off started and not ended)."""
    return facts.human_holds(conn, oid, contact_id)


def followup_context(conn: Connection, oid: int, contact_id: int) -> dict[str, Any]:
    """What the contact page's Follow-up card shows: hand-off state, live runs, flows to enroll in."""
    flows = flow_names(conn, oid)
    rows = conn.execute(queries.enrollments_query(oid, contact_id=contact_id)
                        .where(enrollments.c.status.in_(lifecycle.LIVE)).order_by(enrollments.c.id)).all()
    reasons = reason_params(conn, oid, rows)
    live = [{"id": r.id, "flow": flows.get(int(r.pointer_id), f"#{r.pointer_id}"), "badge": enrollment_badge(r.status),
             "node": node_label(conn, oid, int(r.version_id), r.current_node_id), "next_run": next_run(r.next_eval_at),
             "reason": run_reason(conn, oid, r, reasons.get(int(r.id), {}))} for r in rows]
    return {"handoff": handoff_state(conn, oid, contact_id), "live_runs": live,
            "published_flows": published_flows(conn, oid), "form_key": new_form_key()}


def _form_key() -> str:
    key = request.form.get("key", "")
    if not KEY_PATTERN.match(key):
        abort(400)  # the page always sends one; anything else is not our form
    return key


def _flow_id(conn: Connection, oid: int) -> int | None:
    """The flow named in the form: 404 for one that is not the org's; None (a message) for none."""
    raw = request.form.get("flow_id", "")
    if raw == "":
        return None
    if not valid_id(raw) or queries.find_flow(conn, oid, int(raw)) is None:
        abort(404)
    return int(raw)


class ContactFollowupMixin:
    """Hand-off and enrol-by-hand endpoints for the contacts view (see the module doc)."""

    # --- the contact page ------------------------------------------------------------------------
    def render(self, template: str, **kwargs: Any) -> Any:
        model = kwargs.get("model")
        if template == getattr(self, "details_template", None) and model is not None:
            kwargs.setdefault("followup", followup_context(self.session.connection(),  # type: ignore[attr-defined]
                                                           org_id(), int(model.id)))
        return super().render(template, **kwargs)  # type: ignore[misc]

    # --- hand-off --------------------------------------------------------------------------------
    @expose("/handoff/<int:id>/", methods=("POST",))
    def handoff_view(self, id: int) -> Any:
        """Start (`op=start`) or end (`op=end`) a hand-off on the contact's conversation."""
        model = self.get_one(id)  # type: ignore[attr-defined]  # another org's contact: 404
        op = request.form.get("op")
        if op not in ("start", "end"):
            abort(400)
        back_to = request.form.get("back") if request.form.get("back") in BACK_TARGETS else "contact"
        inbound = request.form.get("inbound", "")
        if back_to == "conversation" and not valid_id(inbound):
            back_to = "contact"
        # Taking over opens a composer (the contact page's, admin/views/desk/composer.py, or the
        # conversation's answer), ready to write.
        compose = "#lembra-compose" if op == "start" else ""
        back = redirect(url_for("sandbox.index", contact=model.id) if back_to == "sandbox"
                        else url_for("conversations.details", inbound_id=inbound) + compose
                        if back_to == "conversation"
                        else self.get_url(".details_view", id=model.id) + compose)  # type: ignore[attr-defined]
        conn = self.session.connection()  # type: ignore[attr-defined]
        oid = org_id()
        holds = handoff_state(conn, oid, int(model.id))
        if (op == "start") == holds:
            self.session.rollback()  # type: ignore[attr-defined]
            flash(_("Uma pessoa da equipe já está atendendo esta conversa.") if holds
                  else _("Não há atendimento humano em andamento nesta conversa."), "warning")
            return back
        before = {r.id: r.status for r in lifecycle.live_ids(conn, oid, [int(model.id)])}
        kind = "handoff_started" if op == "start" else "handoff_ended"
        event_id, _at, _created = record_contact_event(conn, org_id=oid, contact_id=int(model.id), type=kind)
        after = {r.id: r.status for r in lifecycle.live_ids(conn, oid, [int(model.id)])}
        paused = sum(1 for i, s in after.items() if s == "paused_handoff" and before.get(i) != "paused_handoff")
        resumed = sum(1 for i, s in before.items() if s == "paused_handoff" and after.get(i, s) != "paused_handoff")
        ended = sum(1 for i in before if i not in after)
        write_audit(conn, kind, "contacts", int(model.id), {"event_id": event_id, "paused": paused,
                                                            "resumed": resumed, "ended": ended})
        self.session.commit()  # type: ignore[attr-defined]
        if op == "start":
            flash(_("Atendimento humano iniciado: %(pausados)s, %(encerrados)s, conforme a regra de cada fluxo.",
                    pausados=ngettext("%(num)d acompanhamento pausado", "%(num)d acompanhamentos pausados", paused),
                    encerrados=ngettext("%(num)d encerrado", "%(num)d encerrados", ended)), "success")
        else:
            flash(ngettext("Atendimento humano encerrado: %(num)d acompanhamento retomado, no prazo que sua etapa "
                           "já tinha ou depois do tempo de retomada do fluxo, o que vier por último.",
                           "Atendimento humano encerrado: %(num)d acompanhamentos retomados, cada um no prazo que "
                           "sua etapa já tinha ou depois do tempo de retomada do fluxo, o que vier por último.",
                           resumed), "success")
        return back

    # --- enrolling by hand -------------------------------------------------------------------------
    @expose("/enroll/<int:id>/", methods=("POST",))
    def enroll_view(self, id: int) -> Any:
        """Put this contact in the chosen published flow (owners and managers)."""
        model = self.get_one(id)  # type: ignore[attr-defined]
        if not is_editor():
            abort(403)
        back = redirect(self.get_url(".details_view", id=model.id))  # type: ignore[attr-defined]
        conn = self.session.connection()  # type: ignore[attr-defined]
        oid = org_id()
        flow_id = _flow_id(conn, oid)
        key = _form_key()
        if flow_id is None:
            flash(_("Escolha o fluxo."), "error")
            return back
        result = enroll_by_hand(conn, oid, flow_id, int(model.id), key)
        if result.created:
            write_audit(conn, "enroll", "enrollments", result.enrollment_id,
                        {"flow_id": flow_id, "contact_id": int(model.id), "source": "console"})
        self.session.commit()  # type: ignore[attr-defined]
        if result.created:
            flash(_("Paciente incluído no fluxo."), "success")
        elif result.reason == "already_enrolled_with_key":
            flash(_("Este pedido já tinha sido feito: o paciente foi incluído uma vez só."), "info")
        else:
            flash(_("O paciente não foi incluído: %(motivo)s", motivo=reason_text(result.reason)
                    or _("motivo desconhecido")), "error")
        return back

    def _bulk_contacts(self, raw: list[str]) -> list[Any]:
        """The org's (not erased) contacts among these ids; any other id is a 404."""
        ids = sorted(set(ids_of(raw)))
        if len(ids) != len(set(raw)) or not ids or len(ids) > MAX_BULK:
            abort(404)
        rows = self.get_query().filter(Contact.id.in_(ids)).order_by(Contact.name).all()  # type: ignore[attr-defined]
        if len(rows) != len(ids):
            abort(404)
        return rows

    @expose("/enroll-bulk/", methods=("GET", "POST"))
    def enroll_bulk_view(self) -> Any:
        """The bulk action's second step: choose the flow for the selected contacts, then enroll each."""
        if not is_editor():
            abort(403)
        raw = request.values.getlist("ids")
        chosen = self._bulk_contacts(raw)
        conn = self.session.connection()  # type: ignore[attr-defined]
        oid = org_id()
        if request.method == "POST":
            flow_id = _flow_id(conn, oid)
            key = _form_key()
            if flow_id is None:
                flash(_("Escolha o fluxo."), "error")
            else:
                created, again, refused = 0, 0, Counter()
                for contact in chosen:
                    result = enroll_by_hand(conn, oid, flow_id, int(contact.id), f"{key}:{contact.id}")
                    if result.created:
                        created += 1
                        write_audit(conn, "enroll", "enrollments", result.enrollment_id,
                                    {"flow_id": flow_id, "contact_id": int(contact.id), "source": "console_bulk"})
                    elif result.reason == "already_enrolled_with_key":
                        again += 1
                    else:
                        refused[result.reason] += 1
                self.session.commit()  # type: ignore[attr-defined]
                flash(ngettext("%(num)d paciente incluído no fluxo.", "%(num)d pacientes incluídos no fluxo.",
                               created), "success" if created else "info")
                if again:
                    flash(ngettext("%(num)d já tinha sido incluído por este mesmo pedido.",
                                   "%(num)d já tinham sido incluídos por este mesmo pedido.", again), "info")
                for reason, count in sorted(refused.items()):
                    flash(ngettext("%(num)d não incluído: %(motivo)s", "%(num)d não incluídos: %(motivo)s", count,
                                   motivo=reason_text(reason) or _("motivo desconhecido")), "warning")
                return redirect(self.get_url(".index_view"))  # type: ignore[attr-defined]
        flows = published_flows(conn, oid)
        names = [c.name or _("Contato %(id)s", id=c.id) for c in chosen]
        self.session.rollback()  # type: ignore[attr-defined]
        return self.render("admin/followup/enroll_bulk.html",  # type: ignore[attr-defined]
                           ids=[c.id for c in chosen], names=names, flows=flows, form_key=new_form_key(),
                           return_url=self.get_url(".index_view"))  # type: ignore[attr-defined]

    def enroll_action(self, ids: Any) -> Any:
        """The list action's body: on to the page that asks for the flow (the org's ids only)."""
        wanted = ids_of(ids)
        mine = [int(r.id) for r in self.get_query().filter(Contact.id.in_(wanted))  # type: ignore[attr-defined]
                .with_entities(Contact.id)] if wanted else []
        if not mine:
            flash(_("Nenhum dos contatos selecionados pode ser incluído."), "warning")
            return redirect(self.get_url(".index_view"))  # type: ignore[attr-defined]
        return redirect(self.get_url(".enroll_bulk_view", ids=mine[:MAX_BULK]))  # type: ignore[attr-defined]
