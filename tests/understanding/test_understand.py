"""The built-in reader of patients' replies (engine/words/understanding, docs/understanding.md):
the issue's examples, the resolution conventions, negations and mixed signals, menus, org
keywords, refusals and hostile input. The clock is the corpus's: Monday 2026-12-07 10:00 in São
Paulo, the appointment on Wednesday 2026-12-09 at 14:00."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from engine.words.keywords import classify
from engine.words.understanding import STANDARD_INTENTS, Context, Understanding, understand

SP = ZoneInfo("America/Sao_Paulo")
MONDAY = datetime(2026, 12, 7, 10, tzinfo=SP)
APPOINTMENT = datetime(2026, 12, 9, 14, tzinfo=SP)


def read(text: str, now: datetime = MONDAY, **context) -> Understanding:
    context.setdefault("appointment_at", APPOINTMENT)
    return understand(text, Context(now=now, timezone="America/Sao_Paulo", **context))


@pytest.mark.parametrize("text, intent", [
    ("Confirmo!", "confirm"),
    ("não vou faltar não, pode confirmar", "confirm"),
    ("ok mas tem como ser sexta?", "reschedule"),
    ("será que não tem como passar pra sexta?", "reschedule"),
    ("simmmm", "confirm"),
    ("OK 👍", "confirm"),
    ("👍", "confirm"),
    ("blz, vou sim", "confirm"),
    ("sim, quarta às 14h", "confirm"),
    ("não vou poder ir, mas queria remarcar", "reschedule"),
    ("cancelar não, só mudar o horário", "reschedule"),
    ("não confirmo", "cancel"),
    ("confirmo não", "cancel"),
    ("quero cancelar", "cancel"),
    ("vou ter que cancelar", "cancel"),
    ("não vou", "cancel"),
    ("NÃO POSSO IR", "cancel"),
    ("sim, quero cancelar", "cancel"),
    ("cancelr", "cancel"),
    ("remarcr por favor", "reschedule"),
    ("vc pode remarcar pra 6a?", "reschedule"),
    ("dá pra ser sexta de manhã?", "reschedule"),
    ("não posso quarta, pode ser sexta?", "reschedule"),
    ("não. quero remarcar", "reschedule"),
    ("SAIR", "opt_out"),
    ("Não quero mais receber mensagens", "opt_out"),
    ("pare de mandar mensagem, quero cancelar", "opt_out"),
    ("quero falar com um atendente", "human"),
    ("qual o endereço?", "question"),
    ("posso levar meu filho?", "question"),
    ("bom dia", "other"),
    ("", "other"),
    ("não quero sair", "other"),
])
def test_intents(text, intent):
    assert read(text).intent == intent


@pytest.mark.parametrize("text", ["não vou poder ir", "não confirmo", "quero remarcar", "SAIR", "cancela, obrigado",
                                  "ok, mas não vou conseguir ir", "confirmo não", "tá bom, pode cancelar",
                                  "sim sim, quero remarcar", "não, obrigado", "👍 mas preciso remarcar"])
def test_no_critical_errors(text):
    """A cancel, a reschedule or an opt-out is never read as a confirm."""
    assert read(text).intent != "confirm"


@pytest.mark.parametrize("text, date, time, period", [
    ("amanhã", "2026-12-08", None, None),
    ("amanha de manhã", "2026-12-08", None, "morning"),
    ("depois de amanhã às 9h", "2026-12-09", "09:00", None),
    ("hoje à noite", "2026-12-07", None, "evening"),
    ("sexta feira", "2026-12-11", None, None),
    ("6a", "2026-12-11", None, None),
    ("sab", "2026-12-12", None, None),
    ("segunda", "2026-12-14", None, None),  # today is Monday: the next one
    ("semana que vem", "2026-12-14", None, None),
    ("semana que vem na terça", "2026-12-15", None, None),
    ("próxima terça", "2026-12-08", None, None),
    ("dia 12", "2026-12-12", None, None),
    ("dia 5", "2027-01-05", None, None),
    ("dia 7", "2026-12-07", None, None),
    ("12/12", "2026-12-12", None, None),
    ("5/12", "2027-12-05", None, None),
    ("12 de janeiro", "2027-01-12", None, None),
    ("daqui a 15 dias", "2026-12-22", None, None),
    ("daqui a duas semanas", "2026-12-21", None, None),
    ("fim do mês", "2026-12-31", None, None),
    ("às 15h", None, "15:00", None),
    ("15:30", None, "15:30", None),
    ("15h30", None, "15:30", None),
    ("3 da tarde", None, "15:00", None),
    ("três e meia da tarde", None, "15:30", None),
    ("meio-dia", None, "12:00", None),
    ("depois do almoço", None, None, "afternoon"),
    ("de manhã", None, None, "morning"),
    ("à noite", None, None, "evening"),
    ("boa tarde", None, None, None),  # a greeting, not a period
    ("quarta não, sexta às 10", "2026-12-11", "10:00", None),
    ("sexta não dá, só segunda", "2026-12-14", None, None),
    ("pode ser no mesmo horário na sexta?", "2026-12-11", "14:00", None),
])
def test_dates_times_and_periods(text, date, time, period):
    fields = read(text).fields
    assert (fields["date"], fields["time"], fields["period"]) == (date, time, period)


def test_fields_always_carry_date_time_and_period():
    assert read("oi").fields == {"date": None, "time": None, "period": None}


def test_late_afternoon_is_a_range():
    fields = read("no fim da tarde").fields
    assert fields["period"] == "afternoon" and fields["time_range"] == ["16:00", "18:00"]


@pytest.mark.parametrize("text, expected", [
    ("entre 14 e 16h", ["14:00", "16:00"]),
    ("das 8 às 10", ["08:00", "10:00"]),
    ("das 14h30 às 16h", ["14:30", "16:00"]),
])
def test_ranges(text, expected):
    assert read(text).fields["time_range"] == expected


@pytest.mark.parametrize("text, excluded", [
    ("qualquer dia menos segunda", [0]),
    ("qualquer dia exceto segunda e sexta", [0, 4]),
    ("segunda não posso", [0]),
])
def test_exclusions(text, excluded):
    understood = read(text)
    assert understood.fields["exclude_weekdays"] == excluded and understood.fields["date"] is None
    assert understood.intent == "reschedule"


# Conventions of docs/understanding.md, said on other days.
FRIDAY = datetime(2026, 12, 11, 10, tzinfo=SP)


@pytest.mark.parametrize("now, text, date", [
    (FRIDAY, "sexta", "2026-12-18"),  # a bare weekday on that weekday: next week's
    (FRIDAY, "sexta às 18h", "2026-12-11"),  # unless a time later today is given
    (FRIDAY, "sexta às 9h", "2026-12-18"),  # an hour already past today: next week's
    (FRIDAY, "semana que vem", "2026-12-14"),  # Monday of next week
    (FRIDAY, "próxima sexta", "2026-12-18"),
    (datetime(2026, 12, 31, 10, tzinfo=SP), "fim do mês", "2027-01-31"),  # on the last day: next month's
    (datetime(2026, 12, 13, 10, tzinfo=SP), "dia 12", "2027-01-12"),  # past this month: next month's
    (datetime(2026, 12, 13, 10, tzinfo=SP), "12/12", "2027-12-12"),  # past this year: next year's
    (datetime(2027, 1, 30, 10, tzinfo=SP), "dia 31", "2027-01-31"),
    (datetime(2027, 2, 1, 10, tzinfo=SP), "dia 30", "2027-03-30"),  # February has none
    (datetime(2026, 12, 20, 10, tzinfo=SP), "daqui a 15 dias", "2027-01-04"),
])
def test_conventions(now, text, date):
    assert read(text, now=now, appointment_at=None).fields["date"] == date


def test_dates_resolve_in_the_org_timezone():
    """01:00 UTC on Tuesday is still Monday evening in São Paulo: "amanhã" is Tuesday."""
    now = datetime(2026, 12, 8, 1, tzinfo=ZoneInfo("UTC"))
    assert read("amanhã", now=now).fields["date"] == "2026-12-08"


@pytest.mark.parametrize("text, choice", [("1", 1), ("2", 2), ("opção 2", 2), ("a segunda opção", 2),
                                          ("a primeira", 1), ("2️⃣", 2)])
def test_menu_answers_only_when_a_choice_is_pending(text, choice):
    chosen = read(text, pending=("choice",))
    assert chosen.fields["choice"] == choice and chosen.fields["date"] is None
    assert "choice" not in read(text).fields


def test_bare_digits_outside_a_menu_are_the_reminders_own():
    """keywords.classify's defaults: 1 confirms, 2 cancels."""
    assert read("1").intent == "confirm" and read("2").intent == "cancel"


