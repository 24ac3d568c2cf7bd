"""Outbound webhook endpoints of `/api/v1` (docs/webhooks.md): where the org's events go, and the
delivery log of each.

The signing secret is in the answer of the creation and of `rotate-secret`, and nowhere else: it
is stored sealed, never rendered back, never logged nor audited. An endpoint the guard refuses is
a 422 whose `details` list `{code, field, message, message_en}` (the catalogue's sentences); another
org's endpoint answers 404, like one that does not exist.

Importing this module adds its routes to the API blueprint, like admin/api/privacy.py."""

from __future__ import annotations

from typing import Any

from flask import jsonify
from marshmallow import RAISE, Schema, fields, validate
from sqlalchemy import select

from admin.api.core import ApiError, bp, caller, error_response, json_body, load, load_query, org_tx, \
    require_key, runtime
from admin.api.openapi import documented
from admin.api.schemas import MAX_ID, Flag, PageQuery, Text, encode_cursor
from admin.i18n import translate_to
from engine.store.models import webhook_deliveries
from engine.tenants.audit import audit
from engine.tenants.webhooks import endpoints, events
from engine.words.catalogue import describe, known

_DT = {"format": "date-time"}
DELIVERY_STATUSES = ("pending", "delivered", "dead")
_URL = {"description": "http(s) URL of the clinic's system. It must resolve to a public address (the egress "
                       "guard checks it when saved and again at every send); no user or password in it.",
        "example": "https://agenda.clinica.com.br/lembra/webhooks"}
_EVENTS = {"description": "The events to send there: " + ", ".join(f"`{e}`" for e in events.EVENT_TYPES) + "."}


# --- schemas ------------------------------------------------------------------------------------

class WebhookEndpointFields(Schema):
    class Meta:
        unknown = RAISE

    url = Text(validate=validate.Length(min=1, max=endpoints.MAX_URL), metadata=_URL)
    event_types = fields.List(fields.String(validate=validate.OneOf(events.EVENT_TYPES)),
                              validate=validate.Length(min=1, max=len(events.EVENT_TYPES)), metadata=_EVENTS)
    description = Text(allow_none=True, validate=validate.Length(max=endpoints.MAX_DESCRIPTION),
                       metadata={"description": "What the endpoint is, for the clinic's staff."})
    active = Flag(metadata={"description": "false stops new events going there (true by default)."})


class WebhookEndpointIn(WebhookEndpointFields):
    url = Text(required=True, validate=validate.Length(min=1, max=endpoints.MAX_URL), metadata=_URL)
    event_types = fields.List(fields.String(validate=validate.OneOf(events.EVENT_TYPES)), required=True,
                              validate=validate.Length(min=1, max=len(events.EVENT_TYPES)), metadata=_EVENTS)


class WebhookEndpointPatch(WebhookEndpointFields):
    pass


class WebhookEndpointOut(Schema):
    id = fields.Integer(required=True)
    url = fields.String(required=True)
    description = fields.String(required=True, allow_none=True)
    event_types = fields.List(fields.String(validate=validate.OneOf(events.EVENT_TYPES)), required=True)
    active = fields.Boolean(required=True)
    created_at = fields.String(required=True, metadata=_DT)
    updated_at = fields.String(required=True, metadata=_DT)


class WebhookEndpointSecretOut(WebhookEndpointOut):
    secret = fields.String(required=True, metadata={
        "description": "The signing secret (`whsec_…`), shown this once: store it now. Verify each request "
                       "with it as Standard Webhooks says (docs/webhooks.md)."})


class WebhookEndpointQuery(Schema):
    class Meta:
        unknown = RAISE  # a filter it does not take is an error, not a silently unfiltered list

    active = fields.Boolean(truthy={"true"}, falsy={"false"},
                            metadata={"description": "Only the active (`true`) or inactive (`false`) ones."})


class WebhookEndpointListOut(Schema):
    data = fields.List(fields.Nested(WebhookEndpointOut), required=True)


class WebhookEndpointDeletedOut(Schema):
    id = fields.Integer(required=True)
    deliveries_deleted = fields.Integer(required=True, metadata={"description": "Its delivery log, gone with it."})


