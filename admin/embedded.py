"""Everything in one process: web console, scheduler and workers (the embedded default, and
`lembra up` against any database and broker)."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Sequence

from werkzeug.serving import BaseWSGIServer, make_server

from admin.app import create_app
from engine.fleet.broker import setup_broker
from engine.store.runtime import Runtime, install
from engine.fleet.scheduler import Scheduler
from engine.fleet.worker_pools import WorkerPools, start_pools

log = logging.getLogger(__name__)


class Embedded:
    """Scheduler thread + Dramatiq worker threads (+ optionally the web server) in-process.
    `worker_threads` threads take sends and as many take replies and follow-up steps."""

    def __init__(self, rt: Runtime, *, worker_threads: int = 4) -> None:
        self.rt = rt
        install(rt)
        self.broker = setup_broker(rt.settings)
        import engine.fleet.actors as actors

        self.actors = actors
        self.worker_threads = worker_threads
        self.pools: WorkerPools | None = None
        self.scheduler = Scheduler(rt, self.enqueue_send, self.enqueue_flows, self.enqueue_inbound,
                                   enqueue_webhooks=self.enqueue_webhooks)
        self.stop_event = threading.Event()
        self._threads: list[threading.Thread] = []

    def enqueue_send(self, ids: Sequence[int]) -> None:
        self.actors.send_messages.send(list(ids))

    def enqueue_flows(self, pairs: Sequence[Sequence[int]]) -> None:
        self.actors.advance_enrollments.send([list(p) for p in pairs])

    def enqueue_inbound(self, ids: Sequence[int]) -> None:
        self.actors.process_inbound.send(list(ids))

    def enqueue_webhooks(self, claims: Sequence[Sequence[int]]) -> None:
        self.actors.deliver_webhooks.send([list(c) for c in claims])

    def start(self) -> None:
        """Start workers and the scheduler loop in background threads."""
        self.start_workers()
        thread = threading.Thread(target=self.scheduler.run, args=(self.stop_event,), name="scheduler", daemon=True)
        thread.start()
        self._threads.append(thread)
        log.info("embedded scheduler and workers started")

    def drain(self) -> None:
        """Wait until every queued task has been processed (stub broker only)."""
        for queue in self.broker.get_declared_queues():
            self.broker.join(queue)
        if self.pools is not None:
            self.pools.join()

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self.stop_workers()

    def start_workers(self) -> None:
        """Start the worker threads alone (the scheduler runs its passes itself)."""
        if self.pools is None:
            self.pools = start_pools(self.broker, send_threads=self.worker_threads,
                                     conversation_threads=self.worker_threads)

    def stop_workers(self) -> None:
        """Stop the worker threads gracefully (the work they hold finishes first)."""
        if self.pools is not None:
            self.pools.stop()
            self.pools = None

    def listen(self, host: str, port: int) -> BaseWSGIServer:
        """Bind the web console's socket (an OSError when the port is taken), not yet serving."""
        # Werkzeug prints its own advice and exits on a taken port; try the port first so the
        # CLI can say it in one line.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
        app = create_app(self.rt, enqueue_inbound=self.enqueue_inbound)
        return make_server(host, port, app, threaded=True)

    def serve(self, server: BaseWSGIServer) -> None:
        """Run the web console until interrupted, with scheduler and workers alongside."""
        self.start()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
            self.stop()
