"""Dramatiq actors. They carry ids only; the rows in the database say what to do, so an actor
that runs twice (a redelivered message) finds the work done and does nothing.

Import this module through `engine.fleet.broker.setup_broker`, which installs the broker first.
"""

from __future__ import annotations

import logging

import dramatiq

from engine.messaging import dispatch, inbound, turn
from engine.store import runtime
from engine.flows.runtime import advance_claimed
from engine.tenants.webhooks import delivery as webhook_delivery

log = logging.getLogger(__name__)

ACTOR_NAMES = ("send_messages", "process_inbound", "advance_enrollments", "deliver_webhooks")
SEND_QUEUE = "lembra_send"
INBOUND_QUEUE = "lembra_inbound"
FLOWS_QUEUE = "lembra_flows"
WEBHOOKS_QUEUE = "lembra_webhooks"


@dramatiq.actor(queue_name=SEND_QUEUE, max_retries=0, time_limit=15 * 60 * 1000)
def send_messages(message_ids: list[int]) -> None:
    """Send the claimed messages (a batch). One message's failure never stops the others; a crash
    of the whole batch leaves its rows to their leases, and the sweep recovers them."""
    try:
        dispatch.send_batch(runtime.current(), message_ids)
    except Exception:
        log.exception("send crashed", extra={"count": len(message_ids)})


@dramatiq.actor(queue_name=INBOUND_QUEUE, max_retries=3, min_backoff=1000, time_limit=5 * 60 * 1000)
def process_inbound(inbound_ids: list[int]) -> None:
    """Act on stored patient messages (each exactly once, by compare-and-set), and answer each at
    once where it calls for an answer now (`turn.answer_now`)."""
    rt = runtime.current()
    for inbound_id in inbound_ids:
        if inbound.process_inbound(rt, int(inbound_id)) is not None:
            turn.answer_now(rt, int(inbound_id))


@dramatiq.actor(queue_name=FLOWS_QUEUE, max_retries=0, time_limit=15 * 60 * 1000)
def advance_enrollments(pairs: list[list[int]]) -> None:
    """Advance each claimed enrollment ([id, revision] pairs) by its due step."""
    advance_claimed(runtime.current(), pairs)


@dramatiq.actor(queue_name=WEBHOOKS_QUEUE, max_retries=0, time_limit=15 * 60 * 1000)
def deliver_webhooks(claims: list[list[int]]) -> None:
    """POST each claimed webhook delivery ([id, revision] pairs) to the clinic's system. A crash
    leaves the rest to their leases, and the scheduler's sweep puts them back."""
    try:
        webhook_delivery.deliver_claimed(runtime.current(), claims)
    except Exception:
        log.exception("webhook delivery task crashed", extra={"count": len(claims)})
