"""The console pages of the foundation: the sandbox inbox (see what was "sent", answer as the
patient) and the queue. Every query is scoped to the signed-in user's org."""

from __future__ import annotations

import json
import uuid
from typing import Any
from zoneinfo import ZoneInfo

from flask import (
    Blueprint,
    abort,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from sqlalchemy import select
from wtforms import HiddenField, StringField
from wtforms.validators import DataRequired, Length

from admin.webhooks import deliver
from engine.models import channels, contacts, messages, orgs, sandbox_messages
from engine.runtime import Runtime
from gateway.contract import WebhookRequest
from gateway.errors import WebhookError

bp = Blueprint("console", __name__)

STATUS_LABELS = {
    "new": "Planejando", "pending": "Agendada", "claimed": "Na fila", "sending": "Enviando", "sent": "Enviada",
    "delivered": "Entregue", "read": "Lida", "failed": "Falhou", "unknown": "Incerta", "cancelled": "Cancelada",
    "expired": "Expirada", "dead": "Esgotada", "skipped": "Não enviada",
}


class ReplyForm(FlaskForm):
    sandbox_message_id = HiddenField(validators=[DataRequired()])
    text = StringField("Resposta do paciente", validators=[DataRequired(), Length(max=1000)])


def _rt() -> Runtime:
    return current_app.config["LEMBRA_RUNTIME"]


def _org() -> Any:
    with _rt().db.connect() as conn:
        return conn.execute(select(orgs).where(orgs.c.id == current_user.org_id)).one()


@bp.app_template_filter("local")
def local_time(value: Any, tz: str = "America/Sao_Paulo") -> str:
    """An instant shown in the org's timezone, the way a receptionist reads it."""
    if value is None:
        return "—"
    return value.astimezone(ZoneInfo(tz)).strftime("%d/%m/%Y %H:%M")


@bp.route("/")
@login_required
def index():  # type: ignore[no-untyped-def]
    return redirect(url_for("admin.index"))


@bp.route("/sandbox")
@login_required
def sandbox():  # type: ignore[no-untyped-def]
    org = _org()
    with _rt().db.connect() as conn:
        rows = conn.execute(
            select(sandbox_messages, channels.c.kind)
            .join(channels, channels.c.id == sandbox_messages.c.channel_id)
            .where(sandbox_messages.c.org_id == org.id, channels.c.org_id == org.id)
            .order_by(sandbox_messages.c.id.desc()).limit(200)
        ).all()
    return render_template("sandbox.html", org=org, rows=rows, form=ReplyForm())


@bp.route("/sandbox/reply", methods=["POST"])
@login_required
def sandbox_reply():  # type: ignore[no-untyped-def]
    form = ReplyForm()
    if not form.validate_on_submit():
        flash("Escreva a resposta do paciente.", "error")
        return redirect(url_for("console.sandbox"))
    org_id = current_user.org_id
    rt = _rt()
    with rt.db.connect() as conn:
        original = conn.execute(
            select(sandbox_messages).where(sandbox_messages.c.org_id == org_id,
                                           sandbox_messages.c.id == int(form.sandbox_message_id.data or 0))
        ).first()
    if original is None:
        abort(404)
    body = json.dumps({
        "type": "message", "id": f"sbx-in-{uuid.uuid4().hex}", "from": original.to_address,
        "text": form.text.data, "in_reply_to": original.provider_message_id,
    }).encode()
    req = WebhookRequest(method="POST", url=request.url, headers={"Content-Type": "application/json"}, body=body)
    try:
        # Same path as a provider's webhook: parse, store, hand to the inbound actor.
        deliver(rt, "sandbox", original.channel_id, req)
    except WebhookError as exc:
        flash(f"Resposta recusada: {exc.reason}", "error")
    else:
        flash("Resposta enviada como o paciente.", "ok")
    return redirect(url_for("console.sandbox"))


@bp.route("/queue")
@login_required
def queue():  # type: ignore[no-untyped-def]
    org = _org()
    status = request.args.get("status") or None
    query = (
        select(messages.c.id, messages.c.purpose, messages.c.channel_kind, messages.c.status, messages.c.due_at,
               messages.c.sent_at, messages.c.attempts, messages.c.error_code, messages.c.skip_reason,
               contacts.c.name.label("contact_name"))
        .join(contacts, contacts.c.id == messages.c.contact_id)
        .where(messages.c.org_id == org.id, contacts.c.org_id == org.id)
        .order_by(messages.c.id.desc()).limit(300)
    )
    if status in STATUS_LABELS:
        query = query.where(messages.c.status == status)
    with _rt().db.connect() as conn:
        rows = conn.execute(query).all()
    return render_template("queue.html", org=org, rows=rows, status=status, labels=STATUS_LABELS)
