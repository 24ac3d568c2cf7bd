"""Before the provider call: re-check every claimed message of a batch, in one transaction and a
few set-based statements (`check`; the messages left waiting for their recipient's slot go back
to the queue in a second one); the ones that may go are marked `sending` as their calls begin,
a wave at a time (engine/messaging/dispatch/waves.py).

Everything that can have changed since the claim is checked again here, at send time: the
contact's consent and opt-outs, the appointment (cancelled, moved), the follow-up run, expiry,
the sending window, the channel, the template, and the number's pacing slot. A message that may
not go is settled on the spot (cancelled, expired, deferred, failed…) with its own event; one
that may go stays `claimed` until its wave is marked.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from datetime import time as dt_time
from typing import Any, Sequence
from zoneinfo import ZoneInfo

from sqlalchemy.engine import Connection

from engine.core import clock
from engine.messaging.dispatch import batch as batches
from engine.messaging.dispatch.outcomes import fail_in_tx, retry_or_give_up
from engine.messaging.dispatch.ready import Ready
from engine.messaging.optout_links import OptOutTarget, make_url
from engine.messaging.meta_categories import MARKETING
from engine.messaging.pricing import billing_columns
from engine.queue.address_optouts import MARKETING_OPTED_OUT
from engine.queue import recipient_pacing
from engine.queue.outbox import defer_many, transition
from engine.queue.pacing import MAX_WAIT as MAX_PACING_WAIT
from engine.queue.pacing import DbPacingStore
from engine.messaging.render import TemplateError
from engine.store.runtime import Runtime
from engine.messaging.templates import MissingAddress, render_message
from engine.reminders.windows import earliest_allowed_after, is_allowed, policy_for
from gateway import registry
from gateway.crypto import CryptoError
from gateway.pacing import PacingPolicy, Reservation

LIVE_APPOINTMENT = ("scheduled", "confirmed")
#: Messages that must reach a contact even though they just opted out (the goodbye).
OPT_OUT_EXEMPT = ("optout_confirmation",)


def check(rt: Runtime, message_ids: Sequence[int]) -> tuple[list[Ready], dict[int, str]]:
    """Check the claimed messages among `message_ids`; returns those that may go (in order, still
    `claimed`) and, for every other id, what became of it (`not_claimed`, `cancelled`, `deferred`,
    `failed`…)."""
    now = clock.now()
    outcomes: dict[int, str] = {}
    ready: list[Ready] = []
    window_open: dict[int, bool] = {}  # per org: `now` is the batch's, and so is the answer
    with rt.db.begin() as conn:
        batch = batches.load(conn, message_ids, keyring=rt.keyring)
        for msg in batch.messages:
            checked = _check(conn, rt, batch, msg, now, window_open)
            if isinstance(checked, str):
                outcomes[msg.id] = checked
            else:
                ready.append(checked)
        later = _space_recipients(conn, rt, ready, now)
    if later:
        # In a transaction of their own, so that the recipients' rows `reserve` locked are
        # released by the commit right after it: a wave of another batch counting one of them
        # again waits for that commit, not for the deferrals' statements (a crash in between
        # leaves these `claimed`: handed out again when their lease runs out, reserved again).
        deferred = [(item.msg.org_id, item.msg.id, later[item.msg.id]) for item in ready if item.msg.id in later]
        with rt.db.begin() as conn:
            moved = set(defer_many(conn, deferred, "pair_rate_limit"))
        outcomes.update({mid: "deferred" if mid in moved else "not_claimed" for _, mid, _ in deferred})
        ready = [item for item in ready if item.msg.id not in later]
    loaded = {msg.id for msg in batch.messages}
    for mid in message_ids:
        if mid not in loaded:
            outcomes[mid] = "not_claimed"
    return ready, outcomes


def _check(conn: Connection, rt: Runtime, batch: batches.Batch, msg: Any, now: datetime,
           window_open: dict[int, bool]) -> Ready | str:
    """Whether one claimed message may go now; settles it (and says how) when it may not.
    `window_open` keeps, per org, whether its sending window is open `now`."""
    org_id = msg.org_id
    org = batch.orgs[org_id]
    contact = batch.contacts[(org_id, msg.contact_id)]
    appointment = batch.appointments[(org_id, msg.appointment_id)] if msg.appointment_id is not None else None

    def settle(status: str, event: str, reason: str, **values: Any) -> str:
        transition(conn, org_id, msg.id, ("claimed",), status, event,
                   values={"lease_until": None, "skip_reason": reason, **values}, detail={"reason": reason})
        return status

    if contact.erased_at is not None:
        return settle("cancelled", "cancelled", "contact_erased")
    refusal = None if msg.purpose in OPT_OUT_EXEMPT else batch.refusals.get((org_id, msg.contact_id, msg.channel_kind))
    if refusal is not None:
        return settle("cancelled", "cancelled", refusal)
    if appointment is not None and msg.rule_id is not None:
        trigger = batch.triggers.get((org_id, msg.rule_id))
        if trigger != "on_cancel" and appointment.status not in LIVE_APPOINTMENT + ("completed",):
            return settle("cancelled", "cancelled", "appointment_cancelled")
        if msg.appointment_starts_at is not None and appointment.starts_at != msg.appointment_starts_at:
            # Give the key (which names the old time) up, as populate does for moved appointments.
            return settle("cancelled", "cancelled", "appointment_moved",
                          idempotency_key=f"{msg.idempotency_key}:moved:{msg.id}")
    if msg.enrollment_id is not None:
        # A follow-up whose run was stopped (opt-out, a person took over, cancelled) stays unsent.
        if batch.run_statuses.get((org_id, msg.enrollment_id)) in ("cancelled", "paused_handoff"):
            return settle("cancelled", "cancelled", "enrollment_stopped")
    if msg.expires_at is not None and now >= msg.expires_at:
        return settle("expired", "expired", "expired_before_send")
    if msg.respect_window:
        if org_id not in window_open:
            window_open[org_id] = is_allowed(policy_for(org), now)
        if not window_open[org_id]:
            policy = policy_for(org)
            later = earliest_allowed_after(policy, now, msg.expires_at or now + timedelta(days=400))
            if later is None:
                return settle("skipped", "skipped", "no_allowed_instant")
            transition(conn, org_id, msg.id, ("claimed",), "pending", "deferred",
                       values={"lease_until": None, "next_attempt_at": later},
                       detail={"reason": "outside_sending_window"})
            return "deferred"

    channel = batch.channel(org_id, msg.channel_kind)
    if channel is None:
        if not batch.has_channel(org_id, msg.channel_kind):
            return fail_in_tx(conn, msg, "no_channel", "the org has no channel of this kind")
        # A channel exists but is broken or disabled: wait for the operator, like a transient error.
        return retry_or_give_up(conn, rt, msg, msg.attempts + 1, "channel_unavailable", None, now)
    optout_url = None
    if msg.channel_kind == "email":
        optout_url = make_url(rt.keyring, rt.settings.public_url,
                              OptOutTarget(org_id=org_id, contact_id=contact.id, kind="email"))
    locale = contact.locale or org.locale
    template = batch.templates.get((org_id, msg.template_key, msg.channel_kind, locale)) \
        if msg.template_key is not None else None
    try:
        rendered = render_message(conn, org=org, contact=contact, appointment=appointment, message=msg,
                                  conversation_open=batch.conversation_open(org_id, channel.id, contact.id, now),
                                  optout_url=optout_url, template=template)
    except TemplateError as exc:
        return fail_in_tx(conn, msg, "template_error", str(exc))
    except MissingAddress:
        return fail_in_tx(conn, msg, "no_address", "the contact has no address for this channel")
    billing = None
    if channel.provider == "meta":
        reference = rendered.outbound.template
        category = (batch.meta_category(conn, org_id, channel.id, reference.name, reference.language)
                    if reference else None)
        if category == MARKETING and contact.marketing_opted_out_at is not None:
            # Meta's 131050 came for this person: marketing is refused before it is sent.
            return settle("cancelled", "cancelled", MARKETING_OPTED_OUT)
        billing = billing_columns(category, rendered.outbound.conversation_open, contact.phone)
    try:
        # Built (and cached) before any slot is reserved: a cold start must not sit between
        # the reserved instant and the moment on the wire.
        provider = rt.providers.get(channel)
    except (CryptoError, registry.UnknownProvider):
        return retry_or_give_up(conn, rt, msg, msg.attempts + 1, "channel_misconfigured", None, now)
    # Reserve the number's slot last, right before the row is marked sending, so the
    # reserved instant and the moment on the wire stay close.
    send_at = None
    pacing = PacingPolicy.from_channel(channel.min_interval_ms, channel.daily_cap)
    if pacing is None and channel.paused_until is not None and channel.paused_until > now:
        # The provider paused the whole number (its throughput was reached): wait it out.
        transition(conn, org_id, msg.id, ("claimed",), "pending", "deferred",
                   values={"lease_until": None, "next_attempt_at": channel.paused_until},
                   detail={"reason": "throughput"})
        return "deferred"
    if pacing is not None:
        reservation = _reserve_slot(conn, org, channel, pacing, now)
        if reservation.over_cap or reservation.at - now > MAX_PACING_WAIT:
            reason = "daily_cap" if reservation.over_cap else "pacing"
            transition(conn, org_id, msg.id, ("claimed",), "pending", "deferred",
                       values={"lease_until": None, "next_attempt_at": reservation.at},
                       detail={"reason": reason})
            return "deferred"
        send_at = reservation.at
    return Ready(msg=msg, channel=channel, rendered=rendered, provider=provider, send_at=send_at, billing=billing)


def _space_recipients(conn: Connection, rt: Runtime, ready: list[Ready], now: datetime) -> dict[int, datetime]:
    """Of the messages that may go, those whose provider spaces the sends to one recipient (Meta:
    6 s) take their recipient's slot, all in one statement; returns, for each one whose
    recipient's slot has not come yet, when it has (it goes back to the queue for it)."""
    spaced = [item for item in ready if type(item.provider).recipient_interval]
    if not spaced:
        return {}
    hasher = recipient_pacing.RecipientHasher(rt.keyring)
    for item in spaced:
        item.spacing = recipient_pacing.Want(
            item.msg.id, item.msg.org_id, item.channel.id,
            hasher(item.msg.org_id, item.channel.id, item.rendered.outbound.to),
            timedelta(seconds=type(item.provider).recipient_interval or 0), now)
    return recipient_pacing.reserve(conn, [item.spacing for item in spaced if item.spacing], now)


def _reserve_slot(conn: Connection, org: Any, channel: Any, policy: PacingPolicy, now: datetime) -> Reservation:
    """The channel's next send slot; days (for the daily cap) are the org's local days."""
    tz = ZoneInfo(org.timezone)
    today = now.astimezone(tz).date()
    next_day = datetime.combine(today + timedelta(days=1), dt_time(0), tzinfo=tz).astimezone(timezone.utc)
    return DbPacingStore(conn, org.id).reserve(channel.id, policy, now, today.isoformat(), next_day)
