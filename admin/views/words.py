"""The engine's codes in the reader's words, for every console page that shows a message or a
reply: one place, over engine/words/reasons.py (the catalogue), so Fila, Registros, Pendências,
Conversas, the sandbox chat and a patient's history all say the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from babel import Locale, UnknownLocaleError

from admin.i18n import _, current_locale, translate
from engine.words.catalogue import known
from engine.words.reasons import event_label, message_reason, reply_outcome, row_reason, status_label


def language_name(code: str | None) -> str:
    """A language code (pt_BR, en_US, es) as its name in the reader's language ("Português (Brasil)");
    a code babel does not know stays as typed (it is what the clinic typed at Meta)."""
    if not code:
        return "—"
    try:
        name = Locale.parse(code.replace("-", "_")).get_display_name(current_locale())
    except (UnknownLocaleError, ValueError, TypeError):
        return code
    return (name[:1].upper() + name[1:]) if name else code


def message_reason_text(message: Any) -> str:
    """Why a message is where it is (its skip reason or error), as a sentence; "" for none."""
    text = row_reason(message.error_code, message.skip_reason, kind=message.channel_kind)
    return translate(text) if text is not None else ""


def code_text(code: str | None, *, kind: str | None = None) -> str:
    """One error or skip code as its sentence; "" for none."""
    text = message_reason(code, kind=kind)
    return translate(text) if text is not None else ""


def reply_outcome_text(outcome: str | None) -> str:
    """What Lembra did with a patient's reply (not yet processed when `outcome` is None)."""
    return translate(reply_outcome(outcome))


def provider_status_text(status: str | None) -> str | None:
    """What the provider said of a message ("sent", "delivered") as the console's status label;
    None for a status Lembra has no word for (the page then shows the provider's own code as code)."""
    if not status or not known(f"message_status_{status}"):
        return None
    return translate(status_label(status))


def event_text(event: str) -> str:
    """A message event's label ("Enviada", "Nova tentativa agendada")."""
    return translate(event_label(event))


def event_detail_text(detail: Mapping[str, Any] | None, *, kind: str | None = None,
                      users: Mapping[int, str] | None = None) -> str:
    """An event's recorded detail, said in words: its reason, the wait before the next try and
    who did it. Other keys are technical and left out (they stay in the export and the API)."""
    if not detail:
        return ""
    parts: list[str] = []
    for key in ("reason", "code"):
        value = detail.get(key)
        if isinstance(value, str) and value:
            sentence = code_text(value, kind=kind)
            if sentence and sentence not in parts:
                parts.append(sentence)
    delay = detail.get("delay_s")
    if isinstance(delay, (int, float)) and delay > 0:
        minutes = max(1, round(delay / 60))
        parts.append(_("Próxima tentativa em %(num)s min.", num=minutes))
    user_id = detail.get("user_id")
    if isinstance(user_id, int) and users is not None and user_id in users:
        parts.append(_("Por %(quem)s.", quem=users[user_id]))
    return " ".join(parts)
