"""Template endpoints of `/api/v1`: the org's templates and the global defaults, with each one's
Meta mapping (engine/messaging/meta_templates.py); customise a default, change an override (its mapping
included), and list the approved templates of the clinic's WhatsApp Business Account.

A save is checked as the console's Modelos form checks it: a refusal is a 422 whose `details` list
every problem, each `{code, field, message, message_en}` (the catalogue's sentences), and nothing
is written. When Meta cannot be asked for the WABA's templates the save goes through and the answer
carries the sentence in `warnings`; a template Lembra sends on its own initiative with no Meta
mapping at all is refused whatever Meta answers.

Importing this module adds its routes to the API blueprint, like admin/api/privacy.py."""

from __future__ import annotations

from typing import Any, Iterable

from flask import jsonify
from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from admin.api.core import (
    ApiError,
    bp,
    caller,
    error_response,
    finding_detail,
    json_body,
    load,
    load_query,
    org_tx,
    path_id,
    require_key,
    runtime,
)
from admin.api.openapi import documented
from admin.api.schemas import Text
from engine.messaging import meta_templates, template_edits
from engine.tenants.audit import audit
from engine.messaging.meta_templates import BUTTON_ACTIONS, MAX_PARAMETERS, MetaMapping
from engine.words.findings import Finding
from engine.store.models import CHANNEL_KINDS
from engine.messaging.template_edits import UNSET, Changes, TemplateNotFound, TemplateRefused

_DT = {"format": "date-time"}
#: Refusals that are about the resource's state, not the request's fields.
CONFLICTS = ("template_default_read_only", "template_exists")


# --- schemas ------------------------------------------------------------------------------------

class TemplateMetaIn(Schema):
    class Meta:
        unknown = RAISE

    name = Text(required=True, validate=validate.Length(min=1, max=512),
                metadata={"description": "The approved template's name at Meta, e.g. `lembrete_sessao`."})
    language = Text(required=True, validate=validate.Length(min=1, max=20), metadata={"example": "pt_BR"})
    parameters = fields.List(Text(validate=validate.Length(min=1, max=64)), load_default=list,
                             validate=validate.Length(max=MAX_PARAMETERS),
                             metadata={"description": "The Lembra variable that fills each body parameter "
                                                      "({{1}}, {{2}}, …), in order: "
                                                      + ", ".join(meta_templates.VARIABLES) + "."})
    buttons = fields.List(fields.String(validate=validate.OneOf(BUTTON_ACTIONS)), load_default=list,
                          validate=validate.Length(max=len(BUTTON_ACTIONS)),
                          metadata={"description": "What each of the template's quick-reply buttons does, in "
                                                   "their order (reminders and confirmations only)."})


class TemplateQuery(Schema):
    """Filters of the list; an unknown one is a 422, not ignored (a filter a client misspells must
    not answer every template as if it had matched)."""

    class Meta:
        unknown = RAISE

    key = Text(validate=validate.Length(min=1, max=64), metadata={"example": "session_reminder"})
    channel_kind = fields.String(validate=validate.OneOf(CHANNEL_KINDS))
    locale = fields.String(validate=validate.OneOf(template_edits.LOCALES))
    origin = fields.String(validate=validate.OneOf(("default", "clinic")))


_META_IN = {"description": "The approved Meta template this WhatsApp template sends outside the 24-hour window; "
                           "`null` goes back to the global default's mapping."}


class TemplatePatch(Schema):
    """Only the fields given change."""

    class Meta:
        unknown = RAISE

    subject = Text(allow_none=True, validate=validate.Length(max=300))
    body = Text(validate=validate.Length(min=1, max=10_000))
    body_html = Text(allow_none=True, validate=validate.Length(max=100_000))
    meta = fields.Nested(TemplateMetaIn, allow_none=True, metadata=_META_IN)

    @validates_schema(skip_on_field_errors=False)
    def _body_not_blank(self, data: dict[str, Any], **kwargs: Any) -> None:
        if isinstance(data.get("body"), str) and not data["body"].strip():
            raise ValidationError("Must not be blank.", "body")