class WebhookDeliveryQuery(PageQuery):
    status = fields.String(validate=validate.OneOf(DELIVERY_STATUSES))


class WebhookDeliveryOut(Schema):
    id = fields.Integer(required=True)
    event_type = fields.String(required=True)
    webhook_id = fields.String(required=True, metadata={"description": "The `webhook-id` header: the same on "
                                                                       "every attempt."})
    status = fields.String(required=True, validate=validate.OneOf(DELIVERY_STATUSES), metadata={
        "description": "`pending` (waiting for its first attempt or a retry), `delivered` (a 2xx answer) or "
                       "`dead` (given up: refused, or retries exhausted)."})
    attempts = fields.Integer(required=True)
    last_status_code = fields.Integer(required=True, allow_none=True)
    last_error = fields.String(required=True, allow_none=True, metadata={"description": "A catalogue code."})
    last_error_message = fields.String(required=True, allow_none=True)
    last_error_message_en = fields.String(required=True, allow_none=True)
    created_at = fields.String(required=True, metadata=_DT)
    last_attempt_at = fields.String(required=True, allow_none=True, metadata=_DT)
    next_attempt_at = fields.String(required=True, allow_none=True, metadata=_DT)
    delivered_at = fields.String(required=True, allow_none=True, metadata=_DT)


class WebhookDeliveryPage(Schema):
    data = fields.List(fields.Nested(WebhookDeliveryOut), required=True)
    next_cursor = fields.String(required=True, allow_none=True)


class WebhookTestOut(Schema):
    delivery_id = fields.Integer(required=True)
    webhook_id = fields.String(required=True)


# --- rows as the API shows them -------------------------------------------------------------------

def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def endpoint_out(row: Any) -> dict[str, Any]:
    """An endpoint without its secret."""
    return {"id": row.id, "url": row.url, "description": row.description, "event_types": list(row.event_types),
            "active": bool(row.active), "created_at": _iso(row.created_at), "updated_at": _iso(row.updated_at)}


def delivery_out(row: Any) -> dict[str, Any]:
    """A delivery's log line: codes, times and statuses; never its payload or the answer's body."""
    text = describe(row.last_error) if row.last_error and known(row.last_error) else None
    return {"id": row.id, "event_type": row.event_type, "webhook_id": row.webhook_id, "status": row.status,
            "attempts": row.attempts, "last_status_code": row.last_status_code, "last_error": row.last_error,
            "last_error_message": str(text) if text is not None else None,
            "last_error_message_en": translate_to(text, "en") if text is not None else None,
            "created_at": _iso(row.created_at), "last_attempt_at": _iso(row.last_attempt_at),
            "next_attempt_at": _iso(row.next_attempt_at), "delivered_at": _iso(row.delivered_at)}


def _path_id(value: int) -> int:
    if not 1 <= value <= MAX_ID:
        raise ApiError(404)
    return value


def _audit(conn: Any, action: str, endpoint_id: int, changes: dict[str, Any]) -> None:
    who = caller()
    audit(conn, org_id=who.org_id, api_key_id=who.id, action=action, entity="webhook_endpoints",
          entity_id=endpoint_id, changes=changes)


@bp.errorhandler(endpoints.EndpointNotFound)
def _endpoint_not_found(exc: endpoints.EndpointNotFound) -> Any:
    return error_response(404)  # another org's endpoint answers like one that does not exist


@bp.errorhandler(endpoints.EndpointRefused)
def _endpoint_refused(exc: endpoints.EndpointRefused) -> Any:
    text = describe(exc.code, **exc.params)
    return error_response(422, "the endpoint cannot be saved", [{
        "code": exc.code, "field": exc.field, "message": str(text), "message_en": translate_to(text, "en")}])


# --- routes -------------------------------------------------------------------------------------

@bp.get("/webhook-endpoints")
@documented("get", "/webhook-endpoints", "List the org's webhook endpoints", tag="webhooks",
            query=WebhookEndpointQuery, responses={200: (WebhookEndpointListOut, "Every endpoint (never a secret)")},
            errors=(422,))
