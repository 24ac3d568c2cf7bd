"""Delivering webhooks: claim what is due, POST it signed, record the outcome, sweep lost leases.

The house pattern of the outbox and the follow-up runtime (engine/messaging/dispatch/claim.py,
engine/flows/runtime.py): the scheduler claims due deliveries with a lease (`FOR UPDATE SKIP
LOCKED` on PostgreSQL, `revision` bumped) and hands `[id, revision]` pairs to the `deliver_webhooks`
actor; the actor stamps `claim_started_at` just before each POST and writes the outcome with a
compare-and-set on the revision, so a claim that was swept and claimed again meanwhile cannot be
overwritten by the older one. A lease that runs out is swept: an attempt that started (its worker
died mid-POST: the receiver may have it) counts as a failed attempt and is retried after its
backoff; a claim no worker started goes back free. Either way it is retried, never lost.

Delivery is at least once: every attempt carries the same `webhook-id`, so the receiver drops a
repeat. The body is signed as the Standard Webhooks specification says, with its reference library.

Outcomes: a 2xx is `delivered`. Timeouts, connection errors, 5xx, 408 and 429 are transient: the
next attempt comes after BACKOFF (30 s, 2 min, 10 min, 1 h, 6 h; a 429's Retry-After when longer)
and after the last one the delivery is `dead`. Any other answer (4xx, a redirect) and an address
the egress guard refuses are permanent: `dead` at once. `last_error` keeps a catalogue code,
`last_status_code` the HTTP status, and the last attempt's answer is kept to show the org's admins
(`last_response_reason`, the start of `last_response_body` as text fit to show, `last_duration_ms`):
the clinic's own system's words, never logged.

A person's "Reenviar" (`resend`) puts a delivered or given-up delivery back in the queue as it is:
the same row, the same `webhook-id` (the receiver's dedupe key, so a receiver that already has it
drops the repeat) and a fresh round of retries counted from `resend_base`.
"""

from __future__ import annotations

import json
import logging
import time
import unicodedata
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Sequence

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection
from standardwebhooks import Webhook

from engine.core import clock
from engine.core.errors import DomainError
from engine.store.models import webhook_deliveries, webhook_endpoints
from engine.store.runtime import Runtime
from engine.tenants.webhooks.endpoints import endpoint_secret
from gateway import http
from gateway.crypto import CryptoError
from gateway.egress import InvalidAddress, endpoint
from gateway.errors import EgressRefused, ProviderError

log = logging.getLogger(__name__)

#: The wait before each retry, attempt by attempt; a transient failure after the last is `dead`.
BACKOFF = (timedelta(seconds=30), timedelta(minutes=2), timedelta(minutes=10), timedelta(hours=1),
           timedelta(hours=6))
#: How long one POST may take, connect to last byte (seconds), at most: a shorter
#: LEMBRA_SEND_TIMEOUT shortens it (`post_timeout`).
TIMEOUT = 10.0
#: How much of the receiver's answer is read (a longer one is a failed attempt).
MAX_ANSWER = 64 * 1024
#: How much of it is kept to show: characters of its body, of its status line's reason phrase.
ANSWER_CHARS = 2000
REASON_CHARS = 200
#: Unicode categories taken out of a kept answer: controls (but line breaks and tabs), invisible
#: formatting (a right-to-left override, a zero-width joiner) and lone surrogates.
_UNSHOWN = ("Cc", "Cf", "Cs")
#: Deliveries per worker task: each may take TIMEOUT, and all of them must fit in one lease.
TASK = 10
#: Codes of the transient failures (gateway/http.py's) and what the delivery log says of each.
_TRANSIENT = {"timeout": "webhook_timeout", "connect_timeout": "webhook_timeout",
              "connection_error": "webhook_connection_error", "http_429": "webhook_throttled"}


class Claim(NamedTuple):
    """A claimed delivery: its id and the revision its lease was taken at."""

    id: int
    revision: int


