"""Every code a message can carry reads as a sentence (engine/words/reasons.py over engine/words/catalogue.py):
the codes are found in the source, not kept by hand; the families built at run time resolve;
nothing shows a raw code; the CLI prints the words."""

from __future__ import annotations

import ast
from datetime import timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from admin.cli import main
from engine.messaging import dispatch
from engine.words.catalogue import CATALOGUE
from engine.store.models import APPOINTMENT_STATUSES, MESSAGE_STATUSES
from engine.words.reasons import (
    ALIASES,
    FAMILIES,
    META_CODES,
    TWILIO_CODES,
    event_label,
    message_reason,
    reply_outcome,
    row_reason,
    status_label,
)
from tests.factories import World, local
from tests.processes import lembra_env
from tests.python_source import parse

ROOT = Path(__file__).resolve().parent.parent
#: The generic sentences: a code found in the source must never fall back to one of them.
FALLBACKS = {CATALOGUE[key].msgid for key in ("unknown_code", "provider_code", "meta_error", "reply_other")}
#: Where an engine function takes a code to write in `error_code` / `skip_reason`: its index.
CODE_ARGUMENTS = {"settle": 2, "fail_in_tx": 2, "park_unknown": 2, "retry_or_give_up": 4, "cancel_open": 3}
#: Where an outbox function takes an event name.
EVENT_ARGUMENTS = {"transition": 5, "transition_where": 5, "record_events": 3}


# --- finding the codes in the source ----------------------------------------------------------------

def _sources(*folders: str) -> list[tuple[Path, ast.Module]]:
    return [(path, parse(path.read_text(), str(path)))
            for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))]


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's top-level `NAME = "text"` assignments (REASON, RULE_CHANGED, SKIP_TOO_LATE...)."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _strings(node: ast.AST | None, constants: dict[str, str]) -> set[str]:
    """The literal codes an expression can be: `"x"`, `exc.code or "x"`, `a if c else "x"`, NAME."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name) and node.id in constants:
        return {constants[node.id]}
    if isinstance(node, ast.BoolOp):
        return set().union(*(_strings(value, constants) for value in node.values))
    if isinstance(node, ast.IfExp):
        return _strings(node.body, constants) | _strings(node.orelse, constants)
    return set()


def _assigned(node: ast.AST, names: tuple[str, ...], constants: dict[str, str]) -> set[str]:
    """The literal codes put in a variable of one of `names` (`code = "a" if t else "b"`,
    `due, reason = None, "too_late"`)."""
    if not isinstance(node, ast.Assign):
        return set()
    found: set[str] = set()
    for target in node.targets:
        if isinstance(target, ast.Name) and target.id in names:
            found |= _strings(node.value, constants)
        elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
            for name, value in zip(target.elts, node.value.elts):
                if isinstance(name, ast.Name) and name.id in names:
                    found |= _strings(value, constants)
    return found


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _is_code(text: str) -> bool:
    return bool(text) and text.replace("_", "").isalnum() and text.isascii() and " " not in text


def provider_codes() -> tuple[set[str], set[str]]:
    """Codes providers/ and gateway/ raise (`code="..."`) or report (`error_code="..."`), and the
    literal prefixes of those built at run time (`code=f"http_{status}"`)."""
    codes: set[str] = set()
    prefixes: set[str] = set()
    for _, tree in _sources("providers", "gateway"):
        constants = _constants(tree)
        for node in ast.walk(tree):
            codes |= _assigned(node, ("code", "error_code"), constants)
            if not isinstance(node, ast.Call):
                continue
            for keyword in node.keywords:
                if keyword.arg not in ("code", "error_code"):
                    continue
                codes |= _strings(keyword.value, constants)
                value = keyword.value
                if isinstance(value, ast.BoolOp):  # `code or f"http_{status}"`
                    value = next((v for v in value.values if isinstance(v, ast.JoinedStr)), value)
                if isinstance(value, ast.JoinedStr):
                    head = value.values[0]
                    prefixes.add(head.value if isinstance(head, ast.Constant) else "")
    return {code for code in codes if _is_code(code)}, prefixes


def engine_codes() -> set[str]:
    """Codes engine/ and admin/ write in `error_code` / `skip_reason` (as a `values` entry, as the
    code argument of settle / cancel_open / fail_in_tx..., as a run's end reason, which
    cancel_open copies), or in an event's `detail` reason, plus what `refusals` finds."""
    codes: set[str] = set()
    for _, tree in _sources("engine", "admin"):
        constants = _constants(tree)
        codes |= {value for name, value in constants.items() if name.startswith("SKIP_")}
        for node in ast.walk(tree):
            codes |= _assigned(node, ("reason",), constants)
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value in ("error_code", "skip_reason", "reason", "code"):
                        codes |= _strings(value, constants)
            elif isinstance(node, ast.Call):
                index = CODE_ARGUMENTS.get(_called(node))
                if index is not None and len(node.args) > index:
                    codes |= _strings(node.args[index], constants)
                for keyword in node.keywords:
                    if keyword.arg in ("skip_reason", "error_code") or (_called(node) == "end_live"
                                                                        and keyword.arg == "reason"):
                        codes |= _strings(keyword.value, constants)
            elif isinstance(node, ast.FunctionDef) and node.name == "refusals":
                codes |= {value for assign in ast.walk(node) if isinstance(assign, ast.Assign)
                          and isinstance(assign.targets[0], ast.Subscript)
                          for value in _strings(assign.value, constants)}
    return {code for code in codes if _is_code(code)}


