"""Conversation endpoints of `/api/v1`: the patients' replies waiting for a person, as the
console's Conversas shows them (engine/messaging/conversations.py). A clinic's software lists
them, answers one (the same outbox path as the console's answer: purpose `conversation_reply`,
free text or, outside Meta's 24-hour window, the approved template) and marks one handled.

Importing this module adds its routes to the API blueprint, like admin/api/privacy.py."""

from __future__ import annotations

import hashlib
from typing import Any

from flask import jsonify
from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from admin.api.core import (
    ApiError,
    bp,
    caller,
    detail,
    idempotency_key,
    json_body,
    load_query,
    org_tx,
    path_id,
    require_key,
)
from admin.api.openapi import documented
from admin.api.schemas import (
    Flag,
    IdempotencyHeader,
    MessageOut,
    PageQuery,
    Text,
    catalogue_detail,
    encode_cursor,
    page_schema,
)
from admin.api.services import find_message, message_out
from engine.messaging import conversations as convs
from engine.queue.outbox import find_id
from engine.store.models import CHANNEL_KINDS
from engine.tenants.audit import audit
from engine.words.catalogue import describe

ITEM_STATES = ("open", "flow", "flow_handled", "handled")


# --- schemas ------------------------------------------------------------------------------------

class ConversationQuery(PageQuery):
    state = fields.String(load_default="open", validate=validate.OneOf(convs.STATES), metadata={
        "description": "`open`: waiting for a person (the default); `handled`: a person or a flow handled it; "
                       "`all`."})


class ConversationOut(Schema):
    id = fields.Integer(required=True, metadata={"description": "The patient's message (inbound) id."})
    channel_id = fields.Integer(required=True)
    channel_kind = fields.String(required=True, validate=validate.OneOf(CHANNEL_KINDS))
    contact_id = fields.Integer(required=True, allow_none=True,
                                metadata={"description": "Null when no contact carries the sender's address."})
    appointment_id = fields.Integer(required=True, allow_none=True,
                                    metadata={"description": "The appointment the reply is about, if any."})
    text = fields.String(required=True, allow_none=True, metadata={"description": "What the patient wrote."})
    received_at = fields.DateTime(format="iso", required=True)
    state = fields.String(required=True, validate=validate.OneOf(ITEM_STATES), metadata={
        "description": "`open` (waiting for a person), `flow` (a follow-up run is reading it), `flow_handled` "
                       "(a flow understood it) or `handled` (a person did)."})
    handled_at = fields.DateTime(format="iso", required=True, allow_none=True)


ConversationPage = page_schema(ConversationOut, "ConversationPage")


class ConversationReplyIn(Schema):
    class Meta:
        unknown = RAISE

    text = Text(validate=validate.Length(min=1, max=convs.MAX_REPLY),
                metadata={"description": "The answer, sent as typed (free text)."})
    use_template = Flag(load_default=False, metadata={
        "description": "Send the approved reopening template instead (WhatsApp via Meta, outside the 24-hour "
                       "window, when free text cannot go)."})

    @validates_schema(skip_on_field_errors=True)
    def _text_or_template(self, data: dict[str, Any], **kwargs: Any) -> None:
        if not data.get("use_template") and not (data.get("text") or "").strip():
            raise ValidationError([catalogue_detail("conversation_text_required", "text")], "text")


class ConversationReplyOut(Schema):
    conversation = fields.Nested(ConversationOut, required=True)
    message = fields.Nested(MessageOut, required=True, metadata={"description": "The answer in the outbox."})


def conversation_out(item: convs.Item) -> dict[str, Any]:
    """A reply as the API shows it: never the sender's raw address or the handler's e-mail."""
    return {"id": item.id, "channel_id": item.channel_id, "channel_kind": item.channel_kind,
            "contact_id": item.contact_id, "appointment_id": item.appointment.id if item.appointment else None,
            "text": item.text, "received_at": item.received_at, "state": item.state, "handled_at": item.handled_at}


def _find(conn: Any, org_id: int, inbound_id: int) -> convs.Item:
    item = convs.find_item(conn, org_id, path_id(inbound_id))
    if item is None:
        raise ApiError(404)  # another org's reply, like one that does not exist
    return item


def _audit(conn: Any, action: str, inbound_id: int, changes: dict[str, Any]) -> None:
    who = caller()
    audit(conn, org_id=who.org_id, api_key_id=who.id, action=action, entity="inbound_messages",
          entity_id=inbound_id, changes=changes)


