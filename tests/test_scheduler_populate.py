"""The scheduler loop populates in a thread of its own: claiming goes on while a pass runs; the
periodic pass is incremental, with a full pass first and then now and then. No timing: the
populate pass is held on an Event while the scheduler claims."""

from __future__ import annotations

import threading
from datetime import timedelta

from engine.fleet import scheduler as scheduler_module
from engine.reminders.populate import PopulateResult
from engine.fleet.scheduler import CHANGED_SINCE_MARGIN, FULL_POPULATE_EVERY, Scheduler
from tests.factories import World, local


class HeldPopulate:
    """Stands in for populate/populate_changed: records its calls and waits until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls: list[tuple[str, object]] = []

    def full(self, db, *, horizon, **kwargs):  # noqa: ANN001 - populate's signature
        return self._run("full", None)

    def changed(self, db, *, horizon, since):  # noqa: ANN001
        return self._run("changed", since)

    def _run(self, kind: str, since: object) -> PopulateResult:
        self.calls.append((kind, since))
        self.entered.set()
        assert self.release.wait(timeout=60), "the test never released the populate pass"
        return PopulateResult(created=7)


def _due_reminder(rt, clock) -> int:
    world = World(rt)
    world.channel("whatsapp")
    world.rule(120)
    world.appointment(world.contact(), local(2026, 12, 3, 14, 0))
    [row] = world.messages(status="pending")
    clock.set(row.due_at)
    return row.id


def test_claiming_goes_on_while_a_background_populate_runs(rt, clock, monkeypatch):
    message_id = _due_reminder(rt, clock)
    held = HeldPopulate()
    monkeypatch.setattr(scheduler_module, "populate", held.full)
    monkeypatch.setattr(scheduler_module, "populate_changed", held.changed)
    claimed: list[int] = []
    scheduler = Scheduler(rt, claimed.extend)
    try:
        tick = scheduler.tick(background=True)
        assert held.entered.wait(timeout=60)
        # The pass is still held, and the tick has claimed and handed out the due reminder.
        assert scheduler.populating()
        assert tick.claimed == 1 and claimed == [message_id]
        assert tick.populated is None
        # A second tick while the pass runs neither waits for it nor starts another one.
        scheduler._last_populate = 0.0  # the interval is over again
        assert scheduler.tick(background=True).claimed == 0
        assert scheduler.start_populate() is False
        assert held.calls == [("full", None)]
    finally:
        held.release.set()
        assert scheduler.wait_populate(timeout=60)
    assert not scheduler.populating()
    assert scheduler.last_populated == PopulateResult(created=7)


def test_periodic_passes_are_incremental_with_a_full_one_now_and_then(rt, clock, monkeypatch):
    held = HeldPopulate()
    held.release.set()
    monkeypatch.setattr(scheduler_module, "populate", held.full)
    monkeypatch.setattr(scheduler_module, "populate_changed", held.changed)
    scheduler = Scheduler(rt, lambda ids: None)

    def one_pass():
        assert scheduler.start_populate()
        assert scheduler.wait_populate(timeout=60)

    first = clock.now()
    one_pass()  # the first pass of a scheduler is full
    clock.advance(timedelta(minutes=1))
    second = clock.now()
    one_pass()
    clock.advance(timedelta(minutes=1))
    one_pass()
    assert held.calls == [("full", None), ("changed", first - CHANGED_SINCE_MARGIN),
                          ("changed", second - CHANGED_SINCE_MARGIN)]
    clock.advance(FULL_POPULATE_EVERY)
    one_pass()
    assert held.calls[-1] == ("full", None)
    # tick(force_populate=True) stays a full pass, in line.
    tick = scheduler.tick(force_populate=True)
    assert held.calls[-1] == ("full", None) and tick.populated == PopulateResult(created=7)


def test_background_pass_really_populates(rt, clock):
    """The real populate, in the scheduler's thread, on its own connections."""
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    world.appointment(world.contact(), local(2026, 12, 3, 14, 0), refresh=False)
    scheduler = Scheduler(rt, lambda ids: None)
    assert scheduler.start_populate()
    assert scheduler.wait_populate(timeout=120)
    assert scheduler.last_populated is not None and scheduler.last_populated.created == 1
    assert [m.status for m in world.messages()] == ["pending"]
