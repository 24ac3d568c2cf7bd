"""Painel: sent / delivered / read / failed per day for 30 days, queue depth, failure rate, alerts."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from flask import g, redirect, request, url_for
from flask_admin import AdminIndexView, expose
from flask_login import current_user
from sqlalchemy import func, or_, select

from admin.views.base import KIND_LABELS, STATUS_LABELS, org_id, org_timezone
from engine import clock
from engine.models import Org, messages

PENDING_ALERT = 500
FAILURE_ALERT = 0.10
DEPTH = ("new", "pending", "claimed", "sending", "unknown", "failed", "dead")


class DashboardView(AdminIndexView):
    def is_accessible(self) -> bool:
        if not current_user.is_authenticated:
            return False
        g.lembra_org_id = int(current_user.org_id)
        return True

    def inaccessible_callback(self, name: str, **kwargs: Any) -> Any:
        return redirect(url_for("auth.login", next=request.full_path))

    @expose("/")
    def index(self) -> Any:
        from admin.views.base import db_session

        session = db_session()
        oid = org_id()
        org = session.get(Org, oid)
        conn = session.connection()
        now = clock.now()
        tz = ZoneInfo(org_timezone())
        depth = dict(conn.execute(
            select(messages.c.status, func.count()).where(messages.c.org_id == oid, messages.c.status.in_(DEPTH))
            .group_by(messages.c.status)).all())

        hour_ago = now - timedelta(hours=1)
        failed_hour = conn.execute(select(func.count()).select_from(messages).where(
            messages.c.org_id == oid, messages.c.failed_at >= hour_ago)).scalar_one()
        sent_hour = conn.execute(select(func.count()).select_from(messages).where(
            messages.c.org_id == oid, messages.c.sent_at >= hour_ago)).scalar_one()
        attempted_hour = failed_hour + sent_hour
        failure_rate = failed_hour / attempted_hour if attempted_hour else 0.0

        start_local = (now.astimezone(tz) - timedelta(days=29)).replace(hour=0, minute=0, second=0, microsecond=0)
        start = start_local.astimezone(now.tzinfo)
        rows = conn.execute(select(messages.c.channel_kind, messages.c.sent_at, messages.c.delivered_at,
                                   messages.c.read_at, messages.c.failed_at).where(
            messages.c.org_id == oid,
            or_(messages.c.sent_at >= start, messages.c.failed_at >= start))).all()
        per_day: dict[str, dict[str, int]] = defaultdict(lambda: {"sent": 0, "delivered": 0, "read": 0, "failed": 0})
        by_kind: dict[str, dict[str, int]] = defaultdict(lambda: {"sent": 0, "delivered": 0, "read": 0, "failed": 0})
        for r in rows:
            for key, at in (("sent", r.sent_at), ("delivered", r.delivered_at), ("read", r.read_at),
                            ("failed", r.failed_at)):
                if at is not None and at >= start:
                    per_day[at.astimezone(tz).strftime("%Y-%m-%d")][key] += 1
                    by_kind[r.channel_kind][key] += 1
        days = []
        for i in range(30):
            d = start_local + timedelta(days=i)
            counts = per_day.get(d.strftime("%Y-%m-%d"), {"sent": 0, "delivered": 0, "read": 0, "failed": 0})
            days.append({"label": d.strftime("%d/%m"), **counts})
        peak = max([sum(d[k] for k in ("sent", "delivered", "read", "failed")) for d in days] + [1])

        alerts = []
        if depth.get("pending", 0) > PENDING_ALERT:
            alerts.append(f"{depth['pending']} mensagens aguardando envio (mais de {PENDING_ALERT}). "
                          "Verifique se o worker e o agendador estão rodando.")
        if attempted_hour and failure_rate > FAILURE_ALERT:
            alerts.append(f"{failure_rate:.0%} dos envios falharam na última hora. Veja os Registros e o status dos Canais.")
        session.rollback()
        return self.render(
            "admin/dashboard.html", org=org, depth=depth, depth_labels=[(s, STATUS_LABELS[s]) for s in DEPTH],
            failure_rate=failure_rate, failed_hour=failed_hour, attempted_hour=attempted_hour, days=days, peak=peak,
            by_kind=dict(by_kind), kind_labels=KIND_LABELS, alerts=alerts,
            total_30=sum(sum(d[k] for k in ("sent", "failed")) for d in days),
        )
