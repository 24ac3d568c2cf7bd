"""The scheduler: sweeps leases, populates, claims what is due and hands the ids to the broker.

Run any number of them; on PostgreSQL a session advisory lock keeps exactly one active, and a
standby takes over when the active one's connection goes away.

The loop (`run`) populates in a thread of its own, on its own connections, so claiming goes on
while a pass runs; only the active scheduler starts one, and one at a time. A periodic pass only
looks at what changed since the previous one (`populate_changed`); a full pass runs first and then
every FULL_POPULATE_EVERY as a safety net. `tick()` called directly populates in line, as before. Nothing due is ever parked in
the broker for later: the database holds `due_at`, the broker only sees what is due now.

A broker outage stops only the hand-overs. The enrollments claimed for a hand-over that failed
are released at once, free; while the outage lasts a pass sweeps, populates and settles as usual
but claims nothing until the broker answers a probe, and the outage is logged once, then once a
minute, then when it ends (engine/fleet/outage.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, Iterator, Sequence, TypeVar

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from engine.core import clock, metrics
from engine.messaging import clinic_phone, dispatch, inbound, statuses
from engine.fleet.broker import BrokerUnavailable, connection_errors, ping
from engine.core.config import Settings
from engine.flows import runtime as flows
from engine.flows.triggers import scan as scan_triggers
from engine.fleet.outage import BrokerOutage
from engine.reminders.populate import PopulateResult, populate, populate_changed
from engine.privacy.retention import DailyRetention
from engine.store.runtime import Runtime
from engine.tenants.webhooks import delivery as webhooks

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Advisory lock key: "LEMB" as an integer.
LEADER_LOCK = 0x4C454D42
#: How often the periodic populate is a full pass rather than only what changed.
FULL_POPULATE_EVERY = timedelta(minutes=15)
#: How far before the previous pass's start the next one looks for changes: a transaction that
#: wrote before that pass started but committed after its snapshot is still seen (and a little
#: clock skew between the processes that write `updated_at`).
CHANGED_SINCE_MARGIN = timedelta(minutes=2)
#: How long a stopping scheduler waits for its populate pass to end (seconds).
STOP_WAIT = 30.0
#: Follow-up steps and patient replies per worker task at most, whatever LEMBRA_SEND_BATCH says:
#: each may wait on a model for seconds, so a task of them is kept to what it was when sends and
#: conversations shared the setting's old default.
CONVERSATION_TASK = 100
#: How long the probe of a broker found down waits for its answer (seconds): it runs once a pass.
PROBE_TIMEOUT = 2.0


def conversation_task(settings: Settings) -> int:
    """How many follow-up steps or patient replies go in one worker task."""
    return min(settings.send_batch, CONVERSATION_TASK)


def in_tasks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` cut into consecutive worker tasks of at most `size`."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


@dataclass
class Tick:
    """What one pass did."""

    populated: PopulateResult | None
    claimed: int
    reclaimed: int
    unknown: int
    advanced: int = 0
    lost_claims: int = 0
    requeued_claims: int = 0  # enrollment claims no worker started, back in the queue free
    enrolled: int = 0
    retained: int = 0
    repoked: int = 0
    settled: int = 0  # provider statuses that had arrived before their send was recorded
    webhooks: int = 0  # webhook deliveries handed to the workers
    webhooks_swept: int = 0  # webhook deliveries whose lease ran out, put back in the queue
    handoffs_ended: int = 0  # hand-offs the clinic's phone started, ended by the staff's quiet


class Scheduler:
    """One scheduler loop. `enqueue` hands a list of message ids to the workers, `enqueue_flows`
    a list of [enrollment id, revision] claims, `enqueue_inbound` a list of patient messages
    whose first poke was lost, `enqueue_webhooks` a list of [delivery id, revision] claims of
    outbound webhooks. `probe` raises BrokerUnavailable while the broker cannot be
    reached (by default a connection to BROKER_URL); a pass asks it only during an outage."""

    def __init__(self, rt: Runtime, enqueue: Callable[[Sequence[int]], None],
                 enqueue_flows: Callable[[Sequence[Sequence[int]]], None] | None = None,
                 enqueue_inbound: Callable[[Sequence[int]], None] | None = None,
                 probe: Callable[[], None] | None = None,
                 enqueue_webhooks: Callable[[Sequence[Sequence[int]]], None] | None = None) -> None:
        self.rt = rt
        self.enqueue_webhooks = enqueue_webhooks
        self.enqueue = enqueue
        self.enqueue_flows = enqueue_flows
        self.enqueue_inbound = enqueue_inbound
        self.probe = probe or (lambda: ping(rt.settings, timeout=PROBE_TIMEOUT))
        self.outage = BrokerOutage(log)
        self._broker_errors = connection_errors()
        self._last_populate = 0.0
        self._last_repoke = 0.0
        # Engine-clock instants of the last pass's start and of the last full pass's start.
        self._populated_from: datetime | None = None
        self._last_full: datetime | None = None
        self._populate_lock = threading.Lock()  # one pass at a time, in line or in the background
        self._populate_thread: threading.Thread | None = None
        #: The result of the last pass run in the background (None before the first one ends).
        self.last_populated: PopulateResult | None = None
        # Once a day per org (a retention_runs row claims the day; the leader lock keeps one active).
        self.retention = DailyRetention(rt.db)

    def tick(self, *, force_populate: bool = False, background: bool = False) -> Tick:
        """One pass: sweep leases, populate when due, claim and enqueue everything due now.

        `force_populate` runs a full populate pass in line. With `background` (the loop), a due
        populate pass starts in its own thread and this pass goes on claiming at once. Raises
        BrokerUnavailable (after the rest of the pass) when the broker could not be reached."""
        settings = self.rt.settings
        reclaimed, unknown = dispatch.sweep_leases(self.rt)
        swept = self._sweep_flows()
        webhooks_swept = self._sweep_webhooks()
        populated = None
        enrolled = 0
        if force_populate:
            populated, enrolled = self._populate(full=True)
            self._last_populate = time.monotonic()
        elif time.monotonic() - self._last_populate >= settings.populate_interval:
            if background:
                self.start_populate()
            else:
                populated, enrolled = self._populate()
                self._last_populate = time.monotonic()
        claimed = advanced = repoked = delivering = 0
        down: BrokerUnavailable | None = None
        try:
            self._broker_answers()
            claimed = self._hand_messages()
            advanced = self._hand_flows()
            repoked = self._repoke_inbound()
            delivering = self._hand_webhooks()
        except BrokerUnavailable as exc:
            down = exc  # what needs no broker goes on; the pass still fails below
        settled = statuses.settle_early(self.rt)
        quiet = clinic_phone.end_quiet(self.rt, limit=settings.claim_batch)
        retained = self.retention.maybe_run()
        if down is not None:
            raise down
        return Tick(populated=populated, claimed=claimed, reclaimed=reclaimed, unknown=unknown,
                    advanced=advanced, lost_claims=swept.lost, requeued_claims=swept.requeued, enrolled=enrolled,
                    retained=retained, repoked=repoked, settled=settled, webhooks=delivering,
                    webhooks_swept=webhooks_swept, handoffs_ended=quiet)

    def _broker_answers(self) -> None:
        """During an outage, claim nothing until the broker answers the probe."""
        if not self.outage.active:
            return
        try:
            self.probe()
        except BrokerUnavailable as exc:
            self.outage.failed(str(exc))
            raise
        self.outage.answered()

    def _hand(self, enqueue: Callable[[T], None], task: T) -> None:
        """Hand one task to the broker; BrokerUnavailable (logged as the outage says) when it is not there."""
        try:
            enqueue(task)
        except self._broker_errors as exc:
            self.outage.failed(type(exc).__name__)
            raise BrokerUnavailable(type(exc).__name__) from exc
        self.outage.answered()

    def _hand_messages(self) -> int:
        """Claim every due message and hand it to the workers, a task at a time."""
        settings = self.rt.settings
        claimed = 0
        while True:
            # Bounded in-flight work, so a big backlog is not all leased at the same time.
            ids = dispatch.claim_due(self.rt, limit=settings.claim_batch, max_in_flight=settings.max_in_flight,
                                     task=settings.send_batch)
            # A task the broker did not take stays claimed until its lease runs out; the sweep
            # then puts it back free (engine/messaging/dispatch/claim.py), and no more is claimed meanwhile.
            for task in in_tasks(ids, settings.send_batch):
                self._hand(self.enqueue, task)
            claimed += len(ids)
            if len(ids) < settings.claim_batch:
                return claimed

    def populating(self) -> bool:
        """Whether a background populate pass is running."""
        thread = self._populate_thread
        return thread is not None and thread.is_alive()

    def start_populate(self) -> bool:
        """Start a populate pass in a thread of its own, unless one is running; True if started."""
        if self.populating():
            return False
        self._last_populate = time.monotonic()  # the interval counts from the pass's start
        thread = threading.Thread(target=self._populate_in_background, name="populate", daemon=True)
        self._populate_thread = thread
        thread.start()
        return True

    def wait_populate(self, timeout: float | None = None) -> bool:
        """Wait for the background pass, if any; False if it is still running after `timeout`."""
        thread = self._populate_thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _populate_in_background(self) -> None:
        try:
            populated, _ = self._populate()
            self.last_populated = populated
        except Exception:  # noqa: BLE001 - logged; the next interval tries again
            log.exception("background populate failed")

    def _populate(self, *, full: bool = False) -> tuple[PopulateResult, int]:
        """One populate pass (full, or what changed since the previous one) and the flow triggers."""
        settings = self.rt.settings
        with self._populate_lock:
            started = clock.now()
            since = self._populated_from
            if since is None or self._last_full is None or started - self._last_full >= FULL_POPULATE_EVERY:
                full = True
            if full:
                populated = populate(self.rt.db, horizon=settings.populate_horizon)
                self._last_full = started
            else:
                assert since is not None
                populated = populate_changed(self.rt.db, horizon=settings.populate_horizon,
                                             since=since - CHANGED_SINCE_MARGIN)
            self._populated_from = started
            with self.rt.db.begin() as conn:
                enrolled = scan_triggers(conn)
            return populated, enrolled

    def _repoke_inbound(self) -> int:
        """Hand the workers again, once per REPOKE_AFTER, the patient messages nobody acted on.

        Acting is a compare-and-set on `processed_at`, so a poke that was only slow, not lost,
        makes the second one a no-op."""
        interval = inbound.REPOKE_AFTER.total_seconds()
        if self.enqueue_inbound is None or time.monotonic() - self._last_repoke < interval:
            return 0
        self._last_repoke = time.monotonic()
        ids = inbound.unprocessed(self.rt, limit=self.rt.settings.claim_batch)
        enqueue_inbound = self.enqueue_inbound
        for task in in_tasks(ids, conversation_task(self.rt.settings)):
            self._hand(enqueue_inbound, task)
        if ids:
            log.warning("patient messages handed to the workers again", extra={"count": len(ids)})
        return len(ids)

    def _sweep_flows(self) -> flows.Swept:
        """Sweep enrollment claims whose lease ran out (before any hand-over: it needs no broker)."""
        if self.enqueue_flows is None:
            return flows.Swept(lost=0, requeued=0)
        return flows.sweep_lost(self.rt, limit=self.rt.settings.claim_batch)

    def _hand_flows(self) -> int:
        """Claim every due enrollment and hand the claims out, a task at a time. Claims the broker
        did not take are released at once, free: a lease left to run out would keep them from
        the next pass for nothing."""
        if self.enqueue_flows is None:
            return 0
        settings = self.rt.settings
        enqueue_flows = self.enqueue_flows
        size = conversation_task(settings)
        claimed = 0
        while True:
            pairs = flows.claim_due(self.rt, limit=settings.claim_batch, max_in_flight=settings.max_in_flight)
            handed = 0
            try:
                for task in in_tasks(pairs, size):
                    self._hand(enqueue_flows, [list(p) for p in task])
                    handed += len(task)
            except BaseException:
                self._release(pairs[handed:])
                raise
            claimed += len(pairs)
            if len(pairs) < settings.claim_batch:
                return claimed

    def _sweep_webhooks(self) -> int:
        """Put back webhook deliveries whose lease ran out (before any hand-over: it needs no broker)."""
        if self.enqueue_webhooks is None:
            return 0
        swept = webhooks.sweep_expired(self.rt, limit=self.rt.settings.claim_batch)
        return swept.interrupted + swept.requeued

    def _hand_webhooks(self) -> int:
        """Claim every due webhook delivery and hand the claims out, a task at a time; claims the
        broker did not take are released at once, free, like enrollment claims."""
        if self.enqueue_webhooks is None:
            return 0
        enqueue_webhooks = self.enqueue_webhooks
        claimed = 0
        while True:
            claims = webhooks.claim_due(self.rt, limit=self.rt.settings.claim_batch,
                                        max_in_flight=self.rt.settings.max_in_flight)
            handed = 0
            try:
                for task in in_tasks(claims, webhooks.TASK):
                    self._hand(enqueue_webhooks, [list(c) for c in task])
                    handed += len(task)
            except BaseException:
                try:
                    webhooks.release_unhanded(self.rt, claims[handed:])
                except Exception:  # noqa: BLE001 - their leases run out and the sweep puts them back
                    log.exception("releasing webhook claims the broker did not take failed")
                raise
            claimed += len(claims)
            if len(claims) < self.rt.settings.claim_batch:
                return claimed

    def _release(self, pairs: Sequence[tuple[int, int]]) -> None:
        try:
            flows.release_unhanded(self.rt, pairs)
        except Exception:  # noqa: BLE001 - their leases run out and the sweep puts them back, free
            log.exception("releasing enrollment claims the broker did not take failed")

    def run(self, stop: threading.Event) -> None:
        """Loop until `stop` is set, active only while holding the leader lock (PostgreSQL)."""
        if self.rt.db.is_sqlite:
            try:
                self._loop(stop, lambda: True)
            finally:
                self.wait_populate(STOP_WAIT)
            return
        while not stop.is_set():
            try:
                with self.rt.db.engine.connect() as lock_conn:
                    got = lock_conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LEADER_LOCK}).scalar()
                    lock_conn.commit()
                    if not got:
                        metrics.scheduler_standby()
                        stop.wait(5)
                        continue
                    log.info("scheduler is active")
                    try:
                        self._loop(stop, lambda: _still_holding(lock_conn))
                    finally:
                        # Losing the lock: the pass in flight ends before this one stands by (a
                        # new leader would only repeat it: idempotent, but wasted work). Stopping:
                        # waited for a while only; a pass cut short is rolled back.
                        self.wait_populate(STOP_WAIT if stop.is_set() else None)
                    if _still_holding(lock_conn):  # a dead connection released the lock already
                        lock_conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LEADER_LOCK})
                        lock_conn.commit()
            # Not only DBAPIError: a connection killed under us surfaces as PendingRollbackError.
            except SQLAlchemyError as exc:
                log.error("scheduler lost its database connection", extra={"error": type(exc).__name__})
                stop.wait(2)

    def _loop(self, stop: threading.Event, holding: Callable[[], bool]) -> None:
        interval = self.rt.settings.dispatch_interval
        while not stop.is_set():
            if not holding():
                log.warning("scheduler lost the leader lock")
                return
            self.run_pass()
            stop.wait(interval)

    def run_pass(self) -> None:
        """One pass of the loop: a failure is logged (a broker outage as engine/fleet/outage.py says,
        not once per pass) and the loop goes on."""
        try:
            metrics.scheduler_pass(lambda: self.tick(background=True))
        except BrokerUnavailable:
            pass  # already said, once per outage and then once a minute
        except DBAPIError as exc:
            log.error("scheduler pass failed", extra={"error": type(exc).__name__})
        except Exception:
            log.exception("scheduler pass crashed")


def _still_holding(conn) -> bool:  # type: ignore[no-untyped-def]
    try:
        conn.execute(text("SELECT 1")).scalar()
        conn.commit()
        return True
    except SQLAlchemyError:
        return False
