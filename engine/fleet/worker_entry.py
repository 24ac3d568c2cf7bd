"""Entry point for the `dramatiq` command (`dramatiq engine.fleet.worker_entry:broker`): builds the broker
from the environment and declares the actors on it. `lembra worker` does not use it: it runs its
own supervised worker processes (engine/fleet/supervisor.py, engine/fleet/worker_process.py), because the
`dramatiq` command stops every worker process when one of them dies."""

from __future__ import annotations

from engine.fleet.broker import setup_broker
from engine.core.config import Settings
from engine.core.logs import configure

_settings = Settings.from_env()
configure(_settings.log_level, _settings.log_format)
broker = setup_broker(_settings)
