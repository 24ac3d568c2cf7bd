"""The demo clinic `lembra up` seeds: what a newcomer's first conversation needs is there, once."""

from __future__ import annotations

from engine.fleet.demo import seed
from engine.flows.conversation.fields import list_fields


def test_the_demo_declares_the_fields_its_conversations_ask_for_and_seeds_once(rt):
    with rt.db.begin() as conn:
        first = seed(conn, rt.keyring)
    with rt.db.begin() as conn:
        again = seed(conn, rt.keyring)
    assert first.created and not again.created and again.org_id == first.org_id
    with rt.db.connect() as conn:
        found = {f.slug: (f.type, f.harvest) for f in list_fields(conn, first.org_id)}
    assert found == {"data": ("date", "any_reply"), "periodo": ("period", "any_reply"),
                     "horario": ("time", "any_reply")}
