"""Plumbing of `/api/v1`: the blueprint, bearer-key authentication, the org-scoped transaction,
request parsing and the JSON error envelope."""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, Iterator, Mapping

from flask import Blueprint, current_app, g, jsonify, request
from marshmallow import Schema, ValidationError
from sqlalchemy import text
from sqlalchemy.engine import Connection
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from admin.api.schemas import MAX_ID, IdempotencyHeader, catalogue_detail, encode_cursor
from admin.i18n import translate_to
from admin.json_body import BodyRefused, request_json
from engine.tenants.apikeys import ApiKeyIdentity, authenticate
from engine.store.runtime import Runtime
from engine.words.catalogue import describe
from engine.words.findings import Finding
from engine.words.texts import Text

log = logging.getLogger("lembra.api")

PREFIX = "/api/v1"
bp = Blueprint("api", __name__, url_prefix=PREFIX)

REASONS = {
    400: "malformed request", 401: "missing, invalid or revoked API key", 404: "not found",
    405: "method not allowed", 409: "conflict", 413: "request body too large", 415: "unsupported media type",
    422: "validation failed", 500: "internal error", 502: "the provider could not be asked, or refused",
}


class ApiError(Exception):
    """An error answered as `{error, details}` with `status`."""

    def __init__(self, status: int, error: str | None = None, details: Any = None) -> None:
        super().__init__(error or REASONS.get(status, "error"))
        self.status = status
        self.error = error or REASONS.get(status, "error")
        self.details = details


def error_response(status: int, error: str | None = None, details: Any = None,
                   headers: Mapping[str, str] | None = None) -> Any:
    response = jsonify({"error": error or REASONS.get(status, "error"), "details": details})
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="lembra"'
    return response


@bp.errorhandler(ApiError)
def _api_error(exc: ApiError) -> Any:
    return error_response(exc.status, exc.error, exc.details)


@bp.errorhandler(ValidationError)
def _validation_error(exc: ValidationError) -> Any:
    return error_response(422, details=exc.messages)


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException) -> Any:
    code = exc.code or 500
    headers = {}
    if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
        headers["Allow"] = ", ".join(sorted(exc.valid_methods))
    return error_response(code, REASONS.get(code, exc.name.lower()), None, headers)


@bp.errorhandler(Exception)
def _unexpected(exc: Exception) -> Any:
    log.exception("api request failed", extra={"path": request.path, "method": request.method})
    return error_response(500)


@bp.before_app_request
def _unrouted_api_request() -> Any:
    """Unknown paths and methods under /api/v1 answer JSON too. Routing errors never reach a
    blueprint's handlers (no endpoint matched), so they are answered here, before dispatch."""
    exc = request.routing_exception
    if exc is None or not (request.path == PREFIX or request.path.startswith(PREFIX + "/")):
        return None
    if isinstance(exc, MethodNotAllowed):
        return error_response(405, headers={"Allow": ", ".join(sorted(exc.valid_methods or ()))})
    if isinstance(exc, NotFound):
        return error_response(404)
    return None  # redirects (e.g. a missing trailing slash) keep Flask's own behaviour


def runtime() -> Runtime:
    return current_app.config["LEMBRA_RUNTIME"]


def caller() -> ApiKeyIdentity:
    return g.lembra_api_key


