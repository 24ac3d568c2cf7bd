"""Security headers on every response (SPEC §10, issue 9 point 6).

- `Content-Security-Policy`: scripts and `<style>` elements only from the app itself or carrying
  this response's nonce (`csp_nonce()`, also handed to Flask-Admin's templates); no plug-ins, no
  `<base>`, forms post only here, and no page may be framed (`frame-ancestors 'none'`). Flask-Admin
  still writes a few fixed inline event handlers (the list actions, the delete button's
  confirmation, the filter menu) and inert `javascript:void(0)` links (its menus): those exact
  strings are allowed by hash (`'unsafe-hashes'`), nothing else inline is. A template of ours
  writes `<script nonce="{{ csp_nonce() }}">` and binds its handlers there (a form that asks
  first says so with `data-lembra-confirm`, admin/templates/admin/lembra_base.html). `style`
  attributes stay allowed (`style-src-attr`): they cannot run script, and with
  `img-src 'self' data:` they cannot send anything elsewhere.
- `Strict-Transport-Security` when the public URL is https.
- `X-Frame-Options: DENY` (older browsers), `X-Content-Type-Options: nosniff`,
  `Referrer-Policy: same-origin` (opt-out links carry a token in their path).
- `Cache-Control: no-store` on everything but static files: signed-in pages and CSV exports show
  patients' data, and the login page carries a CSRF token.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Iterable

from flask import Flask, Response, current_app, g, request

#: Inline script Flask-Admin's bootstrap4 templates write whatever the view: the filter menu's
#: handler (admin/model/layout.html) and the `href` of its dropdown toggles, which a click tries to
#: follow when Bootstrap does not stop it; the per-view ones are built in `_flask_admin_handlers`.
FIXED_HANDLERS = ("return false;", "javascript:void(0)")
#: The delete button's confirmation (admin/model/row_actions.html), in Flask-Admin's own catalog.
DELETE_CONFIRMATION = "Are you sure you want to delete this record?"


def csp_nonce() -> str:
    """This response's nonce, for `<script nonce=…>` and `<style nonce=…>` in the templates."""
    nonce = g.get("lembra_csp_nonce")
    if nonce is None:
        nonce = g.lembra_csp_nonce = secrets.token_urlsafe(18)
    return nonce


def _sha256(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


def _flask_admin_handlers(app: Flask) -> Iterable[str]:
    """The inline handlers Flask-Admin renders for this app's views: each list action's
    `modelActions.execute('<name>')` and the delete confirmation in every console language."""
    from flask_admin.babel import gettext as admin_gettext
    from flask_babel import force_locale

    from admin.i18n import LOCALES

    yield from FIXED_HANDLERS
    for admin in app.extensions.get("admin", []):
        for view in admin._views:
            for name, _text in getattr(view, "_actions", None) or ():
                yield f"return modelActions.execute('{name}');"
    for locale in LOCALES:
        with force_locale(locale):
            yield f"return faHelpers.safeConfirm('{admin_gettext(DELETE_CONFIRMATION)}');"


def handler_hashes(app: Flask) -> str:
    """The hash sources of `_flask_admin_handlers`, computed once per app (in a request: the
    confirmation's translation needs one)."""
    cached = app.extensions.get("lembra_csp_handler_hashes")
    if cached is None:
        cached = app.extensions["lembra_csp_handler_hashes"] = " ".join(
            sorted({_sha256(source) for source in _flask_admin_handlers(app)}))
    return cached


def content_security_policy(nonce: str, hashes: str) -> str:
    return "; ".join((
        "default-src 'self'",
        f"script-src 'self' 'nonce-{nonce}' 'unsafe-hashes' {hashes}",
        f"style-src 'self' 'nonce-{nonce}'",
        "style-src-attr 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ))


def _is_static() -> bool:
    endpoint = request.endpoint or ""
    return endpoint == "static" or endpoint.endswith(".static")


def add_security_headers(response: Response) -> Response:
    headers = response.headers
    headers["Content-Security-Policy"] = content_security_policy(csp_nonce(), handler_hashes(current_app))
    headers["X-Frame-Options"] = "DENY"
    headers["X-Content-Type-Options"] = "nosniff"
    headers["Referrer-Policy"] = "same-origin"
    if current_app.config.get("SESSION_COOKIE_SECURE"):
        headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    if not _is_static():
        headers["Cache-Control"] = "no-store"
    return response


def init_security_headers(app: Flask) -> None:
    app.jinja_env.globals["csp_nonce"] = csp_nonce
    app.after_request(add_security_headers)