@require_key
def list_webhook_endpoints() -> Any:
    params = load_query(WebhookEndpointQuery())
    with org_tx() as conn:
        rows = endpoints.list_endpoints(conn, caller().org_id)
    if "active" in params:
        rows = [row for row in rows if bool(row.active) == params["active"]]
    return jsonify(WebhookEndpointListOut().dump({"data": [endpoint_out(r) for r in rows]}))


@bp.post("/webhook-endpoints")
@documented("post", "/webhook-endpoints", "Add a webhook endpoint (its secret is shown once)", tag="webhooks",
            description="Events of the subscribed types are POSTed there as JSON, signed as Standard Webhooks "
                        "says (`webhook-id`, `webhook-timestamp`, `webhook-signature`), retried with backoff. "
                        "The answer holds the signing secret: it is never shown again.",
            body=WebhookEndpointIn, responses={201: (WebhookEndpointSecretOut, "Created")},
            errors=(400, 413, 422))
@require_key
def create_webhook_endpoint() -> Any:
    data = load(WebhookEndpointIn(), json_body())
    rt = runtime()
    org_id = caller().org_id
    with org_tx() as conn:
        made = endpoints.create_endpoint(conn, rt.keyring, org_id, url=data["url"], event_types=data["event_types"],
                                         description=data.get("description"), active=data.get("active", True),
                                         egress=rt.settings.egress)
        row = endpoints.get_endpoint(conn, org_id, made.endpoint_id)
        _audit(conn, "create", made.endpoint_id, {"event_types": list(row.event_types), "active": bool(row.active)})
    response = jsonify(WebhookEndpointSecretOut().dump({**endpoint_out(row), "secret": made.secret}))
    response.status_code = 201
    return response


@bp.get("/webhook-endpoints/<int:endpoint_id>")
@documented("get", "/webhook-endpoints/{endpoint_id}", "Get a webhook endpoint", tag="webhooks",
            path_id="endpoint_id", responses={200: (WebhookEndpointOut, "The endpoint")}, errors=(404,))
@require_key
def get_webhook_endpoint(endpoint_id: int) -> Any:
    with org_tx() as conn:
        row = endpoints.get_endpoint(conn, caller().org_id, _path_id(endpoint_id))
    return jsonify(WebhookEndpointOut().dump(endpoint_out(row)))


@bp.patch("/webhook-endpoints/<int:endpoint_id>")
@documented("patch", "/webhook-endpoints/{endpoint_id}", "Change a webhook endpoint", tag="webhooks",
            path_id="endpoint_id",
            description="Only the fields given change. `active: false` stops new events; deliveries already "
                        "waiting are given up (`webhook_endpoint_inactive`). The secret changes only with "
                        "`rotate-secret`.",
            body=WebhookEndpointPatch, responses={200: (WebhookEndpointOut, "Updated")},
            errors=(400, 404, 413, 422))
@require_key
def update_webhook_endpoint(endpoint_id: int) -> Any:
    endpoint_id = _path_id(endpoint_id)
    data = load(WebhookEndpointPatch(), json_body())
    rt = runtime()
    org_id = caller().org_id
    with org_tx() as conn:
        changed = endpoints.update_endpoint(conn, org_id, endpoint_id, egress=rt.settings.egress, **data)
        if changed:  # which fields, not their values: a URL may carry the receiver's own token
            _audit(conn, "update", endpoint_id, {"fields": sorted(changed)})
        row = endpoints.get_endpoint(conn, org_id, endpoint_id)
    return jsonify(WebhookEndpointOut().dump(endpoint_out(row)))


@bp.delete("/webhook-endpoints/<int:endpoint_id>")
@documented("delete", "/webhook-endpoints/{endpoint_id}", "Delete a webhook endpoint and its log",
            tag="webhooks", path_id="endpoint_id",
            description="Nothing more is sent there, pending deliveries included; its delivery log goes too. "
                        "To pause it instead, set `active` to false.",
            responses={200: (WebhookEndpointDeletedOut, "Deleted")}, errors=(404,))