def require_key(view: Callable[..., Any]) -> Callable[..., Any]:
    """401 unless the request carries a live key; the key is then `caller()`."""

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401)
        with runtime().db.begin() as conn:
            identity = authenticate(conn, token.strip())
        if identity is None:
            raise ApiError(401)
        g.lembra_api_key = identity
        return view(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def org_tx() -> Iterator[Connection]:
    """One transaction for the caller's org. On PostgreSQL it also declares the org, so row-level
    security backs up every query's own org filter."""
    with runtime().db.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT set_config('lembra.org_id', :org, true)"), {"org": str(caller().org_id)})
        yield conn


#: The short English `error` of each body refusal (admin/json_body.py); `details` says the rest.
BODY_ERRORS = {"body_not_json": "the body is not valid JSON", "body_too_deep": "the body nests too deeply"}
#: How many field errors a 422 lists (one per unknown key would grow with the request).
MAX_FIELD_ERRORS = 50


def path_id(value: int) -> int:
    """An id from the URL; one no row can have answers 404, like an id that does not exist."""
    if not 1 <= value <= MAX_ID:
        raise ApiError(404)
    return value


def detail(code: str, field: str, text: Text) -> dict[str, Any]:
    """One item of an error's `details`: the catalogue `code`, the request `field` it is about ("" for
    the request as a whole) and its sentence in pt-BR (`message`) and English (`message_en`)."""
    return {"code": code, "field": field, "message": str(text), "message_en": translate_to(text, "en")}


def finding_detail(finding: Finding, field: str | None = None) -> dict[str, Any]:
    """`detail` of a finding, on its own field unless `field` names the request's."""
    return detail(finding.code, finding.field if field is None else field, finding.text)


def json_body() -> Any:
    """The request's JSON document, read strictly (admin/json_body.py): 400, 413 or 422 with
    `details` `{code, field, message, message_en}` when it is refused."""
    try:
        return request_json()
    except BodyRefused as exc:
        raise ApiError(exc.status, BODY_ERRORS.get(exc.code), detail(exc.code, exc.field, exc.message)) from None


def load(schema: Schema, data: Any, extra_errors: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate with `schema`; a 422 lists every field's errors (plus `extra_errors` found
    elsewhere), up to MAX_FIELD_ERRORS messages, and then `_more` counting the rest."""
    errors: dict[str, Any] = dict(extra_errors or {})
    result: dict[str, Any] = {}
    try:
        result = schema.load(data)
    except ValidationError as exc:
        messages = exc.messages if isinstance(exc.messages, dict) else {"_schema": exc.messages}
        errors.update(messages)
    if errors:
        raise ValidationError(_bounded_errors(errors))
    return result


def _bounded_errors(errors: dict[str, Any]) -> dict[str, Any]:
    """marshmallow's nested errors with at most MAX_FIELD_ERRORS messages, in their order; when
    some are left out, `_more` says how many, in both languages."""
    kept = 0
    hidden = 0

    def walk(node: Any) -> Any:
        nonlocal kept, hidden
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                trimmed = walk(value)
                if trimmed not in (None, {}, []):
                    out[key] = trimmed
            return out
        if isinstance(node, list):
            out_list = []
            for item in node:
                if isinstance(item, (dict, list)):
                    trimmed = walk(item)
                    if trimmed not in ({}, []):
                        out_list.append(trimmed)
                elif kept < MAX_FIELD_ERRORS:
                    kept += 1
                    out_list.append(item)
                else:
                    hidden += 1
            return out_list
        if kept < MAX_FIELD_ERRORS:
            kept += 1
            return node
        hidden += 1
        return None

    out = walk(errors)
    if hidden:
        more = describe("more_issues", count=hidden)
        out["_more"] = {"code": "more_issues", "count": hidden, "message": str(more),
                        "message_en": translate_to(more, "en")}
    return out


def load_query(schema: Schema) -> dict[str, Any]:
    return load(schema, {key: request.args.get(key) for key in request.args})


def idempotency_key(body: Any, schema: Schema) -> tuple[str, dict[str, Any]]:
    """The `Idempotency-Key` header and the body, validated together so a 422 lists both."""
    header_errors: dict[str, Any] = {}
    key = None
    given = request.headers.get("Idempotency-Key")
    if given is None or not given.strip():
        # A missing key says what to send, in the catalogue's words, not marshmallow's "Missing data".
        header_errors = {"Idempotency-Key": [catalogue_detail("api_idempotency_key_required", "Idempotency-Key")]}
    else:
        try:
            key = load(IdempotencyHeader(), {"Idempotency-Key": given})
        except ValidationError as exc:
            header_errors = exc.messages if isinstance(exc.messages, dict) else {"Idempotency-Key": exc.messages}
    data = load(schema, body, header_errors)
    assert key is not None
    return key["idempotency_key"], data


def dump(schema: type[Schema], obj: Any, status: int = 200) -> Any:
    """`obj` serialised by `schema` as the JSON response, with `status`."""
    response = jsonify(schema().dump(obj))
    response.status_code = status
    return response


def page(conn: Any, query: Any, id_column: Any, params: Mapping[str, Any]) -> tuple[list[Any], str | None]:
    """One page of `query` in id order after the cursor, and the cursor of the next page."""
    limit = params["limit"]
    if params.get("cursor") is not None:
        query = query.where(id_column > params["cursor"])
    rows = list(conn.execute(query.order_by(id_column).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1].id) if more else None