def event_names() -> set[str]:
    """Every event name the code base writes to `message_events`."""
    names: set[str] = set()
    for _, tree in _sources("engine", "admin"):
        constants = _constants(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                index = EVENT_ARGUMENTS.get(_called(node))
                if index is not None and len(node.args) > index:
                    names |= _strings(node.args[index], constants)
            elif isinstance(node, ast.Dict):  # a multi-row insert's {"event": …} rows
                names |= {value for key, item in zip(node.keys, node.values)
                          if isinstance(key, ast.Constant) and key.value == "event"
                          for value in _strings(item, constants)}
    return names


def reply_outcomes() -> tuple[set[str], set[str]]:
    """The outcomes engine/messaging/inbound.py's `_act` returns, and the prefixes of those built at run time."""
    tree = parse((ROOT / "engine" / "messaging" / "inbound.py").read_text())
    [act] = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "_act"]
    outcomes: set[str] = set()
    prefixes: set[str] = set()
    for node in ast.walk(act):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            first = node.value.elts[0]
            outcomes |= _strings(first, {})
            if isinstance(first, ast.JoinedStr) and isinstance(first.values[0], ast.Constant):
                prefixes.add(first.values[0].value)
    return outcomes, prefixes


# --- every code has its sentence --------------------------------------------------------------------

def test_every_code_a_provider_raises_has_a_sentence() -> None:
    codes, prefixes = provider_codes()
    assert {"sandbox_permanent", "not_on_whatsapp", "hard_bounce", "egress_refused", "timeout"} <= codes
    assert len(codes) > 45  # the scan still finds them
    generic = sorted(code for code in codes if message_reason(code).msgid in FALLBACKS)
    assert generic == []
    # A code built at run time belongs to a family message_reason resolves.
    assert prefixes and prefixes <= set(FAMILIES), prefixes - set(FAMILIES)


def test_every_code_the_engine_writes_on_a_message_has_a_sentence() -> None:
    codes = engine_codes()
    assert {"appointment_changed", "retry_after_expiry", "worker_lost", "lease_expired", "opted_out",
            "address_opted_out", "cancelled_by_operator", "too_late", "rule_changed", "handoff"} <= codes
    assert len(codes) > 30
    generic = sorted(code for code in codes if message_reason(code).msgid in FALLBACKS)
    assert generic == []