@dataclass(frozen=True)
class Answer:
    """What the receiver answered, fit to show: its reason phrase and the start of its body."""

    reason: str | None
    body: str | None


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to: `delivered`, `retry` or `dead`, the catalogue code of a failure,
    the HTTP status when there was an answer, the receiver's Retry-After (seconds), its answer and
    how long the attempt took (ms; None when nothing was sent)."""

    result: str
    code: str | None = None
    status: int | None = None
    retry_after: float | None = None
    answer: Answer | None = None
    duration_ms: int | None = None


class DeliveryNotFound(DomainError):
    """No such delivery of this endpoint in this org (another org's id included)."""

    def __init__(self) -> None:
        super().__init__("no such webhook delivery")


class ResendRefused(DomainError):
    """A delivery that cannot be sent again now: `code` is the catalogue's."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


# --- the scheduler's side ------------------------------------------------------------------------

def claim_due(rt: Runtime, *, limit: int, max_in_flight: int | None = None) -> list[Claim]:
    """Claim up to `limit` due deliveries (all orgs) with a lease; returns them in due order. With
    `max_in_flight`, no more than that many are leased at once: a backlog (a receiver back after an
    outage) is not all leased at once, to wait in the broker while its leases run out."""
    now = clock.now()
    with rt.db.begin() as conn:
        if max_in_flight is not None:
            in_flight = conn.execute(select(func.count()).select_from(webhook_deliveries)
                                     .where(webhook_deliveries.c.lease_until.is_not(None))).scalar_one()
            limit = min(limit, max(max_in_flight - in_flight, 0))
            if limit == 0:
                return []
        due = (select(webhook_deliveries.c.id)
               .where(webhook_deliveries.c.status == "pending", webhook_deliveries.c.lease_until.is_(None),
                      webhook_deliveries.c.next_attempt_at <= now)
               .order_by(webhook_deliveries.c.next_attempt_at, webhook_deliveries.c.id).limit(limit))
        if conn.dialect.name == "postgresql":
            due = due.with_for_update(skip_locked=True)
        # A locking CTE runs once (an IN subquery with SKIP LOCKED may run per row; see dispatch).
        due_cte = due.cte("due")
        rows = conn.execute(
            update(webhook_deliveries)
            .where(webhook_deliveries.c.id.in_(select(due_cte.c.id)), webhook_deliveries.c.status == "pending",
                   webhook_deliveries.c.lease_until.is_(None))
            .values(lease_until=now + rt.settings.lease, revision=webhook_deliveries.c.revision + 1,
                    claim_started_at=None)
            .returning(webhook_deliveries.c.id, webhook_deliveries.c.revision, webhook_deliveries.c.next_attempt_at)
        ).all()
    return [Claim(int(r.id), int(r.revision)) for r in sorted(rows, key=lambda r: (r.next_attempt_at, r.id))]


class Swept(NamedTuple):
    """What one sweep did with the deliveries whose lease ran out."""

    #: Attempts a worker started and did not finish: counted as failed, retried after the backoff.
    interrupted: int
    #: Claims no worker started: due again at once, attempts unchanged.
    requeued: int


def sweep_expired(rt: Runtime, *, limit: int | None = None) -> Swept:
    """Deliveries whose lease ran out, put back in the queue (see the module's docstring)."""
    now = clock.now()
    interrupted = requeued = 0
    with rt.db.begin() as conn:
        query = (select(webhook_deliveries)
                 .where(webhook_deliveries.c.status == "pending", webhook_deliveries.c.lease_until < now)
                 .order_by(webhook_deliveries.c.lease_until, webhook_deliveries.c.id))
        for row in conn.execute(query.limit(limit) if limit is not None else query).all():
            if row.claim_started_at is None:
                requeued += conn.execute(update(webhook_deliveries).where(
                    webhook_deliveries.c.id == row.id, webhook_deliveries.c.revision == row.revision,
                    webhook_deliveries.c.claim_started_at.is_(None))
                    .values(lease_until=None)).rowcount
            elif _finish(conn, row, row.revision, Outcome("retry", "webhook_interrupted"), now):
                interrupted += 1
    if interrupted:
        log.warning("webhook deliveries cut short swept for a retry", extra={"count": interrupted})
    if requeued:
        log.warning("webhook claims no worker started put back in the queue", extra={"count": requeued})
    return Swept(interrupted=interrupted, requeued=requeued)


def release_unhanded(rt: Runtime, claims: Sequence[Sequence[int]]) -> int:
    """Put back at once, free, claims the scheduler could not hand to the broker."""
    released = 0
    with rt.db.begin() as conn:
        for delivery_id, revision in claims:
            released += conn.execute(update(webhook_deliveries).where(
                webhook_deliveries.c.id == int(delivery_id), webhook_deliveries.c.revision == int(revision),
                webhook_deliveries.c.claim_started_at.is_(None), webhook_deliveries.c.status == "pending")
                .values(lease_until=None)).rowcount
    return released


# --- the worker's side ---------------------------------------------------------------------------

def post_timeout(rt: Runtime) -> float:
    """How long one POST may take here: TIMEOUT, or the send timeout when that is shorter. The
    settings keep the send timeout inside a lease, so a POST always fits in one; a lease shorter
    than TIMEOUT would otherwise leave every delivery `stale`, never begun and never failed."""
    return min(TIMEOUT, rt.settings.send_timeout)


def deliver_claimed(rt: Runtime, claims: Sequence[Sequence[int]], *, timeout: float | None = None) -> dict[int, str]:
    """Deliver each claimed delivery ([id, revision] pairs); returns each one's result
    (`delivered`, `retry`, `dead`, or `stale` when its claim was no longer this one)."""
    timeout = post_timeout(rt) if timeout is None else timeout
    client = http.Client(rt.settings.egress)  # every connection passes the egress guard, at send time
    results: dict[int, str] = {}
    try:
        for delivery_id, revision in claims:
            try:
                results[int(delivery_id)] = deliver_one(rt, client, int(delivery_id), int(revision), timeout=timeout)
            except Exception:  # noqa: BLE001 - one delivery's crash never stops the others; its lease runs out
                log.exception("webhook delivery crashed", extra={"delivery_id": int(delivery_id)})
                results[int(delivery_id)] = "crashed"
    finally:
        client.close()
    return results


def deliver_one(rt: Runtime, client: http.Client, delivery_id: int, revision: int, *,
                timeout: float | None = None) -> str:
    """One attempt of one claimed delivery; returns its result."""
    timeout = post_timeout(rt) if timeout is None else timeout
    now = clock.now()
    with rt.db.begin() as conn:
        row = conn.execute(select(webhook_deliveries).where(
            webhook_deliveries.c.id == delivery_id, webhook_deliveries.c.revision == revision,
            webhook_deliveries.c.status == "pending", webhook_deliveries.c.lease_until.is_not(None))).first()
        if row is None:
            return "stale"
        if row.lease_until - now < timedelta(seconds=timeout):
            return "stale"  # not begun: the sweep puts it back free when the lease runs out
        started = conn.execute(update(webhook_deliveries).where(
            webhook_deliveries.c.id == delivery_id, webhook_deliveries.c.revision == revision,
            webhook_deliveries.c.claim_started_at.is_(None)).values(claim_started_at=now)).rowcount
        if not started:
            return "stale"
        target = conn.execute(select(webhook_endpoints).where(
            webhook_endpoints.c.org_id == row.org_id, webhook_endpoints.c.id == row.endpoint_id)).first()
    secret = None
    if target is None or not target.active:
        outcome = Outcome("dead", "webhook_endpoint_inactive")
    else:
        try:
            secret = endpoint_secret(rt.keyring, target)
        except CryptoError:
            outcome = Outcome("dead", "webhook_secret_unreadable")
        else:
            outcome = post(client, target.url, secret, row.webhook_id, row.payload, timeout=timeout)
    with rt.db.begin() as conn:
        _finish(conn, row, revision, outcome, clock.now())
    log.info("webhook delivery attempted", extra={"delivery_id": row.id, "org_id": row.org_id,
                                                 "endpoint_id": row.endpoint_id, "result": outcome.result,
                                                 "code": outcome.code, "status": outcome.status})
    return outcome.result


def signed_request(secret: str, webhook_id: str, payload: Any, sent_at: datetime) -> tuple[bytes, dict[str, str]]:
    """The body and the Standard Webhooks headers of one attempt."""
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    signature = Webhook(secret).sign(webhook_id, sent_at, body)
    headers = {"Content-Type": "application/json", "webhook-id": webhook_id,
               "webhook-timestamp": str(int(sent_at.timestamp())), "webhook-signature": signature}
    return body, headers


def post(client: http.Client, url: str, secret: str, webhook_id: str, payload: Any, *,
         timeout: float = TIMEOUT) -> Outcome:
    """POST the payload signed; classify what came back."""
    try:
        endpoint(url)  # the shape again: a URL stored before a stricter check still may not go out
    except InvalidAddress as exc:
        return Outcome("dead", exc.code)
    # The signature's timestamp is the wall clock's, not the engine's: the receiver compares it
    # with its own clock to refuse replays, so it must say when the request really left.
    body, headers = signed_request(secret, webhook_id, payload, clock.SystemClock().now())
    answered: list[http.HttpResponse] = []

    def keep(response: http.HttpResponse) -> None:
        answered.append(response)  # a non-2xx answer, kept to show; the default mapping classifies it
        return None

    # How long the attempt took is the real time it took, whatever the engine's clock says.
    started = time.perf_counter()
    try:
        response = http.call(client, "POST", url, timeout=timeout, data=body, headers=headers,
                             max_bytes=MAX_ANSWER, classify=keep)
    except EgressRefused:
        return Outcome("dead", "egress_refused")
    except ProviderError as exc:
        return replace(_failure(exc), answer=answer_of(answered[0]) if answered else None,
                       duration_ms=_elapsed_ms(started))
    return Outcome("delivered", status=response.status, answer=answer_of(response),
                   duration_ms=_elapsed_ms(started))


def _elapsed_ms(started: float) -> int:
    return max(int((time.perf_counter() - started) * 1000), 0)


def shown_text(text: str | None, limit: int) -> str | None:
    """`text` fit to show on a page: line breaks made one kind, control and invisible formatting
    characters taken out (a terminal escape, a right-to-left override), outer blanks trimmed, cut to
    `limit` characters with "…" after; None when nothing is left."""
    if not text:
        return None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    kept = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) not in _UNSHOWN).strip()
    if not kept:
        return None
    return kept if len(kept) <= limit else kept[:limit].rstrip() + "…"


