"""Metrics (SPEC §10, engine/core/metrics.py) in one process: every counter moves where the work is done,
and `/metrics` carries them with bounded labels and no personal data. The worker fleet and the web
processes (multiprocess mode, real processes) are in tests/test_metrics_processes.py."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from datetime import UTC, timedelta

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from admin.app import create_app
from engine.messaging import dispatch
from engine.core import metrics
from engine.flows.ai.builtin import BuiltinAI
from engine.store.models import PROVIDERS, channels
from engine.queue.outbox import enqueue
from engine.store.runtime import Runtime, install
from engine.fleet.scheduler import Scheduler
from providers.sandbox.provider import SandboxProvider
from tests.factories import World, sandbox_headers
from tests.flows.helpers import Flows, edge, node

PHONE = "+5516999887766"
NAME = "Ana Clara"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Deltas:
    """What some metrics moved by since this object was made (the registry is process-wide)."""

    def __init__(self, *series: tuple[str, dict[str, str]]) -> None:
        self.series = series
        self.before = [value(name, **labels) for name, labels in series]

    def __call__(self) -> list[float]:
        return [round(value(name, **labels) - b, 6) for (name, labels), b in zip(self.series, self.before)]


def s(name: str, **labels: str) -> tuple[str, dict[str, str]]:
    return name, labels


@pytest.fixture
def world(rt, clock):
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    world.channel("whatsapp")
    world.contact(name=NAME, phone=PHONE, consent=("whatsapp",))
    return world


def _due_message(rt, world: World, clock, key: str, *, late: timedelta = timedelta(0)) -> int:
    contact_id = _contact(rt, world)
    with rt.db.begin() as conn:
        message_id = enqueue(conn, org_id=world.org_id, contact_id=contact_id,
                             channel_kind="whatsapp", purpose="notice", idempotency_key=key,
                             payload={"text": "Olá"}, due_at=clock.now() - late, respect_window=False)
    assert message_id is not None
    return message_id


def _contact(rt, world: World) -> int:
    from sqlalchemy import select

    from engine.store.models import contacts

    with rt.db.connect() as conn:
        return int(conn.execute(select(contacts.c.id).where(contacts.c.org_id == world.org_id)).scalars().first())


def _simulate(rt, channel_id: int, mode: str | None) -> None:
    from datetime import datetime

    with rt.db.begin() as conn:
        conn.execute(update(channels).where(channels.c.id == channel_id).values(
            settings={"simulate": mode} if mode else {}, updated_at=datetime.now(UTC)))


def _send(rt, message_id: int) -> str:
    assert dispatch.claim_due(rt, limit=100) == [message_id]
    return dispatch.send_one(rt, message_id)


# --- sends -------------------------------------------------------------------------------------


def test_a_send_counts_the_provider_call_its_duration_its_lateness_and_the_events(rt, world, clock):
    moved = Deltas(s("lembra_sends_total", provider="sandbox", outcome="sent"),
                   s("lembra_provider_call_seconds_count", provider="sandbox"),
                   s("lembra_send_lateness_seconds_count", kind="whatsapp"),
                   s("lembra_send_lateness_seconds_sum", kind="whatsapp"),
                   s("lembra_send_lateness_seconds_bucket", kind="whatsapp", le="60.0"),
                   s("lembra_send_lateness_seconds_bucket", kind="whatsapp", le="120.0"),
                   s("lembra_message_events_total", event="queued"),
                   s("lembra_message_events_total", event="claimed"),
                   s("lembra_message_events_total", event="sending"),
                   s("lembra_message_events_total", event="sent"))
    message_id = _due_message(rt, world, clock, "late-90", late=timedelta(seconds=90))
    assert _send(rt, message_id) == "sent"
    assert moved() == [1, 1, 1, 90, 0, 1, 1, 1, 1, 1]


def test_failures_are_counted_by_outcome_and_retries_dead_and_unknown_by_event(rt, world, clock, settings,
                                                                              monkeypatch):
    channel_id = world.channels["whatsapp"]
    moved = Deltas(s("lembra_sends_total", provider="sandbox", outcome="transient_error"),
                   s("lembra_sends_total", provider="sandbox", outcome="permanent_error"),
                   s("lembra_sends_total", provider="sandbox", outcome="unknown"),
                   s("lembra_message_events_total", event="retried"),
                   s("lembra_message_events_total", event="dead"),
                   s("lembra_message_events_total", event="failed"),
                   s("lembra_message_events_total", event="unknown"),
                   s("lembra_provider_call_seconds_count", provider="sandbox"))
    # Transient twice with one retry configured: retried, then dead.
    runtime = Runtime.build(dataclasses.replace(settings, retry_delays=(timedelta(minutes=1),)))
    previous = install(runtime)
    try:
        _simulate(runtime, channel_id, "transient")
        message_id = _due_message(runtime, world, clock, "transient")
        assert _send(runtime, message_id) == "retried"
        clock.advance(timedelta(minutes=1))
        assert _send(runtime, message_id) == "dead"
    finally:
        install(previous)
        runtime.close()
    _simulate(rt, channel_id, "permanent")
    assert _send(rt, _due_message(rt, world, clock, "permanent")) == "failed"
    _simulate(rt, channel_id, None)

    def crash(self, outbound):  # a provider bug: the request may or may not have gone out
        raise RuntimeError("boom")

    monkeypatch.setattr(SandboxProvider, "send", crash)
    assert _send(rt, _due_message(rt, world, clock, "crash")) == "unknown"
    assert moved() == [2, 1, 1, 1, 1, 1, 1, 4]


def test_a_metrics_bug_never_stops_a_send(rt, world, clock, monkeypatch):
    def broken(key):
        raise ValueError("broken metric")

    monkeypatch.setattr(metrics, "_metric", broken)
    assert _send(rt, _due_message(rt, world, clock, "still-sent")) == "sent"
    assert world.sandbox()


# --- webhooks ------------------------------------------------------------------------------------


def test_webhooks_are_counted_by_provider_and_result(rt, world, clock):
    client = create_app(rt).test_client()
    channel_id = world.channels["whatsapp"]
    results = ("accepted", "duplicate", "bad_signature", "malformed", "unknown_channel")
    moved = Deltas(*(s("lembra_webhooks_total", provider="sandbox", result=r) for r in results),
                   s("lembra_webhooks_total", provider="other", result="unknown_channel"))
    body = json.dumps({"type": "message", "id": "in-1", "from": PHONE, "text": "Obrigada"})
    headers = {**sandbox_headers(rt, channel_id), "Content-Type": "application/json"}
    url = f"/webhooks/sandbox/{channel_id}"
    assert client.post(url, data=body, headers=headers).status_code == 200
    assert client.post(url, data=body, headers=headers).status_code == 200  # the provider retried it
    assert client.post(url, data=body, headers={"Content-Type": "application/json"}).status_code == 401
    assert client.post(url, data=b"not json", headers=headers).status_code == 400
    assert client.post(f"/webhooks/sandbox/{channel_id + 1000}", data=body, headers=headers).status_code == 404
    # A made-up provider name in the URL is not a new label value.
    assert client.post(f"/webhooks/no-such-{PHONE}/{channel_id}", data=body, headers=headers).status_code == 404
    assert moved() == [1, 1, 1, 1, 1, 1]


# --- follow-ups ----------------------------------------------------------------------------------


class CountingAI(BuiltinAI):
    """The built-in classifier, billed as one LLM call per reply."""

    def classify(self, **kwargs):  # type: ignore[override]
        return dataclasses.replace(super().classify(**kwargs), llm_calls=1)


def test_follow_up_steps_are_counted_by_node_kind_and_status_with_their_llm_calls(rt, world, clock):
    flows = Flows(world, ai=lambda agent: CountingAI())
    graph = {"nodes": [node("inicio", "trigger"), node("pergunta", "action", mode="template",
                                                       template="followup_checkin"),
                       node("resposta", "ai_classify", classes=["confirm"], grace_minutes=60),
                       node("sim", "end", outcome="converted"), node("outro", "end", outcome="custom"),
                       node("calado", "end", outcome="exhausted")],
             "edges": [edge("inicio", "pergunta"), edge("pergunta", "resposta"),
                       edge("resposta", "sim", "class_match", "confirm"), edge("resposta", "calado", "no_reply"),
                       edge("resposta", "outro")]}
    moved = Deltas(s("lembra_flow_steps_total", kind="trigger", status="ok"),
                   s("lembra_flow_steps_total", kind="action", status="ok"),
                   s("lembra_flow_steps_total", kind="ai_classify", status="ok"),
                   s("lembra_llm_calls_total", kind="ai_classify"))
    enrollment_id = flows.enroll(flows.flow(graph), _contact(rt, world))
    flows.run()
    assert flows.enrollment(enrollment_id).status == "waiting_reply"
    flows.reply("ok, confirmo!")
    flows.run()
    assert flows.enrollment(enrollment_id).status == "completed"
    assert moved() == [1, 1, 1, 1]


# --- scheduler -----------------------------------------------------------------------------------


def _one_pass(sched: Scheduler) -> None:
    stop = threading.Event()

    def holding() -> bool:  # one pass, then the loop ends
        stop.set()
        return True

    sched._loop(stop, holding)
    # The loop's pass starts a populate in a thread of its own, as `Scheduler.run` does, and like
    # `run` the test waits for it: a thread still holding a pooled connection when the runtime is
    # disposed leaves it open, and PostgreSQL's driver warns when it is collected in a later test.
    assert sched.wait_populate(timeout=60)


def test_scheduler_passes_their_duration_and_claims_are_counted(rt, world, clock):
    claimed: list[int] = []
    moved = Deltas(s("lembra_scheduler_passes_total", result="ok"),
                   s("lembra_scheduler_passes_total", result="error"),
                   s("lembra_scheduler_pass_seconds_count"),
                   s("lembra_scheduler_claimed_total", what="messages"),
                   s("lembra_scheduler_claimed_total", what="enrollments"))
    _due_message(rt, world, clock, "a")
    _due_message(rt, world, clock, "b")
    _one_pass(Scheduler(rt, claimed.extend, lambda pairs: None))
    assert len(claimed) == 2
    assert value("lembra_scheduler_leader") == 1
    assert value("lembra_scheduler_last_pass_timestamp_seconds") > 0

    def broken(ids):
        raise RuntimeError("broker down")

    _due_message(rt, world, clock, "c")
    _one_pass(Scheduler(rt, broken, lambda pairs: None))  # the loop logs it and goes on
    # A crashed pass counts as an error; what it claimed before crashing is not known to it.
    assert moved() == [1, 1, 2, 2, 0]
    metrics.scheduler_standby()
    assert value("lembra_scheduler_leader") == 0


# --- /metrics --------------------------------------------------------------------------------------


def test_the_metrics_page_has_the_queue_the_counters_and_no_personal_data(rt, world, clock):
    client = create_app(rt).test_client()
    assert _send(rt, _due_message(rt, world, clock, "shown")) == "sent"
    _due_message(rt, world, clock, "due-now")
    with rt.db.begin() as conn:  # a reminder for tomorrow is pending, not due
        enqueue(conn, org_id=world.org_id, contact_id=_contact(rt, world), channel_kind="whatsapp",
                purpose="notice", idempotency_key="tomorrow", payload={"text": "Até amanhã"},
                due_at=clock.now() + timedelta(days=1), respect_window=False)
    client.post(f"/webhooks/sandbox/{world.channels['whatsapp']}", data=b"{}")  # bad signature
    page = client.get("/metrics")
    assert page.status_code == 200 and page.mimetype == "text/plain"
    text = page.text
    assert 'lembra_messages{status="pending"} 2.0' in text
    assert "lembra_messages_due 1.0" in text
    for name in ("lembra_sends_total", "lembra_provider_call_seconds_bucket", "lembra_send_lateness_seconds_bucket",
                 "lembra_message_events_total", "lembra_webhooks_total"):
        assert name in text, name

    assert "99887766" not in text and "Ana" not in text and "clinica" not in text
    allowed = {
        "provider": set(PROVIDERS) | {"other"}, "outcome": set(metrics.SEND_OUTCOMES) | {"other"},
        "kind": {"whatsapp", "email", "sms", "trigger", "wait", "condition", "ai_classify", "ask", "action", "do", "end",
                 "wake", "other"},
        "event": set(metrics.MESSAGE_EVENTS) | {"other"}, "result": set(metrics.WEBHOOK_RESULTS) | {"ok", "error"},
        "status": {"new", "pending", "claimed", "sending", "sent", "delivered", "read", "failed", "cancelled",
                   "expired", "dead", "skipped", "unknown", "ok", "waiting", "deferred", "stale", "other"},
        "what": {"messages", "enrollments", "inbound_repoked"},
    }
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("lembra_"):
            continue
        for sample in family.samples:
            for label, label_value in sample.labels.items():
                if label == "le":
                    assert re.fullmatch(r"[0-9.e+]+|\+Inf", label_value), label_value
                    continue
                assert label in allowed, f"{sample.name}: unexpected label {label}"
                assert label_value in allowed[label], f"{sample.name}{{{label}={label_value!r}}}"


# --- the metrics server of workers and schedulers ----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:  # the error is the response: closed, with its connection
            return exc.code, exc.read().decode()


def test_the_scheduler_metrics_server_answers_metrics_and_health(monkeypatch):
    port = _free_port()
    monkeypatch.setenv("LEMBRA_SCHEDULER_METRICS_PORT", str(port))
    monkeypatch.delenv("LEMBRA_METRICS_HOST", raising=False)
    server = metrics.serve("scheduler")
    assert server is not None and server.port == port
    try:
        metrics.scheduler_standby()
        status, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "lembra_scheduler_leader 0.0" in body
        assert _get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")
        monkeypatch.setattr(metrics, "SCHEDULER_STALE_SECONDS", -1.0)  # the loop showed no life since
        status, body = _get(f"http://127.0.0.1:{port}/healthz")
        assert status == 503 and "no scheduler pass" in body
        assert _get(f"http://127.0.0.1:{port}/nope")[0] == 404
        # A second scheduler on the same machine and port: a warning, it goes on unscraped.
        assert metrics.serve("scheduler") is None
    finally:
        server.close()


def test_metrics_server_settings(monkeypatch, capsys):
    monkeypatch.setenv("LEMBRA_SCHEDULER_METRICS_PORT", "0")
    assert metrics.serve("scheduler") is None  # off
    assert metrics.serve("scheduler", enabled=False) is None  # `lembra scheduler --once`
    monkeypatch.setenv("LEMBRA_WORKER_METRICS_PORT", "nine")
    with pytest.raises(SystemExit) as stop:
        metrics.serve("worker")
    assert stop.value.code == 2
    assert "LEMBRA_WORKER_METRICS_PORT: not a port number" in capsys.readouterr().err
    monkeypatch.delenv("LEMBRA_WORKER_METRICS_PORT")
    monkeypatch.setenv("LEMBRA_METRICS_HOST", "0.0.0.0")
    assert metrics.endpoint("worker") == ("0.0.0.0", 9191)
    monkeypatch.delenv("LEMBRA_METRICS_HOST")
    monkeypatch.delenv("LEMBRA_SCHEDULER_METRICS_PORT")
    assert metrics.endpoint("scheduler") == ("127.0.0.1", 9192)


# --- docs ------------------------------------------------------------------------------------------


def _exposed_names() -> dict[str, set[str]]:
    """Each documented metric name → the series names Prometheus sees for it."""
    names = {"lembra_messages": {"lembra_messages"}, "lembra_messages_due": {"lembra_messages_due"}}
    for kind, name, _help, _labels, _options in metrics._DEFINITIONS.values():
        if kind == "counter":
            names[f"{name}_total"] = {f"{name}_total"}
        elif kind == "histogram":
            names[name] = {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names[name] = {name}
    return names


def test_docs_list_every_metric_and_the_alert_rules_use_only_real_ones():
    from pathlib import Path

    yaml = pytest.importorskip("yaml")
    docs = Path(__file__).resolve().parents[1] / "docs"
    listing = (docs / "metrics.md").read_text()
    for name in _exposed_names():
        assert f"`{name}`" in listing, f"docs/metrics.md does not list {name}"
    series = set().union(*_exposed_names().values())
    rules = yaml.safe_load((docs / "prometheus-alerts.yml").read_text())
    [group] = rules["groups"]
    alerts = {rule["alert"]: rule for rule in group["rules"]}
    assert {"LembraBacklog", "LembraFailureRate", "LembraSchedulerDown"} <= set(alerts)
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] and rule["annotations"]["summary"], name
        for used in re.findall(r"\blembra_[a-z_]+", rule["expr"]):
            assert used in series, f"{name} uses {used}, which no Lembra process exports"
    assert "500" in alerts["LembraBacklog"]["expr"] and "0.10" in alerts["LembraFailureRate"]["expr"]
    assert "[5m]" in alerts["LembraSchedulerDown"]["expr"]
