"""`/healthz` (the process is up), `/readyz` (database and broker reachable), `/metrics`."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select

from engine.core import clock
from engine.core import metrics as engine_metrics
from engine.fleet.broker import check_broker
from engine.core.config import ConfigError
from engine.store.models import MESSAGE_STATUSES, messages
from engine.store.runtime import Runtime

bp = Blueprint("health", __name__)


@bp.route("/healthz")
def healthz():  # type: ignore[no-untyped-def]
    return jsonify(status="ok")


@bp.route("/readyz")
def readyz():  # type: ignore[no-untyped-def]
    rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
    try:
        rt.db.check()
        check_broker(rt.settings)
    except ConfigError as exc:
        return jsonify(status="unavailable", reason=str(exc)), 503
    return jsonify(status="ready")


class QueueCollector:
    """Queue depth by status, read from the database at scrape time (no per-process state): one
    GROUP BY over every org (no org label, no ids), and the pending rows already due (the backlog the
    dashboard alerts on, read through the `messages_due` index)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def collect(self):  # type: ignore[no-untyped-def]
        gauge = GaugeMetricFamily("lembra_messages", "Messages in the outbox by status", labels=["status"])
        with self.rt.db.connect() as conn:
            counts = dict(conn.execute(
                select(messages.c.status, func.count()).group_by(messages.c.status)
            ).all())
            due = conn.execute(select(func.count()).select_from(messages).where(
                messages.c.status == "pending", messages.c.next_attempt_at <= clock.now())).scalar_one()
        for status in MESSAGE_STATUSES:
            gauge.add_metric([status], counts.get(status, 0))
        yield gauge
        yield GaugeMetricFamily("lembra_messages_due", "Pending messages whose time has come (not yet claimed)",
                                value=due)


@bp.route("/metrics")
def metrics():  # type: ignore[no-untyped-def]
    """The queue gauges, then this process's counters (under gunicorn: every web process's, added
    up through prometheus-client's multiprocess directory; see engine/core/metrics.py)."""
    registry: CollectorRegistry = current_app.config["LEMBRA_METRICS"]
    return Response(generate_latest(registry) + engine_metrics.exposition(), mimetype=CONTENT_TYPE_LATEST)