class TemplateIn(TemplatePatch):
    """The org's own template for a purpose, channel kind and language: the global default's texts
    and Meta mapping where not given."""

    key = fields.String(required=True, validate=validate.OneOf(template_edits.TEMPLATE_KEYS))
    channel_kind = fields.String(required=True, validate=validate.OneOf(CHANNEL_KINDS))
    locale = fields.String(load_default="pt_BR", validate=validate.OneOf(template_edits.LOCALES))


class TemplateMetaOut(Schema):
    name = fields.String(required=True)
    language = fields.String(required=True)
    parameters = fields.List(fields.String(), required=True)
    buttons = fields.List(fields.String(validate=validate.OneOf(BUTTON_ACTIONS)), required=True)


class TemplateOut(Schema):
    id = fields.Integer(required=True)
    origin = fields.String(required=True, validate=validate.OneOf(("default", "clinic")),
                           metadata={"description": "`default`: a global default (read-only); `clinic`: the org's."})
    key = fields.String(required=True)
    channel_kind = fields.String(required=True, validate=validate.OneOf(CHANNEL_KINDS))
    locale = fields.String(required=True)
    subject = fields.String(required=True, allow_none=True)
    body = fields.String(required=True)
    body_html = fields.String(required=True, allow_none=True)
    meta = fields.Nested(TemplateMetaOut, required=True, allow_none=True,
                         metadata={"description": "What Meta is sent outside the 24-hour window (null: nothing)."})
    meta_inherited = fields.Boolean(required=True, metadata={"description": "`meta` is the global default's."})
    meta_preview = fields.Dict(required=True, allow_none=True,
                               metadata={"description": "The `template` object Meta would receive, on sample data."})
    updated_at = fields.String(required=True, metadata=_DT)


class FindingOut(Schema):
    code = fields.String(required=True)
    field = fields.String(required=True, metadata={"description": "The part it is about (`meta.name`, `body`, …)."})
    message = fields.String(required=True, metadata={"description": "pt-BR"})
    message_en = fields.String(required=True)


class TemplateSavedOut(TemplateOut):
    warnings = fields.List(fields.Nested(FindingOut), required=True,
                           metadata={"description": "Saved, but said: e.g. Meta could not be asked for the WABA's "
                                                    "templates, so the mapping was not checked against them."})


class TemplatePageOut(Schema):
    data = fields.List(fields.Nested(TemplateOut), required=True)


class WabaButtonOut(Schema):
    type = fields.String(required=True, metadata={"example": "QUICK_REPLY"})
    text = fields.String(required=True)


class WabaTemplateOut(Schema):
    name = fields.String(required=True)
    language = fields.String(required=True)
    status = fields.String(required=True, metadata={"description": "Meta's: APPROVED, PENDING, REJECTED, PAUSED, …"})
    status_text = fields.String(required=True)
    category = fields.String(required=True)
    body = fields.String(required=True)
    parameter_count = fields.Integer(required=True)
    named_parameters = fields.Boolean(required=True, metadata={"description": "Lembra fills numbered ones only."})
    buttons = fields.List(fields.Nested(WabaButtonOut), required=True)
    problems = fields.List(fields.Nested(FindingOut), required=True,
                           metadata={"description": "Why Lembra cannot send it, whatever the mapping (empty: it can)."})


class WabaPageOut(Schema):
    data = fields.List(fields.Nested(WabaTemplateOut), required=True)


# --- helpers ------------------------------------------------------------------------------------

def finding_out(finding: Finding) -> dict[str, Any]:
    part = finding.field
    field = part if part in template_edits.TEXT_FIELDS or part == "key" else f"meta.{part}" if part else "meta"
    return finding_detail(finding, field)


def _refused(exc: TemplateRefused) -> Any:
    found = [finding_out(f) for f in exc.findings]
    if any(f.code in CONFLICTS for f in exc.findings):
        return error_response(409, "the template cannot be changed this way", found)
    return error_response(422, "the template would not work", found)


