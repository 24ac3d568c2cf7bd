"""An org's webhook endpoints: where its events go, which ones, and the secret they are signed with.

The URL is the tenant's: it passes the egress guard when saved (`check_url`) and again at every
send (gateway/http.py connects only to addresses the guard checked). The signing secret is a
Standard Webhooks `whsec_` secret, generated here, returned once (on creation and on rotation),
and stored sealed for its row with the credential keyring, like a channel's credentials: it is
never rendered again and never logged.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError
from engine.store.models import webhook_deliveries, webhook_endpoints
from engine.tenants.webhooks.events import EVENT_TYPES
from gateway.crypto import Keyring
from gateway.egress import EgressPolicy, EgressRefused, InvalidAddress, check_saved_url

#: Bytes of a new secret (the specification asks for 24 to 64).
SECRET_BYTES = 32
SECRET_PREFIX = "whsec_"
MAX_URL = 2000
MAX_DESCRIPTION = 200
TABLE = "webhook_endpoints"


class EndpointNotFound(DomainError):
    """No such endpoint in this org (another org's id included)."""

    def __init__(self) -> None:
        super().__init__("no such webhook endpoint")


class EndpointRefused(DomainError):
    """An endpoint that cannot be saved: `code` is the catalogue's, `field` the input it is about."""

    def __init__(self, field: str, code: str, **params: Any) -> None:
        super().__init__(f"{field}: {code}")
        self.field, self.code, self.params = field, code, params


@dataclass(frozen=True)
class NewSecret:
    """An endpoint and its signing secret, as shown once."""

    endpoint_id: int
    secret: str


def new_secret() -> str:
    """A fresh Standard Webhooks secret: `whsec_` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def check_url(url: Any, egress: EgressPolicy | None) -> str:
    """The URL, stripped, if an endpoint may be saved with it; EndpointRefused otherwise (not an
    http(s) URL the client reads one way, a user or password in it, or, with `egress`, a host that
    resolves inside the network). The guard checks it again at every send: that is the check that holds."""
    if not isinstance(url, str) or not url.strip() or len(url) > MAX_URL:
        raise EndpointRefused("url", "url_invalid")
    url = url.strip()
    try:
        check_saved_url(url, egress)
    except InvalidAddress as exc:
        raise EndpointRefused("url", exc.code) from None
    except EgressRefused:
        raise EndpointRefused("url", "egress_refused") from None
    return url


def check_event_types(event_types: Iterable[Any]) -> list[str]:
    """The subscribed event types, each once, in the documented order; EndpointRefused when one is
    unknown or none is given."""
    wanted = list(event_types)
    if not wanted or any(kind not in EVENT_TYPES for kind in wanted):
        raise EndpointRefused("event_types", "webhook_event_types", choices=", ".join(EVENT_TYPES))
    return [kind for kind in EVENT_TYPES if kind in wanted]


def _description(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION:
        raise EndpointRefused("description", "detail_text", max=MAX_DESCRIPTION)
    return value.strip() or None


def _seal(conn: Connection, keyring: Keyring, org_id: int, endpoint_id: int, secret: str) -> None:
    sealed = keyring.seal({"secret": secret}, table=TABLE, org_id=org_id, row_id=endpoint_id)
    conn.execute(update(webhook_endpoints)
                 .where(webhook_endpoints.c.org_id == org_id, webhook_endpoints.c.id == endpoint_id)
                 .values(secret=sealed.ciphertext, key_version=sealed.key_version))


def create_endpoint(conn: Connection, keyring: Keyring, org_id: int, *, url: str, event_types: Sequence[str],
                    description: str | None = None, active: bool = True,
                    egress: EgressPolicy | None = None) -> NewSecret:
    """A new endpoint with a new secret, sealed to its row before the transaction ends. The secret
    is returned here and never again (`rotate_secret` makes another)."""
    url = check_url(url, egress)
    kinds = check_event_types(event_types)
    text = _description(description)
    now = clock.now()
    endpoint_id = int(conn.execute(insert(webhook_endpoints).values(
        org_id=org_id, url=url, description=text, event_types=kinds, active=bool(active), created_at=now,
        updated_at=now).returning(webhook_endpoints.c.id)).scalar_one())
    secret = new_secret()
    _seal(conn, keyring, org_id, endpoint_id, secret)
    return NewSecret(endpoint_id, secret)


def list_endpoints(conn: Connection, org_id: int) -> list[Any]:
    """The org's endpoints, oldest first."""
    return list(conn.execute(select(webhook_endpoints).where(webhook_endpoints.c.org_id == org_id)
                             .order_by(webhook_endpoints.c.id)))


def get_endpoint(conn: Connection, org_id: int, endpoint_id: int, *, for_update: bool = False) -> Any:
    """The org's endpoint; EndpointNotFound when it is not the org's or does not exist."""
    query = select(webhook_endpoints).where(webhook_endpoints.c.org_id == org_id,
                                            webhook_endpoints.c.id == endpoint_id)
    row = conn.execute(query.with_for_update() if for_update else query).first()
    if row is None:
        raise EndpointNotFound()
    return row


def update_endpoint(conn: Connection, org_id: int, endpoint_id: int, *, egress: EgressPolicy | None = None,
                    **changes: Any) -> dict[str, Any]:
    """Change an endpoint's `url`, `description`, `event_types` or `active` (not its secret: see
    `rotate_secret`). Returns what changed, for the audit trail. Deactivating it stops new events;
    deliveries already waiting are given up when their turn comes (`endpoint_inactive`)."""
    current = get_endpoint(conn, org_id, endpoint_id, for_update=True)
    values: dict[str, Any] = {}
    if "url" in changes:
        values["url"] = check_url(changes["url"], egress)
    if "event_types" in changes:
        values["event_types"] = check_event_types(changes["event_types"] or ())
    if "description" in changes:
        values["description"] = _description(changes["description"])
    if "active" in changes:
        values["active"] = bool(changes["active"])
    changed = {key: value for key, value in values.items() if getattr(current, key) != value}
    if changed:
        conn.execute(update(webhook_endpoints)
                     .where(webhook_endpoints.c.org_id == org_id, webhook_endpoints.c.id == endpoint_id)
                     .values(**changed, updated_at=clock.now()))
    return changed


def rotate_secret(conn: Connection, keyring: Keyring, org_id: int, endpoint_id: int) -> NewSecret:
    """A new secret for the endpoint (the old one stops signing at once); returned this once."""
    get_endpoint(conn, org_id, endpoint_id, for_update=True)
    secret = new_secret()
    _seal(conn, keyring, org_id, endpoint_id, secret)
    conn.execute(update(webhook_endpoints)
                 .where(webhook_endpoints.c.org_id == org_id, webhook_endpoints.c.id == endpoint_id)
                 .values(updated_at=clock.now()))
    return NewSecret(endpoint_id, secret)


def delete_endpoint(conn: Connection, org_id: int, endpoint_id: int) -> int:
    """Delete the endpoint and its delivery log; returns how many deliveries went with it."""
    get_endpoint(conn, org_id, endpoint_id, for_update=True)
    gone = conn.execute(delete(webhook_deliveries).where(webhook_deliveries.c.org_id == org_id,
                                                         webhook_deliveries.c.endpoint_id == endpoint_id)).rowcount
    conn.execute(delete(webhook_endpoints).where(webhook_endpoints.c.org_id == org_id,
                                                 webhook_endpoints.c.id == endpoint_id))
    return int(gone or 0)


def endpoint_secret(keyring: Keyring, row: Any) -> str:
    """The endpoint's signing secret, unsealed (CryptoError when its key is gone)."""
    return str(keyring.open(row.secret, key_version=row.key_version, table=TABLE, org_id=row.org_id,
                            row_id=row.id)["secret"])