def _form_key(key: str) -> str:
    """The engine's one-send key (32 hex characters) made from the caller's Idempotency-Key."""
    return hashlib.sha256(f"api:{key}".encode()).hexdigest()[:32]


# --- routes -------------------------------------------------------------------------------------

@bp.get("/conversations")
@documented("get", "/conversations", "List patients' replies waiting for a person", tag="conversations",
            query=ConversationQuery, responses={200: (ConversationPage, "A page of conversations, oldest first")},
            errors=(422,))
@require_key
def list_conversations() -> Any:
    params = load_query(ConversationQuery())
    org_id = caller().org_id
    with org_tx() as conn:
        items = convs.items_after(conn, org_id, state=params["state"], after=params.get("cursor"),
                                  limit=params["limit"] + 1)
    more = len(items) > params["limit"]
    items = items[:params["limit"]]
    return jsonify(ConversationPage().dump({"data": [conversation_out(i) for i in items],
                                            "next_cursor": encode_cursor(items[-1].id) if more else None}))


@bp.post("/conversations/<int:inbound_id>/reply")
@documented("post", "/conversations/{inbound_id}/reply", "Answer a patient as the staff", tag="conversations",
            path_id="inbound_id",
            description="Queued in the outbox to go now (purpose `conversation_reply`), exactly as an answer "
                        "written in the console, and the sender's open replies are marked handled. The same "
                        "`Idempotency-Key` answers the same message (200); with another text it is a 409. When nothing can go (no contact, "
                        "no channel, Meta's window closed without `use_template`) it is a 422 whose `details` "
                        "say why in the catalogue's words, and nothing is written.",
            body=ConversationReplyIn, header=IdempotencyHeader,
            responses={201: (ConversationReplyOut, "Queued"), 200: (ConversationReplyOut, "Already sent with "
                                                                                          "this key")},
            errors=(400, 404, 409, 413, 422))
@require_key
def reply_conversation(inbound_id: int) -> Any:
    inbound_id = path_id(inbound_id)
    key, data = idempotency_key(json_body(), ConversationReplyIn())
    org_id = caller().org_id
    form_key = _form_key(key)
    with org_tx() as conn:
        item = _find(conn, org_id, inbound_id)
        result = convs.send_reply(conn, org_id, item, None, form_key, text=data.get("text"),
                                  use_template=data["use_template"])
        created = result.message_id is not None
        message_id = result.message_id
        if not created and result.code == "conversation_already_sent":
            message_id = find_id(conn, org_id, f"conversation:{item.id}:{form_key}")
            sent = find_message(conn, org_id, int(message_id)) if message_id is not None else None
            if sent is not None and (sent.payload or {}).get("text") != (None if data["use_template"]
                                                                        else convs.clean_reply(data.get("text"))[0]):
                raise ApiError(409, "this Idempotency-Key was already used for a different request")
        if message_id is None:
            params = {"max": convs.MAX_REPLY} if result.code == "conversation_text_too_long" else {}
            raise ApiError(422, "the answer cannot be sent", [detail(result.code, "text" if "text" in result.code
                                                                     else "", describe(result.code, **params))])
        if created:
            _audit(conn, "reply", item.id, {"message_id": message_id, "template": data["use_template"]})
        message = message_out(find_message(conn, org_id, int(message_id)))
        item = _find(conn, org_id, inbound_id)
    response = jsonify(ConversationReplyOut().dump({"conversation": conversation_out(item), "message": message}))
    response.status_code = 201 if created else 200
    return response


@bp.post("/conversations/<int:inbound_id>/handled")
@documented("post", "/conversations/{inbound_id}/handled", "Mark a patient's reply handled", tag="conversations",
            path_id="inbound_id",
            description="As the console's \"Marcar como resolvida\". Marking one already handled changes nothing "
                        "and answers it as it is.",
            responses={200: (ConversationOut, "Handled")}, errors=(404,))
@require_key
def mark_conversation_handled(inbound_id: int) -> Any:
    org_id = caller().org_id
    with org_tx() as conn:
        item = _find(conn, org_id, inbound_id)
        changed = convs.mark_handled(conn, org_id, [item.id], None)
        item = _find(conn, org_id, item.id)
        if changed:
            _audit(conn, "handle", item.id, {"handled_at": item.handled_at})
    return jsonify(ConversationOut().dump(conversation_out(item)))
