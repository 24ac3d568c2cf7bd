"""Every code the follow-up engine can hand to a person has a sentence in the one catalogue."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.words.catalogue import CATALOGUE, UnknownCode, describe
from engine.flows.ai.base import ERROR_CODES, REASON_CODES

ROOT = Path(__file__).resolve().parent.parent
#: The shapes in which engine/flows writes a reason code.
PATTERNS = (
    re.compile(r'Decision\(\s*"\w+",\s*"(\w+)"'),
    re.compile(r'Enrolled\([^()]*"(\w+)"\)'),
    re.compile(r'\breason="(\w+)"'),
    re.compile(r'Step\("\w+", "(\w+)"'),
    re.compile(r'FlowIssue\([^,()]+, "(\w+)"'),
)


def _codes_in_flows() -> set[str]:
    codes: set[str] = set()
    for path in (ROOT / "engine" / "flows").rglob("*.py"):
        text = path.read_text()
        for pattern in PATTERNS:
            codes.update(pattern.findall(text))
    return codes


def test_every_code_the_flows_engine_writes_has_a_sentence() -> None:
    codes = _codes_in_flows() | set(REASON_CODES) | set(ERROR_CODES)
    assert len(codes) > 40  # the patterns still find the codes
    missing = sorted(code for code in codes if code not in CATALOGUE)
    assert missing == []


def test_a_sentence_binds_its_parameters_and_an_unknown_code_is_a_bug() -> None:
    assert str(describe("classified", **{"class": "reschedule"})) == \
        "A resposta do paciente foi entendida como reschedule."
    with pytest.raises(UnknownCode):
        describe("no_such_code")


def test_a_code_inside_a_sentence_reads_as_its_own_sentence():
    # An AI error is recorded as `ai_unavailable` with {"code": "timeout"}: the parameter's name is
    # the describe() argument's too, and its value is a code a person must not see raw.
    from engine.flows.queries import sentence

    text = str(sentence("ai_unavailable", {"code": "timeout"}))
    assert "tempo esgotado" in text and "timeout" not in text
    assert "(http_599)" in str(sentence("ai_unavailable", {"code": "http_599"}))  # not a code: kept as given


def test_no_code_is_defined_twice_in_the_catalogue():
    # A dict literal keeps the last of two equal keys silently: two sections (written by different
    # hands) giving one code two sentences would lose one without a word.
    import ast

    from tests.python_source import parse

    source = (ROOT / "engine" / "words" / "catalogue.py").read_text()
    [assign] = [node for node in parse(source).body
                if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "CATALOGUE"]
    keys = [key.value for key in assign.value.keys if isinstance(key, ast.Constant)]
    assert len(keys) == len(CATALOGUE)
    assert sorted({key for key in keys if keys.count(key) > 1}) == []


def test_a_message_code_the_flows_already_use_is_read_through_its_send_side_sentence():
    # `timeout` is an AI error (a fragment) and `window_closed` a flow step: on a message they say
    # what the provider answered, from their own keys.
    from engine.words.reasons import ALIASES, message_reason

    for code in ("timeout", "connection_error", "window_closed"):
        assert code in CATALOGUE and ALIASES[code] in CATALOGUE
        assert message_reason(code) == describe(ALIASES[code])
    assert message_reason("http_401") != describe("http_401")  # the AI's fragment is not a message's reason


def test_a_sentence_with_a_count_reads_in_the_singular_or_the_plural_never_with_parentheses() -> None:
    # "problema(s)" reads as a form nobody fills in: the count picks the form, in both languages.
    from admin.i18n import translate_to

    assert str(describe("more_issues", count=1)).startswith("E mais 1 problema, mostrado")
    assert str(describe("more_issues", count=3)).startswith("E mais 3 problemas, mostrados")
    assert translate_to(describe("more_issues", count=1), "en").startswith("And 1 more problem, shown")
    assert translate_to(describe("more_issues", count=7), "en").startswith("And 7 more problems, shown")
    assert str(describe("do_slots_offered", offered=1)) == \
        "O fluxo ofereceu 1 horário livre ao paciente e espera a escolha."
    parenthesised = re.compile(r"\w\((?:s|ns|es|ão|ões)\)")
    assert [code for code, text in CATALOGUE.items()
            if parenthesised.search(text.msgid + (text.plural or "")) and "http(s)" not in text.msgid] == []
