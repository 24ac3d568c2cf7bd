"""What a message is between its checks and its settlement: `Ready` (checked, still `claimed`) and
`Prepared` (marked `sending`). Below the checks, the waves and the outcomes, which all speak of them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from engine.messaging.templates import RenderedMessage
from engine.queue.recipient_pacing import Want
from gateway.contract import Provider


@dataclass
class Prepared:
    """A message marked `sending`: what to hand its provider, and what to settle it with after."""

    org_id: int
    message_id: int
    attempt: int
    channel: Any
    rendered: RenderedMessage
    provider: Provider
    #: The last moment its provider call may begin: the lease's end less LEMBRA_SEND_TIMEOUT, so a
    #: call that takes as long as it may still returns before the sweep takes the row as `unknown`.
    start_by: datetime
    send_at: datetime | None = None
    #: When it was due (for the lateness metric once it is sent).
    due_at: datetime | None = None


@dataclass
class Ready:
    """A checked message, still `claimed`: rendered, its channel's provider built, its pacing
    slot (if any) reserved."""

    msg: Any
    channel: Any
    rendered: RenderedMessage
    provider: Provider
    send_at: datetime | None
    #: How Meta bills it (`price_*` columns, engine/messaging/pricing), written as it is marked
    #: `sending`; None off Meta.
    billing: dict[str, Any] | None = None
    #: Its recipient's slot, when its provider spaces the sends to one person (Meta).
    spacing: Want | None = None