def test_every_status_event_and_reply_outcome_has_words() -> None:
    unknown = CATALOGUE["unknown_code"].msgid
    assert [s for s in MESSAGE_STATUSES if status_label(s).msgid == unknown] == []
    events = event_names()
    assert {"queued", "claimed", "sending", "sent", "failed", "retried", "deferred", "dead"} <= events
    assert sorted(e for e in events if event_label(e).msgid == unknown) == []

    outcomes, prefixes = reply_outcomes()
    assert {"free_text", "unknown_contact", "no_appointment", "opted_out", "already_opted_out", "confirmed",
            "cancelled"} <= outcomes
    assert prefixes == {"appointment_"}
    outcomes |= {f"appointment_{status}" for status in APPOINTMENT_STATUSES}
    other = CATALOGUE["reply_other"].msgid
    assert sorted(o for o in outcomes if reply_outcome(o).msgid == other) == []


def test_aliases_and_tables_point_at_sentences_that_exist() -> None:
    keys = set(ALIASES.values()) | set(META_CODES.values()) | set(TWILIO_CODES.values())
    assert sorted(key for key in keys if key not in CATALOGUE) == []


def test_meta_numbers_read_like_the_names_the_provider_gives_them() -> None:
    from providers.meta.provider import _ERRORS

    for number, (_, name, _) in _ERRORS.items():
        assert message_reason(f"meta_{number}") == message_reason(name), number
        assert message_reason(str(number), kind="whatsapp") == message_reason(name), number


# --- families and the last resort --------------------------------------------------------------------

@pytest.mark.parametrize("code, kind, expected", [
    ("http_429", None, "pediu para esperar"),
    ("http_401", None, "recusou as credenciais do canal (HTTP 401)"),
    ("http_503", None, "teve um erro (HTTP 503)"),
    ("http_404", None, "recusou o pedido (HTTP 404)"),
    ("smtp_535", None, "recusou o usuário ou a senha do canal (código 535)"),
    ("smtp_421", None, "adiou a mensagem (código 421)"),
    ("smtp_550", None, "recusou a mensagem (código 550)"),
    ("meta_131047", None, "só aceita modelos aprovados"),
    ("meta_132001", None, "Este modelo não existe na Meta"),
    ("meta_132007", None, "recusou o modelo de mensagem (erro 132007 da Meta)"),
    ("meta_100", None, "parâmetro inválido"),
    ("meta_4", None, "erro 4 da Meta"),
    ("131026", "whatsapp", "número pode não ter WhatsApp"),
    ("190", "whatsapp", "token de acesso da Meta"),
    ("21610", "sms", "respondeu STOP"),
    ("30003", "sms", "desligado ou sem sinal"),
    ("131026", "sms", "código 131026 do provedor"),
    ("REJECTED", "sms", "recusou a mensagem"),
    ("CARRIER_SAID_NO", "sms", "código CARRIER_SAID_NO do provedor"),
    ("timeout", None, "não respondeu a tempo"),
    ("window_closed", None, "mais de 24 horas"),
    ("sandbox_permanent", None, "O sandbox recusou a mensagem de propósito"),
])
def test_families_resolve_with_their_parameter(code, kind, expected) -> None:
    text = str(message_reason(code, kind=kind))
    assert expected in text
    assert text != code


def test_an_unknown_code_names_itself_only_as_an_internal_code_and_nothing_else() -> None:
    assert message_reason(None) is None and message_reason("") is None
    text = str(message_reason("something_new"))
    assert "código interno something_new" in text
    # Whatever a code carries, only a safe shape of it is repeated.
    odd = str(message_reason("x <b>ana@example.com</b> +55 16 99988"))
    assert "@" not in odd and "<" not in odd and " +55" not in odd and "(código interno " in odd
    assert len(str(message_reason("z" * 500))) < 200
    assert "código interno zzz" in str(reply_outcome("zzz")) and str(reply_outcome(None)).startswith("Recebida")
    assert "código interno weird" in str(status_label("weird"))