@require_key
def delete_webhook_endpoint(endpoint_id: int) -> Any:
    endpoint_id = _path_id(endpoint_id)
    with org_tx() as conn:
        gone = endpoints.delete_endpoint(conn, caller().org_id, endpoint_id)
        _audit(conn, "delete", endpoint_id, {"deliveries_deleted": gone})
    return jsonify(WebhookEndpointDeletedOut().dump({"id": endpoint_id, "deliveries_deleted": gone}))


@bp.post("/webhook-endpoints/<int:endpoint_id>/rotate-secret")
@documented("post", "/webhook-endpoints/{endpoint_id}/rotate-secret", "Give a webhook endpoint a new secret",
            tag="webhooks", path_id="endpoint_id",
            description="The old secret stops signing at once; the answer holds the new one, shown this once.",
            responses={200: (WebhookEndpointSecretOut, "The endpoint and its new secret")}, errors=(404,))
@require_key
def rotate_webhook_secret(endpoint_id: int) -> Any:
    endpoint_id = _path_id(endpoint_id)
    org_id = caller().org_id
    with org_tx() as conn:
        made = endpoints.rotate_secret(conn, runtime().keyring, org_id, endpoint_id)
        _audit(conn, "rotate_secret", endpoint_id, {})
        row = endpoints.get_endpoint(conn, org_id, endpoint_id)
    return jsonify(WebhookEndpointSecretOut().dump({**endpoint_out(row), "secret": made.secret}))


@bp.post("/webhook-endpoints/<int:endpoint_id>/test")
@documented("post", "/webhook-endpoints/{endpoint_id}/test", "Send a test `ping` event", tag="webhooks",
            path_id="endpoint_id",
            description="Queues one `ping` event for this endpoint, signed and retried like any other; follow "
                        "it in the delivery log.",
            responses={202: (WebhookTestOut, "Queued")}, errors=(404,))
@require_key
def test_webhook_endpoint(endpoint_id: int) -> Any:
    endpoint_id = _path_id(endpoint_id)
    org_id = caller().org_id
    with org_tx() as conn:
        endpoints.get_endpoint(conn, org_id, endpoint_id)
        [delivery_id] = events.enqueue(conn, org_id, [endpoint_id], events.PING,
                                       events.envelope(events.PING, {"endpoint_id": endpoint_id}))
        webhook_id = conn.execute(select(webhook_deliveries.c.webhook_id).where(
            webhook_deliveries.c.org_id == org_id, webhook_deliveries.c.id == delivery_id)).scalar_one()
    response = jsonify(WebhookTestOut().dump({"delivery_id": delivery_id, "webhook_id": webhook_id}))
    response.status_code = 202
    return response


@bp.get("/webhook-endpoints/<int:endpoint_id>/deliveries")
@documented("get", "/webhook-endpoints/{endpoint_id}/deliveries", "The delivery log of a webhook endpoint",
            tag="webhooks", path_id="endpoint_id", query=WebhookDeliveryQuery,
            description="Oldest first, a page at a time. Each line says the "
                        "status, the attempts, the last HTTP status and the last error as a catalogue code and "
                        "sentence; never the payload or the receiver's answer.",
            responses={200: (WebhookDeliveryPage, "A page of deliveries")}, errors=(404, 422))
@require_key
def list_webhook_deliveries(endpoint_id: int) -> Any:
    endpoint_id = _path_id(endpoint_id)
    params = load_query(WebhookDeliveryQuery())
    org_id = caller().org_id
    query = select(webhook_deliveries).where(webhook_deliveries.c.org_id == org_id,
                                             webhook_deliveries.c.endpoint_id == endpoint_id)
    if params.get("status"):
        query = query.where(webhook_deliveries.c.status == params["status"])
    if params.get("cursor") is not None:
        query = query.where(webhook_deliveries.c.id > params["cursor"])
    limit = params["limit"]
    with org_tx() as conn:
        endpoints.get_endpoint(conn, org_id, endpoint_id)
        rows = list(conn.execute(query.order_by(webhook_deliveries.c.id).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return jsonify(WebhookDeliveryPage().dump({"data": [delivery_out(r) for r in rows],
                                               "next_cursor": encode_cursor(rows[-1].id) if more else None}))