def template_out(row: Any, default: Any) -> dict[str, Any]:
    mapping, inherited = meta_templates.effective(row, default)
    return {
        "id": row.id, "origin": _origin(row), "key": row.key,
        "channel_kind": row.channel_kind, "locale": row.locale, "subject": row.subject, "body": row.body,
        "body_html": row.body_html, "meta": mapping.as_dict() if mapping is not None else None,
        "meta_inherited": inherited, "meta_preview": meta_templates.preview(mapping),
        "updated_at": row.updated_at.isoformat(),
    }


def _defaults(rows: Iterable[Any]) -> dict[tuple[str, str, str], Any]:
    return {(r.key, r.channel_kind, r.locale): r for r in rows if r.org_id is None}


def _origin(row: Any) -> str:
    return "default" if row.org_id is None else "clinic"


def _matches(row: Any, filters: dict[str, Any]) -> bool:
    """Whether a template passes the list's filters (key, channel_kind, locale, origin)."""
    return all(value == (_origin(row) if name == "origin" else getattr(row, name)) for name, value in filters.items())


def _one(conn: Any, org_id: int, template_id: int) -> dict[str, Any]:
    row = template_edits.find_visible(conn, org_id, template_id)
    return template_out(row, meta_templates.default_of(conn, row))


def _changes(data: dict[str, Any]) -> Changes:
    meta: Any = UNSET
    if "meta" in data:
        given = data["meta"]
        meta = None if given is None else MetaMapping(given["name"], given["language"], tuple(given["parameters"]),
                                                      tuple(given["buttons"]))
    return Changes(**{name: data[name] for name in template_edits.TEXT_FIELDS if name in data}, meta=meta)


def _waba_of(kind: str) -> Any:
    """The WABA's templates a save of a `kind` template is checked against, read with no
    transaction open (None when the org's WhatsApp is not Meta's)."""
    with org_tx() as conn:
        channel = template_edits.waba_for(conn, caller().org_id, kind)
    return meta_templates.read_waba(runtime().providers, channel) if channel is not None else None


def _saved(conn: Any, org_id: int, saved: template_edits.Saved) -> dict[str, Any]:
    who = caller()
    audit(conn, org_id=org_id, api_key_id=who.id, action="create" if saved.created else "update",
          entity="templates", entity_id=saved.id, changes=saved.changes)
    return {**_one(conn, org_id, saved.id), "warnings": [finding_out(f) for f in saved.warnings]}


# --- routes -------------------------------------------------------------------------------------

@bp.errorhandler(TemplateNotFound)
def _template_not_found(exc: TemplateNotFound) -> Any:
    return error_response(404)  # another org's template answers like one that does not exist


@bp.errorhandler(TemplateRefused)
def _template_refused(exc: TemplateRefused) -> Any:
    return _refused(exc)


@bp.get("/templates")
@documented("get", "/templates", "List templates: the org's own and the global defaults", tag="templates",
            query=TemplateQuery, errors=(422,),
            description="Every template the org's messages may use: its own (`origin: clinic`) and the global "
                        "defaults (`origin: default`), each with the Meta mapping it sends outside WhatsApp's "
                        "24-hour window (an override without its own uses its default's: `meta_inherited`).",
            responses={200: (TemplatePageOut, "Every template")})
@require_key
def list_templates() -> Any:
    params = load_query(TemplateQuery())
    with org_tx() as conn:
        rows = template_edits.visible(conn, caller().org_id)
    defaults = _defaults(rows)
    data = [template_out(r, defaults.get((r.key, r.channel_kind, r.locale)) if r.org_id is not None else None)
            for r in rows if _matches(r, params)]
    return jsonify(TemplatePageOut().dump({"data": data}))


@bp.get("/templates/<int:template_id>")
@documented("get", "/templates/{template_id}", "Get a template with its Meta mapping", tag="templates",
            path_id="template_id", responses={200: (TemplateOut, "The template")}, errors=(404,))
