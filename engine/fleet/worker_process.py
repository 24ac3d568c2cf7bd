"""One Dramatiq worker process: `python -m engine.fleet.worker_process --threads N --conversation-threads M`
(N threads for sends, M for patient replies and follow-up steps: engine/fleet/worker_pools.py).

`lembra worker --processes P` starts P of these and replaces any that dies (engine/fleet/supervisor.py).
It does what one child of the `dramatiq` command does (boot the broker, run its `dramatiq.Worker`s,
stop them gracefully on SIGTERM) without the `dramatiq` main process, whose answer to a dead child
is to stop every sibling and exit.

Signals: SIGTERM asks for a graceful stop (consumers stop, the messages being worked on finish);
asking again changes nothing, so a SIGTERM that reaches it twice (from the supervisor and from a
`kill` of the whole process group) is still one graceful stop. A hard stop is the supervisor's
SIGKILL. Under the supervisor SIGINT is ignored: a terminal's Ctrl+C reaches the whole process
group and the supervisor turns it into the one SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from engine.fleet.worker_pools import CONVERSATION_THREADS, SEND_THREADS, start_pools

#: Exit codes, as the `dramatiq` command uses them.
RET_OK, RET_CONFIG, RET_CONNECT = 0, 2, 3
#: Set by the supervisor to its own pid: the child stops when that process is gone.
SUPERVISOR_PID_ENV = "LEMBRA_SUPERVISOR_PID"

log = logging.getLogger("engine.worker")


def _stop_with_parent(parent_pid: int) -> None:
    """Ask the kernel for a SIGTERM when the supervisor dies (Linux), so an orphan does not keep
    consuming beside the fleet a restarted supervisor starts."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the parent's death goes unnoticed
        return
    if os.getppid() != parent_pid:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.fleet.worker_process")
    parser.add_argument("--threads", type=int, default=SEND_THREADS, help="threads taking send tasks")
    parser.add_argument("--conversation-threads", type=int, default=CONVERSATION_THREADS,
                        help="threads taking patient replies and follow-up steps")
    parser.add_argument("--shutdown-timeout", type=float, default=600.0,
                        help="seconds a graceful stop waits for the messages being worked on")
    args = parser.parse_args(argv)

    stop = threading.Event()
    supervised = os.environ.get(SUPERVISOR_PID_ENV, "").isdigit()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN if supervised else (lambda *_: stop.set()))
    if supervised:
        _stop_with_parent(int(os.environ[SUPERVISOR_PID_ENV]))

    try:
        from dramatiq.errors import BrokerConnectionError
    except ImportError:  # dramatiq < 2.1
        from dramatiq.errors import ConnectionError as BrokerConnectionError  # type: ignore[no-redef]

    from engine.fleet.broker import setup_broker
    from engine.core.config import ConfigError, Settings
    from engine.core.logs import configure

    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"lembra worker: error: {exc}", file=sys.stderr)
        return RET_CONFIG
    configure(settings.log_level, settings.log_format)
    try:
        broker = setup_broker(settings)
        broker.emit_after("process_boot")  # what the dramatiq command does: starts the time-limit timer
        pools = start_pools(broker, send_threads=args.threads, conversation_threads=args.conversation_threads)
    except BrokerConnectionError:
        log.exception("broker connection failed")
        return RET_CONNECT
    log.info("worker process is ready for action",
             extra={"pid": os.getpid(), "threads": args.threads, "conversation_threads": args.conversation_threads})

    while not stop.wait(1):
        pass
    log.info("worker process stopping", extra={"pid": os.getpid()})
    pools.stop(timeout_ms=int(args.shutdown_timeout * 1000))
    # A worker thread's RabbitMQ connection (it publishes follow-up pokes) sends no heartbeats while
    # idle, so the server has often closed it by now: pika would log each close as an ERROR.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    broker.close()
    return RET_OK


if __name__ == "__main__":
    sys.exit(main())
