"""Outbound webhooks: the clinic's own system hears about what happened (docs/webhooks.md).

- `endpoints`: an org's endpoints (URL behind the egress guard, subscribed event types, a
  Standard Webhooks signing secret sealed with the credential keyring, shown once);
- `events`: the event types, their payloads, and `emit`, which writes one delivery per subscribed
  active endpoint in the caller's transaction (an event exists if and only if its change committed);
- `delivery`: claiming due deliveries with a lease, the signed POST, retries with backoff, and the
  sweep of leases that ran out (a worker killed mid-delivery: retried, never lost).

It sits in `tenants`, below flows, people and messaging, so that every one of them can emit.
"""

from engine.tenants.webhooks.events import EVENT_TYPES, PING, emit

__all__ = ["EVENT_TYPES", "PING", "emit"]
