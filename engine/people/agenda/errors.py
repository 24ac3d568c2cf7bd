"""The agenda's refusals: each one a `Finding` (a catalogue code on the field it is about), said as
the catalogue's sentence (pt-BR; the console and the API translate it)."""

from __future__ import annotations

from typing import Any

from engine.core.errors import DomainError
from engine.words.findings import Finding
from engine.words.texts import Text


class AgendaError(DomainError):
    """Bad input to the agenda (a professional, their hours or a slot query); nothing was written."""

    def __init__(self, code: str, field: str = "", **params: Any) -> None:
        self.finding = Finding(code, field, params)
        super().__init__(str(self.finding.text))

    @property
    def code(self) -> str:
        """The catalogue code."""
        return self.finding.code

    @property
    def field(self) -> str:
        """The part of the input it is about ("" for the whole)."""
        return self.finding.field

    @property
    def text(self) -> Text:
        """The sentence, translatable."""
        return self.finding.text


class ProfessionalNotFound(AgendaError):
    """No such professional in this org (another org's id answers the same)."""

    def __init__(self, field: str = "professional_id") -> None:
        super().__init__("agenda_no_professional", field)
