"""Prometheus metrics of every Lembra process (SPEC §10), and how each kind of process exposes them.

The engine calls the one-line helpers below (`provider_call`, `lateness`, `message_events`,
`webhook`, `flow_step`, `scheduler_pass`, …) at the points that matter; every metric and label is
listed in docs/metrics.md. Labels are bounded code words (provider, outcome, event, node kind):
never an id, a phone, an e-mail, a name or an org. A helper never raises: a metrics bug must not
stop a send.

Where the numbers are read (one scrape target per process group):

- `lembra web` runs gunicorn with several worker processes, and `lembra worker` a supervisor with
  several Dramatiq worker processes (engine/fleet/supervisor.py). Both use prometheus-client's
  multiprocess mode: `use_multiprocess()` gives the group a private directory
  (PROMETHEUS_MULTIPROC_DIR, under LEMBRA_METRICS_DIR) before prometheus_client is imported, every
  process of the group writes its values there, and one scrape adds them up. The web group answers
  on its own `/metrics`; the worker supervisor serves them on LEMBRA_WORKER_METRICS_PORT (9191).
- `lembra scheduler` is one process: LEMBRA_SCHEDULER_METRICS_PORT (9192).
- `lembra up` (everything in one process) answers on the web port's `/metrics`.

Dramatiq's own Prometheus middleware was not used: it starts its exposition server from the
`dramatiq` command's main process (its `forks`), which `lembra worker` replaced by its own
supervisor, and it picks its directory at import time.

prometheus_client is imported lazily (inside functions), so that importing this module anywhere
does not fix the value class before `use_multiprocess()` has set the directory.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: Environment variables read here (also in the README's Environment table).
HOST_ENV = "LEMBRA_METRICS_HOST"
DIR_ENV = "LEMBRA_METRICS_DIR"
PORT_ENV = {"worker": "LEMBRA_WORKER_METRICS_PORT", "scheduler": "LEMBRA_SCHEDULER_METRICS_PORT"}
DEFAULT_PORT = {"worker": 9191, "scheduler": 9192}
DEFAULT_HOST = "127.0.0.1"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: A scheduler whose loop showed no life (a pass as leader, a lock attempt as standby) for this
#: long answers 503 on its /healthz.
SCHEDULER_STALE_SECONDS = 300.0

#: Buckets, in seconds.
LATENESS_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, float("inf"))
PROVIDER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, float("inf"))
PASS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, float("inf"))

#: Label values outside these sets are reported as "other" (a label never grows without bound).
SEND_OUTCOMES = ("sent", "permanent_error", "transient_error", "unknown")
WEBHOOK_RESULTS = ("accepted", "duplicate", "bad_signature", "malformed", "unknown_channel", "refused")
MESSAGE_EVENTS = ("queued", "claimed", "sending", "sent", "delivered", "read", "failed", "retried", "dead",
                  "unknown", "expired", "cancelled", "skipped", "deferred", "reclaimed")
CHANNEL_KINDS = ("whatsapp", "email", "sms")

# -- the metrics (created on first use, each in the process that uses it) ------------------------

_DEFINITIONS: dict[str, tuple[str, str, str, tuple[str, ...], dict[str, Any]]] = {
    # key: (type, name, help, labels, options)
    "sends": ("counter", "lembra_sends", "Provider send calls by provider and outcome",
              ("provider", "outcome"), {}),
    "provider_seconds": ("histogram", "lembra_provider_call_seconds", "Duration of provider send calls",
                         ("provider",), {"buckets": PROVIDER_BUCKETS}),
    "lateness": ("histogram", "lembra_send_lateness_seconds", "sent_at - due_at of sent messages",
                 ("kind",), {"buckets": LATENESS_BUCKETS}),
    "message_events": ("counter", "lembra_message_events", "Message status changes by event",
                       ("event",), {}),
    "webhooks": ("counter", "lembra_webhooks", "Webhook deliveries by provider and result",
                 ("provider", "result"), {}),
    "flow_steps": ("counter", "lembra_flow_steps", "Follow-up steps by node kind and status",
                   ("kind", "status"), {}),
    "llm_calls": ("counter", "lembra_llm_calls", "LLM calls made by follow-up steps, by node kind",
                  ("kind",), {}),
    "scheduler_passes": ("counter", "lembra_scheduler_passes", "Scheduler passes by result (ok, error)",
                         ("result",), {}),
    "scheduler_seconds": ("histogram", "lembra_scheduler_pass_seconds", "Duration of a scheduler pass",
                          (), {"buckets": PASS_BUCKETS}),
    "scheduler_claimed": ("counter", "lembra_scheduler_claimed", "Rows claimed by scheduler passes",
                          ("what",), {}),
    "scheduler_last_pass": ("gauge", "lembra_scheduler_last_pass_timestamp_seconds",
                            "Unix time of the last completed scheduler pass", (), {"multiprocess_mode": "max"}),
    "scheduler_leader": ("gauge", "lembra_scheduler_leader", "1 while this scheduler is the active one",
                         (), {"multiprocess_mode": "max"}),
    "worker_exits": ("counter", "lembra_worker_process_exits", "Worker processes that died and were replaced",
                     (), {}),
}
_metrics: dict[str, Any] = {}
_children: dict[tuple[str, tuple[str, ...]], Any] = {}
_lock = threading.Lock()


def _metric(key: str, *labels: str) -> Any:
    """The metric `key`, or its child for `labels`: children are kept, as `labels()` takes a lock
    and checks its values on every call (labels are bounded words, so there are few)."""
    if labels:
        child = _children.get((key, labels))
        if child is None:
            child = _children[(key, labels)] = _metric(key).labels(*labels)
        return child
    metric = _metrics.get(key)
    if metric is None:
        with _lock:
            metric = _metrics.get(key)
            if metric is None:
                import prometheus_client as prom

                kind, name, doc, labels, options = _DEFINITIONS[key]
                cls = {"counter": prom.Counter, "histogram": prom.Histogram, "gauge": prom.Gauge}[kind]
                metric = _metrics[key] = cls(name, doc, labels, **options)
    return metric


def _bounded(value: Any, allowed: tuple[str, ...]) -> str:
    return value if value in allowed else "other"


def _quiet(fn: Callable[..., None]) -> Callable[..., None]:
    """A helper that logs instead of raising: metrics never break the work they observe."""

    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:
            log.warning("metrics update failed", exc_info=True, extra={"metric_helper": fn.__name__})

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


@functools.cache
def _providers() -> tuple[str, ...]:
    from gateway import registry

    return tuple(registry.names())


# -- hooks ------------------------------------------------------------------------------------------


def provider_call(provider: str, send: Callable[[T], R], outbound: T) -> R:
    """`send(outbound)`, timed and counted: `lembra_provider_call_seconds{provider}` and
    `lembra_sends_total{provider, outcome}`. The provider's exception goes through unchanged."""
    start = time.perf_counter()
    outcome = "unknown"
    try:
        result = send(outbound)
        outcome = "sent"
        return result
    except Exception as exc:
        outcome = _send_outcome(exc)
        raise
    finally:
        _record_call(provider, outcome, time.perf_counter() - start)


