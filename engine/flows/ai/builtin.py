"""The deterministic AI: keyword classification, template messages, maximum waits. No LLM calls.

It is what an org without an LLM configured gets, and what a flow falls back on: it never
guesses. A reply is classified only when a keyword of a declared class appears in it as whole
words; otherwise the flow takes its fallback edge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from engine.flows.ai.base import AIContext, Classification, Plan, PlannedWait, SmartWait, Written
from engine.words.keywords import normalize_text
from engine.words.understanding import Context, Understanding
from engine.words.understanding import understand as understand_builtin

__all__ = ["DEFAULT_CLASS_KEYWORDS", "MAX_WAIT_REASON", "BuiltinAI", "find_keyword"]

_RESCHEDULE = ("remarcar", "reagendar", "outro dia", "outro horario", "mudar o horario", "trocar o horario")
_PRICE = ("preco", "valor", "quanto custa", "orcamento")

#: Keywords every org gets for a few well-known class names, on top of the node's and the org's.
DEFAULT_CLASS_KEYWORDS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "confirm": ("ok", "confirmo", "confirmar", "sim", "pode ser", "combinado", "vou sim"),
    "cancel": ("cancelar", "cancela", "desmarcar", "nao vou", "nao posso ir"),
    "reschedule": _RESCHEDULE,
    "remarcar": _RESCHEDULE,
    "price": _PRICE,
    "preco": _PRICE,
    "not_interested": ("nao tenho interesse", "nao quero"),
})

#: The operator's sentence for a wait the built-in planned.
MAX_WAIT_REASON = "Sem plano da IA: usa o tempo máximo."

# A keyword right after "não" is negated: "não confirmo" is not a confirmation, nor "não ok".
# Only the word right before counts: normalising folds the comma of "não, quero remarcar" away,
# so a wider look-back could not tell it from "não quero remarcar". Keywords that are themselves
# negative ("nao vou") start at the "não" and are unaffected.
_NEGATIONS = frozenset({"nao"})


def find_keyword(text: str, keywords: Iterable[str]) -> str | None:
    """The first of `keywords` that occurs in `text` as consecutive whole words, or None.

    Both sides are normalised (accents, case, punctuation folded), so "Remárcar?" contains
    "remarcar" but "remarcarei" does not. An occurrence right after "não" does not count.
    """
    words = normalize_text(text).split()
    for keyword in keywords:
        needle = normalize_text(keyword).split()
        if needle and _occurs(needle, words):
            return keyword
    return None


def _occurs(needle: list[str], words: list[str]) -> bool:
    size = len(needle)
    for start in range(len(words) - size + 1):
        if words[start:start + size] == needle and (start == 0 or words[start - 1] not in _NEGATIONS):
            return True
    return False


class BuiltinAI:
    """Keywords, templates and maximum waits: the `AI` that costs nothing and never surprises."""

    def classify(
        self,
        *,
        text: str,
        classes: Sequence[str],
        keywords: Mapping[str, Sequence[str]],
        hint: str | None,
        context: AIContext,
        labels: Mapping[str, str] | None = None,
    ) -> Classification:
        """The first declared class with a keyword in `text` (node's, org's, then defaults); the
        classes' names play no part (keywords decide)."""
        for name in classes:
            candidates = (
                *keywords.get(name, ()),
                *context.org_keywords.get(name, ()),
                *DEFAULT_CLASS_KEYWORDS.get(name, ()),
            )
            if find_keyword(text, candidates) is not None:
                return Classification(name, 0, "builtin_keywords")
        return Classification(None, 0, "no_match")

    def write(self, *, prompt_hint: str, max_chars: int, context: AIContext) -> Written:
        """Never writes: the runtime sends the node's fallback template."""
        return Written(None, 0, "builtin_template")

    def plan(self, *, waits: Sequence[SmartWait], context: AIContext) -> Plan:
        """Every smart wait at its maximum (the safe choice: never nag sooner than allowed)."""
        planned = {w.node_id: PlannedWait(w.node_id, w.max_minutes, MAX_WAIT_REASON) for w in waits}
        return Plan(MappingProxyType(planned), 0, "builtin_max" if waits else "no_waits")

    def understand(self, text: str, context: Context) -> Understanding:
        """The built-in reader's answer (`engine.words.understanding`): no LLM call."""
        return understand_builtin(text, context)
