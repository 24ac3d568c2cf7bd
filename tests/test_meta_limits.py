"""Meta's limits (issue 34): at most about one message every 6 s to one person (131056, the pair
rate limit) and a number's throughput (130429). Sends to one recipient are spaced before they go,
fleet-wide (engine/queue/recipient_pacing.py); a 131056 is retried 6 s later, a transient refusal
and not a failure; a 130429 pauses the whole number, and no other."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import delete, insert, select, text, update

from engine.messaging import dispatch
from engine.messaging.dispatch import checks, waves
from engine.queue import recipient_pacing as recipient_pacing_
from engine.store.models import messages, recipient_pacing
from tests.processes import wait_until
from tests.fakes.meta import notes_error
from tests.test_dispatch_batch import APPOINTMENT, DUE, Graph, booked, meta_world, phone, wa
from tests.test_metrics import Deltas, s
from tests.test_processes import procs  # noqa: F401

PAIR_LIMIT = notes_error(131056, "(Business Account, Consumer Account) pair rate limit hit")


def _send_due(rt, ids=None) -> dict[int, str]:
    claimed = dispatch.claim_due(rt, limit=50)
    return dispatch.send_batch(rt, claimed if ids is None else ids)


def test_a_pair_rate_limit_is_retried_six_seconds_later_as_a_transient_refusal(rt, clock):
    with Graph({wa(0): PAIR_LIMIT}) as graph:
        world = meta_world(rt, graph)
        [mid] = booked(world, 1)
        clock.set(DUE)
        transient = Deltas(s("lembra_sends_total", provider="meta", outcome="transient_error"),
                           s("lembra_sends_total", provider="meta", outcome="permanent_error"))
        assert _send_due(rt) == {mid: "retried"}
        row = world.message(mid)
        assert (row.status, row.error_code, row.failed_at) == ("pending", "pair_rate_limit", None)
        assert row.next_attempt_at == clock.now() + timedelta(seconds=6), "Meta's wait, not the 5 min backoff"
        assert transient() == [1.0, 0.0]

        graph.answers.clear()
        clock.advance(timedelta(seconds=5))
        assert _send_due(rt) == {}, "not due before its 6 s"
        clock.advance(timedelta(seconds=1))
        assert _send_due(rt) == {mid: "sent"}
        assert graph.sends_to(wa(0)) == 2


def test_a_throughput_refusal_pauses_the_whole_number_and_no_other(rt, clock):
    with Graph({wa(0): notes_error(130429, "Rate limit hit")}) as graph:
        world = meta_world(rt, graph)
        first, second = booked(world, 2)
        other_org = meta_world(rt, graph, "outra")
        [elsewhere] = booked(other_org, 1, first=10)
        clock.set(DUE)
        dispatch.claim_due(rt, limit=50)
        assert dispatch.send_batch(rt, [first]) == {first: "retried"}
        # Another patient of the same number waits out the pause; the other org's number sends.
        assert dispatch.send_batch(rt, [second, elsewhere]) == {second: "deferred", elsewhere: "sent"}
        assert world.message(second).next_attempt_at == clock.now() + timedelta(seconds=5)
        assert world.message(first).next_attempt_at == clock.now() + timedelta(seconds=5)
        assert graph.sends_to(wa(1)) == 0

        graph.answers.clear()
        clock.advance(timedelta(seconds=5))
        assert _send_due(rt)[second] == "sent"
        clock.advance(timedelta(seconds=1))  # the refused attempt had taken its patient's 6 s slot
        assert _send_due(rt) == {first: "sent"}


def test_two_messages_to_one_patient_in_one_batch_go_six_seconds_apart_and_no_one_else_waits(rt, clock):
    with Graph({}) as graph:
        world = meta_world(rt, graph)
        booked(world, 2)
        patient = world.contact(name="Paciente 0 de novo", phone=phone(0))  # the same number, twice
        world.appointment(patient, APPOINTMENT)
        ids = [m.id for m in world.messages()]
        clock.set(DUE)
        assert _send_due(rt) == {ids[0]: "sent", ids[1]: "sent", ids[2]: "deferred"}
        assert world.message(ids[2]).next_attempt_at == clock.now() + timedelta(seconds=6)
        with rt.db.connect() as conn:
            stored = conn.execute(select(recipient_pacing.c.recipient)).scalars().all()
        assert len(stored) == 2 and not any(wa(0) in r or wa(1) in r for r in stored), "hashes, never numbers"

        clock.advance(timedelta(seconds=6))
        assert _send_due(rt) == {ids[2]: "sent"}
        assert graph.sends_to(wa(0)) == 2 and graph.sends_to(wa(1)) == 1


def test_the_spacing_holds_across_two_worker_processes(rt, procs, database_url):  # noqa: F811
    """Two worker processes, two reminders to one patient due now: Meta gets them ≥ 6 s apart."""
    import time

    from tests.processes import wait_until
    from tests.test_processes import _start_scheduler, _start_workers, _status_counts

    arrivals: list[float] = []

    class Timed(Graph):
        def _answer(self, request):
            if request.json().get("to") == wa(0):
                arrivals.append(time.monotonic())
            return super()._answer(request)

    with Timed({}) as graph:
        # A sending window open at any hour, whenever the suite runs.
        world = meta_world(rt, graph, quiet_start="00:00", quiet_end="23:59", skip_sundays=False,
                           skip_holidays=False)
        now = datetime.now(timezone.utc)
        patient = world.contact(name="Paciente 0", phone=phone(0))
        for hours in (30, 31):
            world.appointment(patient, now + timedelta(hours=hours))
        world.appointment(world.contact(name="Paciente 1", phone=phone(1)), now + timedelta(hours=30))
        with rt.db.begin() as conn:
            conn.execute(update(messages).where(messages.c.org_id == world.org_id)
                         .values(due_at=now, next_attempt_at=now))
        small = {"LEMBRA_CLAIM_BATCH": "1", "LEMBRA_SEND_BATCH": "1", "LEMBRA_LOG_LEVEL": "INFO",
                 "dramatiq_queue_prefetch": "1"}
        for proc in _start_workers(procs, database_url, 2, **small):
            procs.wait_ready(proc)
        _start_scheduler(procs, database_url, **small)
        wait_until(lambda: _status_counts(rt).get("sent", 0) == 3, timeout=60, what="the three reminders sent",
                   on_fail=lambda: f"{_status_counts(rt)}\n{procs.logs()}")
    assert len(arrivals) == 2
    # The slots are 6 s apart; the first send may leave a little after its slot on a busy machine.
    assert arrivals[1] - arrivals[0] >= 5.5, arrivals


def test_a_wave_takes_its_recipients_rows_in_the_order_a_check_does(rt, clock):
    """A wave that starts late counts its recipients' next slots again (in the wave's own
    statement on PostgreSQL) while other batches' checks reserve theirs (`reserve`, rows locked in
    sorted order). The wave must lock in that order too: one that held a later row while waiting
    for an earlier one a check held deadlocked with the check wanting the later one, and
    PostgreSQL rolled the wave's record back (its calls became `unknown`). Here a check holds the
    first row: the wave waits for it without having taken the second, which a third transaction
    can still lock at once; then the wave marks both messages `sending`, their slots counted from it."""
    if rt.db.is_sqlite:
        pytest.skip("SQLite has one writer at a time: no row locks")
    with Graph({}) as graph:
        world = meta_world(rt, graph)
        ids = booked(world, 2)
        clock.set(DUE)
        assert sorted(dispatch.claim_due(rt, limit=50)) == sorted(ids)
        ready, outcomes = checks.check(rt, ids)
        assert outcomes == {} and len(ready) == 2
        clock.advance(timedelta(seconds=5))  # the wave begins well after its checks: it is late
        now = clock.now()
        # The later row first in the wave and on disk: a plan in either order meets it first.
        ready.sort(key=lambda item: item.spacing.recipient, reverse=True)
        second, first = (item.spacing.recipient for item in ready)
        with rt.db.begin() as conn:
            conn.execute(delete(recipient_pacing))
            for recipient in (second, first):
                conn.execute(insert(recipient_pacing).values(
                    channel_id=ready[0].channel.id, recipient=recipient, org_id=world.org_id,
                    next_allowed_at=now - timedelta(hours=1), taken_by="earlier"))

        wave_pid: list[int] = []
        wave_error: list[BaseException] = []
        marked: list[int] = []

        def wave() -> None:
            try:
                with rt.db.engine.connect() as conn:
                    # Prepared at once and planned generically: the plan PostgreSQL may keep for a
                    # worker's connection, which reads rows in whatever order it finds them.
                    driver = conn.connection.driver_connection
                    driver.prepare_threshold = 0
                    conn.execute(text("SET plan_cache_mode = force_generic_plan"))
                    conn.commit()
                    try:
                        with conn.begin():
                            wave_pid.append(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                            _, prepared = waves.settle_wave(conn, rt, [], ready, now)
                            marked.extend(p.message_id for p in prepared)
                    finally:
                        driver.prepare_threshold = 5
                        conn.execute(text("RESET plan_cache_mode"))
                        conn.commit()
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                wave_error.append(exc)

        with rt.db.engine.connect() as check, rt.db.engine.connect() as third:
            check_tx = check.begin()
            recipient_pacing_.reserve(check, [recipient_pacing_.Want(
                ids[0], world.org_id, ready[0].channel.id, first, timedelta(seconds=6), now)], now)
            thread = threading.Thread(target=wave)
            thread.start()
            try:
                wait_until(lambda: bool(wave_error) or (bool(wave_pid) and _waits_for_a_lock(rt, wave_pid[0])),
                           timeout=30, what="the wave to wait for the row the check holds")
                assert not wave_error, wave_error
                third_tx = third.begin()
                locked = third.execute(text(
                    "SELECT recipient FROM recipient_pacing WHERE channel_id = :channel AND recipient = :recipient "
                    "FOR UPDATE NOWAIT"), {"channel": ready[0].channel.id, "recipient": second}).scalars().all()
                assert locked == [second], "the wave took the second row before the first"
                third_tx.rollback()
            finally:
                check_tx.rollback()
                thread.join(timeout=30)
        assert not thread.is_alive() and not wave_error, wave_error
    assert sorted(marked) == sorted(ids)
    assert {world.message(mid).status for mid in ids} == {"sending"}
    with rt.db.connect() as conn:
        slots = dict(conn.execute(select(recipient_pacing.c.recipient, recipient_pacing.c.next_allowed_at)).all())
    assert slots[first] == slots[second] == now + timedelta(seconds=6)


def test_a_late_wave_counts_its_recipients_slots_from_the_call_and_an_early_one_leaves_them(rt, clock):
    """Both dialects: a wave marked more than `LATE` after its checks moves its recipients' next
    slots to a full interval after the call; one marked at once leaves the check's reservation."""
    with Graph({}) as graph:
        world = meta_world(rt, graph)
        ids = booked(world, 2)
        clock.set(DUE)
        dispatch.claim_due(rt, limit=50)
        ready, _ = checks.check(rt, ids)
        checked = clock.now()
        clock.advance(recipient_pacing_.LATE / 2)
        with rt.db.begin() as conn:
            _, prepared = waves.settle_wave(conn, rt, [], ready[:1], clock.now())
        assert [p.message_id for p in prepared] == [ready[0].msg.id]
        clock.advance(timedelta(seconds=4))
        with rt.db.begin() as conn:
            _, prepared = waves.settle_wave(conn, rt, [], ready[1:], clock.now())
        assert [p.message_id for p in prepared] == [ready[1].msg.id]
    with rt.db.connect() as conn:
        slots = dict(conn.execute(select(recipient_pacing.c.recipient, recipient_pacing.c.next_allowed_at)).all())
    assert slots[ready[0].spacing.recipient] == checked + timedelta(seconds=6), "on time: the check's slot"
    assert slots[ready[1].spacing.recipient] == clock.now() + timedelta(seconds=6), "late: from the call"


def _waits_for_a_lock(rt, pid: int) -> bool:
    with rt.db.engine.connect() as conn:
        return conn.execute(text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                            {"pid": pid}).scalar() == "Lock"
