"""Tests for engine.words.keywords (reply normalisation and intent classification)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.words.keywords import (
    DEFAULT_KEYWORDS,
    classify,
    normalize_text,
    parse_keywords,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("OK!", "ok"),
        (" Confirmar. ", "confirmar"),
        ("Sím", "sim"),
        ("CANCELAR!!", "cancelar"),
        ("👍 ok", "ok"),
        ("Não   vou\n", "nao vou"),
        ("Cancelar inscrição", "cancelar inscricao"),
        ("ÇÃÕÊ", "caoe"),
        ("1️⃣", "1"),  # keycap emoji: digit + variation selector + keycap mark
        ("ｏｋ", "ok"),  # full-width letters, common from some keyboards
        ("ok\u200d\u200b", "ok"),  # zero-width characters
        ("STRASSE ß", "strasse ss"),
        ("¿¡...!?", ""),
        ("", ""),
        ("🙏🏽👍", ""),
    ],
)
def test_normalize_text(raw: str, expected: str) -> None:
    assert normalize_text(raw) == expected


@pytest.mark.parametrize(
    ("raw", "intent"),
    [
        ("OK!", "confirm"),
        (" Confirmar. ", "confirm"),
        ("Sím", "confirm"),
        ("SIM", "confirm"),
        ("👍 ok", "confirm"),
        ("1", "confirm"),
        ("1️⃣", "confirm"),
        ("Confirmado!", "confirm"),
        ("CANCELAR!!", "cancel"),
        ("cancela", "cancel"),
        ("2", "cancel"),
        ("Não vou.", "cancel"),
        ("NAO VOU", "cancel"),
        ("desmarcar", "cancel"),
        ("SAIR", "optout"),
        ("Parar", "optout"),
        ("stop", "optout"),
        ("Cancelar inscrição", "optout"),
        ("descadastrar!", "optout"),
    ],
)
def test_classify_matches(raw: str, intent: str) -> None:
    assert classify(raw) == intent


@pytest.mark.parametrize(
    "raw",
    [
        "vou sair mais cedo",
        "ok, mas vou atrasar 10 min",
        "sim, mas posso mudar o horário?",
        "12",
        "okay",
        "simples",
        "não",
        "",
        "   ",
        "👍",
        "obrigada!",
    ],
)
def test_classify_free_text_is_none(raw: str) -> None:
    assert classify(raw) is None


def test_precedence_optout_over_cancel_over_confirm() -> None:
    overlapping = {"optout": ("pare",), "cancel": ("pare", "nao"), "confirm": ("pare", "nao", "ok")}
    assert classify("Pare!", overlapping) == "optout"
    assert classify("Não", overlapping) == "cancel"
    assert classify("ok", overlapping) == "confirm"


def test_per_org_override_replaces_defaults_for_that_intent() -> None:
    overrides = {"confirm": parse_keywords("Confirmo presença, Tô indo, s")}
    assert classify("confirmo presenca", overrides) == "confirm"
    assert classify("TÔ INDO!", overrides) == "confirm"
    assert classify("S", overrides) == "confirm"
    # "ok" was a default confirm keyword but this org replaced the list.
    assert classify("ok", overrides) is None


def test_missing_intents_fall_back_to_defaults() -> None:
    overrides = {"confirm": ("beleza",)}
    assert classify("sair", overrides) == "optout"
    assert classify("cancelar", overrides) == "cancel"


@pytest.mark.parametrize("empty", [(), None, parse_keywords(None), parse_keywords(" , ")])
def test_empty_override_falls_back_to_defaults(empty: object) -> None:
    # An unset admin field must never disable opt-out.
    assert classify("SAIR", {"optout": empty}) == "optout"  # type: ignore[dict-item]


def test_override_keywords_are_normalised() -> None:
    assert classify("nao quero mais", {"optout": ["Não quero MAIS!"]}) == "optout"


def test_parse_keywords() -> None:
    assert parse_keywords("Sim, OK ,, confirmo!, ,sim") == ("sim", "ok", "confirmo")
    assert parse_keywords("Não vou,Desmarcar") == ("nao vou", "desmarcar")
    assert parse_keywords(None) == ()
    assert parse_keywords("") == ()
    assert parse_keywords(" , ,") == ()


def test_default_keywords_shape() -> None:
    assert set(DEFAULT_KEYWORDS) == {"optout", "confirm", "cancel"}
    for words in DEFAULT_KEYWORDS.values():
        assert isinstance(words, tuple)
        assert all(normalize_text(w) == w for w in words)


def test_default_keywords_are_read_only() -> None:
    with pytest.raises(TypeError):
        DEFAULT_KEYWORDS["confirm"] = ("x",)  # type: ignore[index]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_classify_never_raises(text: str) -> None:
    assert classify(text) in (None, "optout", "confirm", "cancel")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_normalize_text_is_idempotent(text: str) -> None:
    once = normalize_text(text)
    assert normalize_text(once) == once
    assert once == once.strip()
    assert "  " not in once


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([w for words in DEFAULT_KEYWORDS.values() for w in words]),
    st.text(alphabet=" !?.,;:-👍🙏😊\n\t", max_size=5),
    st.text(alphabet=" !?.,;:-👍🙏😊\n\t", max_size=5),
)
def test_keywords_survive_surrounding_punctuation_and_case(word: str, pre: str, post: str) -> None:
    expected = classify(word)
    assert expected is not None
    assert classify(pre + word.upper() + post) == expected
