"""The Flask application factory."""

from __future__ import annotations

from typing import Callable, Sequence

from flask import Flask, redirect, url_for
from flask_wtf import CSRFProtect
from prometheus_client import CollectorRegistry

import engine.flows.receivers  # noqa: F401  (appointment changes and opt-outs reach the flows)

from admin import api, auth, health, optout, webhooks
from admin.errors import init_error_pages
from admin.ids import AsciiIntegerConverter
from admin.i18n import init_i18n
from admin.security import init_security_headers
from admin.throttle import LoginThrottle
from engine.tenants.orgs import warm_dummy_hash
from engine.store.runtime import Runtime

csrf = CSRFProtect()


def create_app(rt: Runtime, *, enqueue_inbound: Callable[[Sequence[int]], None] | None = None) -> Flask:
    """Build the app around a runtime. `enqueue_inbound` hands new patient messages to the
    workers; without one they are processed in the request (tests, one-off tools)."""
    app = Flask(__name__)
    app.url_map.converters["int"] = AsciiIntegerConverter  # before any route is added
    app.config.update(
        SECRET_KEY=_session_key(rt),
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=rt.settings.public_url.startswith("https://"),
        REMEMBER_COOKIE_SECURE=rt.settings.public_url.startswith("https://"),
        # Provider webhooks are small; anything bigger is refused before it is read (413).
        MAX_CONTENT_LENGTH=1024 * 1024,
        LEMBRA_RUNTIME=rt,
    )
    if enqueue_inbound is None:
        from engine.messaging.inbound import process_inbound

        def enqueue_inbound(ids: Sequence[int]) -> None:
            for inbound_id in ids:
                process_inbound(rt, inbound_id)

    app.config["LEMBRA_ENQUEUE_INBOUND"] = enqueue_inbound
    app.extensions["lembra_login_throttle"] = LoginThrottle(rt.settings.ratelimit_url)
    registry = CollectorRegistry()
    registry.register(health.QueueCollector(rt))
    app.config["LEMBRA_METRICS"] = registry

    csrf.init_app(app)
    init_i18n(app)
    init_error_pages(app)
    init_security_headers(app)  # CSP (with a nonce per response), no framing, nosniff, no-store
    auth.login_manager.init_app(app)
    warm_dummy_hash()  # an unknown e-mail's sign-in costs one hash from the first attempt on
    app.register_blueprint(health.bp)
    app.register_blueprint(webhooks.bp)
    csrf.exempt(webhooks.bp)  # providers authenticate by signature, not by session
    app.register_blueprint(optout.bp)
    csrf.exempt(optout.bp)  # RFC 8058 one-click POSTs come from mail clients, with no session
    app.register_blueprint(auth.bp)
    _bookmarks(app)
    app.register_blueprint(api.bp)
    csrf.exempt(api.bp)  # the REST API authenticates by bearer key, not by session cookie
    from admin.views import init_admin

    init_admin(app, rt)  # Flask-Admin console at /admin; its POSTs are checked by CSRFProtect too
    return app


def _bookmarks(app: Flask) -> None:
    """Old addresses kept as redirects: the README's root URL and the sandbox inbox's first home."""
    app.add_url_rule("/", "root", lambda: redirect(url_for("admin.index")))
    # Bookmarks of the standalone page; the inbox now lives in the console (admin/views/messages/sandbox.py).
    app.add_url_rule("/sandbox", "sandbox_bookmark", lambda: redirect(url_for("sandbox.index")))


def _session_key(rt: Runtime) -> bytes:
    """Session signing key, derived from the credential keyring: one secret to keep."""
    return rt.keyring.derive("flask-session")