@require_key
def get_template(template_id: int) -> Any:
    with org_tx() as conn:
        out = _one(conn, caller().org_id, path_id(template_id))
    return jsonify(TemplateOut().dump(out))


@bp.post("/templates")
@documented("post", "/templates", "Customise a template: create the org's own", tag="templates",
            description="Starts from the global default of the same purpose, channel kind and language (its "
                        "texts where not given; its Meta mapping until `meta` is given). A 409 when the org "
                        "already has one. On an org whose WhatsApp goes through Meta, the mapping is checked "
                        "against the WABA's templates: not APPROVED, another number of body parameters or quick "
                        "replies, a template Lembra sends on its own with no mapping: 422, nothing written.",
            body=TemplateIn, responses={201: (TemplateSavedOut, "Created")}, errors=(400, 409, 413, 422))
@require_key
def create_template() -> Any:
    data = load(TemplateIn(), json_body())
    org_id = caller().org_id
    waba = _waba_of(data["channel_kind"])
    with org_tx() as conn:
        saved = template_edits.customize(conn, org_id, key=data["key"], kind=data["channel_kind"],
                                         locale=data["locale"], changes=_changes(data), waba=waba)
        out = _saved(conn, org_id, saved)
    response = jsonify(TemplateSavedOut().dump(out))
    response.status_code = 201
    return response


@bp.patch("/templates/<int:template_id>")
@documented("patch", "/templates/{template_id}", "Change the org's template, its Meta mapping included",
            tag="templates", path_id="template_id",
            description="Only the fields given change; `meta: null` goes back to the default's mapping. A global "
                        "default is read-only (409: customise it with `POST /templates`). The mapping is checked "
                        "as on create.",
            body=TemplatePatch, responses={200: (TemplateSavedOut, "Saved")}, errors=(400, 404, 409, 413, 422))
@require_key
def update_template(template_id: int) -> Any:
    template_id = path_id(template_id)
    data = load(TemplatePatch(), json_body())
    org_id = caller().org_id
    with org_tx() as conn:
        row = template_edits.find_visible(conn, org_id, template_id)
    waba = _waba_of(row.channel_kind) if row.org_id is not None else None
    with org_tx() as conn:
        saved = template_edits.change(conn, org_id, template_id, _changes(data), waba=waba)
        out = _saved(conn, org_id, saved)
    return jsonify(TemplateSavedOut().dump(out))


@bp.get("/templates/waba")
@documented("get", "/templates/waba", "The templates of the clinic's WhatsApp Business Account", tag="templates",
            description="Asked of Meta now (`GET /{waba_id}/message_templates`, every page), whatever their "
                        "status, to pick a mapping from. 409 when the org's WhatsApp does not go through Meta or "
                        "its channel has no WABA id; 502 when Meta could not be asked or refused (the sentence "
                        "says which).",
            responses={200: (WabaPageOut, "The WABA's templates, approved first")}, errors=(409, 502))
@require_key
def waba_templates() -> Any:
    with org_tx() as conn:
        channel = meta_templates.meta_channel(conn, caller().org_id)
    if channel is None:
        raise ApiError(409, "the org's WhatsApp does not go through Meta", [finding_out(Finding("waba_no_channel"))])
    waba = meta_templates.read_waba(runtime().providers, channel)
    if waba.problem is not None:
        status = 409 if waba.problem.code == "waba_channel_no_waba" else 502
        raise ApiError(status, "the WABA's templates could not be read", [finding_out(waba.problem)])
    data = [{"name": t.name, "language": t.language, "status": t.status,
             "status_text": str(meta_templates.status_text(t.status)), "category": t.category, "body": t.body,
             "parameter_count": len(t.parameters), "named_parameters": t.named,
             "buttons": [{"type": b.type, "text": b.text} for b in t.buttons],
             "problems": [finding_out(f) for f in meta_templates.unusable(t)]}
            for t in meta_templates.offered(waba)]
    return jsonify(WabaPageOut().dump({"data": data}))
