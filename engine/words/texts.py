"""Sentences the engine says to people (import reports, refusals), kept translatable.

The engine does not know who reads it or in which language, and must not import Flask. So it
returns a `Text`: a Portuguese msgid (the console's source language) with named parameters.
`str()` gives the Portuguese sentence (CLI, logs of counts); the console translates the msgid
with its catalog (`admin.i18n.translate`). `N_` marks the msgid for extraction (babel.cfg).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Text:
    """A user-facing sentence: `msgid % params`, translated by whoever shows it."""

    msgid: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        if not self.params:
            return self.msgid
        return self.msgid % {k: str(v) if isinstance(v, Text) else v for k, v in self.params.items()}


def N_(msgid: str, **params: Any) -> Text:  # gettext's conventional marker name
    """Mark `msgid` for translation and bind its parameters (values may be Texts themselves)."""
    return Text(msgid, params)