def test_org_keywords_extend_the_built_in_ones():
    keywords = {"confirm": ["tamo junto"], "optout": ["me esquece"]}
    assert read("tamo junto", keywords=keywords).intent == "confirm"
    assert read("me esquece", keywords=keywords).intent == "opt_out"
    assert read("confirmo", keywords=keywords).intent == "confirm"  # built-in kept
    assert read("SAIR", keywords=keywords).intent == "opt_out"
    assert read("tamo junto").intent == "other"


def test_undeclared_intents_are_never_returned():
    understood = read("quero falar com um atendente", intents=("confirm", "cancel"))
    assert understood.intent == "other"
    assert read("quero remarcar, não posso ir", intents=("confirm", "cancel")).intent == "cancel"


@pytest.mark.parametrize("bad", [
    {"now": datetime(2026, 12, 7, 10)},
    {"now": MONDAY, "appointment_at": datetime(2026, 12, 9, 14)},
    {"now": MONDAY, "timezone": "Mars/Olympus"},
])
def test_context_refuses_naive_datetimes_and_unknown_zones(bad):
    with pytest.raises(ValueError):
        Context(**bad)


@pytest.mark.parametrize("text", [
    "a" * 100_000,
    "não " * 30_000,
    "simmmmmmmm" * 10_000,
    "dia 12 " * 20_000,
    "entre 1 e " * 20_000,
    "1" * 100_000,
    "🙂" * 50_000,
    "\u0301" * 50_000,
])
def test_hostile_input_is_answered(text):
    understood = read(text)
    assert understood.intent in STANDARD_INTENTS and 0 <= understood.confidence <= 1


def test_as_json_and_determinism():
    first = read("dá pra ser sexta de manhã?").as_json()
    assert first == read("dá pra ser sexta de manhã?").as_json()
    assert first["engine"] == "builtin" and first["llm_calls"] == 0
    assert set(first) == {"intent", "fields", "confidence", "engine", "llm_calls"}


@pytest.mark.parametrize("text, expected", [("OK!", "confirm"), ("CANCELAR!!", "cancel"), ("sair", "optout"),
                                            ("vou sair mais cedo", None), ("ok, mas vou atrasar", None)])
def test_keywords_classify_is_unchanged(text, expected):
    assert classify(text) == expected
