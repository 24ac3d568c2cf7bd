"""A provider status that arrives before Lembra recorded its send.

A batch's calls are settled together, after the slowest of them, and Meta's `sent` and
`delivered` often come back within the second: the webhook can find its message still `sending`,
with no provider id on it yet. Such a status waits in `early_statuses` and the scheduler applies
it once the send is recorded; a `delivered` or a `failed` is never lost. Here the Graph fake
posts the signed status webhook to Lembra from inside the send call, before it answers: the
exact interleaving, with no timing.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import json
from datetime import timedelta
from typing import Any, Callable

from sqlalchemy import func, select

from admin.app import create_app
from engine.messaging import dispatch, statuses
from engine.tenants.channels import create_channel
from engine.store.models import early_statuses, messages
from engine.store.runtime import Runtime
from engine.fleet.scheduler import Scheduler
from tests.factories import World, local
from tests.fakes.meta import sample_json
from tests.fakes.server import FakeServer, Recorded, Reply

APP_SECRET = "meta-app-secret"
APPOINTMENT = local(2026, 12, 3, 14, 0)
DUE = local(2026, 12, 2, 14, 0)


def status_body(wamid: str, status: str, ts: int, to: str, **extra: Any) -> dict[str, Any]:
    """A status webhook in the shape of the fixture webhook_status_delivered.json."""
    data = sample_json("webhook_status_delivered.json")
    value = data["entry"][0]["changes"][0]["value"]
    item = copy.deepcopy(value["statuses"][0])
    item.update(id=wamid, status=status, timestamp=str(ts), recipient_id=to, **extra)
    value["contacts"][0]["wa_id"] = to
    value["statuses"] = [item]
    return data


def failed_extra() -> dict[str, Any]:
    """The `errors` of webhook_status_failed_130472.json."""
    failed = sample_json("webhook_status_failed_130472.json")
    return {"errors": failed["entry"][0]["changes"][0]["value"]["statuses"][0]["errors"]}


class EagerGraph(FakeServer):
    """The Graph API, which reports a status for each message before it answers the send:
    `report(wamid, request)` posts the webhook(s) to Lembra from the call's own thread."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.report: Callable[[str, dict[str, Any]], None] = lambda wamid, body: None
        super().__init__(self._answer)

    def _answer(self, request: Recorded) -> Reply:
        body = request.json()
        wamid = f"wamid.EARLY{next(self._ids):04d}"
        self.report(wamid, body)
        return Reply(200, {"messaging_product": "whatsapp", "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                           "messages": [{"id": wamid}]})


class Webhooks:
    """Lembra's webhook endpoint, as Meta calls it (signed with the app secret)."""

    def __init__(self, rt: Runtime) -> None:
        self.client = create_app(rt).test_client()
        self.answers: list[int] = []

    def post(self, channel_id: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        signature = "sha256=" + hmac.new(APP_SECRET.encode(), raw, hashlib.sha256).hexdigest()
        response = self.client.post(f"/webhooks/meta/{channel_id}", data=raw, headers={
            "Content-Type": "application/json", "X-Hub-Signature-256": signature})
        self.answers.append(response.status_code)


def meta_world(rt: Runtime, graph: EagerGraph, patients: int, slug: str = "clinica") -> tuple[World, int, list[int]]:
    world = World(rt, slug)
    with rt.db.begin() as conn:
        channel_id = create_channel(
            conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="meta", name="WhatsApp oficial",
            credentials={"phone_number_id": "1122334455667", "access_token": "EAAG-token",
                         "app_secret": APP_SECRET, "verify_token": "verifique", "base_url": graph.url})
    world.channels["whatsapp"] = channel_id
    world.rule(1440, kinds=("whatsapp",))
    for i in range(patients):
        world.appointment(world.contact(name=f"Paciente {i}", phone=f"+55169990000{i:02d}"), APPOINTMENT)
    return world, channel_id, [m.id for m in world.messages()]


def parked(rt: Runtime) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(func.count()).select_from(early_statuses)).scalar_one()


def test_delivered_and_read_reported_during_the_batch_are_applied_once_the_send_is_recorded(rt, clock):
    with EagerGraph() as graph:
        world, channel_id, ids = meta_world(rt, graph, 3)
        hooks = Webhooks(rt)
        clock.set(DUE)
        at = int(DUE.timestamp())
        graph.report = lambda wamid, body: [hooks.post(channel_id, status_body(wamid, s, at + n, body["to"]))
                                            for n, s in enumerate(("sent", "delivered", "read"))]
        assert sorted(dispatch.claim_due(rt, limit=10)) == sorted(ids)

        assert dispatch.send_batch(rt, ids) == {mid: "sent" for mid in ids}

        assert hooks.answers == [200] * 9
        assert {m.status for m in world.messages()} == {"sent"}, "nothing moved while the sends were in flight"
        assert parked(rt) == 9
        tick = Scheduler(rt, enqueue=lambda batch: None).tick()
        assert tick.settled == 9
        rows = {m.id: m for m in world.messages()}
        for mid in ids:
            assert rows[mid].status == "read"
            assert rows[mid].delivered_at == DUE + timedelta(seconds=1)
            assert rows[mid].read_at == DUE + timedelta(seconds=2)
            assert world.events(mid) == ["queued", "claimed", "sending", "sent", "delivered", "read"]
        assert parked(rt) == 0
        assert Scheduler(rt, enqueue=lambda batch: None).tick().settled == 0


def test_a_failure_reported_during_the_batch_fails_the_message_after_it_is_recorded(rt, clock):
    with EagerGraph() as graph:
        world, channel_id, [mid] = meta_world(rt, graph, 1)
        hooks = Webhooks(rt)
        clock.set(DUE)
        graph.report = lambda wamid, body: hooks.post(
            channel_id, status_body(wamid, "failed", int(DUE.timestamp()), body["to"], **failed_extra()))
        dispatch.claim_due(rt, limit=10)

        assert dispatch.send_batch(rt, [mid]) == {mid: "sent"}
        assert statuses.settle_early(rt) == 1

        [row] = world.messages()
        assert (row.status, row.error_code) == ("failed", "130472")
        assert world.events(mid)[-2:] == ["sent", "failed"]


def test_a_status_for_a_send_whose_worker_died_settles_the_unknown_outcome(rt, clock):
    """The status echoes our reference: the provider's id goes on the `sending` row at once, so
    the parked status meets it when the lease sweep parks the row as unknown."""
    with EagerGraph() as graph:
        world, channel_id, [mid] = meta_world(rt, graph, 1)
        hooks = Webhooks(rt)
        clock.set(DUE)
        dispatch.claim_due(rt, limit=10)
        prepared, _ = dispatch.prepare(rt, [mid])  # marked `sending`; the worker dies in the call
        assert [p.message_id for p in prepared] == [mid]
        body = status_body("wamid.DIED", "delivered", int(DUE.timestamp()), "5516999000000",
                           biz_opaque_callback_data=str(mid))
        hooks.post(channel_id, body)
        assert hooks.answers == [200] and parked(rt) == 1
        [row] = world.messages()
        assert (row.status, row.provider_message_id) == ("sending", "wamid.DIED")

        clock.advance(rt.settings.lease + timedelta(seconds=1))
        tick = Scheduler(rt, enqueue=lambda batch: None).tick()

        assert (tick.unknown, tick.settled) == (1, 1)
        [row] = world.messages()
        assert (row.status, row.error_code) == ("delivered", None)


def test_a_replayed_status_parks_once_and_an_unmatched_one_is_dropped_after_a_day(rt, clock):
    with EagerGraph() as graph:
        world, channel_id, _ = meta_world(rt, graph, 1)
        hooks = Webhooks(rt)
        clock.set(DUE)
        body = status_body("wamid.FROM-THE-PHONE", "delivered", int(DUE.timestamp()), "5516999000000")
        hooks.post(channel_id, body)
        hooks.post(channel_id, body)
        assert hooks.answers == [200, 200] and parked(rt) == 1

        assert statuses.settle_early(rt) == 0, "no message of Lembra's carries that id"
        clock.advance(statuses.KEEP_UNMATCHED - timedelta(minutes=1))
        assert statuses.settle_early(rt) == 0 and parked(rt) == 1
        clock.advance(timedelta(minutes=2))
        assert statuses.settle_early(rt) == 1 and parked(rt) == 0
        assert {m.status for m in world.messages()} == {"pending"}


def test_a_status_posted_to_another_orgs_channel_never_touches_this_orgs_message(rt, clock):
    with EagerGraph() as graph:
        world, channel_id, [mid] = meta_world(rt, graph, 1)
        other, other_channel, _ = meta_world(rt, graph, 0, slug="outra")
        hooks = Webhooks(rt)
        clock.set(DUE)
        dispatch.claim_due(rt, limit=10)
        assert dispatch.send_batch(rt, [mid]) == {mid: "sent"}
        [row] = world.messages()

        # The other clinic's endpoint (its own secret is the same here) reports this org's wamid.
        hooks.post(other_channel, status_body(row.provider_message_id, "read", int(DUE.timestamp()), "5516999000000"))
        assert hooks.answers == [200] and parked(rt) == 1
        assert statuses.settle_early(rt) == 0

        [row] = world.messages()
        assert row.status == "sent" and row.read_at is None
        with rt.db.connect() as conn:
            assert conn.execute(select(early_statuses.c.org_id)).scalars().all() == [other.org_id]
            assert conn.execute(select(messages.c.status).where(messages.c.org_id == other.org_id)).all() == []
