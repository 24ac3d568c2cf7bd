"""Webhooks: where the org's events go (engine/tenants/webhooks/), each endpoint's deliveries, and
"Reenviar" for one that did not arrive.

An endpoint is saved through the engine, as the API saves it: its URL passes the egress guard (a
refusal is the catalogue's sentence on the URL, nothing written) and its events come from the
engine's list. The signing secret is on the page that answers the creation, once: the response is
not cached, the secret is never in a redirect, the session, a log or the audit, and no later page
shows it. A delivery shows its status as a sentence, the receiver's HTTP status and the last error
in the catalogue's words; its own page adds what the receiver answered to the last attempt (its
reason phrase and the start of its body, as the engine kept them, shown as text in a <pre>: the
clinic's own system's words, for the org's admins only) and how long the attempt took.
"Reenviar" sends the same delivery again with the engine's `delivery.resend`: the same row and
`webhook-id` (receivers drop repeats by it, docs/webhooks.md), one more attempt of it with a fresh
round of retries, not a new delivery. Owners and managers only; another org's endpoint or delivery
is a 404.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import abort, flash, make_response, redirect, request, url_for
from flask_admin import expose
from sqlalchemy import select

from admin.i18n import _, _l, translate
from admin.ids import parse_id
from admin.views.base import db_session, local_dt, org_id, runtime, write_audit
from admin.views.settings.gated import AdminPageView, path_id
from engine.store.models import webhook_deliveries
from engine.tenants.webhooks import delivery, endpoints, events
from engine.words.catalogue import describe, known

#: The events an endpoint may subscribe to, as the clinic reads them (the engine's list, in its order).
EVENT_LABELS = {
    events.APPOINTMENT_BOOKED: _l("Agendamento marcado"),
    events.APPOINTMENT_MOVED: _l("Agendamento remarcado"),
    events.APPOINTMENT_CONFIRMED: _l("Agendamento confirmado pelo paciente"),
    events.APPOINTMENT_CANCELLED: _l("Agendamento cancelado"),
    events.CONTACT_OPTED_OUT: _l("Paciente pediu para não receber mais mensagens"),
    events.RUN_ENDED: _l("Acompanhamento de um paciente terminou"),
    events.RUN_NOTIFIED: _l("Um fluxo avisou o sistema da clínica"),
    events.PING: _l("Teste"),
}
assert set(events.EVENT_TYPES) <= set(EVENT_LABELS), "every event type needs a label"
#: A delivery's status, as the catalogue says it.
STATUS_CODES = {"pending": "webhook_delivery_pending", "delivered": "webhook_delivery_delivered",
                "dead": "webhook_delivery_dead"}
STATUS_COLORS = {"pending": "warning", "delivered": "success", "dead": "danger"}
#: Deliveries listed per endpoint, newest first.
DELIVERY_ROWS = 50


def event_label(event_type: str) -> str:
    """An event type in words (one the console does not know yet reads as a generic event)."""
    label = EVENT_LABELS.get(event_type)
    return str(label) if label is not None else _("Outro evento")


def delivery_row(row: Any) -> dict[str, Any]:
    """A delivery as the list shows it: no payload, no body of the answer, no raw code."""
    error = translate(describe(row.last_error)) if row.last_error and known(row.last_error) else ""
    return {"id": row.id, "event": event_label(row.event_type), "status": translate(describe(STATUS_CODES.get(
        row.status, "webhook_delivery_pending"))), "color": STATUS_COLORS.get(row.status, "secondary"),
        "attempts": row.attempts, "http": row.last_status_code, "error": error,
        "created_at": local_dt(row.created_at), "last_attempt_at": local_dt(row.last_attempt_at),
        "resendable": row.status in ("delivered", "dead")}


def delivery_detail(row: Any) -> dict[str, Any]:
    """A delivery as its own page shows it: the list's line, its `webhook-id`, when it is due or
    was resent, and the receiver's answer to the last attempt (text the engine kept, never parsed)."""
    return {**delivery_row(row), "webhook_id": row.webhook_id, "pending": row.status == "pending",
            "next_attempt_at": local_dt(row.next_attempt_at),
            "resent_at": local_dt(row.resent_at) if row.resent_at else None,
            "attempted": row.attempts > 0, "reason": row.last_response_reason,
            "body": row.last_response_body, "duration_ms": row.last_duration_ms, "kept": delivery.ANSWER_CHARS}


