"""The exact text a patient receives from every default template (issue 11, finding 2).

The defaults live in the migrations (`sql/*/0002`, `0008`, …), rendered with trim_blocks, where a
newline after a block tag silently disappears: "às 14:00.Local: Rua …". So every default is
compared whole, character by character, and the reminder also end to end through the sandbox.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from engine.messaging import dispatch
from engine.store.models import templates
from engine.messaging.render import reminder_variables, render_text
from tests.factories import World

STARTS_AT = datetime(2026, 3, 23, 17, 0, tzinfo=UTC)  # a Monday, 14:00 in São Paulo
VARIABLES = reminder_variables(contact_name="Ana Clara Souza", professional="Dra. Beatriz Costa",
                               starts_at=STARTS_AT, timezone="America/Sao_Paulo", mode="in_person",
                               location="Rua das Flores, 123", org_name="Clínica Exemplo")

REMINDER_WHATSAPP = ("Olá, Ana! Lembrete: sua sessão com Dra. Beatriz Costa é segunda-feira, 23/03, às 14:00.\n"
                     "Local: Rua das Flores, 123\n"
                     "\n"
                     "Para confirmar, responda OK. Para cancelar, responda CANCELAR.\n"
                     "Para não receber mais mensagens, responda SAIR.\n"
                     "\n"
                     "Clínica Exemplo")

#: (key, channel kind) → (subject, body) exactly as the patient reads them.
EXPECTED: dict[tuple[str, str], tuple[str | None, str]] = {
    ("cancel_ack", "email"): ("Sessão cancelada: 23/03, às 14:00",
                              "Tudo bem, Ana. Sua sessão de segunda-feira, 23 de março de 2026, às 14:00, foi cancelada "
                              "e a clínica foi avisada.\n\nClínica Exemplo"),
    ("cancel_ack", "sms"): (None, "Clínica Exemplo: sessão de 23/03 às 14:00 cancelada. A clínica foi avisada."),
    ("cancel_ack", "whatsapp"): (None, "Tudo bem, Ana. Sua sessão de 23/03, às 14:00, foi cancelada e a clínica foi "
                                       "avisada."),
    ("confirm_ack", "email"): ("Presença confirmada: 23/03, às 14:00",
                               "Obrigado, Ana! Sua presença está confirmada para segunda-feira, 23 de março de 2026, "
                               "às 14:00.\n\nClínica Exemplo"),
    ("confirm_ack", "sms"): (None, "Clínica Exemplo: presença confirmada para 23/03 às 14:00. Obrigado!"),
    ("confirm_ack", "whatsapp"): (None, "Obrigado, Ana! Sua presença está confirmada para segunda-feira, 23/03, às "
                                        "14:00."),
    ("conversation_reopen", "whatsapp"): (None, "Olá, Ana! Aqui é da Clínica Exemplo: recebemos sua mensagem e "
                                                "queremos responder. Responda esta mensagem para continuarmos a "
                                                "conversa."),
    ("followup_checkin", "email"): ("Podemos ajudar, Ana?",
                                    "Olá, Ana!\n\nPassando para saber se ficou alguma dúvida. Responda este e-mail e "
                                    "reservamos um horário para você.\n\nClínica Exemplo"),
    ("followup_checkin", "sms"): (None, "Clínica Exemplo: oi, Ana! Ficou alguma dúvida? Responda esta mensagem e "
                                        "reservamos um horário para você. SAIR para parar."),
    ("followup_checkin", "whatsapp"): (None, "Olá, Ana! Passando para saber se ficou alguma dúvida. Quer que a gente "
                                             "reserve um horário para você?\n\nClínica Exemplo"),
    ("followup_rebook", "email"): ("Vamos remarcar, Ana?",
                                   "Olá, Ana!\n\nSentimos sua falta na consulta. Quer remarcar? Responda este e-mail "
                                   "com o melhor dia e horário para você.\n\nClínica Exemplo"),
    ("followup_rebook", "sms"): (None, "Clínica Exemplo: sentimos sua falta, Ana. Quer remarcar? Responda com o "
                                       "melhor dia e horário. SAIR para parar."),
    ("followup_rebook", "whatsapp"): (None, "Olá, Ana! Sentimos sua falta na consulta. Quer remarcar? Responda com o "
                                            "melhor dia e horário para você.\n\nClínica Exemplo"),
    ("followup_reply_ack", "email"): ("Recebemos sua resposta",
                                      "Obrigado, Ana!\n\nRecebemos sua resposta e a equipe vai falar com você em "
                                      "breve.\n\nClínica Exemplo"),
    ("followup_reply_ack", "sms"): (None, "Clínica Exemplo: obrigado, Ana! Recebemos sua resposta e vamos falar com "
                                          "você em breve."),
    ("followup_reply_ack", "whatsapp"): (None, "Obrigado, Ana! Recebemos sua resposta e a equipe da Clínica Exemplo "
                                               "vai falar com você em breve."),
    ("optout_confirmation", "email"): ("Você não receberá mais mensagens da Clínica Exemplo",
                                       "Pronto: você não receberá mais mensagens automáticas da Clínica Exemplo. Se "
                                       "mudar de ideia, fale com a clínica."),
    ("optout_confirmation", "sms"): (None, "Clínica Exemplo: você não receberá mais mensagens automáticas."),
    ("optout_confirmation", "whatsapp"): (None, "Pronto: você não receberá mais mensagens automáticas da Clínica "
                                                "Exemplo. Se mudar de ideia, fale com a clínica."),
    ("session_cancellation", "email"): ("Sessão cancelada: 23/03, às 14:00",
                                        "Olá, Ana.\n\nSua sessão de segunda-feira, 23 de março de 2026, às 14:00, com "
                                        "Dra. Beatriz Costa foi cancelada. Para remarcar, fale com a clínica.\n\n"
                                        "Clínica Exemplo"),
    ("session_cancellation", "sms"): (None, "Clínica Exemplo: sua sessão de 23/03 às 14:00 foi cancelada. Para "
                                            "remarcar, fale com a clínica."),
    ("session_cancellation", "whatsapp"): (None, "Olá, Ana. Sua sessão de 23/03, às 14:00, com Dra. Beatriz Costa foi "
                                                 "cancelada. Para remarcar, fale com a clínica.\n\nClínica Exemplo"),
    ("session_confirmation", "email"): ("Sessão agendada: 23/03, às 14:00",
                                        "Olá, Ana!\n\nSua sessão com Dra. Beatriz Costa foi agendada para "
                                        "segunda-feira, 23 de março de 2026, às 14:00.\n\nClínica Exemplo"),
    ("session_confirmation", "sms"): (None, "Clínica Exemplo: sessão agendada para 23/03 às 14:00 com Dra. Beatriz "
                                            "Costa."),
    ("session_confirmation", "whatsapp"): (None, "Olá, Ana! Sua sessão com Dra. Beatriz Costa foi agendada para "
                                                 "segunda-feira, 23 de março de 2026, às 14:00.\n\nClínica Exemplo"),
    ("session_reminder", "email"): ("Lembrete: sua sessão segunda-feira, 23/03, às 14:00",
                                    "Olá, Ana!\n\nLembrete: sua sessão com Dra. Beatriz Costa é segunda-feira, 23 de "
                                    "março de 2026, às 14:00.\nLocal: Rua das Flores, 123\n\nSe não puder comparecer, "
                                    "avise a clínica.\n\nClínica Exemplo"),
    ("session_reminder", "sms"): (None, "Clínica Exemplo: lembrete da sua sessão segunda-feira, 23/03, às 14:00 com "
                                        "Dra. Beatriz Costa. Responda OK para confirmar, CANCELAR para cancelar, SAIR "
                                        "para parar."),
    ("session_reminder", "whatsapp"): (None, REMINDER_WHATSAPP),
}


def _defaults(rt) -> dict[tuple[str, str], tuple[str | None, str]]:
    with rt.db.connect() as conn:
        rows = conn.execute(select(templates).where(templates.c.org_id.is_(None))).all()
    return {(r.key, r.channel_kind): (r.subject, r.body) for r in rows}


def test_every_default_template_reads_exactly_as_written_here(rt):
    defaults = _defaults(rt)
    assert sorted(defaults) == sorted(EXPECTED), "a new default template needs its exact text here"
    for key, (subject, body) in defaults.items():
        rendered = (render_text(subject, VARIABLES) if subject else None, render_text(body, VARIABLES))
        assert rendered == EXPECTED[key], key


@pytest.mark.parametrize("kind", ["whatsapp", "email"])
def test_a_reminder_without_a_place_keeps_its_blank_line_and_has_no_empty_label(rt, kind):
    subject, body = _defaults(rt)[("session_reminder", kind)]
    text = render_text(body, {**VARIABLES, "local": ""})
    assert "Local" not in text
    assert "às 14:00.\n\n" in text and "\n\n\n" not in text


def test_the_whatsapp_reminder_a_patient_receives_through_the_sandbox(rt, clock):
    world = World(rt, "exemplo")  # "Clínica Exemplo"
    world.channel("whatsapp")
    world.rule(1440)
    contact = world.contact(name="Ana Clara Souza")
    clock.set(STARTS_AT - timedelta(days=3))
    world.appointment(contact, STARTS_AT, location="Rua das Flores, 123", mode="in_person")
    [reminder] = world.messages()
    clock.set(reminder.due_at)  # the day before is a Sunday: the window moves it, which is not the point here
    for message_id in dispatch.claim_due(rt, limit=10):
        dispatch.send_one(rt, message_id)
    [sent] = world.sandbox()
    assert sent.body == REMINDER_WHATSAPP


def test_the_readme_tells_a_clinic_on_meta_which_templates_to_create_as_the_defaults_map_them(rt):
    """Issue 30: the README's table of approved templates to create at Meta is the default mappings:
    the same names, variables in the same order, as many {{n}} in the suggested text, the same
    quick replies; and every template Lembra sends on its own initiative is in it."""
    import re
    from pathlib import Path

    from engine.messaging.meta_templates import BUTTON_TITLES, INITIATED_KEYS

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- meta-templates:", 1)[1].split("<!-- /meta-templates -->", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| `")]
    with rt.db.connect() as conn:
        defaults = {row.key: row for row in conn.execute(select(templates).where(
            templates.c.org_id.is_(None), templates.c.channel_kind == "whatsapp"))}
    assert {row[0].strip("`") for row in rows} == set(INITIATED_KEYS)
    for key, name, text, variables, replies in rows:
        default = defaults[key.strip("`")]
        assert name.strip("`") == default.meta_template_name and default.meta_language == "pt_BR"
        assert variables.strip("`").split(", ") == default.meta_parameters
        assert sorted(set(re.findall(r"\{\{(\d+)\}\}", text)), key=int) == \
            [str(n) for n in range(1, len(default.meta_parameters) + 1)]
        assert not re.match(r"\s*\{\{", text) and not re.search(r"\}\}\s*$", text), "Meta refuses a variable at an end"
        expected = ", ".join(BUTTON_TITLES[b] for b in default.meta_buttons) or "—"
        assert replies == expected


#: What a patient reads when an optional value is missing and the template did not plan for it.
BROKEN = {
    "a double space": re.compile(r"[^\S\n]{2,}"),
    "a space before punctuation": re.compile(r"[^\S\n][,.;:!?)]"),
    "a dangling preposition": re.compile(r"\b(?:com|de|da|do|em|para|por|às)[^\S\n]*(?:[,.;:!?]|\n|$)", re.I),
    "empty parentheses": re.compile(r"\(\s*\)"),
    "an empty label": re.compile(r"^[^\S\n]*\w+:[^\S\n]*$", re.M),
    "a comma after a line break or a doubled one": re.compile(r"(?:^|\n)[^\S\n]*,|,[^\S\n]*,"),
}
#: The variables a reminder may lack: no professional, place, mode or patient's name on record.
OPTIONAL = {"profissional": "", "local": "", "modalidade": "", "nome": "", "nome_completo": ""}


@pytest.mark.parametrize("missing", [*OPTIONAL, "all"])
def test_every_default_template_reads_well_when_an_optional_value_is_missing(rt, missing):
    # "Sua sessão com  foi agendada": an appointment without a professional must not show the hole.
    empty = OPTIONAL if missing == "all" else {missing: ""}
    problems = []
    for key, (subject, body) in sorted(_defaults(rt).items()):
        for part, source in (("subject", subject), ("body", body)):
            if not source:
                continue
            text = render_text(source, {**VARIABLES, **empty})
            problems += [f"{key} {part}: {what} in {text!r}" for what, pattern in BROKEN.items()
                         if pattern.search(text)]
    assert not problems, "\n".join(problems)
