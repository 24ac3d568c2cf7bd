"""The JSON body of a request, read strictly: the one parser of the REST API's bodies and of the
flow builder's (issue 30, point 6). Each answers a refusal in its own shape; what is refused,
and the sentence that says so, is the same for both.

- larger than the app's MAX_CONTENT_LENGTH: 413 (`body_too_large`), before it is read;
- not JSON (or not UTF-8): 400 (`body_not_json`);
- nested deeper than `engine.core.strict_json.MAX_DEPTH`: 400 (`body_too_deep`);
- a value no database stores (NaN, Infinity, 1e999, an integer past 64 bits, a NUL character or
  a lone surrogate in a string or a key): 422 (`body_invalid_value`, saying where).
"""

from __future__ import annotations

from typing import Any

from flask import current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from engine.words.catalogue import describe
from engine.core.strict_json import JsonRefused, loads
from engine.words.texts import Text


class BodyRefused(Exception):
    """A request body refused before anything looked at its meaning: `status` to answer, and
    `message` (a catalogue sentence) with the `code` it comes from and the `field` it is about."""

    def __init__(self, status: int, code: str, params: dict[str, Any], field: str | None = None) -> None:
        super().__init__(code)
        self.status, self.code, self.params, self.field = status, code, params, field

    @property
    def message(self) -> Text:
        return describe(self.code, **self.params)


def too_large() -> BodyRefused:
    """The refusal of a body over the app's MAX_CONTENT_LENGTH (also when something else, such as
    the CSRF check reading the form, met the limit first: admin/errors.py answers it)."""
    limit = current_app.config.get("MAX_CONTENT_LENGTH") or 0
    return BodyRefused(413, "body_too_large", {"max": limit // 1024})


def request_json() -> Any:
    """The request's body as a JSON document (any JSON value); BodyRefused otherwise."""
    try:
        raw = request.get_data(cache=True)
    except RequestEntityTooLarge:
        raise too_large() from None
    try:
        return loads(raw)
    except JsonRefused as exc:
        if exc.problem is None:
            raise BodyRefused(400, exc.code, exc.params) from None
        raise BodyRefused(422, exc.code, exc.params, field=exc.params["field"]) from None
