"""A template's Meta mapping: which approved template of the clinic's WhatsApp Business Account
(WABA) a Lembra template sends through Meta's Cloud API when the 24-hour customer-service window is
closed: its name, its language, the Lembra variables that fill its body parameters ({{1}}, {{2}}, …)
in order, and which of its quick-reply buttons is Confirmar and which Cancelar.

An org's override without a mapping of its own uses the mapping of the global default it overrides
(same key, channel kind and language): "Personalizar" changes the text, not what Meta sends, until
the clinic maps the override otherwise.

At save (console, API, CLI) `review` refuses what is sure to fail at send: a malformed mapping; on
an org whose WhatsApp goes through Meta, a template Lembra sends on its own initiative with no
mapping at all; and, when the WABA's list could be read, a mapping to a template that is not there,
not APPROVED, or whose body parameters, header or buttons do not match it. When the list cannot be
read (no WABA id on the channel, Meta down or refusing the token), the save goes through with a
warning saying so: a Meta outage must not lock a clinic out of its templates. The unmapped case is
refused whatever Meta answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.engine import Connection

from engine.words.catalogue import describe, known
from engine.words.findings import Finding
from engine.tenants.channels import default_channel
from engine.store.models import templates
from engine.store.provider_pool import ProviderPool
from engine.messaging.render import SAMPLE_VARIABLES
from engine.words.texts import Text
from gateway import registry
from gateway.contract import Button, ProviderTemplate, TemplateRef
from gateway.crypto import CryptoError
from gateway.errors import EgressRefused, PermanentError, ProviderError

#: What a quick-reply button of a mapped template does, in the order a mapping lists them; the
#: payload sent is "<action>:<appointment id>", which engine/messaging/inbound.py acts on when it is tapped.
BUTTON_ACTIONS = ("confirm", "cancel")
BUTTON_TITLES = {"confirm": "Confirmar", "cancel": "Cancelar"}
#: Templates whose messages are about an appointment, so a tap can say which one.
KEYS_WITH_BUTTONS = ("session_reminder", "session_confirmation")
#: Templates Lembra sends on its own initiative, so at any time after the patient last wrote: on
#: Meta these need an approved template. The rest answer the patient, inside the open window.
INITIATED_KEYS = frozenset({"session_reminder", "session_confirmation", "session_cancellation",
                            "followup_checkin", "followup_rebook", "conversation_reopen"})
#: The variables a body parameter may take (engine.messaging.render.reminder_variables), in the order shown.
VARIABLES = tuple(SAMPLE_VARIABLES)
MAX_PARAMETERS = 20
#: Meta's template names: lowercase letters, digits and underscores.
NAME_RE = re.compile(r"[a-z0-9_]{1,512}")
#: Meta's language codes: pt_BR, en_US, es, …
LANGUAGE_RE = re.compile(r"[a-z]{2,3}(_[A-Z]{2})?")
APPROVED = "APPROVED"
#: The preview's appointment id (sample data, like the variables).
SAMPLE_APPOINTMENT_ID = 123


@dataclass(frozen=True)
class MetaMapping:
    """What a Lembra template sends through Meta outside the 24-hour window."""

    name: str
    language: str
    parameters: tuple[str, ...] = ()
    buttons: tuple[str, ...] = ()

    @classmethod
    def of(cls, row: Any) -> MetaMapping | None:
        """The row's own mapping (a `templates` row, or anything with its meta_* attributes); None
        when it has no Meta template name."""
        name = getattr(row, "meta_template_name", None)
        if not isinstance(name, str) or not name.strip():
            return None
        language = getattr(row, "meta_language", None)
        return cls(name=name, language=language if isinstance(language, str) and language else "pt_BR",
                   parameters=_names(getattr(row, "meta_parameters", None)),
                   buttons=_names(getattr(row, "meta_buttons", None)))

    def columns(self) -> dict[str, Any]:
        """The `templates` columns that store this mapping."""
        return {"meta_template_name": self.name, "meta_language": self.language,
                "meta_parameters": list(self.parameters), "meta_buttons": list(self.buttons)}

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "language": self.language, "parameters": list(self.parameters),
                "buttons": list(self.buttons)}


#: The columns of a row with no mapping of its own (it uses its default's).
NO_MAPPING: dict[str, Any] = {"meta_template_name": None, "meta_language": None, "meta_parameters": None,
                              "meta_buttons": None}


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


# --- the mapping a row sends ------------------------------------------------------------------------

def default_of(conn: Connection, row: Any) -> Any:
    """The global default an org's template overrides (same key, kind and language), or None."""
    if row.org_id is None:
        return None
    return conn.execute(select(templates).where(
        templates.c.org_id.is_(None), templates.c.key == row.key, templates.c.channel_kind == row.channel_kind,
        templates.c.locale == row.locale)).first()


