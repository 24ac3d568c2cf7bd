"""`lembra up`, `web`, `worker` and `scheduler`: the long-running processes."""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

import click

from admin.cli.common import fail, load_runtime, load_settings
from engine.fleet.worker_pools import CONVERSATION_THREADS, SEND_THREADS


@click.command(help="Run everything in one process: web console, scheduler and workers. With no "
                    "configuration this is the embedded default (SQLite, in-process broker, sandbox, demo clinic).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--demo/--no-demo", default=True, show_default=True, help="Seed the demo clinic on first start.")
@click.option("--threads", default=4, show_default=True, type=click.IntRange(min=1),
              help="Worker threads for sends, and as many for replies and follow-up steps.")
def up(host: str, port: int, demo: bool, threads: int) -> None:
    from admin.embedded import Embedded
    from engine.fleet import demo as demo_seed

    rt = load_runtime(check_broker=True, migrate=True)
    if demo:
        with rt.db.begin() as conn:
            seeded = demo_seed.seed(conn, rt.keyring)
        if seeded.created:
            click.echo("Demo clinic created.")
        click.echo(f"Sign in as {seeded.owner_email} / {seeded.owner_password}")
    embedded = Embedded(rt, worker_threads=threads)
    try:
        server = embedded.listen(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            fail(f"port {port} is already in use on {host}: pick another with `lembra up --port 8080`")
        fail(f"cannot listen on {host}:{port} ({exc.strerror or type(exc).__name__})")
    click.echo(f"Lembra is running on http://{host}:{port}/  (Ctrl+C to stop)")
    embedded.serve(server)


@click.command(help="Run the web console and webhooks under gunicorn.")
@click.option("--bind", default="0.0.0.0:8000", show_default=True)
@click.option("--workers", default=2, show_default=True, type=int)
def web(bind: str, workers: int) -> None:
    from gunicorn.app.base import BaseApplication

    from engine.core import metrics

    metrics.use_multiprocess("web")  # before prometheus_client is imported: /metrics adds up every gunicorn worker
    rt = load_runtime(check_broker=True)
    rt.close()

    class _App(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            self.cfg.set("bind", bind)
            self.cfg.set("workers", workers)
            self.cfg.set("threads", 4)
            self.cfg.set("accesslog", None)

        def load(self) -> Any:
            from admin.wsgi import app

            return app

    _App().run()


@click.command(help="Run Dramatiq worker processes (any number, on any machine). A worker process "
                    "that dies is replaced (with a backoff) while the others keep working; SIGTERM or "
                    "Ctrl+C stops them gracefully. Exits 1 if one keeps dying at start.")
@click.option("--processes", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", default=SEND_THREADS, show_default=True, type=click.IntRange(min=1),
              help="Threads per process taking send tasks (each task's provider calls run in parallel).")
@click.option("--conversation-threads", default=CONVERSATION_THREADS, show_default=True, type=click.IntRange(min=1),
              help="Threads per process taking patient replies and follow-up steps, apart from the sends.")
@click.option("--shutdown-timeout", default=600, show_default=True, type=click.FloatRange(min=0),
              help="Seconds a graceful stop waits for the messages being worked on.")
def worker(processes: int, threads: int, conversation_threads: int, shutdown_timeout: float) -> None:
    settings = load_settings()
    if settings.broker_kind == "stub":
        fail("lembra worker needs BROKER_URL (redis:// or amqp://); the embedded default runs workers in `lembra up`")
    load_runtime(check_broker=True).close()
    # The supervisor (engine/fleet/supervisor.py) replaces this process, so what stays is small.
    child = [sys.executable, "-m", "engine.fleet.worker_process", "--threads", str(threads),
             "--conversation-threads", str(conversation_threads), "--shutdown-timeout", str(shutdown_timeout)]
    os.execv(sys.executable, [sys.executable, "-m", "engine.fleet.supervisor", "--processes", str(processes), "--", *child])


@click.command(help="Run the scheduler (populate, claim, dispatch). Safe to run twice: on PostgreSQL "
                    "only one is active. With the in-process broker it also runs the workers.")
@click.option("--once", is_flag=True, help="One populate + dispatch pass, then exit.")
def scheduler(once: bool) -> None:
    import threading

    from admin.embedded import Embedded
    from engine.core import metrics
    from engine.fleet.broker import setup_broker
    from engine.store.runtime import install
    from engine.fleet.scheduler import Scheduler

    rt = load_runtime(check_broker=True)
    metrics.serve("scheduler", enabled=not once)  # /metrics and /healthz on LEMBRA_SCHEDULER_METRICS_PORT
    if rt.settings.broker_kind == "stub":
        embedded = Embedded(rt)
        if once:
            embedded.start_workers()
            tick = embedded.scheduler.tick(force_populate=True)
            embedded.drain()
            embedded.stop_workers()
            click.echo(f"claimed {tick.claimed} message" + ("" if tick.claimed == 1 else "s"))
            return
        embedded.start()
        try:
            embedded.stop_event.wait()
        except KeyboardInterrupt:
            embedded.stop()
        return
    install(rt)
    setup_broker(rt.settings)
    import engine.fleet.actors as actors

    sched = Scheduler(rt, lambda ids: actors.send_messages.send(list(ids)),
                      lambda pairs: actors.advance_enrollments.send([list(p) for p in pairs]),
                      lambda ids: actors.process_inbound.send(list(ids)),
                      enqueue_webhooks=lambda claims: actors.deliver_webhooks.send([list(c) for c in claims]))
    if once:
        tick = sched.tick(force_populate=True)
        click.echo(f"claimed {tick.claimed} message" + ("" if tick.claimed == 1 else "s"))
        return
    stop = threading.Event()
    try:
        sched.run(stop)
    except KeyboardInterrupt:
        stop.set()
