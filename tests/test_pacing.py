"""Send pacing against WhatsApp bans: a minimum interval between sends from one number, with
jitter, and a daily cap — held across worker processes, because the slot lives in the database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from sqlalchemy import select, update

from engine.models import channels, messages, sandbox_messages
from engine.pacing import DbPacingStore
from gateway.pacing import PacingPolicy
from tests.processes import wait_until
from tests.test_processes import _start_scheduler, _start_workers, _status_counts, backlog, procs  # noqa: F401


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


def test_pacing_holds_across_two_worker_processes(rt, backlog, procs, database_url):  # noqa: F811
    ids = backlog(12)
    with rt.db.begin() as conn:
        conn.execute(update(channels).where(channels.c.id == backlog.channel_id)
                     .values(min_interval_ms=300, daily_cap=8, updated_at=datetime.now(timezone.utc)))
    small = {"LEMBRA_CLAIM_BATCH": "4", "LEMBRA_SEND_BATCH": "1"}
    _start_workers(procs, database_url, 2, **small)
    _start_scheduler(procs, database_url, **small)

    def settled() -> bool:
        counts = _status_counts(rt)
        return counts.get("sent", 0) == 8 and counts.get("pending", 0) == len(ids) - 8

    wait_until(settled, timeout=120, what="8 sends and 4 held for tomorrow",
               on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")
    with rt.db.connect() as conn:
        stamps = sorted(conn.execute(select(sandbox_messages.c.created_at)).scalars().all())
        held = conn.execute(select(messages.c.next_attempt_at).where(messages.c.status == "pending")).scalars().all()
        senders = conn.execute(select(messages.c.claimed_by).where(messages.c.status == "sent").distinct()).scalars().all()
    assert len(stamps) == 8
    gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
    # Slots are 300-450 ms apart; what reaches the wire may shift by scheduling noise on a busy
    # machine, never collapse (unpaced, 8 threads would send most of these within milliseconds).
    assert sum(gaps) / len(gaps) >= 0.3, f"sends closer than the minimum interval on average: {gaps}"
    assert min(gaps) >= 0.15, f"two sends far closer than the minimum interval: {gaps}"
    local_midnight = datetime.combine(datetime.now(ZoneInfo("America/Sao_Paulo")).date() + timedelta(days=1),
                                      datetime.min.time(), tzinfo=ZoneInfo("America/Sao_Paulo"))
    assert all(at >= local_midnight for at in held), "over-cap messages wait for the next local day"
    assert len(senders) >= 1
