"""Meta's limits (issue 34): at most about one message every 6 s to one person (131056, the pair
rate limit) and a number's throughput (130429). Sends to one recipient are spaced before they go,
fleet-wide (engine/queue/recipient_pacing.py); a 131056 is retried 6 s later, a transient refusal
and not a failure; a 130429 pauses the whole number, and no other."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import select, update

from engine.messaging import dispatch
from engine.store.models import messages, recipient_pacing
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
