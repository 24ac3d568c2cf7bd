"""Issue 9, point 12 (SPEC §10): retention. Texts of finished messages, inbound bodies, sandbox
copies and webhook bodies go after the org's queue days (90); finished messages, events, replies
and webhook deliveries after its events days (730); in batches; what the dashboard counts and
what live follow-ups read stays; once a day from the scheduler and as `lembra retention run`.
Time is the `clock` fixture's, never slept; org B (other settings) is never touched by A's run."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, insert, select

from admin.cli import main
from admin.views.desk.dashboard import tally
from engine.messaging import dispatch
from engine.flows.contact_events import record_contact_event
from engine.messaging.inbound import process_inbound
from engine.store.models import (
    contact_events,
    enrollment_events,
    enrollments,
    inbound_messages,
    inbox_items,
    message_events,
    messages,
    retention_runs,
    sandbox_messages,
    webhook_events,
)
from engine.core.errors import DomainError
from engine.queue.outbox import enqueue
from engine.privacy import retention
from engine.fleet.scheduler import Scheduler
from tests.factories import World, local
from tests.flows.helpers import Flows, linear, node
from tests.processes import lembra_env

_ids = itertools.count(1)


def tenant(rt, slug: str) -> tuple[World, Flows, dict[str, Any]]:
    """A clinic with one of everything retention handles, all made now (the clock's T0)."""
    world = World(rt, slug=slug, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    world.channel("whatsapp")
    world.channel("email")
    world.rule(60, kinds=("whatsapp",))
    flows = Flows(world)
    contact = world.contact()
    now = _now()
    with rt.db.begin() as conn:
        adhoc = enqueue(conn, org_id=world.org_id, contact_id=contact, channel_kind="whatsapp", purpose="adhoc",
                        idempotency_key=f"api:{slug}", payload={"text": "oi", "request_sha256": "f" * 64},
                        respect_window=False)
        enqueue(conn, org_id=world.org_id, contact_id=contact, channel_kind="email", purpose="adhoc",
                idempotency_key=f"api:{slug}:mail", payload={"text": "Olá", "subject": "Sua consulta"},
                respect_window=False)
        inbound_id = conn.execute(insert(inbound_messages).values(
            org_id=world.org_id, channel_id=world.channels["whatsapp"], provider_message_id=f"in-{next(_ids)}",
            from_address="+5516999887766", text="bom dia", received_at=now).returning(inbound_messages.c.id)).scalar_one()
        conn.execute(insert(webhook_events).values(
            org_id=world.org_id, channel_id=world.channels["whatsapp"], provider="sandbox", events=1,
            body={"from": "[redacted]", "text": "[redacted]"}, received_at=now))
        record_contact_event(conn, org_id=world.org_id, contact_id=contact, type="stage_changed", stage="lead")
    process_inbound(rt, inbound_id)
    for mid in dispatch.claim_due(rt, limit=100):
        dispatch.send_one(rt, mid)
    ended = flows.flow(linear(node("inicio", "trigger"), node("fim", "end", outcome="converted")))
    done_run = flows.enroll(ended, contact)
    waiting = flows.flow(linear(node("inicio", "trigger"),
                                node("msg", "action", mode="template", template="followup_checkin"),
                                node("espera", "wait", mode="fixed", minutes=60), node("fim", "end", outcome="exhausted")))
    live_run = flows.enroll(waiting, world.contact(name="Bia", phone="+5516911112222", email=None))
    flows.run()
    with rt.db.begin() as conn:
        conn.execute(insert(inbox_items).values(org_id=world.org_id, kind="message_dead", message_id=adhoc,
                                                detail="x", dedupe_key=f"message:{adhoc}:dead", created_at=now))
    assert world.message(adhoc).status == "sent" and world.message(adhoc).body == "oi"
    return world, flows, {"adhoc": adhoc, "inbound": inbound_id, "done_run": done_run, "live_run": live_run}


def _now():
    from engine.core import clock

    return clock.now()


def count(rt, table, org_id: int, *where) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(table.c.org_id == org_id, *where)).scalar_one()


def texts(rt, org_id: int) -> int:
    """Messages of the org that still carry a text."""
    return count(rt, messages, org_id, messages.c.body.is_not(None))


def test_texts_go_after_90_days_and_rows_after_two_years_only_in_the_org_that_says_so(rt, clock):
    a, a_flows, a_ids = tenant(rt, "clinica-a")
    b, _, _ = tenant(rt, "clinica-b")
    with rt.db.begin() as conn:
        retention.set_retention(conn, b.org_id, queue_days=365, events_days=1000)
    sent_a, texts_b, events_b = count(rt, messages, a.org_id), texts(rt, b.org_id), count(rt, message_events, b.org_id)
    assert texts(rt, a.org_id) >= 3 and count(rt, sandbox_messages, a.org_id) >= 3

    clock.advance(timedelta(days=89))
    assert retention.run_org(rt.db, a.org_id).total == 0  # nothing is old enough yet

    clock.advance(timedelta(days=2))
    result = retention.run_org(rt.db, a.org_id)
    assert result.done and result.counts["messages_anonymised"] == 2 and result.counts["sandbox_deleted"] == 3
    assert result.counts["inbound_anonymised"] == 1 and result.counts["webhook_bodies_removed"] == 1
    adhoc = a.message(a_ids["adhoc"])
    assert (adhoc.body, adhoc.status, adhoc.anonymised_at is not None) == (None, "sent", True)
    assert adhoc.payload == {"request_sha256": "f" * 64}  # the API's Idempotency-Key still answers
    assert adhoc.sent_at is not None  # the counts stay
    # The live follow-up's message is kept for its run; every other text is gone.
    [followup] = a_flows.followups(a_ids["live_run"])
    assert followup.body is not None and texts(rt, a.org_id) == 1
    assert count(rt, sandbox_messages, a.org_id) == 0
    with rt.db.connect() as conn:
        reply = conn.execute(select(inbound_messages).where(inbound_messages.c.id == a_ids["inbound"])).one()
        body = conn.execute(select(webhook_events.c.body).where(webhook_events.c.org_id == a.org_id)).scalar()
    assert (reply.text, reply.from_address, reply.intent, reply.outcome) == (None, None, reply.intent, "free_text")
    assert body is None
    assert count(rt, messages, a.org_id) == sent_a  # nothing deleted yet
    # Org B keeps a year of texts: untouched.
    assert texts(rt, b.org_id) == texts_b and count(rt, message_events, b.org_id) == events_b
    assert retention.run_org(rt.db, a.org_id).total == 0  # a second run finds nothing more

    clock.advance(timedelta(days=731 - 91))
    result = retention.run_org(rt.db, a.org_id)
    assert result.done and result.counts["messages_deleted"] == sent_a - 1
    assert count(rt, messages, a.org_id) == 1  # the live run's message
    assert count(rt, message_events, a.org_id, message_events.c.message_id != followup.id) == 0
    assert count(rt, inbound_messages, a.org_id) == 0 and count(rt, webhook_events, a.org_id) == 0
    assert count(rt, contact_events, a.org_id) == 0
    with rt.db.connect() as conn:
        item = conn.execute(select(inbox_items.c.message_id).where(inbox_items.c.org_id == a.org_id)).one()
        done_events = conn.execute(select(func.count()).select_from(enrollment_events).where(
            enrollment_events.c.enrollment_id == a_ids["done_run"])).scalar_one()
        live_events = conn.execute(select(func.count()).select_from(enrollment_events).where(
            enrollment_events.c.enrollment_id == a_ids["live_run"])).scalar_one()
        live_status = conn.execute(select(enrollments.c.status).where(enrollments.c.id == a_ids["live_run"])).scalar()
    assert item.message_id is None  # the operator's item stays, its link to the deleted message goes
    assert done_events == 0 and live_events > 0 and live_status == "active"
    # B: two years are not its 1000 days; its texts went after its 365.
    assert count(rt, messages, b.org_id) == sent_a and count(rt, message_events, b.org_id) >= events_b
    assert retention.run_org(rt.db, b.org_id).counts["messages_deleted"] == 0


def test_the_dashboard_keeps_its_30_days_and_settings_have_floors(rt, clock):
    world, _, _ = tenant(rt, "clinica-a")
    with rt.db.begin() as conn:
        with pytest.raises(DomainError):
            retention.set_retention(conn, world.org_id, events_days=30)  # the dashboard counts 30 days
        with pytest.raises(DomainError):
            retention.set_retention(conn, world.org_id, queue_days=6)
        with pytest.raises(DomainError):
            retention.set_retention(conn, world.org_id, queue_days=200, events_days=100)
        assert retention.set_retention(conn, world.org_id, queue_days=7, events_days=31) == (7, 31)

    def dashboard() -> tuple[dict, dict]:
        now = _now()
        start = now - timedelta(days=29)
        with rt.db.connect() as conn:
            rows = conn.execute(select(messages.c.channel_kind, messages.c.sent_at, messages.c.delivered_at,
                                       messages.c.read_at, messages.c.failed_at).where(
                messages.c.org_id == world.org_id)).all()
        from zoneinfo import ZoneInfo

        return tally(rows, start.replace(hour=0), ZoneInfo("America/Sao_Paulo"))

    clock.advance(timedelta(days=29))
    before = dashboard()
    assert sum(sum(v.values()) for v in before[1].values()) >= 3
    result = retention.run_org(rt.db, world.org_id)
    assert result.counts["messages_anonymised"] == 2 and result.counts["messages_deleted"] == 0
    assert dashboard() == before  # texts gone, every count the dashboard shows unchanged
    # At the shortest events retention, rows go only once they left the dashboard's 30 days.
    clock.advance(timedelta(days=3))
    before = dashboard()
    assert retention.run_org(rt.db, world.org_id).counts["messages_deleted"] == 2
    assert dashboard() == before


def test_batches_walk_the_rows_and_a_budget_resumes_where_it_stopped(rt, clock):
    world, _, _ = tenant(rt, "clinica-a")
    with rt.db.begin() as conn:
        for i in range(7):
            enqueue(conn, org_id=world.org_id, contact_id=world.messages()[0].contact_id, channel_kind="email",
                    purpose="adhoc", idempotency_key=f"k{i}", payload={"text": "x"}, respect_window=False)
    for mid in dispatch.claim_due(rt, limit=100):
        dispatch.send_one(rt, mid)
    clock.advance(timedelta(days=91))
    dry = retention.run_org(rt.db, world.org_id, dry_run=True)
    assert dry.counts["messages_anonymised"] == 9 and texts(rt, world.org_id) == 10  # a dry run changes nothing
    partial = retention.run_org(rt.db, world.org_id, batch=3, max_batches=2)
    assert not partial.done and partial.counts == {"messages_anonymised": 6}
    rest = retention.run_org(rt.db, world.org_id, batch=3)
    assert rest.done and 6 + rest.counts["messages_anonymised"] == dry.counts["messages_anonymised"]
    assert {k: v for k, v in rest.counts.items() if k != "messages_anonymised"} == \
        {k: v for k, v in dry.counts.items() if k != "messages_anonymised"}


def _runs(rt) -> list[tuple[int, str, bool]]:
    with rt.db.connect() as conn:
        return [(r.org_id, r.day, r.finished_at is not None) for r in conn.execute(
            select(retention_runs).order_by(retention_runs.c.org_id, retention_runs.c.day))]


def test_the_scheduler_runs_it_once_a_day_per_org_after_3_am(rt, clock):
    a, _, _ = tenant(rt, "clinica-a")
    b = World(rt, slug="clinica-b", timezone="America/Manaus")  # an hour behind São Paulo
    scheduler = Scheduler(rt, lambda ids: None)
    clock.set(local(2027, 3, 10, 2, 55))
    assert scheduler.tick().retained == 0 and _runs(rt) == []
    clock.set(local(2027, 3, 10, 3, 5))  # 02:05 in Manaus
    tick = scheduler.tick()
    assert tick.retained >= 3 and _runs(rt) == [(a.org_id, "2027-03-10", True)]
    assert texts(rt, a.org_id) == 1
    clock.set(local(2027, 3, 10, 4, 5))
    assert scheduler.tick().retained == 0
    assert _runs(rt) == [(a.org_id, "2027-03-10", True), (b.org_id, "2027-03-10", True)]
    # A second scheduler (a standby that took the lock, a restart) does not run the day again.
    clock.set(local(2027, 3, 10, 23, 0))
    assert Scheduler(rt, lambda ids: None).tick().retained == 0 and len(_runs(rt)) == 2
    clock.set(local(2027, 3, 11, 3, 1))
    scheduler.tick()
    assert (a.org_id, "2027-03-11", True) in _runs(rt)


def test_a_run_that_runs_out_of_budget_goes_on_at_the_next_pass(rt, clock):
    world, _, _ = tenant(rt, "clinica-a")
    daily = retention.DailyRetention(rt.db, budget=1, batch=1)
    clock.set(local(2027, 3, 10, 3, 0))
    passes = 0
    while not _runs(rt) or not _runs(rt)[0][2]:
        daily.maybe_run()  # no CHECK_EVERY wait while a run is under way
        passes += 1
        assert passes < 100
    assert passes > 3 and texts(rt, world.org_id) == 1
    with rt.db.connect() as conn:
        counts = conn.execute(select(retention_runs.c.counts)).scalar_one()
    assert (counts["messages_anonymised"], counts["sandbox_deleted"], counts["inbound_anonymised"]) == (2, 3, 1)


def test_lembra_retention_run_and_dry_run(rt, clock, database_url):
    world, _, _ = tenant(rt, "clinica-a")
    runner = CliRunner()
    env = lembra_env(database_url)
    clock.advance(timedelta(days=91))
    dry = runner.invoke(main, ["retention", "run", "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert "clinica-a: would change" in dry.output and "messages_anonymised" in dry.output
    assert texts(rt, world.org_id) >= 3
    real = runner.invoke(main, ["retention", "run", "--org", "clinica-a"], env=env)
    assert real.exit_code == 0 and "clinica-a: changed" in real.output
    assert texts(rt, world.org_id) == 1
    shown = runner.invoke(main, ["retention", "set", "--org", "clinica-a", "--events-days", "20"], env=env)
    assert shown.exit_code == 2 and "31" in shown.output
    assert runner.invoke(main, ["retention", "set", "--org", "clinica-a", "--queue-days", "30"], env=env).exit_code == 0
    listing = runner.invoke(main, ["retention", "show", "--org", "clinica-a"], env=env)
    assert "texts 30 days, rows and events 730 days" in listing.output
