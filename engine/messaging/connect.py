"""Linking a channel's phone (Evolution's QR code or pairing code) and reading its connection state.

No Flask here: the console calls these with the signed-in user's org, and every query is scoped
to that org, so another org's channel id is simply not found. No database transaction is held
while the provider is called (a slow Evolution server must hold neither a pooled connection nor
SQLite's write lock), and what the provider reports is recorded on the channel row through
`engine.messaging.inbound.apply_connection`, the same mapping the `connection.update` webhook goes through.

Provider failures stay typed (`TransientError` / `PermanentError` with the provider's `code`);
their messages are Lembra's own words, never a provider's body or a credential.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select

from engine.messaging.inbound import BROKEN_STATES, apply_connection
from engine.store.models import channels
from engine.store.runtime import Runtime
from gateway import registry
from gateway.contract import ConnectInfo, ConnectionEvent, Health, Provider
from gateway.errors import PermanentError

#: States a provider reports about the phone's link, recorded on the channel. Not "error": that is
#: Lembra failing to ask (server down, wrong key), which says nothing about the phone, and writing it
#: would erase the last state the provider did report.
CONNECTION_STATES = ("open", "connecting", *BROKEN_STATES)
#: Evolution's QR PNG is a few KB; anything this big is not a QR code.
MAX_QR_CHARS = 256 * 1024
#: A raster image as a base64 data: URI, nothing else (no SVG, no parameters, no other scheme):
#: this string ends up in an <img src>.
_QR_DATA_URI = re.compile(r"data:image/(?:png|jpeg|gif|webp);base64,[A-Za-z0-9+/]+={0,2}")


class ChannelNotFound(LookupError):
    """No channel with that id in that org."""


@dataclass(frozen=True)
class ConnectionSnapshot:
    """The phone's link as the provider sees it now, plus the QR code being shown, if any."""

    health: Health
    #: While the provider is waiting for a scan (`connecting`): its current QR / pairing code.
    info: ConnectInfo | None = None


def supports_connect(provider_name: str) -> bool:
    """True when the provider links a phone (overrides `Provider.connect`), e.g. Evolution."""
    try:
        cls = registry.load(provider_name)
    except registry.UnknownProvider:
        return False
    return cls.connect is not Provider.connect


def qr_image(value: Any) -> str | None:
    """`value` when it is a base64 raster-image data: URI safe to put in an <img src>, else None."""
    if isinstance(value, str) and len(value) <= MAX_QR_CHARS and _QR_DATA_URI.fullmatch(value):
        return value
    return None


def recorded_state(status_detail: str | None) -> str | None:
    """The connection state last recorded on a channel row (its `status_detail` is "state[:detail]")."""
    if not status_detail:
        return None
    state = status_detail.split(":", 1)[0]
    # Evolution's `qrcode.updated` webhook: a QR code is on screen, i.e. waiting for the scan.
    if state == "qrcode":
        return "connecting"
    return state if state in CONNECTION_STATES else None


def connect_channel(rt: Runtime, org_id: int, channel_id: int, *, number: str | None = None,
                    notify: bool = True) -> ConnectInfo:
    """Ask the channel's provider to link a phone and return its QR code (a pairing code too, when
    `number` — the clinic's phone — is given).

    This has a side effect on the provider: Evolution starts a new WhatsApp session when the
    instance is closed. The returned state is recorded on the channel (`notify=False`: without an
    inbox item when it breaks, for a caller that shows the state to the operator itself). The QR
    code is dropped unless it is a raster-image data: URI. Raises ChannelNotFound, PermanentError (code
    "unsupported" for a provider without a connect step, "invalid_number", …) or TransientError.
    """
    channel = _channel(rt, org_id, channel_id)
    if not supports_connect(channel.provider):
        # Checked here (not only by the base class) so no credential is even decrypted for it.
        raise PermanentError("this provider has no connect step", code="unsupported")
    provider = rt.providers.get(channel)
    if number:
        info = provider.connect(number=number)  # type: ignore[call-arg]  # Evolution's optional pairing number
    else:
        info = provider.connect()
    info = replace(info, qr_code_base64=qr_image(info.qr_code_base64))
    if info.state:
        _record(rt, org_id, channel_id, info.state, notify=notify)
    return info


def channel_health(rt: Runtime, org_id: int, channel_id: int, *, notify: bool = True) -> Health:
    """The channel's connection health now; a state the provider reported is recorded on the row
    (as `connect_channel` does, `notify` included).

    Never raises for provider failures: the provider's `health()` answers them as
    ``Health(ok=False, state="error", detail=<code>)``. Raises ChannelNotFound.
    """
    channel = _channel(rt, org_id, channel_id)
    health = rt.providers.get(channel).health()
    _record(rt, org_id, channel_id, health.state, notify=notify)
    return health


def connection_snapshot(rt: Runtime, org_id: int, channel_id: int, *, notify: bool = True) -> ConnectionSnapshot:
    """The health, and while the provider waits for a scan, the QR code it is showing.

    Read-only on the provider's side: the QR is asked for only when the state is `connecting`,
    where Evolution's /instance/connect returns the current code without touching the session
    (it starts one only from `close`, which `connect_channel` is for). Raises ChannelNotFound and,
    from fetching the QR, the provider's typed errors.
    """
    health = channel_health(rt, org_id, channel_id, notify=notify)
    if health.state != "connecting":
        return ConnectionSnapshot(health=health)
    info = connect_channel(rt, org_id, channel_id, notify=notify)
    if info.state == "open":  # scanned between the two calls
        return ConnectionSnapshot(health=Health(ok=True, state="open"))
    return ConnectionSnapshot(health=health, info=info)


def _channel(rt: Runtime, org_id: int, channel_id: int) -> Any:
    with rt.db.connect() as conn:
        row = conn.execute(
            select(channels).where(channels.c.org_id == org_id, channels.c.id == channel_id)
        ).first()
    if row is None:
        raise ChannelNotFound(f"no channel {channel_id} in org {org_id}")
    return row


def _record(rt: Runtime, org_id: int, channel_id: int, state: str, *, notify: bool) -> None:
    if state not in CONNECTION_STATES:
        return
    with rt.db.begin() as conn:
        # Re-read inside the write: the status may have moved while the provider was answering.
        row = conn.execute(
            select(channels).where(channels.c.org_id == org_id, channels.c.id == channel_id)
        ).first()
        if row is not None:
            apply_connection(conn, row, ConnectionEvent(state=state), notify=notify)
