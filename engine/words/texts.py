"""Sentences the engine says to people (import reports, refusals), kept translatable.

The engine does not know who reads it or in which language, and must not import Flask. So it
returns a `Text`: a Portuguese msgid (the console's source language) with named parameters.
`str()` gives the Portuguese sentence (CLI, logs of counts); the console translates the msgid
with its catalog (`admin.i18n.translate`). `N_` marks the msgid for extraction (babel.cfg);
`Np_` marks a sentence with a count, singular and plural, read with ngettext (never "(s)").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Text:
    """A user-facing sentence: `msgid % params`, translated by whoever shows it.

    A sentence with a count has a `plural` msgid too, and `number` names the parameter that holds
    the count; the reader's language picks the form (ngettext)."""

    msgid: str
    params: Mapping[str, Any] = field(default_factory=dict)
    plural: str | None = None
    number: str = "count"

    @property
    def count(self) -> int | None:
        """The count that picks the singular or plural form (None for a sentence without one)."""
        if self.plural is None:
            return None
        try:
            return int(self.params.get(self.number, 1))
        except (TypeError, ValueError):
            return None

    def source(self) -> str:
        """The Portuguese msgid in the form the count asks for (singular for 1, as ngettext without a
        catalog reads it, so the CLI and the Portuguese console agree)."""
        count = self.count
        return self.plural if self.plural is not None and count is not None and count != 1 else self.msgid

    def __str__(self) -> str:
        if not self.params:
            return self.source()
        return self.source() % {k: str(v) if isinstance(v, Text) else v for k, v in self.params.items()}


def N_(msgid: str, **params: Any) -> Text:  # gettext's conventional marker name
    """Mark `msgid` for translation and bind its parameters (values may be Texts themselves)."""
    return Text(msgid, params)


def Np_(singular: str, plural: str, number: str = "count", **params: Any) -> Text:
    """Mark a sentence with a count for translation: its singular and plural, and the parameter
    (`number`) whose value picks between them."""
    return Text(singular, params, plural=plural, number=number)
