"""The intent of a normalised reply: keyword phrases per intent found in each clause, negation
turning or dropping them, and an order of precedence that keeps the costly mistakes away (a
cancel, a reschedule or an opt-out must never be read as a confirm, nor a confirm as a cancel).

Phrases match as whole words anywhere in a clause (unlike keywords.classify, which wants the whole
message); a misspelt single word is matched with rapidfuzz when it is close to one keyword only."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rapidfuzz import fuzz, process

from engine.words.keywords import normalize_text

__all__ = ["BUILTIN_PHRASES", "Signals", "Table", "keyword_table", "read_signals"]

# Built-in phrases per intent, normalised (no accents, lower case). Longer phrases win over the
# shorter ones they contain: "nao quero mais receber" is an opt-out, not a cancel.
BUILTIN_PHRASES: Mapping[str, tuple[str, ...]] = {
    "opt_out": (
        "sair", "parar", "pare", "stop", "descadastrar", "descadastra", "cancelar inscricao",
        "nao quero mais receber", "nao quero receber", "nao me mande", "nao mande mais", "para de mandar",
        "pare de mandar", "parem de mandar", "para de enviar", "pare de enviar", "nao envie mais",
        "remover meu numero", "tira meu numero", "tirar meu numero", "me tira da lista", "me tire da lista",
        "bloquear", "nao quero mais mensagens", "chega de mensagem", "nao me mandem", "para de me mandar",
        "pare de me mandar", "parem de enviar", "parem de me mandar", "me tira dessa lista", "me tira desta lista",
        "remove meu numero", "remova meu numero", "numero errado", "nao me manda mais",
    ),
    "reschedule": (
        "remarcar", "remarca", "remarco", "remarcacao", "reagendar", "reagenda", "reagendamento",
        "mudar o horario", "mudar de horario", "mudar o dia", "mudar a data", "mudar a consulta", "mudar para",
        "trocar o horario", "trocar de horario", "trocar o dia", "trocar a data", "trocar a consulta",
        "alterar o horario", "alterar a data", "alterar o dia", "alterar a consulta", "mudar horario",
        "outro dia", "outro horario", "outra data", "outra hora", "outro dia e horario", "adiar", "antecipar",
        "da para ser", "daria para ser", "poderia ser", "seria possivel", "tem horario",
        "tem vaga", "teria horario", "teria vaga", "prefiro", "preferia", "melhor para mim", "consigo ir",
        "posso ir", "marcar para", "passar para", "transferir", "mudar", "trocar", "tem como ser",
        "tem como passar", "tem como mudar", "nao tem como passar", "nao tem como ser", "nao tem como mudar",
        "nao da para passar", "nao da para mudar",
    ),
    "cancel": (
        "cancelar", "cancela", "cancelo", "desmarque", "cancele", "cancelem", "cancelamento", "desmarcar", "desmarca", "desmarco",
        "nao vou", "nao vou poder", "nao posso", "nao consigo", "nao da", "nao vai dar", "nao poderei",
        "nao irei", "nao vou conseguir", "nao vou comparecer", "nao comparecerei", "impossivel",
        "desisto", "desistir", "nao preciso mais", "nao quero mais a consulta", "nao tenho como",
        "infelizmente nao", "nao",
    ),
    "human": (
        "falar com alguem", "falar com uma pessoa", "falar com atendente", "atendente", "humano",
        "pessoa de verdade", "me liga", "me ligue", "me ligar", "ligar para mim", "liga para mim",
        "falar com a recepcao", "falar com a secretaria", "falar com o doutor", "falar com a doutora",
        "falar com voces", "falar com voce", "recepcionista", "secretaria",
    ),
    "confirm": (
        "sim", "ok", "confirmo", "confirmado", "confirmada", "confirmar", "confirma", "confirmadissimo",
        "vou sim", "estarei la", "estarei presente", "pode confirmar", "certo", "combinado", "beleza",
        "ta bom", "esta bom", "tudo certo", "com certeza", "claro", "positivo", "vou", "irei", "estarei",
        "presente", "perfeito", "fechado", "tranquilo", "pode deixar", "vou comparecer", "compareco",
        "la estarei", "ta certo", "ta confirmado", "isso", "isso mesmo", "obrigado", "valeu", "show",
        "otimo", "joia", "de acordo", "vou estar la", "to indo", "estou indo", "okey", "nao vou faltar",
        "pode contar comigo", "sem falta",
    ),
}
# Words a question starts with; a "?" anywhere also makes a question.
QUESTION_STARTS = frozenset({
    "qual", "quais", "quanto", "quantos", "quanta", "onde", "como", "quando", "quem", "porque", "por que",
    "precisa", "preciso", "posso", "tem", "pode", "aceita", "aceitam", "vai", "devo", "sera", "existe",
})
_NEGATORS = frozenset({"nao", "nem", "nunca"})
# Confirm-ish emoji normalize_text strips: read from the raw text.
CONFIRM_EMOJI = ("👍", "✅", "👌", "🙏", "✔")
_FUZZY_MIN_LENGTH = 6
_FUZZY_SCORE = 86


@dataclass(frozen=True)
class Signals:
    """What the phrases of a reply say: per intent, the strongest evidence found (1.0 for an
    exact phrase, less for a misspelt word or a turned negation)."""

    found: Mapping[str, float]
    negated: frozenset[str]


Table = tuple[tuple[tuple[str, ...], str], ...]


def keyword_table(extra: Mapping[str, Iterable[str]] | None) -> Table:
    """The built-in phrases, extended by the org's own (normalised) per intent, as (tokens, intent)
    pairs in matching order: longest first and, among equals, those carrying a negation ("não
    posso" before "posso ir"). "optout" is accepted for "opt_out" (the orgs table's spelling)."""
    table: dict[str, list[str]] = {intent: list(words) for intent, words in BUILTIN_PHRASES.items()}
    for intent, words in (extra or {}).items():
        key = "opt_out" if intent == "optout" else intent
        for word in words or ():
            normal = normalize_text(str(word))[:100]
            if normal:
                table.setdefault(key, []).append(normal)
    pairs = {(tuple(w.split()), intent) for intent, words in table.items() for w in words}
    return tuple(sorted(pairs, key=lambda p: (-len(p[0]), not _NEGATORS.intersection(p[0]), p[1], p[0])))


def _fuzzy_vocabulary(table: Table) -> dict[str, str]:
    vocabulary: dict[str, str] = {}
    for phrase, intent in table:
        if len(phrase) == 1 and len(phrase[0]) >= _FUZZY_MIN_LENGTH and not phrase[0].isdigit():
            vocabulary.setdefault(phrase[0], intent)
    return vocabulary


def _match_clause(tokens: list[str], table: Table, vocabulary: Mapping[str, str], found: dict[str, float],
                  negated: set[str]) -> None:
    used = [False] * len(tokens)
    hits: list[tuple[int, int, str, float]] = []
    for phrase, intent in table:
        size = len(phrase)
        if size > len(tokens):
            continue
        for start in range(len(tokens) - size + 1):
            if any(used[start:start + size]) or tuple(tokens[start:start + size]) != phrase:
                continue
            for i in range(start, start + size):
                used[i] = True
            hits.append((start, size, intent, 1.0))
    for index, token in enumerate(tokens):
        if used[index] or len(token) < _FUZZY_MIN_LENGTH or not token.isalpha():
            continue
        best = process.extractOne(token, vocabulary.keys(), scorer=fuzz.ratio, score_cutoff=_FUZZY_SCORE)
        if best is not None and best[0][0] == token[0]:
            used[index] = True
            hits.append((index, 1, vocabulary[best[0]], 0.75))
    for start, size, intent, strength in hits:
        phrase_has_negator = any(t in _NEGATORS for t in tokens[start:start + size])
        before = [t for t in tokens[max(0, start - 3):start] if t in _NEGATORS]
        after = tokens[start + size:start + size + 1]
        is_negated = not phrase_has_negator and (bool(before) or after == ["nao"])
        if intent == "cancel" and tokens[start:start + size] == ["nao"]:
            # A bare "não" is a weak cancel: "não, quero remarcar" is a reschedule, and a "não"
            # next to another keyword is that keyword's negation, read there.
            others = [h for h in hits if h[2] != "cancel" or h[0] != start]
            if others:
                continue
            strength = 0.7
        if is_negated:
            negated.add(intent)
            if intent == "confirm":  # "não confirmo", "confirmo não"
                found["cancel"] = max(found.get("cancel", 0), 0.85 * strength)
            elif intent == "cancel":  # "não quero cancelar", "cancelar não": keeps the appointment
                found["keep"] = max(found.get("keep", 0), 0.7 * strength)
            continue
        found[intent] = max(found.get(intent, 0), strength)


def read_signals(clauses: tuple[str, ...], raw: str, table: Table) -> Signals:
    """The intents the phrases of each clause point to."""
    vocabulary = _fuzzy_vocabulary(table)
    found: dict[str, float] = {}
    negated: set[str] = set()
    for clause in clauses:
        _match_clause(clause.split()[:200], table, vocabulary, found, negated)
    if any(e in raw for e in CONFIRM_EMOJI) and "confirm" not in negated:
        found["confirm"] = max(found.get("confirm", 0), 0.9)
    if "?" in raw or (clauses and clauses[0].split()[0] in QUESTION_STARTS):
        found["question"] = 0.6
    return Signals(found, frozenset(negated))
