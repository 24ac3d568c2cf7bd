"""The REST API `/api/v1` (SPEC §9): a clinic's own software pushes contacts and appointments,
reads and sends messages, and reports hand-off and stage events.

Every request carries `Authorization: Bearer lembra_<prefix>_<secret>`; the key decides the org,
and every query below is scoped to it. Another org's ids answer 404, exactly like ids that do not
exist. Errors are JSON `{error, details}`; a 422 lists every field's errors at once.
"""

from __future__ import annotations

from admin.api import agenda, fields, privacy, templates, understand, views, webhooks  # noqa: F401  (registers the routes)
from admin.api import conversations, directory  # noqa: F401  (agents, channels, conversations)
from admin.api.core import bp

__all__ = ["bp"]
