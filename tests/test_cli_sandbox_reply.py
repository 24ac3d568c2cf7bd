"""`lembra sandbox reply`: a script plays the patient on the sandbox provider, through the same path
as the console's Caixa do sandbox, and reads what the engine made of the reply."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from admin.cli import main
from engine.messaging import dispatch
from engine.store.models import appointments, inbound_messages, preferences, webhook_events
from tests.factories import World
from tests.processes import lembra_env

PHONE = "+5516999887766"


class Clinic:
    """A demo-like org: a sandbox WhatsApp channel, a 2 h reminder rule, and a patient whose
    reminder the sandbox has "sent"."""

    def __init__(self, rt, clock, slug: str) -> None:
        self.world = World(rt, slug=slug)
        self.channel_id = self.world.channel("whatsapp")
        self.world.rule(120)
        self.contact_id = self.world.contact(name="Ana Clara", phone=PHONE)
        self.appointment_id = self.world.appointment(self.contact_id, clock.now() + timedelta(hours=5))


@pytest.fixture
def clinic(rt, clock):
    made = Clinic(rt, clock, "clinica-demo")
    clock.advance(timedelta(hours=3, minutes=1))  # the 2 h reminder of the 5 h appointment is due
    assert [dispatch.send_one(rt, mid) for mid in dispatch.claim_due(rt, limit=50)] == ["sent"]
    assert len(made.world.sandbox()) == 1
    return made


def _run(rt, *args: str):
    return CliRunner().invoke(main, ["sandbox", "reply", *args], env=lembra_env(rt.settings.database_url))


def _status(rt, appointment_id: int) -> str:
    with rt.db.connect() as conn:
        return conn.execute(select(appointments.c.status).where(appointments.c.id == appointment_id)).scalar_one()


def _written(rt) -> tuple[int, int]:
    with rt.db.connect() as conn:
        return (conn.execute(select(func.count()).select_from(inbound_messages)).scalar_one(),
                conn.execute(select(func.count()).select_from(webhook_events)).scalar_one())


@pytest.fixture
def records():
    """Every record Lembra's own loggers write, at any level (the CLI replaces the root's handlers,
    so these sit on the packages' loggers)."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep(level=logging.DEBUG)
    loggers = [logging.getLogger(name) for name in ("engine", "admin", "gateway", "providers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    yield seen
    for lg, level in zip(loggers, levels):
        lg.removeHandler(handler)
        lg.setLevel(level)


def test_ok_confirms_the_appointment_and_says_so(rt, clinic, records):
    result = _run(rt, "--org", "clinica-demo", "--phone", PHONE, "OK")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "O paciente confirmou o agendamento."
    assert _status(rt, clinic.appointment_id) == "confirmed"
    # The reply answered the reminder the sandbox sent (as the console's reply does).
    with rt.db.connect() as conn:
        row = conn.execute(select(inbound_messages)).one()
    assert row.in_reply_to == clinic.world.sandbox()[0].provider_message_id
    assert row.contact_id == clinic.contact_id and row.outcome == "confirmed"
    # The acknowledgement is queued like any reply's.
    assert [m.purpose for m in clinic.world.messages()] == ["session_reminder", "confirm_ack"]
    assert any(r.getMessage() == "inbound processed" for r in records)  # the loggers were heard
    logged = " ".join(r.getMessage() + repr(r.__dict__) for r in records) + result.stderr
    assert "16999887766" not in logged and "'OK'" not in logged and '"OK"' not in logged


def test_json_and_english(rt, clinic):
    result = _run(rt, "--org", "clinica-demo", "--phone", PHONE, "--json", "CONFIRMAR")
    assert result.exit_code == 0, result.output
    with rt.db.connect() as conn:
        inbound_id = conn.execute(select(inbound_messages.c.id)).scalar_one()
    assert json.loads(result.output) == {"inbound_id": inbound_id, "outcome": "confirmed",
                                         "contact_id": clinic.contact_id, "run_id": None}
    again = _run(rt, "--org", "clinica-demo", "--phone", PHONE, "--lang", "en", "OK")
    assert again.exit_code == 0, again.output
    assert again.output.strip() == "The patient replied, but the appointment was already confirmed; nothing changed."


def test_sair_opts_the_patient_out(rt, clinic):
    result = _run(rt, "--org", "clinica-demo", "--phone", PHONE, "--channel", str(clinic.channel_id), "SAIR")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "O paciente pediu para sair: não recebe mais mensagens e recebeu a confirmação."
    with rt.db.connect() as conn:
        opted = conn.execute(select(preferences.c.opted_out_at).where(
            preferences.c.contact_id == clinic.contact_id)).scalars().all()
    assert opted and all(at is not None for at in opted)
    assert _status(rt, clinic.appointment_id) == "scheduled"


def test_a_tapped_button_cancels(rt, clinic):
    result = _run(rt, "--org", "clinica-demo", "--phone", PHONE, "--button", f"cancel:{clinic.appointment_id}")
    assert result.exit_code == 0, result.output
    assert "O paciente cancelou o agendamento" in result.output
    assert _status(rt, clinic.appointment_id) == "cancelled"


@pytest.mark.parametrize("args, sentence", [
    (["--org", "nope", "--phone", PHONE, "OK"], "Não há clínica com o identificador nope."),
    (["--org", "clinica-demo", "--phone", "16 99988-7766", "OK"], "formato E.164"),
    (["--org", "clinica-demo", "--phone", "5516999887766", "OK"], "formato E.164"),
    (["--org", "clinica-demo", "--phone", "+55 16 99988-7766", "OK"], "formato E.164"),
    (["--org", "clinica-demo", "--phone", "+5500000", "OK"], "formato E.164"),
    (["--org", "clinica-demo", "--phone", PHONE, "  "], "Escreva a resposta do paciente."),
    (["--org", "clinica-demo", "--phone", PHONE, "x" * 1001], "passa de 1000 caracteres"),
    (["--org", "clinica-demo", "--phone", PHONE, "--button", "confirm:999"], "não tem esse botão"),
    (["--org", "clinica-demo", "--phone", PHONE, "--channel", "999999", "OK"],
     "O canal 999999 não é um canal do sandbox desta clínica."),
])
def test_bad_input_is_one_catalogue_sentence_and_writes_nothing(rt, clinic, args, sentence):
    result = _run(rt, *args)
    assert result.exit_code == 2
    assert sentence in result.output and result.output.startswith("lembra: error: ")
    assert PHONE not in result.output
    assert _written(rt) == (0, 0)
    assert _status(rt, clinic.appointment_id) == "scheduled"


def test_errors_in_english(rt, clinic):
    result = _run(rt, "--org", "clinica-demo", "--phone", "123", "--lang", "en", "OK")
    assert result.exit_code == 2 and "Give the phone in E.164" in result.output


def test_another_orgs_channel_is_refused(rt, clock, clinic):
    other = Clinic(rt, clock, "outra-clinica")
    result = _run(rt, "--org", "clinica-demo", "--phone", PHONE, "--channel", str(other.channel_id), "OK")
    assert result.exit_code == 2
    assert f"O canal {other.channel_id} não é um canal do sandbox desta clínica." in result.output
    assert _written(rt) == (0, 0)
    assert _status(rt, clinic.appointment_id) == "scheduled" and _status(rt, other.appointment_id) == "scheduled"


def test_an_org_without_a_sandbox_channel(rt, clock):
    World(rt, slug="sem-sandbox").channel("sms")  # a sandbox, but no WhatsApp one
    result = _run(rt, "--org", "sem-sandbox", "--phone", PHONE, "OK")
    assert result.exit_code == 2 and "não tem um canal de WhatsApp do sandbox" in result.output
    assert _written(rt) == (0, 0)


def test_a_reply_a_flow_takes_says_the_flow_reads_it(rt, clock):
    """The demo's "Remarcar" flow takes a patient's wish to reschedule: the command says so rather
    than leaving it for a person."""
    from engine.fleet.demo import seed

    with rt.db.begin() as conn:
        seed(conn, rt.keyring)
    result = _run(rt, "--org", "demo", "--phone", "+5511998761002", "posso remarcar para sexta de manhã?")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("O fluxo Remarcar está lendo esta resposta")
