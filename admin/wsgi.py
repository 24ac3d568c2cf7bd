"""WSGI entry point for gunicorn: `gunicorn admin.wsgi:app`."""

from __future__ import annotations

from admin.app import create_app
from engine.fleet.broker import setup_broker
from engine.core.config import Settings
from engine.core.logs import configure
from engine.store.runtime import Runtime, install

_settings = Settings.from_env()
configure(_settings.log_level, _settings.log_format)
_runtime = Runtime.build(_settings)
install(_runtime)
setup_broker(_settings)

import engine.fleet.actors as _actors  # noqa: E402  (declared on the broker set up above)

app = create_app(_runtime, enqueue_inbound=lambda ids: _actors.process_inbound.send(list(ids)))
