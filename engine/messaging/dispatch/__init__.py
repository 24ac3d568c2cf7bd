"""Dispatch: claim due messages, send each at most once, retry or fail, sweep expired leases.

The life of a message: `pending` → (scheduler claims, with a lease) `claimed` → (a worker
re-checks everything, then marks it just before its provider call, a wave of calls in flight at a
time) `sending` → `sent`, or back to `pending` with a later attempt (transient failure), or
`failed` (permanent), `dead` (out of attempts), `expired` (a retry would land after it is
useful). A lease that expires on a `claimed` row hands it out again at no cost; one that expires
on a `sending` row means the worker died when the call may have started, so the outcome is
`unknown` and it is not sent blindly again.

- `claim`: the scheduler's side (claim what is due, sweep expired leases), and the claim of what
  is due to a contact who just wrote (engine/messaging/turn.py);
- `batch`: what the checks read, loaded for a whole batch with one query per table;
- `checks`: the checks at send time (`check`);
- `send`: the provider calls of a batch, in waves no larger than the calls in flight;
- `waves`: between two waves, the last one `sent` and the next one `sending`;
- `outcomes`: retried, failed, dead, expired, unknown.
"""

from engine.messaging.dispatch.batch import refusal
from engine.messaging.dispatch.checks import LIVE_APPOINTMENT, OPT_OUT_EXEMPT, check
from engine.messaging.dispatch.ready import Prepared, Ready
from engine.messaging.dispatch.claim import WORKER_ID, claim_due, claim_for_contact, sweep_leases
from engine.messaging.dispatch.send import prepare, send_batch, send_one

__all__ = [
    "LIVE_APPOINTMENT", "OPT_OUT_EXEMPT", "WORKER_ID", "Prepared", "Ready", "check",
    "claim_due", "claim_for_contact", "prepare", "refusal", "send_batch", "send_one", "sweep_leases",
]
