"""`Finding`: one thing wrong with what someone asked for, as a catalogue code on the part of the
input it is about. A save that refuses says its findings; the console, the API's `details` and the
CLI turn each into the catalogue's sentence (pt-BR, and English where the reader wants it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from engine.words.catalogue import describe
from engine.words.texts import Text


@dataclass(frozen=True)
class Finding:
    """A catalogue `code` with its `params`; `field` names the part of the input it is about
    ("" for the input as a whole)."""

    code: str
    field: str = ""
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def text(self) -> Text:
        """The sentence a person reads (pt-BR msgid; the console and the API translate it)."""
        return describe(self.code, **self.params)