def test_a_row_says_its_skip_reason_first_and_an_expired_retry_says_its_last_error() -> None:
    assert row_reason(None, None) is None
    assert row_reason("sandbox_transient", "opted_out") == message_reason("opted_out")
    assert row_reason("sandbox_permanent", None) == message_reason("sandbox_permanent")
    text = str(row_reason("http_503", "retry_after_expiry"))
    assert "prazo desta mensagem" in text and "HTTP 503" in text
    assert row_reason(None, "retry_after_expiry") == message_reason("retry_after_expiry")


def test_every_message_sentence_binds_its_parameters() -> None:
    params = {"code": "X1", "status": 500, "error": "erro"}
    for key, entry in CATALOGUE.items():
        if key.startswith(("message_status_", "message_event_", "reply_", "send_", "smtp_", "meta_", "sms_")):
            assert "%(" not in str(type(entry)(entry.msgid, params)), key


# --- the CLI --------------------------------------------------------------------------------------------

APPOINTMENT = local(2026, 12, 3, 14, 0)
DUE = local(2026, 12, 2, 14, 0).astimezone(timezone.utc)


def _failed_and_cancelled(rt, slug: str) -> World:
    """A clinic with one reminder the sandbox refused and one cancelled with its appointment."""
    world = World(rt, slug=slug)
    world.channel("whatsapp", simulate="permanent")
    world.rule(1440, kinds=("whatsapp",))
    contact = world.contact()
    world.appointment(contact, APPOINTMENT)
    other = world.appointment(contact, local(2026, 12, 10, 14, 0))
    from engine.people import appointments as appts
    from engine.reminders.populate import refresh_appointment

    with rt.db.begin() as conn:
        appts.cancel(conn, world.org_id, other, source="clinic")
        refresh_appointment(conn, world.org_id, other)
    return world


def test_lembra_messages_prints_sentences_and_codes_only_when_asked(rt, clock) -> None:
    clock.set(DUE)
    world = _failed_and_cancelled(rt, "clinica-a")
    [claimed] = dispatch.claim_due(rt, limit=10)
    assert dispatch.send_one(rt, claimed) == "failed"
    other = World(rt, slug="clinica-b")
    other.channel("whatsapp")
    other.rule(1440)
    other.appointment(other.contact(name="Bruno", phone="+5516988887777"), APPOINTMENT)

    env = lembra_env(rt.settings.database_url)
    runner = CliRunner()
    words = runner.invoke(main, ["messages", "--org", "clinica-a"], env=env)
    assert words.exit_code == 0, words.output
    assert "O sandbox recusou a mensagem de propósito" in words.output
    assert "O agendamento mudou" in words.output and "Falhou" in words.output and "Cancelada" in words.output
    assert "sandbox_permanent" not in words.output and "appointment_changed" not in words.output
    ids = {m.id for m in world.messages()}
    listed = {int(line.split()[0]) for line in words.output.splitlines()[1:-1]}
    assert listed == ids  # the other clinic's reminder is not there
    assert "Ana Clara" not in words.output and "99988" not in words.output

    codes = runner.invoke(main, ["messages", "--org", "clinica-a", "--codes"], env=env)
    assert codes.exit_code == 0, codes.output
    assert "sandbox_permanent" in codes.output and "appointment_changed" in codes.output
    assert "O sandbox recusou" not in codes.output

    bad = runner.invoke(main, ["messages", "--status", "weird"], env=env)
    assert bad.exit_code == 2 and "status must be one of" in bad.output
    nobody = runner.invoke(main, ["messages", "--org", "no-such-clinic"], env=env)
    assert nobody.exit_code == 2
