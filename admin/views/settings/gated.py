"""The base of the settings pages that are not a table of one model (Campos, Agenda, Webhooks):
signed-in owners and managers only, like Chaves de API (admin/views/settings/access.py); anyone
else signed in gets 403 and the menu hides the entry, anyone signed out goes to the login page."""

from __future__ import annotations

from typing import Any

from flask import abort
from flask_login import current_user

from admin.ids import MAX_ID
from admin.views.base import TenantPageView

#: Roles that may open these pages at all.
ADMIN_ROLES = ("owner", "manager")


class AdminPageView(TenantPageView):
    """A console page for owners and managers; the page is bound to the signed-in user's org."""

    def is_accessible(self) -> bool:
        return super().is_accessible() and current_user.role in ADMIN_ROLES

    def inaccessible_callback(self, name: str, **kwargs: Any) -> Any:
        if current_user.is_authenticated:
            abort(403)  # signed in, just not allowed here (not a trip to the login page)
        return super().inaccessible_callback(name, **kwargs)


def path_id(value: int) -> int:
    """A path's `<int:…>` id, or 404 when no row can have it (past bigint: the database must not be asked)."""
    if not 1 <= value <= MAX_ID:
        abort(404)
    return value
