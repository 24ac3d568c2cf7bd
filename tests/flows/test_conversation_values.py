"""Reading fields out of a patient's reply: each type checked (a date in the future and within the
horizon, a choice among the options…), a boolean only when asked, one thing said fills one field."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest

from engine.flows.conversation.fields import Field, Option
from engine.flows.conversation.values import ValueRejected, coerce, harvest
from engine.words.understanding import Context, Understanding, understand

SAO_PAULO = ZoneInfo("America/Sao_Paulo")
NOW = datetime(2026, 12, 7, 10, 0, tzinfo=SAO_PAULO)  # a Monday morning
TODAY = NOW.date()


def spec(slug: str, kind: str, harvest_rule: str | None = None, options: tuple[str, ...] = ()) -> Field:
    rule = harvest_rule or ("any_reply" if kind in ("date", "time", "period", "phone", "email") else "when_asked")
    return Field(id=1, slug=slug, label=slug, type=kind, question="?", harvest=rule,
                 options=tuple(Option(o, o.title()) for o in options))


DAY, PERIOD, HOUR = spec("dia", "date"), spec("periodo", "period"), spec("hora", "time")
OK = spec("aceita", "boolean")
UNIT = spec("unidade", "choice", options=("centro", "zona sul"))


def read(text: str, specs: list[Field], asked: str | None = None):
    pending = ("choice",) if any(s.type == "choice" and s.slug == asked for s in specs) else ()
    reading = understand(text, Context(now=NOW, pending=pending))
    return harvest(specs, text, reading, asked=asked, today=TODAY)


def test_fields_come_in_any_order_from_one_reply():
    found = read("pode ser sexta de manhã, lá pelas 9h", [DAY, PERIOD, HOUR])
    assert found.values == {"dia": "2026-12-11", "periodo": "morning", "hora": "09:00"}
    assert found.refused == {}


def test_a_reply_that_names_nothing_takes_nothing():
    assert read("oi, tudo bem?", [DAY, PERIOD, HOUR]).values == {}


def test_a_stray_yes_never_fills_a_boolean_that_was_not_asked():
    assert read("sim", [OK, DAY]).values == {}
    assert read("sim", [OK, DAY], asked="aceita").values == {"aceita": True}
    assert read("não confirmo", [OK], asked="aceita").values == {"aceita": False}


def test_a_choice_is_read_by_number_or_by_label_only_when_asked():
    assert read("2", [UNIT], asked="unidade").values == {"unidade": "zona sul"}
    assert read("Centro", [UNIT], asked="unidade").values == {"unidade": "centro"}
    assert read("7", [UNIT], asked="unidade").refused["unidade"].code == "detail_choice"
    assert read("2", [UNIT]).values == {}


def test_a_date_in_the_past_or_beyond_the_horizon_is_refused_with_a_sentence():
    said = Understanding("reschedule", {"date": "2026-12-01", "time": None, "period": None})
    past = harvest([DAY], "pode ser dia 1/12/2026?", said, asked=None, today=TODAY)
    assert past.values == {} and past.refused["dia"].code == "field_value_past"
    assert "passou" in str(past.refused["dia"].text)
    far = harvest([DAY], "x", understand("dia 20/12", Context(now=NOW)), asked=None, today=TODAY, horizon_days=5)
    assert far.refused["dia"].code == "field_value_horizon"


def test_one_date_fills_one_field_the_asked_one_first():
    other = spec("retorno", "date")
    assert read("quinta", [DAY, other], asked="retorno").values == {"retorno": "2026-12-10"}
    assert read("quinta", [DAY, other]).values == {"dia": "2026-12-10"}


def test_a_free_text_field_takes_the_whole_answer_to_its_question_only():
    note = spec("motivo", "text")
    assert read("dor nas costas", [note], asked="motivo").values == {"motivo": "dor nas costas"}
    assert read("dor nas costas", [note]).values == {}


@pytest.mark.parametrize("kind, value, stored", [
    ("number", "3,5", 3.5), ("number", "12", 12), ("time", "09:30", "09:30"), ("period", "evening", "evening"),
    ("phone", "(16) 99988-7766", "+5516999887766"), ("email", " Ana@Exemplo.com ", "ana@exemplo.com"),
    ("date", "2026-12-07", "2026-12-07"),
])
def test_each_type_stores_its_normal_form(kind, value, stored):
    assert coerce(spec("x", kind), value, today=TODAY) == stored


@pytest.mark.parametrize("kind, value, code", [
    ("number", True, "detail_number"), ("number", "três", "detail_number"), ("time", "25:00", "field_value_time"),
    ("period", "madrugada", "detail_choice"), ("phone", "123", "field_value_phone"),
    ("email", "ana@", "field_value_email"), ("date", "2026-13-01", "field_value_date"),
    ("date", "2026-12-06", "field_value_past"), ("boolean", "talvez", "detail_boolean"),
    ("text", "", "detail_text"), ("text", None, "detail_required"),
])
def test_each_type_refuses_what_it_cannot_hold(kind, value, code):
    with pytest.raises(ValueRejected) as refused:
        coerce(spec("x", kind), value, today=TODAY)
    assert refused.value.finding.code == code and refused.value.finding.field == "x"


def test_contact_details_are_found_inside_a_sentence():
    phone, mail = spec("tel", "phone"), spec("mail", "email")
    found = read("meu cel é (11) 98765-4321 e o email ana.souza@exemplo.com.br", [phone, mail])
    assert found.values == {"tel": "+5511987654321", "mail": "ana.souza@exemplo.com.br"}


def test_today_is_the_orgs_day_not_the_servers():
    late = datetime(2026, 12, 7, 23, 30, tzinfo=SAO_PAULO)  # already the 8th in UTC
    reading = understand("hoje", Context(now=late))
    assert harvest([DAY], "hoje", reading, asked=None, today=late.date()).values == {"dia": "2026-12-07"}
    assert late.astimezone(UTC).date() == date(2026, 12, 8), "the premise: UTC is already on the next day"
