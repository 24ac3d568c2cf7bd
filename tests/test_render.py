"""Tests for engine.messaging.render (sandboxed message templates and reminder variables)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from babel.dates import format_skeleton
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.messaging.render import (
    MAX_SOURCE_LENGTH,
    MAX_TEXT_OUTPUT,
    SAMPLE_VARIABLES,
    TemplateError,
    reminder_variables,
    render_html,
    render_text,
    validate,
)

SECRET = "Fulana Secreta"
STARTS_AT = datetime(2026, 3, 21, 17, 0, tzinfo=UTC)


def _variables(**overrides: object) -> dict[str, object]:
    kwargs: dict[str, object] = {
        "contact_name": "Ana Clara Souza",
        "professional": "Dra. Beatriz Costa",
        "starts_at": STARTS_AT,
        "timezone": "America/Sao_Paulo",
        "mode": "in_person",
        "location": "Rua das Flores, 123",
        "org_name": "Clínica Exemplo",
    }
    kwargs.update(overrides)
    return reminder_variables(**kwargs)  # type: ignore[arg-type]


# --- reminder_variables -----------------------------------------------------


def test_reminder_variables_pt_br_in_local_time() -> None:
    v = _variables()
    assert v == {
        "nome": "Ana",
        "nome_completo": "Ana Clara Souza",
        "profissional": "Dra. Beatriz Costa",
        "data": "21/03",
        "data_completa": "sábado, 21 de março de 2026",
        "hora": "14:00",  # 17:00 UTC is 14:00 in São Paulo
        "dia_semana": "sábado",
        "modalidade": "Presencial",
        "local": "Rua das Flores, 123",
        "clinica": "Clínica Exemplo",
    }


def test_rendering_uses_local_hour_not_utc() -> None:
    out = render_text("{{ nome }}, sua consulta é {{ data }} às {{ hora }}.", _variables())
    assert out == "Ana, sua consulta é 21/03 às 14:00."


def test_local_date_can_differ_from_utc_date() -> None:
    # 01:30 UTC on the 22nd is still the 21st in São Paulo.
    v = _variables(starts_at=datetime(2026, 3, 22, 1, 30, tzinfo=UTC))
    assert (v["data"], v["hora"], v["dia_semana"]) == ("21/03", "22:30", "sábado")


def test_other_aware_offsets_are_converted() -> None:
    plus_two = timezone(timedelta(hours=2))
    v = _variables(starts_at=datetime(2026, 3, 21, 19, 0, tzinfo=plus_two))
    assert v["hora"] == "14:00"
    v = _variables(timezone="America/Manaus")
    assert v["hora"] == "13:00"


def test_en_locale() -> None:
    v = _variables(locale="en", mode="online")
    assert v["data_completa"] == "Saturday, March 21, 2026"
    assert v["dia_semana"] == "Saturday"
    assert v["hora"] == "2:00 PM"  # plain space, not CLDR's U+202F
    assert v["data"] == "3/21"
    assert v["modalidade"] == "Online"
    out = render_text("See you on {{ data_completa }} at {{ hora }}", v)
    assert out == "See you on Saturday, March 21, 2026 at 2:00 PM"


@pytest.mark.parametrize("locale", ["pt_BR", "pt_PT", "en", "en_GB", "es", "fr", "de", "ja"])
def test_the_day_and_month_are_babels_skeleton(locale: str) -> None:
    # The pattern is matched once per locale; in locales of different orders and separators it must
    # stay what format_skeleton gives.
    tz = ZoneInfo("America/Sao_Paulo")
    for starts in (STARTS_AT, datetime(2026, 12, 3, 2, 0, tzinfo=UTC)):
        expected = format_skeleton("ddMM", starts.astimezone(tz), tzinfo=tz, locale=locale)
        assert _variables(locale=locale, starts_at=starts)["data"] == expected.replace("\u202f", " ").replace("\xa0", " ")


def test_locale_with_hyphen_is_accepted() -> None:
    assert _variables(locale="pt-BR")["data_completa"] == "sábado, 21 de março de 2026"


@pytest.mark.parametrize(
    ("mode", "label"),
    [("online", "Online"), ("in_person", "Presencial"), ("domiciliar", "domiciliar"), (None, "")],
)
def test_modalidade_labels(mode: str | None, label: str) -> None:
    assert _variables(mode=mode)["modalidade"] == label


def test_missing_optional_fields_become_empty_strings() -> None:
    v = _variables(contact_name=None, professional=None, location=None, mode=None)
    assert v["nome"] == v["nome_completo"] == v["profissional"] == v["local"] == ""
    assert _variables(contact_name="   ")["nome"] == ""


def test_first_name_and_whitespace() -> None:
    v = _variables(contact_name="  João   da  Silva ")
    assert v["nome"] == "João"
    assert v["nome_completo"] == "João da Silva"


def test_naive_datetime_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        _variables(starts_at=datetime(2026, 3, 21, 14, 0))


def test_unknown_timezone_and_locale_rejected() -> None:
    with pytest.raises(ValueError, match="timezone"):
        _variables(timezone="Mars/Olympus_Mons")
    with pytest.raises(ValueError, match="locale"):
        _variables(locale="xx_NOPE")


def test_sample_variables_cover_every_variable() -> None:
    assert set(SAMPLE_VARIABLES) == set(_variables())
    assert SAMPLE_VARIABLES["nome"] == "Ana"
    assert SAMPLE_VARIABLES["profissional"] == "Dra. Beatriz Costa"
    assert SAMPLE_VARIABLES["hora"] == "14:00"
    render_text("{{ nome }} {{ clinica }} {{ modalidade }} {{ local }}", SAMPLE_VARIABLES)


# --- rendering ----------------------------------------------------------------


def test_text_is_not_escaped() -> None:
    assert render_text("Olá {{ nome }}", {"nome": "Ana & <Bia>"}) == "Olá Ana & <Bia>"


def test_html_autoescapes_variables() -> None:
    out = render_html("<p>Olá {{ nome }}</p>", {"nome": "<script>alert(1)</script>"})
    assert out == "<p>Olá &lt;script&gt;alert(1)&lt;/script&gt;</p>"
    assert "<script>" not in out
    assert type(out) is str


def test_block_tags_do_not_leave_blank_lines() -> None:
    source = "Olá {{ nome }}!\n{% if local %}\nLocal: {{ local }}\n{% endif %}\nAté logo"
    expected = "Olá Ana!\nLocal: Centro\nAté logo"
    assert render_text(source, {"nome": "Ana", "local": "Centro"}) == expected
    assert render_text(source, {"nome": "Ana", "local": ""}) == "Olá Ana!\nAté logo"


def test_common_template_features_work() -> None:
    source = (
        "{{ nome|upper }} {{ profissional|default('equipe') }} "
        "{% for i in range(3) %}{{ i }}{% endfor %} {{ '%s!' % clinica }}"
    )
    assert render_text(source, {"nome": "ana", "profissional": "", "clinica": "X"}) == "ANA  012 X!"


def test_undefined_variable_names_the_variable_not_values() -> None:
    with pytest.raises(TemplateError) as excinfo:
        render_text("Olá {{ nome }}\n{{ nome_paciente }}", {"nome": SECRET})
    message = str(excinfo.value)
    assert message.startswith("undefined variable 'nome_paciente'")
    assert "line 2" in message
    assert excinfo.value.lineno == 2
    assert SECRET not in message


@pytest.mark.parametrize(
    "source",
    [
        "{{ nome.sobrenome }}",
        "{{ nome[99] }}",
        "{{ {}[nome] }}",
        "{{ nome|attr(nome) }}",
        "{{ nome + 1 }}",
        "{{ nome|int / 0 }}",
        "{{ nome.upper.__self__ }}",
        "{% include nome %}",
    ],
)
def test_runtime_errors_never_leak_values(source: str) -> None:
    with pytest.raises(TemplateError) as excinfo:
        render_text(source, {"nome": SECRET})
    assert SECRET not in str(excinfo.value)
    assert "Fulana" not in str(excinfo.value)
    assert excinfo.value.__cause__ is None
    assert excinfo.value.__suppress_context__


def test_syntax_error() -> None:
    with pytest.raises(TemplateError, match=r"^syntax error at line 2: ") as excinfo:
        render_text("Olá\n{% if nome %}sem fim", {"nome": "x"})
    assert excinfo.value.lineno == 2


def test_unknown_filter_is_a_syntax_error() -> None:
    with pytest.raises(TemplateError, match="syntax error at line 1"):
        validate("{{ nome|naoexiste }}")


def test_validate() -> None:
    validate("Olá {{ nome }}, {% if hora %}às {{ hora }}{% endif %}")
    validate("{{ variavel_que_so_existe_no_envio }}")  # variables are not checked
    with pytest.raises(TemplateError, match="syntax error at line 3"):
        validate("a\nb\n{{ nome }")
    with pytest.raises(TemplateError, match="too long"):
        validate("x" * (MAX_SOURCE_LENGTH + 1))


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ joiner.__init__.__globals__ }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ self.__init__.__globals__ }}",
        "{{ nome.upper.__self__ }}",
        "{{ nome.mro() }}",
        "{{ nome|attr('__class__') }}",
        "{{ nome['__class__'] }}",
        "{{ lista.append(1) }}",
        "{{ '{0.__class__}'.format(nome) }}",
        "{{ nome.format_map({}) }}",
    ],
)
def test_sandbox_escapes_raise_template_error(source: str) -> None:
    variables = {"nome": SECRET, "lista": [1]}
    with pytest.raises(TemplateError) as excinfo:
        render_text(source, variables)
    assert SECRET not in str(excinfo.value)
    assert variables["lista"] == [1]
    with pytest.raises(TemplateError):
        render_html(source, {"nome": SECRET, "lista": [1]})


def test_output_too_long() -> None:
    with pytest.raises(TemplateError, match="^rendered message too long$"):
        render_text("{% for i in range(1000) %}{{ nome }}{% endfor %}", {"nome": "0123456789"})
    # exactly at the limit is fine
    assert len(render_text("{{ 'x' * n }}", {"n": MAX_TEXT_OUTPUT})) == MAX_TEXT_OUTPUT


@pytest.mark.timeout(10)  # a regression fails here instead of hanging; the bound itself is counted
def test_runaway_nested_loops_stop_quickly() -> None:
    source = "{% for i in range(1000) %}{% for j in range(1000) %}xx{% endfor %}{% endfor %}"
    with pytest.raises(TemplateError, match="too long"):
        render_text(source, {})
    # with no output to cap, the render's step budget stops it (tests/test_template_limits.py)
    with pytest.raises(TemplateError, match="^Modelo pesado demais: "):
        render_text(source.replace("xx", ""), {})


def test_html_has_a_larger_limit() -> None:
    out = render_html("{% for i in range(1000) %}<p>{{ i }}</p>{% endfor %}", {})
    assert len(out) > MAX_TEXT_OUTPUT


def test_source_too_long() -> None:
    with pytest.raises(TemplateError, match="template too long"):
        render_text("x" * (MAX_SOURCE_LENGTH + 1), {})


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x' * 1000000000 }}",
        "{{ [0] * 10**9 }}",
        "{{ 9 ** 9999999 }}",
        "{{ nome|center(1000000000) }}",
        "{{ nome.ljust(1000000000) }}",
        "{{ nome|indent(1000000000) }}",
        "{{ '%1000000000s' % nome }}",
        "{{ '%*s' % (1000000000, nome) }}",
        "{{ '%1000000000s'|format(nome) }}",
        "{{ '{:>1000000000}'.format(nome) }}",
        "{{ nome.replace('', 'x' * 50000).replace('', 'x' * 50000) }}",
        "{{ nome|replace('', 'x' * 50000)|replace('', 'x' * 50000) }}",
        "{{ nome.expandtabs(1000000000) }}",
        "{% for i in range(10**9) %}{% endfor %}",
        "{{ range(10)|batch(1000000000)|list }}",
    ],
)
@pytest.mark.timeout(10)
def test_memory_bombs_fail_fast(source: str) -> None:
    with pytest.raises(TemplateError):
        render_text(source, {"nome": "Ana"})


def test_compiled_templates_are_cached() -> None:
    from engine.messaging import render

    source = "cache {{ nome }}"
    render_text(source, {"nome": "a"})
    hits = render._compile_text.cache_info().hits
    assert render_text(source, {"nome": "b"}) == "cache b"
    assert render._compile_text.cache_info().hits == hits + 1


def test_input_mapping_is_not_mutated() -> None:
    variables: dict[str, object] = {"nome": "Ana", "itens": ["a"]}
    render_text("{% set nome = 'X' %}{{ nome }}", variables)
    assert variables == {"nome": "Ana", "itens": ["a"]}


_template_alphabet = st.sampled_from(
    ["{{", "}}", "{%", "%}", "{#", "#}", "nome", "hora", " if ", " for ", " in ", "endif", "endfor",
     "|", "upper", ".", "(", ")", "'", "*", "%", "range", "__class__", "\n", " ", "x", "1"]
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=60), st.lists(_template_alphabet, max_size=20).map("".join)))
def test_arbitrary_sources_render_or_raise_template_error(source: str) -> None:
    try:
        out = render_text(source, SAMPLE_VARIABLES)
    except TemplateError as exc:
        assert "Ana Clara" not in str(exc)
    else:
        assert isinstance(out, str)
        assert len(out) <= MAX_TEXT_OUTPUT
