"""engine.messaging.conversations.appointments_for: which appointment a reply is about, for a whole page
of replies in three queries (the console's Conversas lists 50 at a time)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

from sqlalchemy import event, update

from engine.messaging.conversations import appointments_for
from engine.store.models import messages
from tests.factories import World


def _reply(inbound_id: int, contact_id: int | None, channel_id: int, in_reply_to: str | None = None,
           flow_enrollment_id: int | None = None):
    return SimpleNamespace(id=inbound_id, contact_id=contact_id, channel_id=channel_id, in_reply_to=in_reply_to,
                           flow_enrollment_id=flow_enrollment_id)


def test_the_answered_message_then_the_next_booking_then_the_last_one(rt, clock):
    world = World(rt)
    channel = world.channel("whatsapp")
    world.rule(1440)
    now = clock.now()
    ana = world.contact(name="Ana", phone="+5516999000001")
    past_ana = world.appointment(ana, now - timedelta(days=10))
    soon = world.appointment(ana, now + timedelta(days=2))
    later = world.appointment(ana, now + timedelta(days=5))
    bia = world.contact(name="Bia", phone="+5516999000002")
    old = world.appointment(bia, now - timedelta(days=30))
    last = world.appointment(bia, now - timedelta(days=3))
    [later_reminder] = [m for m in world.messages() if m.appointment_id == later]
    with rt.db.begin() as conn:
        conn.execute(update(messages).where(messages.c.id == later_reminder.id)
                     .values(provider_message_id="wamid.LATER", channel_id=channel, status="sent"))

    other = World(rt, "outra")
    other_channel = other.channel("whatsapp")
    stranger = other.contact(name="Ana da outra", phone="+5516999000001")
    other.appointment(stranger, now + timedelta(days=1))

    replies = [_reply(1, ana, channel, "wamid.LATER"), _reply(2, ana, channel), _reply(3, bia, channel),
               _reply(4, ana, channel, "wamid.UNKNOWN"), _reply(5, None, channel),
               _reply(6, stranger, other_channel)]
    statements: list[str] = []
    with rt.db.connect() as conn:
        event.listen(conn, "before_cursor_execute", lambda *a: statements.append(a[2]))
        found = appointments_for(conn, world.org_id, replies)
    assert {k: v.id for k, v in found.items()} == {1: later, 2: soon, 3: last, 4: soon}
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 3, \
        "one query per way of finding it, whatever the page's size"
    assert past_ana not in {v.id for v in found.values()} and old not in {v.id for v in found.values()}
