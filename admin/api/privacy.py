"""Privacy endpoints of `/api/v1` (LGPD): erase a contact, export its consent evidence. (The
contact fields that say when an address was refused and which contacts share the phone come
from `engine.queue.address_optouts.contact_fields`.)

Importing this module adds its routes to the API blueprint (`admin.api.core.bp`) and declares
them for the OpenAPI document, like admin/api/views.py does for the others."""

from __future__ import annotations

from typing import Any

from flask import jsonify
from marshmallow import Schema, fields, validate

from admin.api.core import ApiError, bp, caller, org_tx, path_id, require_key, runtime
from admin.api.openapi import documented
from engine.tenants.audit import audit
from engine.store.models import CHANNEL_KINDS
from engine.privacy import consent, erasure

_DT = {"format": "date-time"}


# --- schemas ------------------------------------------------------------------------------------

class ContactErasedOut(Schema):
    id = fields.Integer(required=True)
    erased_at = fields.String(required=True, metadata=_DT)
    erased_by = fields.String(required=True, metadata={"description": "`api_key:ID`, `user:ID` or `cli:NAME`"})
    messages_cancelled = fields.Integer(required=True, metadata={"description": "Not sent yet; now cancelled."})
    enrollments_ended = fields.Integer(required=True, metadata={"description": "Live follow-up runs ended."})
    messages_anonymised = fields.Integer(required=True)
    replies_anonymised = fields.Integer(required=True)
    sandbox_anonymised = fields.Integer(required=True)
    audit_scrubbed = fields.Integer(required=True)
    addresses_hashed = fields.Integer(required=True, metadata={
        "description": "Refused addresses now kept only as a keyed hash: still refused if they come back."})


class ConsentContactOut(Schema):
    id = fields.Integer(required=True)
    external_id = fields.String(required=True, allow_none=True)
    name = fields.String(required=True, allow_none=True)
    phone = fields.String(required=True, allow_none=True)
    email = fields.String(required=True, allow_none=True)
    created_at = fields.String(required=True, metadata=_DT)
    erased_at = fields.String(required=True, allow_none=True, metadata=_DT)
    erased_by = fields.String(required=True, allow_none=True)


class ConsentKindOut(Schema):
    channel_kind = fields.String(required=True, validate=validate.OneOf(CHANNEL_KINDS))
    status = fields.String(required=True, validate=validate.OneOf(("agreed", "refused", "not_agreed", "never_asked")))
    agreed_at = fields.String(required=True, allow_none=True, metadata=_DT)
    refused_at = fields.String(required=True, allow_none=True, metadata=_DT)
    source = fields.String(required=True, allow_none=True, metadata={"description": "clinic, api, reply:whatsapp, …"})
    evidence = fields.String(required=True, allow_none=True)


class OptOutOut(Schema):
    at = fields.String(required=True, allow_none=True, metadata=_DT)
    scope = fields.String(required=True, validate=validate.OneOf(("contact", "address", "reply")), metadata={
        "description": "`contact`: this contact's refusal of a kind; `address`: a refusal of its phone or "
                       "e-mail (by it or another contact on the same address); `reply`: a reply that asked to stop."})
    channel_kinds = fields.List(fields.String(validate=validate.OneOf(CHANNEL_KINDS)), required=True)
    source = fields.String(required=True, allow_none=True)
    evidence = fields.String(required=True, allow_none=True)
    address = fields.String(required=True, allow_none=True, validate=validate.OneOf(("phone", "email")))
    address_kept = fields.String(validate=validate.OneOf(("plain", "hashed")))
    by_this_contact = fields.Boolean(required=True)


class ConsentHistoryOut(Schema):
    at = fields.String(required=True, metadata=_DT)
    action = fields.String(required=True)
    by = fields.String(required=True)
    fields_ = fields.List(fields.String(), required=True, data_key="fields", attribute="fields")
    consent = fields.List(fields.String(), required=True, allow_none=True)


class ConsentEvidenceOut(Schema):
    format = fields.String(required=True)
    generated_at = fields.String(required=True, metadata=_DT)
    contact = fields.Nested(ConsentContactOut, required=True)
    consent = fields.List(fields.Nested(ConsentKindOut), required=True)
    opt_outs = fields.List(fields.Nested(OptOutOut), required=True)
    refused_now = fields.List(fields.String(validate=validate.OneOf(CHANNEL_KINDS)), required=True)
    history = fields.List(fields.Nested(ConsentHistoryOut), required=True)


# --- routes -------------------------------------------------------------------------------------

@bp.delete("/contacts/<int:contact_id>")
@documented("delete", "/contacts/{contact_id}", "Erase a contact (LGPD)", tag="contacts", path_id="contact_id",
            description="Anonymises the contact everywhere: name, phone, e-mail and language, the text of every "
                        "message to it and reply from it, the sandbox's copies and the audit trail's values. "
                        "Everything not sent yet is cancelled and every live follow-up run ends "
                        "(`contact_erased`). The counts stay, and a tombstone says when and by whom; the "
                        "external id stays reserved. Refusals of its phone or e-mail keep blocking the address "
                        "(kept as a keyed hash when no other contact carries it). The contact then answers 404.",
            responses={200: (ContactErasedOut, "Erased")}, errors=(404,))
@require_key
def erase_contact(contact_id: int) -> Any:
    contact_id = path_id(contact_id)
    who = caller()
    with org_tx() as conn:
        try:
            done = erasure.erase_contact(conn, who.org_id, contact_id, by=f"api_key:{who.id}",
                                         keyring=runtime().keyring)
        except erasure.ContactNotFound:
            raise ApiError(404) from None
        counts = done.counts()
        audit(conn, org_id=who.org_id, api_key_id=who.id, action="erase", entity="contact", entity_id=contact_id,
              changes=counts)
    counts["id"] = counts.pop("contact_id")
    return jsonify(ContactErasedOut().dump(counts))


@bp.get("/contacts/<int:contact_id>/consent")
@documented("get", "/contacts/{contact_id}/consent", "A contact's consent evidence", tag="contacts",
            path_id="contact_id",
            description="What the contact agreed to, per channel kind (when, source, evidence), and every "
                        "opt-out: its own, the refusals of its phone or e-mail by whichever contact carried "
                        "them, and each reply that asked to stop. No message text.",
            responses={200: (ConsentEvidenceOut, "The evidence")}, errors=(404,))
@require_key
def contact_consent(contact_id: int) -> Any:
    contact_id = path_id(contact_id)
    org_id = caller().org_id
    with org_tx() as conn:
        try:
            document = consent.evidence(conn, org_id, contact_id)
        except consent.ContactNotFound:
            raise ApiError(404) from None
    if document["contact"]["erased_at"] is not None:
        raise ApiError(404)  # like every other read of an erased contact (the CLI still shows its tombstone)
    return jsonify(ConsentEvidenceOut().dump(document))