def _send_outcome(exc: BaseException) -> str:
    from gateway.errors import ProviderError

    if not isinstance(exc, ProviderError) or exc.outcome_unknown:
        return "unknown"  # a provider bug or a timeout after the request left: it may have gone out
    return "permanent_error" if exc.permanent else "transient_error"


@_quiet
def _record_call(provider: str, outcome: str, seconds: float) -> None:
    provider = _bounded(provider, _providers())
    _metric("sends", provider, _bounded(outcome, SEND_OUTCOMES)).inc()
    _metric("provider_seconds", provider).observe(seconds)


@_quiet
def lateness(kind: str, due_at: datetime | None, sent_at: datetime) -> None:
    """Observe `sent_at - due_at` of a message just marked sent."""
    if due_at is None:
        return
    if due_at.tzinfo is None:
        due_at = due_at.replace(tzinfo=UTC)
    if sent_at.tzinfo is None:
        sent_at = sent_at.replace(tzinfo=UTC)
    seconds = max((sent_at - due_at).total_seconds(), 0.0)
    _metric("lateness", _bounded(kind, CHANNEL_KINDS)).observe(seconds)


@_quiet
def message_events(event: str, count: int) -> None:
    """`count` messages recorded `event` (engine.queue.outbox.record_events: every status change)."""
    if count:
        _metric("message_events", _bounded(event, MESSAGE_EVENTS)).inc(count)


