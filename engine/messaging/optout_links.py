"""Signed opt-out links (email `List-Unsubscribe`, RFC 8058): they work without login and
cannot be forged or pointed at another contact."""

from __future__ import annotations

from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeSerializer

from gateway.crypto import Keyring

SALT = "lembra-optout"


@dataclass(frozen=True)
class OptOutTarget:
    """Whom a link opts out, and of which channel kind."""

    org_id: int
    contact_id: int
    kind: str


def _serializer(keyring: Keyring) -> URLSafeSerializer:
    return URLSafeSerializer(keyring.derive("optout-links"), salt=SALT)


def make_token(keyring: Keyring, target: OptOutTarget) -> str:
    """The token for one contact × kind."""
    return _serializer(keyring).dumps([target.org_id, target.contact_id, target.kind])


def make_url(keyring: Keyring, public_url: str, target: OptOutTarget) -> str:
    """The public opt-out URL for one contact × kind."""
    return f"{public_url.rstrip('/')}/optout/{make_token(keyring, target)}"


def read_token(keyring: Keyring, token: str) -> OptOutTarget | None:
    """The target a token names, or None when it was not signed by this installation."""
    try:
        org_id, contact_id, kind = _serializer(keyring).loads(token)
    except (BadSignature, ValueError, TypeError):
        return None
    if not (isinstance(org_id, int) and isinstance(contact_id, int) and isinstance(kind, str)):
        return None
    return OptOutTarget(org_id, contact_id, kind)
