"""Typed errors: a send either worked, failed for now (transient) or failed for good (permanent)."""

from __future__ import annotations


class ProviderError(Exception):
    """A send or call to a provider failed.

    `code` is the provider's own error code (for the queue and logs; never contains PII).
    `retry_after` is the provider's requested wait in seconds, when it gave one (HTTP 429).
    `opt_out` marks failures that mean the recipient unsubscribed (e.g. Twilio 21610).
    `channel_broken` marks failures that will repeat for every message on this channel until an
    operator acts (expired token, disconnected instance).
    `outcome_unknown` marks failures after which the message may or may not have gone out (a
    read timeout after the request was sent, a relay that hung up after the body): retrying
    could deliver it twice, so unless the provider honours idempotency keys it is parked for an
    operator instead.
    """

    permanent: bool = False

    def __init__(
        self,
        reason: str,
        *,
        code: str | None = None,
        retry_after: float | None = None,
        opt_out: bool = False,
        channel_broken: bool = False,
        outcome_unknown: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.retry_after = retry_after
        self.opt_out = opt_out
        self.channel_broken = channel_broken
        self.outcome_unknown = outcome_unknown

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, reason={self.reason!r})"


class TransientError(ProviderError):
    """Worth retrying later: timeouts, connection errors, 5xx, throttling."""

    permanent = False


class RateLimited(TransientError):
    """The provider refused the call for how fast it came, not for what it carried: the same
    message goes again after `retry_after` seconds (its own wait, not the backoff schedule's).

    `scope` says what must slow down: `"recipient"` (too many messages to this person, e.g. Meta
    131056: the engine spaces this recipient's next sends too) or `"channel"` (the sending number
    reached its throughput, e.g. Meta 130429: every message of the channel waits)."""

    def __init__(self, reason: str, *, scope: str, retry_after: float, code: str | None = None) -> None:
        if scope not in ("recipient", "channel"):
            raise ValueError(f"unknown rate-limit scope {scope!r}")
        super().__init__(reason, code=code, retry_after=retry_after)
        self.scope = scope


class PermanentError(ProviderError):
    """Retrying will not help: invalid number, not on WhatsApp, unsubscribed, bad request."""

    permanent = True


class EgressRefused(PermanentError):
    """A tenant-set address (a channel's `base_url` or SMTP host, an agent's LLM URL) resolves to
    an address Lembra may not connect to: loopback, private, link-local, CGNAT, multicast,
    reserved (see `gateway.egress`). Raised before any connection is attempted, so the answer is
    the same whatever listens there. `host` is the name as the tenant typed it (never what it
    resolved to, which would map the internal network for them)."""

    def __init__(self, host: str) -> None:
        self.host = host[:255]
        super().__init__(f"address not allowed: {self.host}", code="egress_refused", channel_broken=True)


class WebhookError(Exception):
    """A webhook request was refused; `status` is the HTTP status to answer with."""

    status = 400

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadSignature(WebhookError):
    """The signature or shared secret did not match: 401, nothing stored."""

    status = 401


class MalformedWebhook(WebhookError):
    """The body is not what the provider documents: 400, nothing stored."""

    status = 400


class UnknownChannel(WebhookError):
    """No channel by that id for that provider: 404."""

    status = 404