@_quiet
def webhook(provider: str, result: Any) -> None:
    """One webhook delivery: `result` is what `inbound.receive` returned (accepted, or duplicate
    when the same delivery was already stored), the WebhookError it raised, or a result word."""
    from gateway.errors import BadSignature, MalformedWebhook, UnknownChannel, WebhookError

    if isinstance(result, str):
        word = result
    elif isinstance(result, BadSignature):
        word = "bad_signature"
    elif isinstance(result, UnknownChannel):
        word = "unknown_channel"
    elif isinstance(result, MalformedWebhook) or (isinstance(result, WebhookError) and result.status == 400):
        word = "malformed"
    elif isinstance(result, WebhookError):
        word = "refused"
    else:
        word = "duplicate" if getattr(result, "duplicate", False) else "accepted"
    _metric("webhooks", _bounded(provider, _providers()), _bounded(word, WEBHOOK_RESULTS)).inc()


@_quiet
def flow_step(kind: str, status: str, llm_calls: int = 0) -> None:
    """A follow-up step was recorded, with the LLM calls it made. The caller (the flow's lifecycle,
    which knows its node kinds and step statuses) passes bounded label values."""
    _metric("flow_steps", kind, status).inc()
    if llm_calls > 0:
        _metric("llm_calls", kind).inc(llm_calls)


_heartbeat = [time.monotonic()]


def scheduler_pass(tick: Callable[[], T]) -> T:
    """Run one scheduler pass (`tick()`), timed and counted with what it claimed."""
    start = time.perf_counter()
    try:
        result = tick()
    except Exception:
        _record_pass("error", time.perf_counter() - start, None)
        raise
    _record_pass("ok", time.perf_counter() - start, result)
    return result


@_quiet
def _record_pass(result: str, seconds: float, tick: Any) -> None:
    _heartbeat[0] = time.monotonic()
    _metric("scheduler_passes", result).inc()
    _metric("scheduler_seconds").observe(seconds)
    _metric("scheduler_leader").set(1)
    if tick is not None:
        _metric("scheduler_claimed", "messages").inc(int(getattr(tick, "claimed", 0) or 0))
        _metric("scheduler_claimed", "enrollments").inc(int(getattr(tick, "advanced", 0) or 0))
        _metric("scheduler_claimed", "inbound_repoked").inc(int(getattr(tick, "repoked", 0) or 0))
        _metric("scheduler_last_pass").set(time.time())


@_quiet
def scheduler_standby() -> None:
    """The scheduler tried the leader lock and another one holds it: alive, standing by."""
    _heartbeat[0] = time.monotonic()
    _metric("scheduler_leader").set(0)


@_quiet
def worker_process_exited(pid: int | None) -> None:
    """The supervisor noticed a dead worker process: count it and drop its live gauges."""
    _metric("worker_exits").inc()
    path = os.environ.get(MULTIPROC_ENV)
    if pid and path:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, path)


# -- exposition -------------------------------------------------------------------------------------


