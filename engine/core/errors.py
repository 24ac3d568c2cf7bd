"""The error every domain operation raises for bad input: below every package, so each of them
(and the console, the API and the CLI that show it) can name it without importing another."""

from __future__ import annotations


class DomainError(ValueError):
    """Bad input to a domain operation; the message is one line and safe to show."""
