"""Send pacing against WhatsApp bans: a minimum interval between sends from one number, with
jitter, and a daily cap — held across worker processes, because the slot lives in the database."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import select

from engine.store.models import message_events, messages
from engine.queue.pacing import DbPacingStore
from gateway.pacing import PacingPolicy
from tests.processes import wait_until
from tests.test_processes import REAL_BROKER, _start_scheduler, _start_workers, _status_counts, backlog, procs  # noqa: F401


def test_reservations_space_sends_and_stop_at_the_daily_cap(rt, clock):
    from tests.factories import World

    world = World(rt)
    channel_id = world.channel("whatsapp")
    policy = PacingPolicy(min_interval=timedelta(seconds=3), jitter=timedelta(seconds=1), daily_cap=3)
    now = clock.now()
    tomorrow = now + timedelta(days=1)
    slots = []
    for _ in range(4):
        with rt.db.begin() as conn:
            slots.append(DbPacingStore(conn, world.org_id).reserve(channel_id, policy, now, "2026-12-01", tomorrow))
    assert [s.over_cap for s in slots] == [False, False, False, True]
    assert slots[0].at == now
    for earlier, later in zip(slots, slots[1:3]):
        assert timedelta(seconds=3) <= later.at - earlier.at <= timedelta(seconds=4)
    assert slots[3].at == tomorrow
    with rt.db.begin() as conn:  # a new day resets the count
        fresh = DbPacingStore(conn, world.org_id).reserve(channel_id, policy, tomorrow, "2026-12-02", tomorrow)
    assert not fresh.over_cap


def test_evolution_pacing_holds_across_two_worker_processes(rt, backlog, procs, database_url):  # noqa: F811
    """Two worker processes drain one backlog through an Evolution number: the Evolution fake
    sees the sends spaced by the minimum interval, and the daily cap holds the rest."""
    import time

    from engine.tenants.channels import create_channel
    from tests.fakes.evolution import EvolutionFake
    from tests.fakes.server import FakeServer

    fake = EvolutionFake()
    arrivals: list[float] = []

    def handler(request):
        if "/message/sendText/" in request.path:
            arrivals.append(time.monotonic())
        return fake(request)

    with FakeServer(handler) as server:
        with rt.db.begin() as conn:
            create_channel(conn, rt.keyring, org_id=backlog.world.org_id, kind="whatsapp", provider="evolution",
                           name="Número da recepção", is_default=True, min_interval_ms=300, daily_cap=8,
                           credentials={"base_url": server.url, "api_key": fake.api_key, "instance": fake.instance,
                                        "webhook_secret": "a-long-enough-webhook-secret-for-hs256!"})
        # More in flight than one process has threads (4), so both must take part.
        small = {"LEMBRA_CLAIM_BATCH": "2", "LEMBRA_SEND_BATCH": "1", "LEMBRA_MAX_IN_FLIGHT": "6",
                 "LEMBRA_LOG_LEVEL": "INFO", "dramatiq_queue_prefetch": "1"}
        for proc in _start_workers(procs, database_url, 2, **small):
            procs.wait_ready(proc)
        _start_scheduler(procs, database_url, **small)
        ids = backlog(12)

        local_midnight = datetime.combine(datetime.now(ZoneInfo("America/Sao_Paulo")).date() + timedelta(days=1),
                                          datetime.min.time(), tzinfo=ZoneInfo("America/Sao_Paulo"))

        def settled() -> bool:
            with rt.db.connect() as conn:
                held = conn.execute(select(messages.c.next_attempt_at)
                                    .where(messages.c.status == "pending")).scalars().all()
            return _status_counts(rt).get("sent", 0) == 8 and len(held) == len(ids) - 8 and \
                all(at >= local_midnight for at in held)

        wait_until(settled, timeout=120, what="8 sends and 4 held for the next local day",
                   on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")
        with rt.db.connect() as conn:
            senders = conn.execute(select(messages.c.claimed_by).where(messages.c.status == "sent")
                                   .distinct()).scalars().all()
            slot_details = conn.execute(select(message_events.c.detail).where(message_events.c.event == "sending")
                                        ).scalars().all()
    assert len(arrivals) == 8, "the daily cap stopped the ninth send"
    # The fleet-wide guarantee: the slots the two processes reserved are a minimum interval apart.
    slots = sorted(datetime.fromisoformat(d["slot"]) for d in slot_details)
    assert len(slots) == 8
    slot_gaps = [(b - a).total_seconds() for a, b in zip(slots, slots[1:])]
    assert min(slot_gaps) >= 0.3, f"two reserved slots closer than the minimum interval: {slot_gaps}"
    # On the wire, a busy machine may shift a send a little after its slot; on average the gaps hold
    # (unpaced, 8 threads would send most of these within milliseconds of each other).
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert sum(gaps) / len(gaps) >= 0.3, f"sends closer than the minimum interval on average: {gaps}"
    if REAL_BROKER:
        # With SQLite and the stub broker the two consumers are embedded schedulers that take turns
        # on SQLite's write lock, and one may drain the 8 sends alone; the slot check above holds either way.
        assert len(senders) == 2, f"both worker processes sent: {senders}"