def exposition() -> bytes:
    """This process's metrics in the text format; in multiprocess mode, its whole group's."""
    import prometheus_client as prom

    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        registry = prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return prom.generate_latest(registry)
    return prom.generate_latest(prom.REGISTRY)


def use_multiprocess(role: str) -> str:
    """Give this process group (`web` or `worker`) a fresh multiprocess directory, before
    prometheus_client is imported (the children inherit it through the environment). Stale
    directories of earlier runs of the same role are removed; this one is removed at exit."""
    if "prometheus_client.values" in sys.modules and not os.environ.get(MULTIPROC_ENV):
        raise RuntimeError("engine.core.metrics.use_multiprocess() must run before prometheus_client is imported")
    base = os.environ.get(DIR_ENV) or tempfile.gettempdir()
    try:
        os.makedirs(base, exist_ok=True)
        _remove_stale(base, role)
        path = tempfile.mkdtemp(prefix=f"lembra-{role}-metrics-{os.getpid()}-", dir=base)
    except OSError as exc:
        _config_error(f"{DIR_ENV}: cannot create a metrics directory in {base} ({exc.strerror})")
    os.environ[MULTIPROC_ENV] = path
    os.environ.pop("prometheus_multiproc_dir", None)
    owner = os.getpid()
    # Only the process that made it removes it (gunicorn's forked workers run atexit handlers too).
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, ignore_errors=True))
    return path


def _remove_stale(base: str, role: str) -> None:
    prefix = f"lembra-{role}-metrics-"
    for name in os.listdir(base):
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        # Our own pid names a directory of an earlier run (in a container the command is pid 1).
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _config_error(message: str) -> None:
    print(f"lembra: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def endpoint(role: str) -> tuple[str, int]:
    """(host, port) of a worker or scheduler metrics server from the environment; port 0 = off."""
    host = os.environ.get(HOST_ENV, "").strip() or DEFAULT_HOST
    name = PORT_ENV[role]
    raw = os.environ.get(name, "").strip()
    if not raw:
        return host, DEFAULT_PORT[role]
    if not raw.isdigit() or int(raw) > 65535:
        _config_error(f"{name}: not a port number: {raw!r} (0 turns the metrics server off)")
    return host, int(raw)


class MetricsServer:
    """`/metrics` and `/healthz` over HTTP, in a daemon thread of the process that serves them."""

    def __init__(self, host: str, port: int, health: Callable[[], str | None]) -> None:
        self.health = health
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    from prometheus_client import CONTENT_TYPE_LATEST

                    self._answer(200, exposition(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    problem = outer.health()
                    self._answer(503 if problem else 200, (problem or "ok").encode() + b"\n", "text/plain")
                else:
                    self._answer(404, b"not found\n", "text/plain")

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:  # no access log (scrapes every 15 s)
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="metrics-server", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _scheduler_health() -> str | None:
    age = time.monotonic() - _heartbeat[0]
    return f"no scheduler pass or lock attempt for {age:.0f} s" if age > SCHEDULER_STALE_SECONDS else None


def serve(role: str, *, enabled: bool = True) -> MetricsServer | None:
    """Start the metrics server of a `worker` (its supervisor: the group's multiprocess directory
    is set up first, so start this before the worker processes) or of a `scheduler`.
    A port already taken is a warning, not a stop: the process works on, unscraped."""
    if not enabled:
        return None
    host, port = endpoint(role)
    if port == 0:
        return None
    if role == "worker":
        use_multiprocess("worker")
    _heartbeat[0] = time.monotonic()
    health = _scheduler_health if role == "scheduler" else (lambda: None)
    try:
        server = MetricsServer(host, port, health)
    except OSError as exc:
        log.warning("metrics server not started", extra={"role": role, "host": host, "port": port,
                                                          "error": exc.strerror})
        return None
    log.info("metrics server listening", extra={"role": role, "host": host, "port": server.port})
    return server
