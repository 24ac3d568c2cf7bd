"""Process logging: JSON lines (or plain text), never PII.

Log calls pass ids and codes in `extra`, never phones, names or message bodies; SQLAlchemy is
built with `hide_parameters` so a failing statement does not print the row it was writing.
"""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

_configured = False


def configure(level: str = "INFO", fmt: str = "json") -> None:
    """Configure the root logger once per process."""
    global _configured
    if _configured:
        return
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        ))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Request lines carry URLs with ids only, but keep them out of the default level anyway.
    logging.getLogger("werkzeug").setLevel("WARNING")
    logging.getLogger("pika").setLevel("WARNING")
    _configured = True
