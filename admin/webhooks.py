"""`/webhooks/<provider>/<channel_id>`: every provider's callbacks land here (SPEC §5).

The raw body is handed to the provider's parser untouched (signatures are computed over the
exact bytes). Bad signature → 401, malformed → 400, unknown channel → 404, nothing stored.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from flask import Blueprint, Response, current_app, jsonify, request

from engine.messaging import inbound
from engine.core import metrics
from engine.store.runtime import Runtime
from gateway.contract import WebhookRequest
from gateway.errors import WebhookError

log = logging.getLogger(__name__)
bp = Blueprint("webhooks", __name__)


def deliver(rt: Runtime, provider: str, channel_id: int, req: WebhookRequest, *,
            enqueue: Callable[[Sequence[int]], None] | None = None) -> inbound.Received:
    """Store a webhook delivery and hand its new patient messages to the workers: the app's
    (`LEMBRA_ENQUEUE_INBOUND`), or `enqueue` for a caller outside a request (`lembra sandbox reply`)."""
    received = inbound.receive(rt, provider, channel_id, req)
    if received.inbound_ids:
        (enqueue or current_app.config["LEMBRA_ENQUEUE_INBOUND"])(received.inbound_ids)
    return received


@bp.route("/webhooks/<provider>/<int:channel_id>", methods=["GET", "POST"])
def webhook(provider: str, channel_id: int) -> Response | tuple[Response, int]:
    rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
    req = WebhookRequest(
        method=request.method,
        url=request.url,
        headers=dict(request.headers),
        body=request.get_data(cache=False),
        query=request.args.to_dict(),
    )
    try:
        received = deliver(rt, provider, channel_id, req)
    except WebhookError as exc:
        metrics.webhook(provider, exc)
        log.info("webhook refused", extra={"provider": provider, "channel_id": channel_id, "status": exc.status})
        return jsonify(error=exc.reason), exc.status
    metrics.webhook(provider, received)
    if received.response_body is not None:
        return Response(received.response_body, status=received.response_status,
                        mimetype=received.response_content_type)
    return jsonify(ok=True, inbound=len(received.inbound_ids), statuses=received.statuses_applied), 200