def effective(row: Any, default: Any) -> tuple[MetaMapping | None, bool]:
    """(the mapping `row` sends, whether it is its default's): its own, else its default's."""
    own = MetaMapping.of(row)
    if own is not None or default is None:
        return own, False
    inherited = MetaMapping.of(default)
    return inherited, inherited is not None


def template_ref(mapping: MetaMapping, variables: Mapping[str, object], appointment_id: int | None) -> TemplateRef:
    """The provider's template reference for one message: the parameters filled from its variables
    in the mapping's order, and the buttons' payloads when the message is about an appointment."""
    buttons: tuple[Button, ...] = ()
    if appointment_id is not None:
        buttons = tuple(Button(f"{action}:{appointment_id}", BUTTON_TITLES.get(action, action))
                        for action in mapping.buttons)
    return TemplateRef(name=mapping.name, language=mapping.language,
                       parameters=tuple(str(variables.get(name, "")) for name in mapping.parameters),
                       buttons=buttons)


def preview(mapping: MetaMapping | None) -> Mapping[str, Any] | None:
    """The `template` object Meta would receive for `mapping`, filled from sample data (never a
    patient's); None without a mapping."""
    if mapping is None:
        return None
    ref = template_ref(mapping, SAMPLE_VARIABLES, SAMPLE_APPOINTMENT_ID)
    return registry.load("meta").template_preview(ref)


# --- findings ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Review:
    """What a save must refuse (`errors`) and what it should say but allow (`warnings`)."""

    errors: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()


def format_findings(key: str, kind: str, mapping: MetaMapping) -> list[Finding]:
    """Whatever makes `mapping` malformed, whatever the WABA holds."""
    if kind != "whatsapp":
        return [Finding("waba_only_whatsapp")]
    found: list[Finding] = []
    if not NAME_RE.fullmatch(mapping.name):
        found.append(Finding("waba_name_invalid", "name"))
    if not LANGUAGE_RE.fullmatch(mapping.language):
        found.append(Finding("waba_language_invalid", "language"))
    if len(mapping.parameters) > MAX_PARAMETERS:
        found.append(Finding("waba_parameters_too_many", "parameters", {"max": MAX_PARAMETERS}))
    for name in dict.fromkeys(mapping.parameters):
        if name not in VARIABLES:
            found.append(Finding("waba_parameter_unknown", "parameters",
                                 {"variable": name[:40], "variables": ", ".join(VARIABLES)}))
    if mapping.buttons and key not in KEYS_WITH_BUTTONS:
        found.append(Finding("waba_buttons_not_here", "buttons"))
    elif any(b not in BUTTON_ACTIONS for b in mapping.buttons) or len(set(mapping.buttons)) != len(mapping.buttons):
        found.append(Finding("waba_buttons_invalid", "buttons"))
    return found


def match_findings(mapping: MetaMapping, listed: Sequence[ProviderTemplate]) -> list[Finding]:
    """Why `mapping` would fail at Meta given the WABA's templates (empty when it fits one)."""
    named = [t for t in listed if t.name == mapping.name]
    chosen = next((t for t in named if t.language == mapping.language), None)
    what = {"name": mapping.name, "language": mapping.language}
    if chosen is None:
        if named:
            languages = ", ".join(sorted({t.language for t in named}))
            return [Finding("waba_template_language", "language", {**what, "languages": languages})]
        return [Finding("waba_template_not_found", "name", what)]
    found = unusable(chosen)
    if not chosen.named and len(chosen.parameters) != len(mapping.parameters):
        found.append(Finding("waba_template_parameter_count", "parameters",
                             {**what, "expected": len(chosen.parameters), "given": len(mapping.parameters)}))
    quick = sum(1 for b in chosen.buttons if b.type == "QUICK_REPLY")
    leading = all(b.type == "QUICK_REPLY" for b in chosen.buttons[:len(mapping.buttons)])
    if quick != len(mapping.buttons) or not leading:
        found.append(Finding("waba_template_buttons", "buttons", {**what, "count": quick, "given": len(mapping.buttons)}))
    return found


