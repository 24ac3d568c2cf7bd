"""Classify patient replies to reminders (opt-out, confirm, cancel).

Patients answer on WhatsApp/SMS with things like ``"OK!"``, ``" Confirmar. "``,
``"Sím"``, ``"CANCELAR!!"`` or ``"👍 ok"``. Replies are normalised (accents,
case, punctuation and emoji removed) and then compared against keyword lists
as a WHOLE message: a free-text reply such as ``"vou sair mais cedo"`` must
never be read as an opt-out, so there is no substring matching.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Literal

__all__ = [
    "DEFAULT_KEYWORDS",
    "INTENT_PRECEDENCE",
    "Intent",
    "classify",
    "normalize_text",
    "parse_keywords",
]

Intent = Literal["optout", "confirm", "cancel"]

# When a reply matches several intents, honour the most consequential one: an
# opt-out must never be lost, and cancelling frees a slot, whereas a wrong
# confirmation is cheap to correct.
INTENT_PRECEDENCE: tuple[Intent, ...] = ("optout", "cancel", "confirm")

DEFAULT_KEYWORDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "optout": ("sair", "parar", "stop", "descadastrar", "cancelar inscricao"),
        "confirm": ("ok", "confirmar", "confirmo", "sim", "1", "confirmado"),
        "cancel": ("cancelar", "cancela", "2", "nao vou", "desmarcar"),
    }
)


def _normalize_once(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    # casefold can produce characters that decompose further (and NFKD can
    # produce upper-case letters from symbols like U+210C), so decompose on
    # both sides of it.
    decomposed = unicodedata.normalize("NFKD", decomposed.casefold())
    out: list[str] = []
    for ch in decomposed:
        category = unicodedata.category(ch)
        if category[0] == "M":
            # Accents and other combining marks, including emoji variation
            # selectors and the keycap mark in "1️⃣".
            continue
        if category[0] in "PSZC":
            # Punctuation, symbols/emoji, separators and control/format
            # characters (e.g. zero-width joiners) all act as word breaks.
            out.append(" ")
        else:
            out.append(ch)
    return " ".join("".join(out).split())


def normalize_text(text: str) -> str:
    """Normalise a free-text reply for keyword matching.

    Applies Unicode NFKD, removes accents and other combining marks,
    casefolds, turns punctuation, symbols (emoji included), separators and
    control characters into spaces, collapses runs of whitespace and strips.
    ``normalize_text(" Não, VOU! 👍")`` is ``"nao vou"``.

    The result is idempotent: ``normalize_text(normalize_text(x)) ==
    normalize_text(x)``.
    """
    result = _normalize_once(text)
    # One pass is a fixed point for every code point in today's Unicode
    # tables (checked exhaustively), but casefold/NFKD interactions could
    # change with a future Python; a few extra passes keep idempotency from
    # silently depending on that.
    for _ in range(3):
        again = _normalize_once(result)
        if again == result:
            break
        result = again
    return result


def parse_keywords(csv: str | None) -> tuple[str, ...]:
    """Parse a comma-separated keyword list (per-organisation overrides).

    Each keyword is normalised with :func:`normalize_text`; empty entries and
    duplicates are dropped, order is preserved. ``None`` or a blank string
    gives an empty tuple.
    """
    if not csv:
        return ()
    seen: dict[str, None] = {}
    for part in csv.split(","):
        keyword = normalize_text(part)
        if keyword:
            seen.setdefault(keyword, None)
    return tuple(seen)


_DEFAULT_SETS: Mapping[str, frozenset[str]] = MappingProxyType(
    {intent: frozenset(map(normalize_text, words)) for intent, words in DEFAULT_KEYWORDS.items()}
)


def _keyword_set(intent: str, keywords: Mapping[str, Iterable[str]] | None) -> frozenset[str]:
    if keywords is None:
        return _DEFAULT_SETS[intent]
    override = keywords.get(intent)
    if override is None:
        return _DEFAULT_SETS[intent]
    words = frozenset(w for w in (normalize_text(str(k)) for k in override) if w)
    # An empty override is almost always an unset admin field (parse_keywords
    # of NULL), and silently disabling opt-out would be a compliance bug, so
    # it falls back to the defaults instead of matching nothing.
    return words or _DEFAULT_SETS[intent]


def classify(
    text: str,
    keywords: Mapping[str, Iterable[str]] | None = None,
) -> Intent | None:
    """Return the intent of a patient reply, or ``None`` if it is free text.

    The whole normalised message must equal a keyword; ``"ok"`` matches
    ``"OK!"`` and ``"👍 ok"`` but ``"ok, mas vou atrasar"`` matches nothing.

    :param text: the reply as received.
    :param keywords: optional per-organisation overrides, ``intent -> words``.
        An intent that is missing (or maps to ``None`` or no words) uses
        :data:`DEFAULT_KEYWORDS`; a present one replaces the defaults for that
        intent. Words are normalised, so accents/case do not matter.
    :returns: ``"optout"``, ``"cancel"`` or ``"confirm"`` (checked in that
        order when several match), or ``None``.
    """
    if not isinstance(text, str):
        return None
    normalized = normalize_text(text)
    if not normalized:
        return None
    for intent in INTENT_PRECEDENCE:
        if normalized in _keyword_set(intent, keywords):
            return intent
    return None
