"""The outbox's enqueue: one message per org and idempotency key, ever, and one `queued` event per
message written, whether the messages come one at a time or a claim's worth in one statement: a
`pending` one's as it is written, a `new` one's when the planner places it."""

from __future__ import annotations

from sqlalchemy import select

from engine.queue.outbox import Outgoing, enqueue, enqueue_many
from engine.reminders.populate import plan_new
from engine.store.models import message_events, messages
from tests.factories import World


def _outgoing(world: World, contact: int, key: str, **more) -> Outgoing:
    return Outgoing(org_id=world.org_id, contact_id=contact, channel_kind="whatsapp", purpose="followup",
                    idempotency_key=key, template_key="followup_checkin", **more)


def test_a_batch_writes_each_key_once_and_says_which_were_already_taken(rt, clock):
    world, other = World(rt, "clinica-a"), World(rt, "clinica-b")
    ana, bia = world.contact(), other.contact()
    with rt.db.begin() as conn:
        first = enqueue(conn, org_id=world.org_id, contact_id=ana, channel_kind="whatsapp", purpose="followup",
                        idempotency_key="k-1", template_key="followup_checkin")
    with rt.db.begin() as conn:
        ids = enqueue_many(conn, [
            _outgoing(world, ana, "k-1"),  # taken before
            _outgoing(world, ana, "k-2", payload={"text": "Olá"}),
            _outgoing(world, ana, "k-2"),  # taken by the one before it
            _outgoing(other, bia, "k-1"),  # another org's key space
            _outgoing(world, ana, "k-3", respect_window=False),
        ])
    assert first is not None and ids[0] is None and ids[2] is None
    assert None not in (ids[1], ids[3], ids[4]) and len({first, ids[1], ids[3], ids[4]}) == 4
    with rt.db.connect() as conn:
        rows = {row.id: row for row in conn.execute(select(messages))}
        events = conn.execute(select(message_events.c.message_id, message_events.c.event, message_events.c.org_id)
                              .order_by(message_events.c.message_id)).all()
    assert (rows[ids[1]].payload, rows[ids[1]].status, rows[ids[1]].due_at) == ({"text": "Olá"}, "new", None)
    assert (rows[ids[4]].status, rows[ids[4]].due_at) == ("pending", clock.now())
    assert rows[ids[3]].org_id == other.org_id and rows[first].payload is None
    # The `new` ones wait for the planner's event; the `pending` one is queued now.
    assert [(e.message_id, e.event) for e in events] == [(ids[4], "queued")]
    with rt.db.begin() as conn:
        for org_id in (world.org_id, other.org_id):
            plan_new(conn, org_id)
    with rt.db.connect() as conn:
        events = conn.execute(select(message_events.c.message_id, message_events.c.event, message_events.c.org_id)
                              .order_by(message_events.c.message_id)).all()
    written = sorted(i for i in (first, ids[1], ids[3], ids[4]) if i is not None)
    assert [(e.message_id, e.event) for e in events] == [(i, "queued") for i in written]  # one each
    assert {e.org_id for e in events if e.message_id == ids[3]} == {other.org_id}


def test_an_empty_batch_writes_nothing(rt, clock):
    with rt.db.begin() as conn:
        assert enqueue_many(conn, []) == []
        assert conn.execute(select(messages.c.id)).first() is None