def unusable(template: ProviderTemplate) -> list[Finding]:
    """Why Lembra cannot send `template` whatever the mapping: not APPROVED, named parameters, a
    header or a button that needs a value at send time."""
    what = {"name": template.name, "language": template.language}
    found: list[Finding] = []
    if template.status != APPROVED:
        found.append(Finding("waba_template_not_approved", "name", {**what, "status": status_text(template.status)}))
    if template.named:
        found.append(Finding("waba_template_named_parameters", "parameters", what))
    if template.header_needs_parameter:
        found.append(Finding("waba_template_header", "name", what))
    if any(b.needs_parameter for b in template.buttons):
        found.append(Finding("waba_template_button_value", "buttons", what))
    return found


def status_text(status: str) -> Text | str:
    """Meta's template status in words (APPROVED, PENDING, REJECTED, PAUSED, …); an unknown one as
    Meta names it."""
    code = f"waba_status_{status.lower()}"
    return describe(code) if status and known(code) else (status or "?")


# --- the WABA's list --------------------------------------------------------------------------------

@dataclass(frozen=True)
class WabaList:
    """The templates of the org's WABA, or why they could not be read (`problem`, a warning)."""

    templates: tuple[ProviderTemplate, ...] | None = None
    problem: Finding | None = None


def meta_channel(conn: Connection, org_id: int) -> Any:
    """The channel the org's WhatsApp messages go through when it is Meta's Cloud API, else None."""
    channel = default_channel(conn, org_id, "whatsapp")
    return channel if channel is not None and channel.provider == "meta" else None


def read_waba(pool: ProviderPool, channel: Any) -> WabaList:
    """The channel's WABA templates, asked of Meta now. Call it with no transaction open: Meta may
    take the whole provider timeout to answer."""
    try:
        listed = pool.get(channel).list_templates()
    except EgressRefused:
        return WabaList(problem=Finding("waba_templates_address_refused"))
    except PermanentError as exc:
        if exc.code == "waba_missing":
            return WabaList(problem=Finding("waba_channel_no_waba"))
        return WabaList(problem=Finding("waba_templates_refused"))
    except ProviderError:
        return WabaList(problem=Finding("waba_templates_unreachable"))
    except (CryptoError, registry.UnknownProvider):
        return WabaList(problem=Finding("waba_templates_refused"))
    return WabaList(templates=tuple(listed))


def review(key: str, kind: str, mapping: MetaMapping | None, *, own: bool, on_meta: bool,
           waba: WabaList | None) -> Review:
    """What a save of a template with this (effective) mapping must refuse or say.

    `own` says the mapping is the template's own (an inherited one is the default's, not checked
    for its shape); `on_meta` that the org's WhatsApp goes through Meta; `waba` is the WABA's list
    when `on_meta` (None when it was not asked)."""
    if mapping is None:
        if on_meta and kind == "whatsapp" and key in INITIATED_KEYS:
            return Review(errors=(Finding("waba_template_unmapped", "name"),))
        return Review()
    errors = format_findings(key, kind, mapping) if own else []
    if errors or not on_meta or kind != "whatsapp":
        return Review(errors=tuple(errors))
    if waba is None or waba.templates is None:
        problem = waba.problem if waba is not None else None
        return Review(warnings=(problem or Finding("waba_templates_unreachable"),))
    return Review(errors=tuple(match_findings(mapping, waba.templates)))


def offered(waba: WabaList | None) -> list[ProviderTemplate]:
    """The WABA's templates to offer a clinic: approved ones first, then by name and language."""
    if waba is None or waba.templates is None:
        return []
    return sorted(waba.templates, key=lambda t: (t.status != APPROVED, t.name, t.language))
