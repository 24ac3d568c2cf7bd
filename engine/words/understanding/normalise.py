"""Normalising a reply for understanding: :func:`engine.words.keywords.normalize_text` (case,
accents, punctuation, emoji) plus what free text needs on top of it: clauses kept apart (a
negation belongs to its clause), times and dates written with ``:`` or ``/`` kept whole, runs of a
repeated letter collapsed ("simmmm") and WhatsApp abbreviations spelt out ("vc", "amanha", "6a")."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.words.keywords import normalize_text

__all__ = ["MAX_CHARS", "Normalised", "normalise"]

#: A patient's text is untrusted: only its beginning is read (a reply is a line or two).
MAX_CHARS = 1000

# Each pattern is linear (no nested quantifiers), so a hostile text cannot make them backtrack.
_CLAUSE_BREAK = re.compile(r"[,;!?\n]+|\.(?!\d)|\s+(?:mas|porem|por[eé]m|só que|so que)\s+", re.IGNORECASE)
# "15:30", "12/12", "12/12/2026", "12.12" kept as one token (normalize_text would split them).
_PROTECTED = re.compile(r"\b\d{1,2}:\d{2}\b|\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b")
_REPEATS = re.compile(r"([a-z])\1{2,}")
_HOURS_SUFFIX = re.compile(r"\b(\d{1,2}) ?(?:hrs|hr|horas|hora|hs)\b")

# One token for another; the keys are already normalised. Short words that are also ordinary
# Portuguese ("ter", "qua") are left alone: "vou ter que cancelar" is not Tuesday.
ABBREVIATIONS: dict[str, str] = {
    "vc": "voce", "vcs": "voces", "ce": "voce", "pq": "porque", "q": "que", "blz": "beleza",
    "tb": "tambem", "tbm": "tambem", "hj": "hoje", "amnh": "amanha", "amn": "amanha", "amanh": "amanha",
    "dps": "depois", "msm": "mesmo", "n": "nao", "nn": "nao", "naum": "nao", "td": "tudo",
    "obg": "obrigado", "obgd": "obrigado", "brigado": "obrigado", "pfv": "por favor", "pf": "por favor",
    "pfvr": "por favor", "vlw": "valeu", "sab": "sabado", "dom": "domingo", "seg": "segunda",
    "qui": "quinta", "sex": "sexta", "qta": "quinta", "sxt": "sexta", "2a": "segunda", "3a": "terca",
    "4a": "quarta", "5a": "quinta", "6a": "sexta", "hrs": "h", "hr": "h",
    "ss": "sim", "s": "sim", "okay": "ok", "oks": "ok", "okk": "ok", "k": "", "kk": "",
    "rs": "", "rsrs": "", "pra": "para", "pro": "para o", "p": "para", "cm": "com",
    "agr": "agora", "dnv": "de novo", "mto": "muito", "mt": "muito", "qdo": "quando", "qnd": "quando",
    "hrario": "horario", "orario": "horario", "consuta": "consulta", "meiodia": "meio dia",
}
# "sexta feira", "segunda-feira": the weekday alone says it.
_FEIRA = re.compile(r"\b(segunda|terca|quarta|quinta|sexta) feira\b")


@dataclass(frozen=True)
class Normalised:
    """A reply made comparable: its clauses, each a string of normalised tokens."""

    clauses: tuple[str, ...]

    @property
    def text(self) -> str:
        """All clauses, one space apart."""
        return " ".join(c for c in self.clauses if c)

    @property
    def tokens(self) -> tuple[str, ...]:
        """All tokens in order."""
        return tuple(self.text.split())


def _clause(raw: str) -> str:
    parts: list[str] = []
    last = 0
    for match in _PROTECTED.finditer(raw):
        parts.append(normalize_text(raw[last:match.start()]))
        parts.append(match.group())
        last = match.end()
    parts.append(normalize_text(raw[last:]))
    text = " ".join(p for p in parts if p)
    text = _REPEATS.sub(r"\1", text)
    text = _HOURS_SUFFIX.sub(r"\1h", text)
    words: list[str] = []
    for token in text.split():
        words.append(ABBREVIATIONS.get(token, token))
    text = " ".join(w for w in words if w)
    return _FEIRA.sub(r"\1", text)


def normalise(text: str) -> Normalised:
    """Normalise a reply: its first :data:`MAX_CHARS` characters, split into clauses at
    punctuation and at "mas", each clause normalised as described in the module."""
    raw = (text or "")[:MAX_CHARS]
    clauses = tuple(c for c in (_clause(part) for part in _CLAUSE_BREAK.split(raw)) if c)
    return Normalised(clauses)
