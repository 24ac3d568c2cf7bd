"""The desk's live pages (Conversas, a conversation, the sandbox chat) refresh themselves: htmx
(admin/static/vendor) polls a fragment endpoint of the same view, which answers only the rows or
the bubbles, with the page's own org scope and role check. admin/static/desk/live.js keeps a
thread at its newest message and skips a poll that brings nothing new."""

from __future__ import annotations

#: How often a live page asks for news (htmx `hx-trigger`): a patient's message shows within seconds.
POLL = "every 3s"
