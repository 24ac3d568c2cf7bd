"""Entry point for `dramatiq` worker processes (`lembra worker` runs them): builds the broker from
the environment and declares the actors on it."""

from __future__ import annotations

from engine.broker import setup_broker
from engine.config import Settings
from engine.logs import configure

_settings = Settings.from_env()
configure(_settings.log_level, _settings.log_format)
broker = setup_broker(_settings)
