"""Canais: the channel views (view.py), the form built from the providers' declarations (forms.py)
and what the pages say about providers (messages.py)."""

from admin.views.settings.channels.messages import egress_error
from admin.views.settings.channels.view import ChannelView

__all__ = ["ChannelView", "egress_error"]
