"""The error every domain operation raises for bad input: below every package, so each of them
(and the console, the API and the CLI that show it) can name it without importing another."""

from __future__ import annotations


class DomainError(ValueError):
    """Bad input to a domain operation; the message is one line and safe to show."""


class SettingRefused(DomainError):
    """A setting refused by its validator: `field` is the setting it is about, `code` the
    catalogue's (engine/words/catalogue.py) with `params`, so a form says it in the reader's
    language; the message (for the CLI) stays one English line."""

    def __init__(self, field: str, code: str, message: str, **params: object) -> None:
        super().__init__(message)
        self.field = field
        self.code = code
        self.params = params
