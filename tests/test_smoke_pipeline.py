"""The reminder pipeline end to end in one process: populate → claim → send through the sandbox."""

from datetime import timedelta

from sqlalchemy import select

from engine.messaging import dispatch
from engine.store.models import sandbox_messages
from tests.factories import World


def test_reminder_goes_out_once_at_its_time(rt, clock):
    world = World(rt)
    world.channel("whatsapp")
    world.rule(1440)
    contact = world.contact()
    world.appointment(contact, clock.now() + timedelta(hours=29))
    [message] = world.messages()
    assert message.status == "pending"
    assert message.due_at == clock.now() + timedelta(hours=5)

    assert dispatch.claim_due(rt, limit=10) == []
    clock.advance(timedelta(hours=5))
    ids = dispatch.claim_due(rt, limit=10)
    assert ids == [message.id]
    assert dispatch.send_one(rt, message.id) == "sent"
    assert dispatch.send_one(rt, message.id) == "not_claimed"
    with rt.db.connect() as conn:
        sent = conn.execute(select(sandbox_messages)).all()
    assert len(sent) == 1
    assert "Lembrete" in sent[0].body