def answer_of(response: http.HttpResponse) -> Answer:
    """The receiver's answer as it is kept: its reason phrase and the start of its body, as text."""
    return Answer(reason=shown_text(response.reason, REASON_CHARS), body=shown_text(response.text, ANSWER_CHARS))


def _failure(exc: ProviderError) -> Outcome:
    code = exc.code or ""
    status = int(code[5:]) if code.startswith("http_") and code[5:].isdigit() else None
    if exc.permanent:
        return Outcome("dead", "webhook_refused", status)
    reason = _TRANSIENT.get(code) or ("webhook_server_error" if status is not None else "webhook_request_error")
    return Outcome("retry", reason, status, exc.retry_after)


def next_attempt(attempts: int, now: datetime, retry_after: float | None = None) -> datetime | None:
    """When attempt number `attempts + 1` is due after `attempts` failed ones (of this round: a
    person's resend starts a new one); None: give up."""
    if attempts > len(BACKOFF):
        return None
    wait = BACKOFF[attempts - 1]
    if retry_after:
        wait = max(wait, min(timedelta(seconds=retry_after), BACKOFF[-1]))
    return now + wait


def _finish(conn: Connection, row: Any, revision: int, outcome: Outcome, now: datetime) -> bool:
    """Record an attempt's outcome on the delivery `row` if the claim is still this one; True when
    it was recorded. The answer replaces the previous attempt's (None: no answer this time)."""
    done = row.attempts + 1
    answer = outcome.answer or Answer(None, None)
    values: dict[str, Any] = {"attempts": done, "last_attempt_at": now, "last_status_code": outcome.status,
                              "last_error": outcome.code, "lease_until": None, "claim_started_at": None,
                              "last_response_reason": answer.reason, "last_response_body": answer.body,
                              "last_duration_ms": outcome.duration_ms}
    if outcome.result == "delivered":
        values.update(status="delivered", delivered_at=now, next_attempt_at=None, last_error=None)
    else:
        due = (next_attempt(done - (row.resend_base or 0), now, outcome.retry_after)
               if outcome.result == "retry" else None)
        values.update(status="pending" if due else "dead", next_attempt_at=due)
    return bool(conn.execute(update(webhook_deliveries).where(
        webhook_deliveries.c.id == row.id, webhook_deliveries.c.revision == revision,
        webhook_deliveries.c.status == "pending").values(**values)).rowcount)


