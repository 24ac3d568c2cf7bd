"""Painel: messages per day and per channel over 30 days, queue depth, failure rate, alerts.

Each message counts once, by the furthest state it reached (read > delivered > failed > sent), on
the day it was sent (or, never sent, the day it failed). Counting every timestamp instead would put
a message that was delivered and read into three segments of the same day's bar.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from flask_admin import AdminIndexView, expose
from sqlalchemy import func, or_, select

from admin.i18n import _, _l, format_percent_local, translate
from admin.views.base import KIND_LABELS, STATUS_LABELS, SignedInOrgAccess, org_id, org_timezone
from admin.views.costs import estimate, unpriced_note
from engine.core import clock
from engine.messaging.meta_categories import flag_keys, marketing_in_use
from engine.store.models import Org, flow_pointers, messages
from engine.words.catalogue import describe

PENDING_ALERT = 500
FAILURE_ALERT = 0.10
DEPTH = ("new", "pending", "claimed", "sending", "unknown", "failed", "dead")
#: The furthest states a sent (or failed) message can end in, bottom segment of a bar first.
OUTCOMES = ("read", "delivered", "sent", "failed")
#: Legend and column headers: each says what it counts, since a message is in one of them only.
OUTCOME_LABELS = {"read": _l("Lidas"), "delivered": _l("Entregues, não lidas"),
                  "sent": _l("Enviadas, sem confirmação de entrega"), "failed": _l("Falharam")}
DAYS = 30


def furthest_state(row: Any) -> str | None:
    """The one state a message is counted in: read > delivered > failed > sent, or None if it was
    never sent nor failed. A failure after the send (the provider's later `failed` status) beats
    `sent`; a send after a failure (a retry that went out) beats that failure."""
    if row.read_at is not None:
        return "read"
    if row.delivered_at is not None:
        return "delivered"
    if row.failed_at is not None and (row.sent_at is None or row.failed_at >= row.sent_at):
        return "failed"
    if row.sent_at is not None:
        return "sent"
    return None


def tally(rows: Iterable[Any], start: datetime, tz: ZoneInfo) -> tuple[dict[str, dict[str, int]],
                                                                       dict[str, dict[str, int]]]:
    """Per local day (YYYY-MM-DD) and per channel kind, how many messages ended in each of OUTCOMES,
    each message once, on the day it was sent (or failed), from `start` on."""
    per_day: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
    for r in rows:
        state = furthest_state(r)
        anchor = r.sent_at if r.sent_at is not None else r.failed_at
        if state is None or anchor is None or anchor < start:
            continue
        per_day[anchor.astimezone(tz).strftime("%Y-%m-%d")][state] += 1
        by_kind[r.channel_kind][state] += 1
    return dict(per_day), dict(by_kind)


class DashboardView(SignedInOrgAccess, AdminIndexView):
    """The console's index page (endpoint `admin`)."""

    @expose("/")
    def index(self) -> Any:
        """Cards, the 30-day chart, the per-channel table and the alerts of the user's org."""
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

        # Failure rate of the last hour: of the messages sent or failed in it (each once), how many failed.
        hour_ago = now - timedelta(hours=1)
        failed_hour = conn.execute(select(func.count()).select_from(messages).where(
            messages.c.org_id == oid, messages.c.failed_at >= hour_ago)).scalar_one()
        attempted_hour = conn.execute(select(func.count()).select_from(messages).where(
            messages.c.org_id == oid, or_(messages.c.sent_at >= hour_ago, messages.c.failed_at >= hour_ago))
        ).scalar_one()
        failure_rate = failed_hour / attempted_hour if attempted_hour else 0.0

        start_local = (now.astimezone(tz) - timedelta(days=DAYS - 1)).replace(hour=0, minute=0, second=0,
                                                                                microsecond=0)
        start = start_local.astimezone(now.tzinfo)
        rows = conn.execute(select(messages.c.channel_kind, messages.c.sent_at, messages.c.delivered_at,
                                   messages.c.read_at, messages.c.failed_at).where(
            messages.c.org_id == oid,
            or_(messages.c.sent_at >= start, messages.c.failed_at >= start))).all()
        per_day, by_kind = tally(rows, start, tz)
        days = []
        for i in range(DAYS):
            d = start_local + timedelta(days=i)
            counts = per_day.get(d.strftime("%Y-%m-%d"), dict.fromkeys(OUTCOMES, 0))
            days.append({"label": d.strftime("%d/%m"), "total": sum(counts.values()), **counts})
        peak = max([d["total"] for d in days] + [1])

        alerts = []
        if depth.get("pending", 0) > PENDING_ALERT:
            alerts.append(_("%(n)d mensagens aguardando envio (mais de %(limite)d). Verifique se o worker e o "
                            "agendador estão rodando.", n=depth["pending"], limite=PENDING_ALERT))
        if attempted_hour and failure_rate > FAILURE_ALERT:
            percent = format_percent_local(failure_rate)
            alerts.append(_("%(pct)s dos envios falharam na última hora. Veja os Registros e o status dos Canais.",
                            pct=percent))
        marketing = flag_keys(marketing_in_use(conn, oid))
        if marketing:
            alerts.append(translate(describe("waba_marketing_flags", count=len(marketing))))
        cost = estimate(conn, oid)
        flow_names = {}
        if cost.costs is not None and cost.costs.by_flow:
            flow_names = dict(conn.execute(select(flow_pointers.c.id, flow_pointers.c.name).where(
                flow_pointers.c.org_id == oid, flow_pointers.c.id.in_(list(cost.costs.by_flow)))).all())
        session.rollback()
        return self.render(
            "admin/dashboard.html", org=org, depth=depth, depth_labels=[(s, STATUS_LABELS[s]) for s in DEPTH],
            failure_rate=failure_rate, failed_hour=failed_hour, attempted_hour=attempted_hour, days=days, peak=peak,
            outcomes=OUTCOMES, outcome_labels=OUTCOME_LABELS, by_kind=by_kind, kind_labels=KIND_LABELS, alerts=alerts,
            total_30=sum(d["total"] for d in days), cost=cost, flow_names=flow_names,
            unpriced=unpriced_note(cost.costs),
        )
