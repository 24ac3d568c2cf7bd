"""The agenda's refusals: each one a catalogue code, the field it is about and the sentence a
person reads (pt-BR; the console and the API translate it)."""

from __future__ import annotations

from typing import Any

from engine.core.errors import DomainError
from engine.words.catalogue import describe
from engine.words.texts import Text


class AgendaError(DomainError):
    """Bad input to the agenda (a professional, their hours or a slot query); nothing was written."""

    def __init__(self, code: str, field: str = "", **params: Any) -> None:
        self.code = code
        self.field = field
        self.params = params
        self.text: Text = describe(code, **params)
        super().__init__(str(self.text))


class ProfessionalNotFound(AgendaError):
    """No such professional in this org (another org's id answers the same)."""

    def __init__(self, field: str = "professional_id") -> None:
        super().__init__("agenda_no_professional", field)
