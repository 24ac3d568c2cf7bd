"""`/healthz` (the process is up), `/readyz` (database and broker reachable), `/metrics`."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select

from engine.broker import check_broker
from engine.config import ConfigError
from engine.models import MESSAGE_STATUSES, messages
from engine.runtime import Runtime

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
    """Queue depth by status, read from the database at scrape time (no per-process state)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def collect(self):  # type: ignore[no-untyped-def]
        gauge = GaugeMetricFamily("lembra_messages", "Messages in the outbox by status", labels=["status"])
        with self.rt.db.connect() as conn:
            counts = dict(conn.execute(
                select(messages.c.status, func.count()).group_by(messages.c.status)
            ).all())
        for status in MESSAGE_STATUSES:
            gauge.add_metric([status], counts.get(status, 0))
        yield gauge


@bp.route("/metrics")
def metrics():  # type: ignore[no-untyped-def]
    registry: CollectorRegistry = current_app.config["LEMBRA_METRICS"]
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