def posted(form: Any) -> dict[str, Any]:
    """The form as `create_endpoint` / `update_endpoint` take it."""
    return {"url": (form.get("url") or "").strip(), "event_types": form.getlist("event_types"),
            "description": (form.get("description") or "").strip() or None, "active": "active" in form}


class WebhooksView(AdminPageView):
    """Webhooks (endpoint `settings_webhooks`, /admin/settings/webhooks/)."""

    @expose("/")
    def index(self) -> Any:
        """Every endpoint of the org (never a secret)."""
        session = db_session()
        rows = endpoints.list_endpoints(session.connection(), org_id())
        session.rollback()
        return self.render("admin/settings/webhooks.html", endpoints=rows, event_label=event_label)

    @expose("/new/", methods=("GET", "POST"))
    def create(self) -> Any:
        """A new endpoint; the answer to a saved one is the only page that shows its secret."""
        values: Mapping[str, Any] = {"url": "", "event_types": [], "description": "", "active": True}
        errors: dict[str, str] = {}
        if request.method == "POST":
            values = posted(request.form)
            session = db_session()
            conn = session.connection()
            oid = org_id()
            rt = runtime()
            try:
                made = endpoints.create_endpoint(conn, rt.keyring, oid, egress=rt.settings.egress, **values)
            except endpoints.EndpointRefused as exc:
                session.rollback()
                errors = {exc.field: translate(describe(exc.code, **exc.params))}
            else:
                row = endpoints.get_endpoint(conn, oid, made.endpoint_id)
                # Like the API: which events and whether active; not the URL (it may hold the
                # receiver's own token) and never the secret.
                write_audit(conn, "create", "webhook_endpoints", made.endpoint_id,
                            {"event_types": list(row.event_types), "active": bool(row.active)})
                session.commit()
                page = make_response(self.render("admin/settings/webhook_created.html", secret=made.secret,
                                                  endpoint=row))
                page.headers["Cache-Control"] = "no-store"  # no copy of the secret in a browser or proxy cache
                return page
        return self._form(values, errors, None)

    @expose("/<int:endpoint_id>/edit/", methods=("GET", "POST"))
    def edit(self, endpoint_id: int) -> Any:
        """An endpoint's URL, events, description and active switch (the secret does not change)."""
        endpoint_id = path_id(endpoint_id)
        session = db_session()
        conn = session.connection()
        oid = org_id()
        row = self._endpoint(conn, oid, endpoint_id)
        errors: dict[str, str] = {}
        if request.method == "POST":
            values = posted(request.form)
            try:
                changed = endpoints.update_endpoint(conn, oid, endpoint_id, egress=runtime().settings.egress,
                                                    **values)
            except endpoints.EndpointRefused as exc:
                session.rollback()
                errors = {exc.field: translate(describe(exc.code, **exc.params))}
            else:
                if changed:  # which fields, not their values (as the API audits it)
                    write_audit(conn, "update", "webhook_endpoints", endpoint_id, {"fields": sorted(changed)})
                session.commit()
                flash(_("Endereço salvo."), "success")
                return redirect(url_for(".index"))
        else:
            session.rollback()
            values = {"url": row.url, "event_types": list(row.event_types), "description": row.description or "",
                      "active": bool(row.active)}
        return self._form(values, errors, endpoint_id)

    @expose("/<int:endpoint_id>/deliveries/")
    def deliveries(self, endpoint_id: int) -> Any:
        """The endpoint's latest deliveries, newest first."""
        endpoint_id = path_id(endpoint_id)
        session = db_session()
        conn = session.connection()
        oid = org_id()
        row = self._endpoint(conn, oid, endpoint_id)
        found = conn.execute(select(webhook_deliveries).where(
            webhook_deliveries.c.org_id == oid, webhook_deliveries.c.endpoint_id == endpoint_id)
            .order_by(webhook_deliveries.c.id.desc()).limit(DELIVERY_ROWS)).all()
        session.rollback()
        return self.render("admin/settings/webhook_deliveries.html", endpoint=row,
                           deliveries=[delivery_row(d) for d in found], rows=DELIVERY_ROWS)

    @expose("/<int:endpoint_id>/deliveries/<int:delivery_id>/")
    def delivery_details(self, endpoint_id: int, delivery_id: int) -> Any:
        """One delivery: its status, attempts and what the receiver answered to the last one."""
        endpoint_id, delivery_id = path_id(endpoint_id), path_id(delivery_id)
        session = db_session()
        conn = session.connection()
        oid = org_id()
        row = self._endpoint(conn, oid, endpoint_id)
        found = conn.execute(select(webhook_deliveries).where(
            webhook_deliveries.c.org_id == oid, webhook_deliveries.c.endpoint_id == endpoint_id,
            webhook_deliveries.c.id == delivery_id)).first()
        session.rollback()
        if found is None:
            abort(404)
        page = make_response(self.render("admin/settings/webhook_delivery.html", endpoint=row,
                                          d=delivery_detail(found)))
        page.headers["Cache-Control"] = "no-store"  # the receiver's answer stays out of shared caches
        return page

    @expose("/<int:endpoint_id>/resend/", methods=("POST",))
    def resend(self, endpoint_id: int) -> Any:
        """Send the posted delivery (a delivered or given-up one) again: the same delivery, the same
        `webhook-id`, one more attempt of it (the engine's `delivery.resend`)."""
        endpoint_id = path_id(endpoint_id)
        session = db_session()
        conn = session.connection()
        oid = org_id()
        self._endpoint(conn, oid, endpoint_id)
        delivery_id = parse_id(request.form.get("delivery", ""))
        if delivery_id is None:
            session.rollback()
            abort(404)
        if request.form.get("back") == "details":
            back = redirect(url_for(".delivery_details", endpoint_id=endpoint_id, delivery_id=delivery_id))
        else:
            back = redirect(url_for(".deliveries", endpoint_id=endpoint_id))
        try:
            old = delivery.resend(conn, oid, endpoint_id, delivery_id)
        except delivery.DeliveryNotFound:
            session.rollback()
            abort(404)
        except delivery.ResendRefused as exc:
            session.rollback()
            flash(translate(describe(exc.code)), "error" if exc.code == "webhook_resend_inactive" else "warning")
            return back
        write_audit(conn, "resend", "webhook_deliveries", delivery_id,
                    {"endpoint_id": endpoint_id, "status": old.status, "attempts": old.attempts})
        session.commit()
        flash(_("Aviso colocado na fila de novo, com o mesmo identificador: ele aparece aqui como mais uma "
                "tentativa."), "success")
        return back

    def _endpoint(self, conn: Any, oid: int, endpoint_id: int) -> Any:
        try:
            return endpoints.get_endpoint(conn, oid, endpoint_id)
        except endpoints.EndpointNotFound:
            db_session().rollback()
            abort(404)

    def _form(self, values: Mapping[str, Any], errors: Mapping[str, str], endpoint_id: int | None) -> Any:
        return self.render("admin/settings/webhook_form.html", values=values, errors=errors, endpoint_id=endpoint_id,
                           events=[(kind, event_label(kind)) for kind in events.EVENT_TYPES])