# --- a person's resend ---------------------------------------------------------------------------

def resend(conn: Connection, org_id: int, endpoint_id: int, delivery_id: int) -> Any:
    """Send a delivered or given-up delivery again, in `conn`'s transaction: the same row back in
    the queue, due now, with the same `webhook-id` and payload and a fresh round of retries (its
    attempts go on counting). Returns the row as it was before. DeliveryNotFound when it is not a
    delivery of this endpoint of the org; ResendRefused when the endpoint is inactive
    (`webhook_resend_inactive`) or the delivery is still waiting for its turn
    (`webhook_resend_pending`)."""
    row = conn.execute(select(webhook_deliveries).where(
        webhook_deliveries.c.org_id == org_id, webhook_deliveries.c.endpoint_id == endpoint_id,
        webhook_deliveries.c.id == delivery_id)).first()
    if row is None:
        raise DeliveryNotFound()
    active = conn.execute(select(webhook_endpoints.c.active).where(
        webhook_endpoints.c.org_id == org_id, webhook_endpoints.c.id == endpoint_id)).scalar()
    if not active:
        raise ResendRefused("webhook_resend_inactive")
    if row.status not in ("delivered", "dead"):
        raise ResendRefused("webhook_resend_pending")
    # Compare-and-set on the status it had: two clicks queue it once. The revision moves on, so a
    # worker still holding an old claim of this row cannot write over the new round.
    queued = conn.execute(update(webhook_deliveries).where(
        webhook_deliveries.c.org_id == org_id, webhook_deliveries.c.id == delivery_id,
        webhook_deliveries.c.status == row.status, webhook_deliveries.c.revision == row.revision)
        .values(status="pending", next_attempt_at=clock.now(), lease_until=None, claim_started_at=None,
                revision=webhook_deliveries.c.revision + 1, resend_base=row.attempts,
                resent_at=clock.now())).rowcount
    if not queued:
        raise ResendRefused("webhook_resend_pending")
    return row
